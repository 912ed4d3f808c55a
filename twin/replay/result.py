"""What a what-if run returns: per component, per kind of limit, and the verdict.

A scenario's verdict is relative to the recording it replays (DESIGN.md, Replay and what-if):
what the recording already breached is reported apart from what the scenario changes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

Kind = Literal["gpu", "pdu_phase", "rack", "cdu_heat", "cdu_flow", "loop", "link"]
Verdict = Literal["fits", "fits with risks", "does not fit", "baseline"]


class ComponentResult(BaseModel):
    """One limit of one component over the whole run."""

    kind: Kind
    id: str
    unit: str
    limit: float
    peak: float
    min_headroom: float
    #: seconds this component spent over its limit (never longer than the recording)
    time_over_s: float
    first_breach: datetime | None
    #: the value at the end of the recording, as live headroom reads "now": the last minute's
    #: mean for powers, currents, flows and traffic, the last reading for temperatures
    value_end: float | None = None


class ComponentChange(BaseModel):
    """How a scenario moved one component's minimum headroom against the recording."""

    kind: Kind
    id: str
    unit: str
    limit: float
    baseline_min_headroom: float
    min_headroom: float
    #: scenario minus baseline; negative: the scenario takes headroom away
    delta: float
    baseline_time_over_s: float
    time_over_s: float
    #: "new breach", "worse breach", "short breach" (shorter than the duration tolerance, or a
    #: breach lengthened by less), "already breaching", "less headroom", "within tolerance",
    #: "more headroom"
    change: str
    first_breach: datetime | None = None  # in the scenario


class KindSummary(BaseModel):
    kind: Kind
    unit: str
    components: int
    worst_id: str
    worst_min_headroom: float
    #: the same component's minimum headroom in the baseline run (a scenario's summary; None
    #: for the baseline's own, or a component the recording does not have, such as a new rack)
    worst_baseline_min_headroom: float | None = None
    breaching: int
    #: the longest time any one component of this kind spent over its limit (<= the recording)
    time_over_s: float
    #: the sum over components of the time each spent over its limit
    component_over_s: float
    first_breach: datetime | None


class RunResult(BaseModel):
    name: str
    description: str
    verdict: Verdict
    reasons: list[str]
    kinds: list[KindSummary]
    worst: list[ComponentResult]  # the components over or nearest their limits
    #: components over their limit in the recording itself (the baseline run)
    recorded_breaches: list[ComponentResult] = Field(default_factory=list)
    #: the components whose headroom the scenario moved most, or whose breach it created or
    #: worsened (empty for the baseline)
    changes: list[ComponentChange] = Field(default_factory=list)
    alerts: list[dict[str, Any]]
    it_energy_kwh: float
    liquid_heat_kwh: float
    #: GPU-seconds at the max operating temperature (held there by the thermal controller, or
    #: read there in the recording): one definition for the baseline and every scenario
    throttled_gpu_s: float
    #: IT energy the throttled GPUs did not draw (their work not done), kWh
    undelivered_energy_kwh: float = 0.0
    duration_s: float = 0.0
    #: site-level paths for the report's figures, all on the same time axis ``t_h``
    series: dict[str, list[float]]
    cdus: dict[str, dict[str, float]]  # per CDU: time means of flow, supply, return, heat
    gpu_mean_temp_c: dict[str, float]  # per GPU of the site: mean temperature over the run
