"""One detection pass: headroom, hot spots, pumps and fleets, turned into alert observations.

:func:`detect` computes what the twin knows about its limits from the store (headroom through
the calibrated chain, hot spots, running pumps, underused fleets) and :func:`observations`
turns it into the :class:`twin.alerts.Observation` list the alert engine evaluates. The metric
names are the constants of :mod:`twin.alerts.metrics` (the registry rule files are checked
against):

=========================================  ======  ==============================================
metric                                      entity  value
=========================================  ======  ==============================================
``headroom.gpu.k_to_slowdown``              gpu     K from the max operating temperature, now
``headroom.gpu.time_to_breach_p90_s``       gpu     s until the p90 path reaches it (*)
``headroom.pdu_phase.time_to_breach_p50_s`` phase   s until the p50 current reaches 80 % (*)
``headroom.pdu_phase.a_to_limit``           phase   A left to the derated limit, now
``headroom.rack.kw_to_limit``               rack    kW left on its feeds together, now
``headroom.rack.time_to_breach_p50_s``      rack    s until the p50 power reaches it (*)
``headroom.cdu.capacity_free_fraction``     cdu     share of the CDU's capacity free, now
``headroom.cdu.time_to_breach_p50_s``       cdu     s until the p50 heat reaches capacity (*)
``headroom.cdu.flow_lpm_to_limit``          cdu     L/min over the flow the heat needs, now
``headroom.cdu.flow_time_to_breach_p50_s``  cdu     s until the p50 heat needs more flow (*)
``headroom.loop.k_to_return_limit``         cdu     K from the return limit, now
``headroom.loop.time_to_breach_p50_s``      cdu     s until the p50 return reaches it (*)
``headroom.link.gbps_to_limit``             link    Gb/s left to capacity (busier direction)
``headroom.link.time_to_breach_p50_s``      link    s until the p50 traffic reaches it (*)
``hotspot.gpu.residual_sigma``              gpu     smallest minute residual over the model / σ
                                                   (labels measured_c, model_c, sigma_k)
``hotspot.gpu.over_limit_k``                gpu     K over the catalog limit (only when over)
``hotspot.rack.inlet_c``                    rack    inlet air °C (every rack with a reading)
``drift.gpu.r_k_per_w``                     gpu     R of the last 30 min over its fleet's median
                                                   - 1 (labels r_k_per_w, fleet_r_k_per_w)
``cooling.gpu.step_k``                      gpu     K the temperature fell below the model at
                                                   flat power (cooling changed, not the load)
``cdu.pumps_running``                       cdu     pumps not seen stopped (speed > 5 %) [#]_
``fleet.underused_gpus``                    fleet   GPUs to reclaim (flagged fleets only)
``fleet.drain_drop_fraction``               fleet   1 - activity of the last 15 min over its level
                                                   before (``twin.analysis.fleet_drain``; labels
                                                   level_now, level_before, basis, window)
=========================================  ======  ==============================================

(*) Every ``time_to_breach`` metric: without a breach inside the horizon the value is twice
the horizon, labelled ``beyond_horizon``, so a rule's ``clear_value`` above the horizon
resolves it; 0 when the limit is breached now.

.. [#] A pump without a speed reading in the last minute counts as running (label
   ``unknown``): a missing record is not a stopped pump. A CDU with no pump reading at all
   gives no observation.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel

from collectors.contract import sub_id
from twin.alerts import AlertEngine
from twin.alerts.metrics import (
    CDU_PUMPS_RUNNING,
    COOLING_GPU_STEP_K,
    DRIFT_GPU_R,
    FLEET_DRAIN_DROP,
    FLEET_UNDERUSED_GPUS,
    HEADROOM_CDU_FLOW_LPM_TO_LIMIT,
    HEADROOM_CDU_FLOW_TIME_TO_BREACH_P50_S,
    HEADROOM_CDU_FREE_FRACTION,
    HEADROOM_CDU_TIME_TO_BREACH_P50_S,
    HEADROOM_GPU_K_TO_SLOWDOWN,
    HEADROOM_GPU_TIME_TO_BREACH_P90_S,
    HEADROOM_LINK_GBPS_TO_LIMIT,
    HEADROOM_LINK_TIME_TO_BREACH_P50_S,
    HEADROOM_LOOP_K_TO_RETURN_LIMIT,
    HEADROOM_LOOP_TIME_TO_BREACH_P50_S,
    HEADROOM_PDU_PHASE_A_TO_LIMIT,
    HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S,
    HEADROOM_RACK_KW_TO_LIMIT,
    HEADROOM_RACK_TIME_TO_BREACH_P50_S,
    HOTSPOT_GPU_OVER_LIMIT_K,
    HOTSPOT_GPU_RESIDUAL_SIGMA,
    HOTSPOT_RACK_INLET_C,
)
from twin.alerts.model import Observation
from twin.analysis.coverage import NoTelemetry, missing_kinds, newest_sample
from twin.analysis.fleet_drain import fleet_drain_observations
from twin.analysis.fleets import FleetReport, span_text, underused_fleets
from twin.analysis.headroom import HeadroomReport, compute_headroom
from twin.analysis.hotspots import HotSpotReport, find_hotspots
from twin.chain import phase_table, pumps_running
from twin.forecast import ForecastCache
from twin.health import ServiceHealth
from twin.procs import lower_this_thread
from twin.site import Site
from twin.store import Store
from twin.store.reads import newest_values, save_headroom
from twin.store.windows import WindowReader

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The name this loop reports under in :class:`twin.health.ServiceHealth`.
LOOP = "detection"


class PumpState(BaseModel):
    cdu: str
    pumps: int
    running: int  # pumps seen turning
    stopped: list[str]  # pumps seen stopped
    unknown: list[str] = []  # pumps with no speed reading in the window


@dataclass
class Detection:
    """One pass's results. A stage that failed left an empty report (its ``problems`` say why)
    and its exception in ``failures``; ``missing`` holds the kinds without recent telemetry."""

    now: datetime
    headroom: HeadroomReport
    hotspots: HotSpotReport
    pumps: list[PumpState]
    fleets: FleetReport | None
    #: fleet drains (twin.analysis.fleet_drain): one dict per fleet with a judged drop
    drains: list[dict] = field(default_factory=list)
    #: kind -> "no <kind> telemetry in the last N s: <what is not computed>"
    missing: dict[str, str] = field(default_factory=dict)
    #: stage (headroom, hotspots, pumps, fleets, coverage) -> the exception it raised
    failures: dict[str, BaseException] = field(default_factory=dict)

    @property
    def errors(self) -> dict[str, str]:
        """stage -> ``"<exception type>: <message>"``."""
        return {k: _describe(e) for k, e in self.failures.items()}


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def pump_states(store: Store, site: Site, now: datetime, window_s: float = 60.0) -> list[PumpState]:
    """Pumps turning per CDU, from each pump's speed over the last ``window_s``."""
    start = now - timedelta(seconds=window_s)
    speed = newest_values(store, "cdu", "pump_speed_pct", start, now)
    out = []
    for c in site.cdus:
        seen = {p: speed[sid] for p in c.pumps if (sid := sub_id(c.name, p)) in speed}
        if not seen:
            continue  # no pump telemetry: say nothing rather than "0 running"
        stopped = [p for p, v in seen.items() if v is None or not pumps_running(v)]
        out.append(
            PumpState(
                cdu=c.name,
                pumps=len(c.pumps),
                running=len(seen) - len(stopped),
                stopped=stopped,
                unknown=[p for p in c.pumps if p not in seen],
            )
        )
    return out


