"""Pydantic models of the API's requests and responses (documented in /openapi.json).

Every quantity carries its unit in its name (``power_kw``, ``temp_c``, ``headroom_a``) or in
a ``unit`` field next to it; every time is UTC (ISO 8601 with an offset).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from twin.site import Site

HeadroomKind = Literal["gpu", "pdu_phase", "rack", "cdu", "loop", "link"]
HEADROOM_KINDS: tuple[str, ...] = ("gpu", "pdu_phase", "rack", "cdu", "loop", "link")
Resolution = Literal["auto", "raw", "1m", "1h"]


class ErrorBody(BaseModel):
    """Every 4xx: ``detail`` says what was wrong and how to put it right."""

    detail: str | list[Any]


class BrokerHealth(BaseModel):
    """The MQTT connection as the ingest sees it."""

    connected: bool | None = Field(description="None: not tried yet")
    since: datetime | None = Field(description="when it last connected or disconnected")
    reconnects: int
    disconnects: int
    last_reason: str | None = Field(description="why it last disconnected")


class IngestProgress(BaseModel):
    lag_s: float = Field(description="age of the oldest received-but-unstored message [s]")
    last_commit_at: datetime | None = Field(description="last commit of received messages")
    store_retrying: str | None = Field(description="a store error being retried")
    stall_after_s: float = Field(description="lag beyond which /healthz answers 503 [s]")
    samples: dict[str, int] | None = Field(
        default=None,
        description="samples stored since the service started, per kind (None: no ingest);"
        " the cheap progress figure beside /metrics, whose headroom series are many at scale",
    )


class LoopHealth(BaseModel):
    successes_total: int
    errors_total: int
    last_success: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    failing: bool = Field(description="the most recent pass failed")


class Health(BaseModel):
    """``/healthz``: 200 with ok or degraded, 503 with stalled; ``reason`` says why."""

    status: Literal["ok", "degraded", "stalled"]
    reason: str | None = Field(description="why the status is not ok")
    site: str | None
    started_at: datetime
    uptime_s: float
    broker_connected: bool | None = Field(
        description="broker.connected; None: no MQTT service in this process or not tried yet"
    )
    broker: BrokerHealth | None = None
    ingest: IngestProgress | None = None
    loops: dict[str, LoopHealth] = Field(
        default_factory=dict, description="each background loop (ingest, calibration, ...)"
    )
    missing_telemetry: dict[str, str] = Field(
        default_factory=dict, description="kind -> what could not be computed without it"
    )


class ApiIndex(BaseModel):
    """What this API offers; ``features`` names optional parts (``whatif``: issue 7)."""

    version: str
    site: str | None
    endpoints: list[str]
    features: dict[str, bool]


# ---- site ------------------------------------------------------------------------------------


class SiteCounts(BaseModel):
    halls: int
    rows: int
    racks: int
    nodes: int
    gpus: int
    pdus: int
    cdus: int
    links: int
    fleets: int


class SiteResponse(BaseModel):
    name: str
    counts: SiteCounts
    site: Site = Field(description="the site model as loaded from its YAML file")


# ---- state and series ------------------------------------------------------------------------


class DeviceState(BaseModel):
    id: str
    source: str
    ts: datetime
    values: dict[str, float | None] = Field(description="quantity -> value, units in `units`")


class StateQuery(BaseModel):
    """``POST /api/v1/state/{kind}``: the ids as a list (at most 20000)."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] | None = Field(default=None, description="device ids; default all")
    max_age_s: float = Field(default=300.0, gt=0, le=30 * 86400)


