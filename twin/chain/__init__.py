"""The twin's one propagation chain (DESIGN.md, "One chain"; docs/physics.md).

GPU power from activity through the calibrated curve -> GPU temperature through the calibrated
R and C at the loop's flow, with the thermal controller -> node and rack power -> PDU phases and
breakers -> rack heat to liquid and air -> CDU heat, flow, return -> loop; plus links.

Live headroom (``twin.analysis.headroom``), what-if replay (``twin.replay.whatif``) and the API
call these functions and keep no copy of them. ``limits`` owns every limit and derating, ``params``
says which parameter a device runs on (calibrated, else catalog), ``trend`` fits the phase current's
trend that the racks' load does not explain, ``breach`` turns a frame's "now" and a load path
into the time to breach of each limit (live: one "now"; a replay: every minute at once).
"""

from twin.chain.limits import (
    PhaseTable,
    derated_a,
    feed_capacity_kw,
    phase_table,
    power_factor,
    pumps_running,
    rack_capacity_kw,
)
from twin.chain.params import ChainParams, GpuParams, resolve
from twin.chain.thermal import ThermalResult, gpu_temperatures

__all__ = [
    "ChainParams",
    "GpuParams",
    "PhaseTable",
    "ThermalResult",
    "derated_a",
    "feed_capacity_kw",
    "gpu_temperatures",
    "phase_table",
    "power_factor",
    "pumps_running",
    "rack_capacity_kw",
    "resolve",
]