def detect(
    store: Store,
    site: Site,
    *,
    now: datetime | None = None,
    horizon_s: float = 3600.0,
    fleets: bool = True,
    forecasts: ForecastCache | None = None,
) -> Detection:
    """Everything the alert engine is fed, computed once from the store.

    ``now`` defaults to the newest sample of any kind (a site may lack a kind, GPUs included).
    Each stage (headroom, hot spots, pumps, fleets) runs on whatever telemetry exists and is
    isolated from the others: one that raises leaves an empty result and its exception in
    :attr:`Detection.failures`, and the rest are still computed and evaluated. Raises
    :class:`NoTelemetry` only when the store holds no telemetry at all.
    """
    if now is None:
        now = newest_sample(store)
        if now is None:
            raise NoTelemetry("the store holds no telemetry yet: nothing to detect on")
    now = now.astimezone(UTC)
    failures: dict[str, BaseException] = {}

    def stage(name: str, run: Callable[[], T], empty: Callable[[str], T]) -> T:
        try:
            return run()
        except Exception as e:  # one stage failing must not take the others with it
            failures[name] = e
            return empty(f"{name} failed: {_describe(e)}")

    # one reader for the pass: headroom and hot spots share the windows both read
    windows = WindowReader(store)
    headroom = stage(
        "headroom",
        lambda: compute_headroom(
            store, site, now=now, horizon_s=horizon_s, windows=windows, forecasts=forecasts
        ),
        lambda why: HeadroomReport(
            computed_at=datetime.now(UTC),
            data_until=now,
            horizon_s=horizon_s,
            step_s=60.0,
            load_basis="",
            rows=[],
            problems=[why],
        ),
    )
    hot = stage(
        "hotspots",
        lambda: find_hotspots(store, site, now=now, windows=windows),
        lambda why: HotSpotReport(
            computed_at=datetime.now(UTC),
            data_until=now,
            k_sigma=3.0,
            minutes=5,
            hotspots=[],
            residual_sigma={},
            rack_inlet_c={},
            problems=[why],
        ),
    )
    pumps = stage("pumps", lambda: pump_states(store, site, now), lambda why: [])
    fleet_report = (
        stage("fleets", lambda: underused_fleets(store, site, now=now), lambda why: None)
        if fleets and site.fleets
        else None
    )
    drains = (
        stage("drain", lambda: fleet_drain_observations(store, site, now), lambda why: [])
        if fleets and site.fleets
        else []
    )
    missing = stage("coverage", lambda: missing_kinds(store, site, now), lambda why: {})
    return Detection(
        now=now,
        headroom=headroom,
        hotspots=hot,
        pumps=pumps,
        fleets=fleet_report,
        drains=drains,
        missing=missing,
        failures=failures,
    )


