"""The alert metric names: every metric an :class:`~twin.alerts.model.Observation` may carry.

One owner for the names the detectors emit (:mod:`twin.analysis.detect`, fed by
:mod:`twin.analysis.headroom`, :mod:`twin.analysis.hotspots` and :mod:`twin.analysis.fleets`),
what-if replays (:mod:`twin.replay.whatif`) and rule files watch. Emitters use the constants below;
the rule loader (:func:`twin.alerts.rules.parse_rules`) refuses a rule whose metric is not listed
here, or whose ``entity_kind`` is not one the metric is emitted for, so a rule that could never
fire is an error at load instead of a silent gap.

Adding a metric: add a constant and a :class:`MetricSpec` to :data:`METRICS`, then emit it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from twin.alerts.model import EntityKind

__all__ = [
    "CDU_PUMPS_RUNNING",
    "COOLING_GPU_STEP_K",
    "DRIFT_GPU_R",
    "EXCESS_METRICS",
    "FLEET_DRAIN_DROP",
    "FLEET_UNDERUSED_GPUS",
    "HEADROOM_CDU_FLOW_LPM_TO_LIMIT",
    "HEADROOM_CDU_FLOW_TIME_TO_BREACH_P50_S",
    "HEADROOM_CDU_FREE_FRACTION",
    "HEADROOM_CDU_TIME_TO_BREACH_P50_S",
    "HEADROOM_GPU_K_TO_SLOWDOWN",
    "HEADROOM_GPU_TIME_TO_BREACH_P90_S",
    "HEADROOM_LINK_GBPS_TO_LIMIT",
    "HEADROOM_LINK_TIME_TO_BREACH_P50_S",
    "HEADROOM_LOOP_K_TO_RETURN_LIMIT",
    "HEADROOM_LOOP_TIME_TO_BREACH_P50_S",
    "HEADROOM_PDU_PHASE_A_TO_LIMIT",
    "HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S",
    "HEADROOM_RACK_KW_TO_LIMIT",
    "HEADROOM_RACK_TIME_TO_BREACH_P50_S",
    "HOTSPOT_GPU_OVER_LIMIT_K",
    "HOTSPOT_GPU_RESIDUAL_SIGMA",
    "HOTSPOT_RACK_INLET_C",
    "METRICS",
    "MODEL_METRICS",
    "RESIDUAL_MIN_EXCESS_K",
    "MetricSpec",
    "metric_problem",
]


#: A residual page needs this absolute excess over the model in each judged minute besides k
#: sigma (a residual rule's default ``min_excess_k``): three steps of the 1 °C die sensor,
#: above what the die and coolant sensors' quantization (up to 0.5 K each in a minute mean)
#: and a healthy GPU's minute error against its fitted model (about 1 K held out on the real
#: A100 trace) add up to, and well under the 5-15 K a degraded cold plate adds at load
#: (docs/physics.md §2.7). [K]
RESIDUAL_MIN_EXCESS_K = 3.0


@dataclass(frozen=True)
class MetricSpec:
    """One alert metric: its name, the entity kinds it is emitted for, its unit, its meaning."""

    name: str
    kinds: tuple[EntityKind, ...]
    unit: str
    meaning: str
    #: labels every observation of the metric carries (what a summary may quote)
    labels: tuple[str, ...] = ()


HEADROOM_GPU_K_TO_SLOWDOWN = "headroom.gpu.k_to_slowdown"
HEADROOM_GPU_TIME_TO_BREACH_P90_S = "headroom.gpu.time_to_breach_p90_s"
HEADROOM_PDU_PHASE_A_TO_LIMIT = "headroom.pdu_phase.a_to_limit"
HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S = "headroom.pdu_phase.time_to_breach_p50_s"
HEADROOM_RACK_KW_TO_LIMIT = "headroom.rack.kw_to_limit"
HEADROOM_RACK_TIME_TO_BREACH_P50_S = "headroom.rack.time_to_breach_p50_s"
HEADROOM_CDU_FREE_FRACTION = "headroom.cdu.capacity_free_fraction"
HEADROOM_CDU_TIME_TO_BREACH_P50_S = "headroom.cdu.time_to_breach_p50_s"
HEADROOM_CDU_FLOW_LPM_TO_LIMIT = "headroom.cdu.flow_lpm_to_limit"
HEADROOM_CDU_FLOW_TIME_TO_BREACH_P50_S = "headroom.cdu.flow_time_to_breach_p50_s"
HEADROOM_LOOP_K_TO_RETURN_LIMIT = "headroom.loop.k_to_return_limit"
HEADROOM_LOOP_TIME_TO_BREACH_P50_S = "headroom.loop.time_to_breach_p50_s"
HEADROOM_LINK_GBPS_TO_LIMIT = "headroom.link.gbps_to_limit"
HEADROOM_LINK_TIME_TO_BREACH_P50_S = "headroom.link.time_to_breach_p50_s"
HOTSPOT_GPU_RESIDUAL_SIGMA = "hotspot.gpu.residual_sigma"
HOTSPOT_GPU_OVER_LIMIT_K = "hotspot.gpu.over_limit_k"
HOTSPOT_RACK_INLET_C = "hotspot.rack.inlet_c"
DRIFT_GPU_R = "drift.gpu.r_k_per_w"
COOLING_GPU_STEP_K = "cooling.gpu.step_k"
CDU_PUMPS_RUNNING = "cdu.pumps_running"
FLEET_UNDERUSED_GPUS = "fleet.underused_gpus"
FLEET_DRAIN_DROP = "fleet.drain_drop_fraction"

_SPECS = (
    MetricSpec(
        HEADROOM_GPU_K_TO_SLOWDOWN, ("gpu",), "K", "K left to the max operating temperature, now"
    ),
    MetricSpec(
        HEADROOM_GPU_TIME_TO_BREACH_P90_S,
        ("gpu",),
        "s",
        "s until the p90 forecast reaches the max operating temperature (2x horizon if never)",
    ),
    MetricSpec(
        HEADROOM_PDU_PHASE_A_TO_LIMIT,
        ("pdu_phase",),
        "A",
        "A left to the phase's derated (80 %) limit, now",
    ),
    MetricSpec(
        HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S,
        ("pdu_phase",),
        "s",
        "s until the p50 forecast current reaches the derated limit (2x horizon if never)",
    ),
    MetricSpec(
        HEADROOM_RACK_KW_TO_LIMIT, ("rack",), "kW", "kW left on the rack's feeds together, now"
    ),
    MetricSpec(
        HEADROOM_RACK_TIME_TO_BREACH_P50_S,
        ("rack",),
        "s",
        "s until the p50 rack power reaches what its feeds carry (2x horizon if never)",
    ),
    MetricSpec(
        HEADROOM_CDU_FREE_FRACTION, ("cdu",), "1", "share of the CDU's heat capacity free, now"
    ),
    MetricSpec(
        HEADROOM_CDU_TIME_TO_BREACH_P50_S,
        ("cdu",),
        "s",
        "s until the p50 heat reaches the CDU's capacity at its flow (2x horizon if never)",
    ),
    MetricSpec(
        HEADROOM_CDU_FLOW_LPM_TO_LIMIT,
        ("cdu",),
        "L/min",
        "L/min of flow over what the heat needs with the return at its limit, now",
    ),
    MetricSpec(
        HEADROOM_CDU_FLOW_TIME_TO_BREACH_P50_S,
        ("cdu",),
        "s",
        "s until the p50 heat needs more flow than the CDU has (2x horizon if never)",
    ),
    MetricSpec(
        HEADROOM_LOOP_K_TO_RETURN_LIMIT,
        ("cdu",),
        "K",
        "K from the loop's return-temperature limit, reported per CDU, now",
    ),
    MetricSpec(
        HEADROOM_LOOP_TIME_TO_BREACH_P50_S,
        ("cdu",),
        "s",
        "s until the p50 return temperature reaches the loop's limit, reported per CDU"
        " (2x horizon if never)",
    ),
    MetricSpec(
        HEADROOM_LINK_GBPS_TO_LIMIT,
        ("link",),
        "Gb/s",
        "Gb/s left to the link's capacity in its busier direction, now",
    ),
    MetricSpec(
        HEADROOM_LINK_TIME_TO_BREACH_P50_S,
        ("link",),
        "s",
        "s until the p50 traffic reaches the link's capacity (2x horizon if never)",
    ),
    MetricSpec(
        HOTSPOT_GPU_RESIDUAL_SIGMA,
        ("gpu",),
        "sigma",
        "smallest minute residual over the thermal model, in sigmas, over the window",
    ),
    MetricSpec(
        HOTSPOT_GPU_OVER_LIMIT_K,
        ("gpu",),
        "K",
        "K over the catalog temperature limit (reported only while over)",
    ),
    MetricSpec(
        HOTSPOT_RACK_INLET_C, ("rack",), "degC", "rack inlet air temperature (racks with a reading)"
    ),
    MetricSpec(
        DRIFT_GPU_R,
        ("gpu",),
        "1",
        "thermal resistance R (last 30 min) over its fleet's median, minus 1",
    ),
    MetricSpec(
        COOLING_GPU_STEP_K,
        ("gpu",),
        "K",
        "fall of the temperature below the model at flat power (negative; reported only while"
        " a cooling change is in the lookback window)",
    ),
    MetricSpec(
        CDU_PUMPS_RUNNING,
        ("cdu",),
        "pumps",
        "pumps not seen stopped (speed >= the running threshold, or no reading)",
    ),
    MetricSpec(
        FLEET_UNDERUSED_GPUS,
        ("fleet",),
        "GPUs",
        "GPUs an underused inference fleet could free at its p95 load (flagged fleets only)",
    ),
    MetricSpec(
        FLEET_DRAIN_DROP,
        ("fleet",),
        "1",
        "1 - the fleet's last 15 min activity over its level before (same time yesterday, else"
        " the previous 1 h median); labels level_now, level_before, basis, window",
    ),
)

#: The labels each metric's observations always carry, live (twin.analysis.detect.observations) and
#: in a what-if (twin.replay): a rule summary may quote only these (checked at load), so no page
#: renders a value nobody reported. Live observations carry more context (``limit_c``,
#: ``free_kw``, ``stopped`` ...) into the payloads' labels.
_LABELS: dict[str, tuple[str, ...]] = {
    HOTSPOT_GPU_RESIDUAL_SIGMA: ("excess_k", "sigma_k", "measured_c", "model_c"),
    DRIFT_GPU_R: ("r_k_per_w", "fleet_r_k_per_w", "excess_k"),
    FLEET_UNDERUSED_GPUS: ("kw_freed", "covered_s", "covered"),
    FLEET_DRAIN_DROP: ("level_now", "level_before", "basis", "window"),
}

#: metric name -> its spec; the rule loader validates against this.
METRICS: Mapping[str, MetricSpec] = MappingProxyType(
    {s.name: dataclasses.replace(s, labels=_LABELS.get(s.name, ())) for s in _SPECS}
)

#: Metrics judged through a fitted model of the GPU (residual, R drift, the GPU temperature
#: forecast through the RC model): emitted only from a calibration fitted on this site's
#: telemetry, and only for GPUs whose fit was usable (a seeded or catalog model serves
#: headroom, never such a page).
MODEL_METRICS: frozenset[str] = frozenset(
    {HOTSPOT_GPU_RESIDUAL_SIGMA, DRIFT_GPU_R, HEADROOM_GPU_TIME_TO_BREACH_P90_S}
)

#: Metrics whose observations carry ``excess``, the absolute excess in K the value stands for
#: (the residual: the smallest loaded minute over the model; R drift: (R - the fleet's median)
#: x the heat R was estimated at): a rule on one may ask for ``min_excess_k``.
EXCESS_METRICS: frozenset[str] = frozenset({HOTSPOT_GPU_RESIDUAL_SIGMA, DRIFT_GPU_R})


def metric_problem(
    metric: str, entity_kind: str | None, metrics: Mapping[str, MetricSpec] = METRICS
) -> str | None:
    """Why a rule on (``metric``, ``entity_kind``) could never fire, or None when it can."""
    spec = metrics.get(metric)
    if spec is None:
        return f"unknown metric {metric!r}; known metrics: {', '.join(sorted(metrics))}"
    if entity_kind is not None and entity_kind not in spec.kinds:
        return (
            f"metric {metric!r} is emitted for entity_kind {' or '.join(spec.kinds)},"
            f" not {entity_kind!r}"
        )
    return None