class SeriesQuery(BaseModel):
    """``POST /api/v1/series``: the GET's parameters in a body, ``ids`` a list (at most
    20000)."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    quantity: str
    ids: list[str] | None = Field(default=None, description="device ids; default all")
    start: str | None = Field(default=None, description="ISO 8601 or Unix s")
    end: str | None = Field(default=None, description="ISO 8601 or Unix s, exclusive")
    resolution: Resolution = "auto"
    format: str | None = Field(default=None, description="'arrow' or json")
    agg: str | None = Field(default=None, description="sum | mean | min | max")


class StateResponse(BaseModel):
    kind: str
    units: dict[str, str] = Field(description="quantity -> unit")
    newest: datetime | None = Field(description="newest sample of this kind in the store")
    max_age_s: float = Field(
        description="devices silent longer than this before `newest` are left out"
    )
    devices: list[DeviceState]


class Series(BaseModel):
    id: str
    t: list[datetime]
    value: list[float | None] = Field(description="raw value, or the bucket mean for rollups")
    min: list[float | None] | None = Field(default=None, description="bucket minimum (rollups)")
    max: list[float | None] | None = Field(default=None, description="bucket maximum (rollups)")
    devices: list[int] | None = Field(
        default=None,
        description="with agg: devices in each bucket (fewer in a partial first or last minute)",
    )


class SeriesResponse(BaseModel):
    """A quantity of some devices over [start, end).

    ``resolution`` ``auto`` picks raw samples for ranges up to 2 h, 1-minute rollups up to
    2 days and 1-hour rollups beyond. Rollups cover complete buckets only (the newest minute
    or hour appears once it has ended and the service's rollup pass has run, every minute).
    """

    kind: str
    quantity: str
    unit: str
    resolution: Literal["raw", "1m", "1h"]
    agg: str | None = Field(default=None, description="the aggregate across devices, if any")
    start: datetime
    end: datetime
    points: int
    series: list[Series]


# ---- headroom, overview, racks ---------------------------------------------------------------


class HeadroomRowOut(BaseModel):
    """Headroom of one limit of one entity: ``headroom_* = limit - value`` in ``unit``."""

    kind: HeadroomKind
    id: str
    quantity: str
    unit: str
    limit: float | None
    value_now: float | None
    headroom_now: float | None
    headroom_min_p50: float | None
    headroom_min_p90: float | None
    breach_in_s_p50: float | None = Field(description="None: no breach within the horizon")
    breach_in_s_p90: float | None
    rack: str | None = None
    cdu: str | None = None
    basis: str | None = Field(
        None,
        description="where the p50/p90 paths come from: 'forecast (k of n racks; ...)' or"
        " 'persistence', with why where a forecast was asked for (e.g. 'persistence (less"
        " than 24 h of node power history for a forecast)'); phases add ', trend', GPUs"
        " their thermal model's source",
    )


class HeadroomResponse(BaseModel):
    computed_at: datetime | None = Field(description="None: no report stored yet")
    data_until: datetime | None
    rows: list[HeadroomRowOut]


class HeadroomKindHistory(BaseModel):
    kind: str
    t: list[datetime] = Field(description="when each stored report was computed")
    used_pct: list[float | None] = Field(
        description="share of its limit the tightest limit of this kind used [%]"
    )


class HeadroomHistoryResponse(BaseModel):
    """The tightest limit per kind over the stored headroom reports (one per detection pass,
    the newest 1,440 kept: 24 h at the default 60 s)."""

    start: datetime
    kinds: list[HeadroomKindHistory]


class HeadroomKindSummary(BaseModel):
    kind: str
    unit: str
    count: int
    min_headroom: float | None = Field(description="smallest headroom now, in `unit`")
    min_id: str | None
    breached_now: int = Field(description="limits at or past zero headroom now")
    breach_within_horizon_p90: int = Field(description="limits whose p90 path crosses zero")


class IngestHealth(BaseModel):
    received: int | None = Field(description="messages received since the service started")
    stored_messages: int | None
    duplicates: int | None
    dead_letters_since_start: dict[str, int]
    dead_letters_stored: dict[str, int] = Field(description="dead letters in the store, all time")
    newest: dict[str, datetime | None] = Field(description="newest sample per kind")
    lag_s: dict[str, float | None] = Field(description="now - newest sample, per kind [s]")
    broker_connected: bool | None
    write_errors: int | None


class AlertCounts(BaseModel):
    enabled: bool
    active: int
    by_severity: dict[str, int]
    unacknowledged: int


class Overview(BaseModel):
    site: str | None
    data_until: datetime | None
    it_power_kw: float | None = Field(description="sum of the latest node input power [kW]")
    nodes_reporting: int
    gpus_reporting: int
    gpu_power_kw: float | None = Field(description="sum of the latest GPU board power [kW]")
    cooling_load_kw: float | None = Field(description="sum of the latest CDU heat removed [kW]")
    cooling_capacity_kw: float | None = Field(description="rated capacity of the site's CDUs")
    headroom_computed_at: datetime | None
    headroom: list[HeadroomKindSummary]
    tightest: list[HeadroomRowOut] = Field(description="the limits closest to breach")
    alerts: AlertCounts
    ingest: IngestHealth


class RackSummary(BaseModel):
    name: str
    hall: str
    row: str
    grid_col: int
    grid_row: int
    cdu: str | None
    pdus: list[str]
    fleet: str | None
    nodes: int
    gpus: int
    power_kw: float | None = Field(description="sum of its nodes' latest input power [kW]")
    power_limit_kw: float | None = Field(description="what its feeds carry together [kW]")
    headroom_kw: float | None
    gpu_temp_max_c: float | None
    gpu_headroom_min_k: float | None = Field(description="smallest GPU K to slowdown")
    gpu_util_mean_pct: float | None
    inlet_temp_c: float | None = Field(description="warmest latest inlet reading [°C]")
    pdu_headroom_min_a: float | None = Field(description="smallest phase A to derated limit")
    limit_used_max_pct: float | None = Field(
        None,
        description="the largest share of a limit used among its GPUs, PDU phases and feeds"
        " [%], as twin.bands counts it (a temperature above the bands' reference)",
    )
    limit_used_max_of: str | None = Field(None, description='whose limit that is ("gpu a03-n1:2")')
    limit_used_pct: dict[str, float] = Field(
        default_factory=dict,
        description="per kind of limit (gpu, pdu_phase, rack): the largest share used [%]",
    )
    alerts: int = Field(description="active incidents naming this rack or its members")


class RacksResponse(BaseModel):
    data_until: datetime | None
    racks: list[RackSummary]


class GpuRow(BaseModel):
    id: str
    index: int
    power_w: float | None
    temp_c: float | None
    mem_temp_c: float | None
    util_pct: float | None
    sm_active: float | None
    power_limit_w: float | None
    headroom_k: float | None = Field(description="K to the max operating temperature")


class NodeRow(BaseModel):
    name: str
    model: str
    gpu_model: str
    phase: str | None
    power_w: float | None
    inlet_temp_c: float | None
    outlet_temp_c: float | None
    fan_speed_pct: float | None
    gpus: list[GpuRow]


class PhaseRow(BaseModel):
    id: str
    pdu: str
    feed: str
    current_a: float | None
    voltage_v: float | None
    power_w: float | None
    rated_a: float = Field(description="breaker or input rating [A]")
    limit_a: float = Field(description="80 % continuous derating of the rating [A]")
    headroom_a: float | None
    breach_in_s_p50: float | None


class PumpRow(BaseModel):
    name: str
    speed_pct: float | None
    power_w: float | None
    running: bool | None


class CduRow(BaseModel):
    name: str
    model: str | None
    capacity_kw: float | None
    max_flow_lpm: float | None
    return_limit_c: float
    supply_temp_c: float | None
    return_temp_c: float | None
    flow_lpm: float | None
    dp_kpa: float | None
    heat_kw: float | None
    fw_supply_temp_c: float | None
    fw_return_temp_c: float | None
    capacity_used_pct: float | None = Field(description="heat_kw / capacity_kw x 100")
    headroom_kw: float | None
    return_headroom_k: float | None
    racks: list[str]
    pumps: list[PumpRow]


class RackDetail(BaseModel):
    data_until: datetime | None = None
    rack: RackSummary
    nodes: list[NodeRow]
    phases: list[PhaseRow]
    cdu: CduRow | None


class CdusResponse(BaseModel):
    data_until: datetime | None
    cdus: list[CduRow]


class PhasesResponse(BaseModel):
    data_until: datetime | None
    phases: list[PhaseRow]


class LinkRow(BaseModel):
    name: str
    a: str
    b: str
    capacity_gbps: float
    tx_gbps: float | None
    rx_gbps: float | None
    utilization_pct: float | None = Field(description="busier direction / capacity x 100")
    errors: int | None
    headroom_gbps: float | None


class LinksResponse(BaseModel):
    data_until: datetime | None
    links: list[LinkRow]


# ---- calibration -----------------------------------------------------------------------------


class ParamSummary(BaseModel):
    param: str
    median: float | None
    p10: float | None
    p90: float | None
    n: int = Field(description="devices with a usable value")


class QualitySummary(BaseModel):
    quantity: str
    mae: float | None = Field(description="median over devices, in the quantity's unit")
    cv_rmse: float | None = Field(description="median CV(RMSE), a fraction")
    nmbe: float | None
    mape: float | None
    devices: int


class ClassCalibration(BaseModel):
    device_class: str = Field(description="gpu:<model>, or the kind (rack, cdu, ...)")
    devices: int
    usable_fraction: float
    params: list[ParamSummary]
    quality: list[QualitySummary]
    unusable_reasons: dict[str, int]


class CalibrationEventOut(BaseModel):
    kind: str
    id: str
    param: str
    value: float | None
    own_median: float | None
    fleet_median: float | None
    detail: str | None


class CalibrationRun(BaseModel):
    run_id: int
    fitted_at: datetime
    window_start: datetime
    window_end: datetime
    holdout_start: datetime
    gpus: int
    seconds: float
    source: Literal["fit", "seed"] = Field(
        description="fit: fitted on this store's telemetry; seed: the calibration of a"
        " recorded bundle (serve --seed-calibration), kept until the first fit"
    )
    seeded_from: str | None = Field(description="the bundle a seeded run came from")
    seeded_at: datetime | None = Field(description="when a seeded run was stored")


class ModelRules(BaseModel):
    """The alert rules judged through a fitted model (residual, R drift, the GPU temperature
    forecast): armed only by a calibration fitted on this store's telemetry."""

    armed: bool = Field(description="the newest run is a fit on this site's telemetry")
    run_id: int | None = Field(description="the run they judge with (None: not armed)")
    rules: list[str] = Field(description="the rule file's model-based rules")
    waiting: list[str] = Field(description="those waiting for the first fit (empty once armed)")
    gpus_not_judged: int = Field(
        description="GPUs whose fit was refused and that have no earlier usable fit on this"
        " site: the model skips them"
    )
    gpus_judged_by_earlier_fit: int = Field(
        default=0,
        description="GPUs without a usable fit in this run (refused or not made), judged by"
        " their newest usable fit for the residual and R drift; the GPU temperature forecast"
        " (which uses the newest run's parameters) skips them until a run fits them again",
    )
    note: str


class CalibrationResponse(BaseModel):
    run: CalibrationRun | None = Field(description="None: no calibration stored yet")
    runs: int
    fits: int = Field(description="runs fitted on this store's telemetry (seeded ones not)")
    first_fit_expected_at: datetime | None = Field(
        description="when the first fit on live data is expected; None once there is one,"
        " or when this service does not calibrate"
    )
    note: str = Field(
        description="where the calibration stands, in one line: seeded from which bundle at"
        " what time and when the first fit is expected, or when the last fit was"
    )
    classes: list[ClassCalibration]
    events: list[CalibrationEventOut]
    model_rules: ModelRules | None = Field(
        None, description="whether the model-based alert rules judge yet (None: no rules)"
    )


# ---- alerts ----------------------------------------------------------------------------------


class Ack(BaseModel):
    acked_at: datetime
    acked_by: str
    comment: str


class ActiveAlert(BaseModel):
    dedup_key: str
    rule: str
    severity: str
    group_kind: str
    group_id: str
    notified: bool = Field(description="paged (False while held by for_s, group_wait_s, silence)")
    starts_at: datetime | None
    members: list[str]
    racks: list[str] = Field(
        default_factory=list,
        description="the racks the incident concerns: those its CDU, loop or PDU serves,"
        " its fleet's, or the rack of its node or GPU",
    )
    cdus: list[str] = Field(
        default_factory=list, description="the CDUs that cool what the incident concerns"
    )
    summary: str | None = Field(
        None,
        description="one line from the worst member now, rendered again at every evaluation"
        " (None before it is paged and while no member fires)",
    )
    paged_summary: str | None = Field(None, description="the line the page (or reminder) sent")
    value: float | None = Field(None, description="the worst member's value now, in unit")
    unit: str | None = Field(None, description="unit of value and of the rule's threshold")
    firing_for_s: float | None = Field(
        None, description="seconds from the incident's start to the last evaluation"
    )
    evaluated_at: datetime | None = Field(None, description="the last evaluation's time")
    runbook_url: str | None = Field(None, description="the rule's runbook, when it gives one")
    flapping: bool = Field(False, description="flap detection marked it: no reminders")
    repeat: int = Field(0, description="reminders sent (repeat_interval_s)")
    acknowledged: Ack | None
    values: dict[str, float | None] = Field(
        default_factory=dict,
        description="each member's latest observed value of the rule's metric (else the value"
        " it was paged with), in the metric's unit",
    )
    metric: str | None = Field(None, description="the rule's metric (its name carries its unit)")
    op: str | None = Field(None, description="the rule's comparison (<, <=, >, >=)")
    threshold: float | None = Field(None, description="the rule's threshold, in the metric's unit")


class AlertEvent(BaseModel):
    at: datetime
    dedup_key: str
    status: str = Field(description="firing | resolved | acknowledge")
    rule: str | None
    severity: str | None
    summary: str | None
    starts_at: datetime | None
    ends_at: datetime | None
    by: str | None = None


class AlertsResponse(BaseModel):
    enabled: bool = Field(description="False: the service runs without --rules")
    rules: list[str]
    active: list[ActiveAlert]
    history: list[AlertEvent] = Field(description="newest first")


class AckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    by: str = Field(default="api", max_length=200)
    comment: str = Field(default="", max_length=2000)


class AckResponse(BaseModel):
    dedup_key: str
    acknowledged: Ack
    outbox_rows: int = Field(description="acknowledge events queued to hooks that take them")


class SilenceRequest(BaseModel):
    """A silence: ``matchers`` (rule, severity, dedup_key, group_kind, group_id, entity_id or
    any label) all must match; it lasts until ``ends_at`` or for ``duration_s`` from
    ``starts_at`` (default now); give exactly one of the two."""

    model_config = ConfigDict(extra="forbid")

    matchers: dict[str, str] = Field(min_length=1)
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    duration_s: float | None = Field(default=None, gt=0, le=366 * 86400)
    created_by: str = Field(min_length=1, max_length=200)
    comment: str = Field(default="", max_length=2000)

    @model_validator(mode="after")
    def _one_end(self) -> SilenceRequest:
        if (self.ends_at is None) == (self.duration_s is None):
            raise ValueError("give exactly one of ends_at and duration_s")
        for k, v in self.matchers.items():
            if not k or not v:
                raise ValueError("matcher names and values must be non-empty")
        return self


class SilenceOut(BaseModel):
    id: str
    matchers: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    active: bool


class SilencesResponse(BaseModel):
    silences: list[SilenceOut] = Field(description="the newest `limit`, oldest first")
    total: int = Field(description="every silence that matched")


# ---- status ----------------------------------------------------------------------------------


class StatusResponse(BaseModel):
    """`dctwin status --json`, plus the running service's counters."""

    model_config = ConfigDict(extra="allow")

    db: str
    shard: str | None = Field(
        default=None, description="the shard whose store this is (`dctwin serve --shard`)"
    )
    samples: dict[str, int]
    readings: dict[str, int]
    time_range: dict[str, str] | None
    time_range_by_kind: dict[str, dict[str, str]]
    messages: int
    sources: int
    seq_gaps: int
    dead_letters: dict[str, int]
    unknown_ids: list[dict[str, Any]] = Field(description="the first `limit` unknown ids")
    unknown_ids_total: int = Field(description="every unknown id in the store")
    service: dict[str, Any] = Field(
        default_factory=dict, description="ingest counters and scheduler runs of this service"
    )