def _observer(out: list[Observation], ts: datetime) -> Callable[..., None]:
    """``obs(metric, kind, id, value, excess=None, **labels)``: append that observation at
    ``ts`` to ``out`` (``excess``: the K a residual or drift value stands for)."""

    def obs(
        metric: str, kind: str, sid: str, value: float, excess: float | None = None, **labels: str
    ) -> None:
        out.append(
            Observation(
                metric=metric,
                entity_kind=kind,  # type: ignore[arg-type]
                entity_id=sid,
                value=value,
                excess=excess,
                ts=ts,
                labels=labels,
            )
        )

    return obs


def observations(d: Detection) -> list[Observation]:
    """The alert engine's input for one detection pass (see the table in the module doc)."""
    ts = d.now
    out: list[Observation] = []
    obs = _observer(out, ts)

    beyond = 2.0 * d.headroom.horizon_s
    hs = d.hotspots
    # model-based metrics (MODEL_METRICS) only from a fit on this site's telemetry, and only
    # for GPUs whose fit was usable: a seeded or catalog model serves headroom, never a page
    armed = hs.model_run is not None

    def breach(metric: str, kind: str, sid: str, b: float | None, **labels: str) -> None:
        """A time-to-breach observation: twice the horizon, labelled, when none is forecast."""
        if b is None:
            labels["beyond_horizon"] = "true"
        obs(metric, kind, sid, beyond if b is None else b, **labels)

    for r in d.headroom.rows:
        if r.headroom_now is None:
            continue
        if r.kind == "gpu":
            obs(
                HEADROOM_GPU_K_TO_SLOWDOWN,
                "gpu",
                r.id,
                r.headroom_now,
                limit_c=f"{r.limit:g}",
                temp_c=f"{r.value_now:.1f}" if r.value_now is not None else "not reported",
            )
            if armed and r.id not in hs.not_judged and r.basis.endswith("calibrated"):
                breach(HEADROOM_GPU_TIME_TO_BREACH_P90_S, "gpu", r.id, r.breach_in_s_p90)
        elif r.kind == "pdu_phase":
            obs(HEADROOM_PDU_PHASE_A_TO_LIMIT, "pdu_phase", r.id, r.headroom_now)
            breach(
                HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S,
                "pdu_phase",
                r.id,
                r.breach_in_s_p50,
                limit_a=f"{r.limit:g}",
                current_a=f"{r.value_now:.1f}",
            )
        elif r.kind == "rack":
            obs(HEADROOM_RACK_KW_TO_LIMIT, "rack", r.id, r.headroom_now)
            breach(HEADROOM_RACK_TIME_TO_BREACH_P50_S, "rack", r.id, r.breach_in_s_p50)
        elif r.kind == "cdu" and r.quantity == "heat_kw" and r.limit > 0:
            obs(
                HEADROOM_CDU_FREE_FRACTION,
                "cdu",
                r.id,
                r.headroom_now / r.limit,
                free_kw=f"{r.headroom_now:.1f}",
            )
            breach(HEADROOM_CDU_TIME_TO_BREACH_P50_S, "cdu", r.id, r.breach_in_s_p50)
        elif r.kind == "cdu" and r.quantity == "flow_lpm":
            obs(HEADROOM_CDU_FLOW_LPM_TO_LIMIT, "cdu", r.id, r.headroom_now)
            breach(HEADROOM_CDU_FLOW_TIME_TO_BREACH_P50_S, "cdu", r.id, r.breach_in_s_p50)
        elif r.kind == "loop":
            obs(HEADROOM_LOOP_K_TO_RETURN_LIMIT, "cdu", r.id, r.headroom_now)
            breach(HEADROOM_LOOP_TIME_TO_BREACH_P50_S, "cdu", r.id, r.breach_in_s_p50)
        elif r.kind == "link":
            obs(HEADROOM_LINK_GBPS_TO_LIMIT, "link", r.id, r.headroom_now)
            breach(HEADROOM_LINK_TIME_TO_BREACH_P50_S, "link", r.id, r.breach_in_s_p50)
    for gid, z in hs.residual_sigma.items() if armed else ():
        obs(
            HOTSPOT_GPU_RESIDUAL_SIGMA,
            "gpu",
            gid,
            z,
            excess=hs.excess_k[gid],
            excess_k=f"{hs.excess_k[gid]:.1f}",
            sigma_k=f"{hs.sigma_k[gid]:.2f}",
            measured_c=f"{hs.measured_c[gid]:.1f}",
            model_c=f"{hs.model_c[gid]:.1f}",
        )
    for gid, v in hs.r_drift.items() if armed else ():
        obs(
            DRIFT_GPU_R,
            "gpu",
            gid,
            v,
            excess=hs.r_excess_k[gid],  # K: what a drift rule's min_excess_k is checked on
            r_k_per_w=f"{hs.r_k_per_w[gid]:.4f}",
            fleet_r_k_per_w=f"{hs.fleet_r_k_per_w[gid]:.4f}",
            excess_k=f"{hs.r_excess_k[gid]:.1f}",
        )
    for h in d.hotspots.hotspots:
        if h.reason == "over_limit":
            obs(HOTSPOT_GPU_OVER_LIMIT_K, "gpu", h.id, h.excess, detail=h.detail)
        elif h.reason == "cooling_changed":
            at = h.at.isoformat() if h.at else ""
            obs(COOLING_GPU_STEP_K, "gpu", h.id, h.excess, detail=h.detail, at=at)
    for rack, value in d.hotspots.rack_inlet_c.items():
        obs(HOTSPOT_RACK_INLET_C, "rack", rack, value)
    _pump_observations(obs, d.pumps)
    if d.fleets is not None:
        for f in d.fleets.fleets:
            if f.flagged and f.gpus_to_reclaim:
                obs(
                    FLEET_UNDERUSED_GPUS,
                    "fleet",
                    f.fleet,
                    float(f.gpus_to_reclaim),
                    kw_freed=f"{f.kw_freed or 0:.1f}",
                    reason=f.reason,
                    covered_s=f"{f.covered_s:.0f}",
                    covered=span_text(f.covered_s),
                )
    for dr in d.drains:
        obs(FLEET_DRAIN_DROP, "fleet", dr["fleet"], dr["drop"], **dr["labels"])
    return out


#: The metrics the breached-now pass owns (:func:`now_observations`): each a limit crossed in
#: the newest sample, so a step fault pages within seconds of the sample that shows it, not
#: after the minute pass. With the pass on, the full pass takes these from it too (one
#: figure, one implementation).
NOW_METRICS = frozenset(
    {HEADROOM_GPU_K_TO_SLOWDOWN, HEADROOM_PDU_PHASE_A_TO_LIMIT, CDU_PUMPS_RUNNING}
)
#: How far back the breached-now pass looks for a device's newest sample: a poller every 10 s
#: and one late sample. [s]
NOW_WINDOW_S = 30.0


def now_observations(
    store: Store, site: Site, now: datetime, window_s: float = NOW_WINDOW_S
) -> list[Observation]:
    """The breached-now metrics from each device's newest sample in the last ``window_s``:
    K from each GPU's max operating temperature (catalog), A left to each PDU line's or
    breaker's derated limit, and running pumps per CDU. A device without a sample in the
    window gives no observation (a missing reading is not a breach, nor a clear)."""
    start = now - timedelta(seconds=window_s)
    out: list[Observation] = []
    obs = _observer(out, now)

    temp = store.latest_readings("gpu", "temp_c", start, now)
    if temp:
        for nd in site.nodes:
            limit = nd.gpu_spec.max_operating_temp_c
            for gid in nd.gpu_ids():
                t = temp.get(gid)
                if t is not None:
                    obs(
                        HEADROOM_GPU_K_TO_SLOWDOWN,
                        "gpu",
                        gid,
                        limit - t,
                        limit_c=f"{limit:g}",
                        temp_c=f"{t:.1f}",
                    )
    current = store.latest_readings("pdu", "current_a", start, now)
    if current:
        table = phase_table(site)
        for pid, limit in zip(table.ids, table.limit_a, strict=True):
            a = current.get(pid)
            if a is not None:
                obs(
                    HEADROOM_PDU_PHASE_A_TO_LIMIT,
                    "pdu_phase",
                    pid,
                    float(limit) - a,
                    limit_a=f"{limit:g}",
                    current_a=f"{a:.1f}",
                )
    _pump_observations(obs, pump_states(store, site, now, window_s))
    return out


def _pump_observations(obs: Callable[..., None], pumps: list[PumpState]) -> None:
    """``cdu.pumps_running`` per CDU; a pump without a reading is not claimed stopped: only a
    pump seen stopped counts."""
    for p in pumps:
        extra = {"unknown": ",".join(p.unknown)} if p.unknown else {}
        obs(
            CDU_PUMPS_RUNNING,
            "cdu",
            p.cdu,
            float(p.running + len(p.unknown)),
            pumps=str(p.pumps),
            stopped=",".join(p.stopped),
            **extra,
        )


def only_owned(d: Detection, owns: Callable[[str, str], bool]) -> Detection:
    """``d`` with the headroom rows, hot spots and pumps of what ``owns`` says is this shard's
    (a shard computes the racks it reads for its spanning CDUs and PDUs, but reports its own)."""
    hr = d.headroom.model_copy(update={"rows": [r for r in d.headroom.rows if owns(r.kind, r.id)]})
    hot = d.hotspots.model_copy(
        update={"hotspots": [h for h in d.hotspots.hotspots if owns(h.kind, h.id)]}
    )
    pumps = [p for p in d.pumps if owns("cdu", p.cdu)]
    return dataclasses.replace(d, headroom=hr, hotspots=hot, pumps=pumps)


class DetectionScheduler:
    """Inside `dctwin serve`: every ``interval_s``, detect, store the headroom, and hand the
    observations to the alert engine (whose outbox a :class:`twin.alerts.Delivery` drains).

    With ``health``, each pass reports ``ok("detection")`` or ``error("detection", "<stage>:
    <exception type>: <message>; ...")`` naming every stage that failed (the others still ran
    and the rules were evaluated on what they computed), and ``set_missing(kind, ...)`` for
    each kind without recent telemetry, cleared when it returns. A failure is logged with its
    traceback once per distinct error, not on every pass."""

    def __init__(
        self,
        store: Store,
        site: Site,
        *,
        interval_s: float = 60.0,
        fast_every_s: float = 0.0,
        horizon_s: float = 3600.0,
        engine: AlertEngine | None = None,
        health: ServiceHealth | None = None,
        owns: Callable[[str, str], bool] | None = None,
        nice: int = 0,
    ):
        self.store = store.cursor()
        #: how much lower than the process the loop's thread runs (Linux)
        self.nice = nice
        self.site = site
        #: a shard's (entity kind, id) -> whether it reports it (twin.site.shards); None: all
        self.owns = owns
        self.interval_s = interval_s
        #: the breached-now pass's cadence (0: none; the full pass evaluates those metrics)
        self.fast_every_s = fast_every_s if engine is not None else 0.0
        self.fast_runs = 0
        self.horizon_s = horizon_s
        self.engine = engine
        self.health = health
        self.runs = 0
        self.failures = 0
        self.last: Detection | None = None
        #: the headroom's load forecast, made once per forecast step (5 min) on its own
        #: thread: no pass waits for it
        self.forecasts = ForecastCache(background=True, nice=nice)
        #: the error text of the last pass ("" when it succeeded): what was logged last
        self.last_error = ""
        self._missing: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dctwin-detect", daemon=True)
        if health is not None:
            health.register(LOOP)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.forecasts.close()  # its connection is a cursor of this one's
        self.store.close()

    def run_once(self) -> Detection | None:
        """One pass; None when the store holds no telemetry yet."""
        try:
            d = detect(self.store, self.site, horizon_s=self.horizon_s, forecasts=self.forecasts)
        except NoTelemetry as e:
            log.info("detection skipped: %s", e)
            self._report_missing(missing_kinds(self.store, self.site, datetime.now(UTC)))
            self._report({})
            return None
        if self.owns is not None:
            d = only_owned(d, self.owns)
        failures = dict(d.failures)
        if "headroom" not in failures:  # a failed stage keeps the last good report stored
            try:
                save_headroom(self.store, d.headroom)
            except Exception as e:
                failures["store headroom"] = e
        if self.engine is not None:
            try:
                obs = observations(d)
                if self.fast_every_s > 0:  # the breached-now figures, as the fast pass has them
                    obs = [o for o in obs if o.metric not in NOW_METRICS]
                    obs += now_observations(self.store, self.site, d.now)
                self._evaluate(obs, d.now)
            except Exception as e:
                failures["alerts"] = e
        if "coverage" not in failures:
            self._report_missing(d.missing)
        self.runs += 1
        self.last = d
        self._report(failures)
        return d

    def _evaluate(self, obs: list[Observation], now: datetime) -> None:
        assert self.engine is not None
        if self.owns is not None:
            obs = [o for o in obs if self.owns(o.entity_kind, o.entity_id)]
        for n in self.engine.evaluate(obs, now=now):
            log.warning("alert %s %s: %s", n.status, n.dedup_key, n.summary)

    def run_fast_once(self) -> int:
        """The breached-now pass (:func:`now_observations`) on the newest samples, evaluated;
        returns the observations judged (0: no telemetry yet, or no engine)."""
        if self.engine is None:
            return 0
        now = newest_sample(self.store)
        if now is None:
            return 0
        obs = now_observations(self.store, self.site, now.astimezone(UTC))
        self._evaluate(obs, now.astimezone(UTC))
        self.fast_runs += 1
        return len(obs)

    def _report_missing(self, missing: dict[str, str]) -> None:
        for kind in sorted(self._missing - missing.keys()):
            log.info("detection: %s telemetry is back", kind)
            if self.health is not None:
                self.health.set_missing(kind, None)
        for kind, what in sorted(missing.items()):
            if kind not in self._missing:
                log.warning("detection: %s", what)
            if self.health is not None:
                self.health.set_missing(kind, what)
        self._missing = set(missing)

    def _report(self, failures: dict[str, BaseException]) -> None:
        """Health and log for one pass: each distinct error is logged once, with traceback."""
        if not failures:
            if self.last_error:
                log.info("detection recovered (was failing: %s)", self.last_error)
            self.last_error = ""
            if self.health is not None:
                self.health.ok(LOOP)
            return
        self.failures += 1
        text = "; ".join(f"{stage}: {_describe(e)}" for stage, e in failures.items())
        if text != self.last_error:
            for stage, e in failures.items():
                log.error(
                    "detection stage %s failed; the other stages ran, and this one is retried"
                    " next pass: %s",
                    stage,
                    _describe(e),
                    exc_info=e,
                )
        self.last_error = text
        if self.health is not None:
            self.health.error(LOOP, text)

    def _loop(self) -> None:
        """The full pass every ``interval_s``; between them, the breached-now pass every
        ``fast_every_s`` (a failing fast pass is logged once and retried; the full pass goes
        on)."""
        lower_this_thread(self.nice)
        tick = self.fast_every_s if 0 < self.fast_every_s < self.interval_s else self.interval_s
        next_full = time.monotonic() + self.interval_s
        fast_error = ""
        while not self._stop.wait(max(0.0, min(tick, next_full - time.monotonic()))):
            if time.monotonic() >= next_full - 1e-3:
                next_full = time.monotonic() + self.interval_s
                try:
                    self.run_once()
                except Exception as e:  # never take the service down
                    self._report({"pass": e})
                continue
            try:
                self.run_fast_once()
                fast_error = ""
            except Exception as e:
                text = _describe(e)
                if text != fast_error:
                    log.error("breached-now pass failed; retried in %g s: %s", tick, text)
                fast_error = text
