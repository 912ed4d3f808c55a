"""Headroom, hot spots and alerts on the simulator's injected faults, end to end.

Two healthy hours of the small site are simulated, ingested and calibrated once; each test
copies that store and that simulation (``copy.deepcopy`` after its 7,200 ticks), gives the copy
its fault starting at the 2-hour mark (``SiteSimulator.add_faults``), ingests minute by minute,
and runs the twin's detection after every minute, as `dctwin serve` does.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from twin.alerts import AlertEngine, Outbox, Topology, load_rules
from twin.alerts.metrics import HEADROOM_GPU_TIME_TO_BREACH_P90_S
from twin.analysis.detect import detect, observations
from twin.analysis.headroom import compute_headroom
from twin.analysis.hotspots import find_hotspots
from twin.calibrate.calibrate import calibrate, save_run
from twin.ingest import Ingester, IngestLimits
from twin.simulator import SiteSimulator, parse_fault
from twin.site import Site, load_site
from twin.store import Store
from twin.store.reads import latest_headroom_rows, save_headroom

from .helpers import REPO, SMALL_SITE, Recorder, check_schemas, hooks_for

SEED = 21
BASE_S = 7200
START = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)  # a Monday morning, 2 h before the faults
#: A GPU of the small site's inference rack (its load varies; the training rack's is flat),
#: and a time when that rack's load is 10 % under its last hour's 90th percentile.
INFERENCE_GPU = "inf-r02-n1:0"
P90_AT = START + timedelta(seconds=BASE_S - 8 * 60)


@pytest.fixture(scope="module")
def site() -> Site:
    return load_site(SMALL_SITE)


@dataclass(frozen=True)
class Base:
    db: Path  # two healthy hours, ingested and calibrated
    sim: SiteSimulator  # the simulation that wrote them, 7,200 ticks in


@pytest.fixture(scope="module")
def base(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Base:
    """Two healthy hours, simulated once, ingested and calibrated."""
    db = tmp_path_factory.mktemp("detect") / "base.duckdb"
    sim = SiteSimulator(site, seed=SEED, start=START)
    with Store(db) as store:
        ing = Ingester(store, site, IngestLimits(max_past_s=0))
        batch: list[tuple[str, bytes]] = []
        for _ in range(BASE_S):
            batch.extend(sim.step())
        ing.ingest(batch)
        save_run(store, calibrate(store, site, window_s=BASE_S, holdout_s=1200.0))
    return Base(db, sim)


@pytest.fixture(scope="module")
def base_db(base: Base) -> Path:
    return base.db


class Replay:
    """The base store, and a copy of the base simulation given faults, a minute at a time."""

    def __init__(self, site: Site, base: Base, tmp: Path, faults: list[str]):
        self.db = tmp / "replay.duckdb"
        shutil.copy(base.db, self.db)
        self.store = Store(self.db)
        self.site = site
        # the same first two hours, neither simulated nor ingested again
        self.sim = copy.deepcopy(base.sim)
        self.sim.add_faults([parse_fault(f) for f in faults])
        self.ingester = Ingester(self.store, site, IngestLimits(max_past_s=0))
        self.samples: list[tuple[str, bytes]] = []

    def minute(self) -> list[tuple[str, bytes]]:
        batch: list[tuple[str, bytes]] = []
        for _ in range(60):
            batch.extend(self.sim.step())
        self.ingester.ingest(batch)
        return batch

    @property
    def minutes_in(self) -> float:
        return (self.sim.elapsed_s - BASE_S) / 60.0


@pytest.fixture
def replay(site: Site, base: Base, tmp_path: Path) -> Iterator[object]:
    made: list[Replay] = []

    def make(*faults: str) -> Replay:
        r = Replay(site, base, tmp_path, list(faults))
        made.append(r)
        return r

    yield make
    for r in made:
        r.store.close()


def _gpu_temp(batch: list[tuple[str, bytes]], gid: str) -> list[float]:
    out = []
    for topic, payload in batch:
        if "/gpu/" in topic:
            for s in json.loads(payload)["samples"]:
                if s["id"] == gid:
                    out.append(s["temp_c"])
    return out


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_degrading_cold_plate_is_a_hot_spot_before_slowdown(site: Site, replay) -> None:
    gpu = "trn-r01-n1:3"
    r = replay(f"cold_plate_decay:{gpu}@2h+1h")
    limit = site.nodes[0].gpu_spec.max_operating_temp_c
    flagged_at = reached_at = None
    false_alarms: set[str] = set()
    for _ in range(45):
        batch = r.minute()
        if reached_at is None and max(_gpu_temp(batch, gpu)) >= limit - 0.5:
            reached_at = r.minutes_in
        report = find_hotspots(r.store, site)
        above = {h.id for h in report.hotspots if h.reason == "above_model"}
        if gpu in above and flagged_at is None:
            flagged_at = r.minutes_in
            spot = next(h for h in report.hotspots if h.id == gpu)
            assert spot.excess > 0 and spot.residual_sigma >= 3.0
            assert limit - spot.value > 10.0  # flagged while still far from slowdown
        false_alarms |= above - {gpu}
    print(f"cold plate: flagged at {flagged_at} min, 87 °C reached at {reached_at} min")
    assert flagged_at is not None and reached_at is not None
    assert flagged_at < reached_at - 10, (flagged_at, reached_at)
    assert not false_alarms


def _refit(store: Store, gid: str, *, mae: float | None = None, refused: bool = False) -> int:
    """Save the newest fit again as a new fit run with GPU ``gid``'s held-out error set to
    ``mae`` (a refit whose held-out minutes caught a fault) or its fit refused."""
    run = store.latest_fit_run_id()
    rows = store.calibration_param_rows(run)
    quality = store.calibration_quality(run)
    if refused:
        rows = [
            {**r, "value": None, "usable": False, "reason": "R not identifiable (test)"}
            if (r["kind"], r["id"]) == ("gpu", gid)
            else r
            for r in rows
        ]
        quality = [q for q in quality if (q["kind"], q["id"]) != ("gpu", gid)]
    if mae is not None:
        quality = [
            {**q, "mae": mae} if (q["kind"], q["id"]) == ("gpu", gid) else q for q in quality
        ]
    meta = next(x for x in store.calibration_runs() if x["run_id"] == run)
    meta = {k: v for k, v in meta.items() if k != "run_id"}
    return store.save_calibration_run(meta, rows, quality, [])


@pytest.mark.slow  # the module's two simulated hours
def test_refits_over_a_fault_do_not_clear_its_hot_spot(site: Site, replay) -> None:
    """bench_alerts seed 0 day 3 (trn-a05-n3:5): a step on a cold plate was paged by its
    residual; the hourly refit whose held-out minutes caught the step published a 6 K error
    (sigma 7.8 K: the page cleared), and the next refit was refused (the GPU was no longer
    judged), so the fault paged twice more. The residual's sigma is never above the GPU's
    own history's, and a GPU whose newest fit is refused is judged by its last usable one."""
    from twin.alerts import load_rules
    from twin.api.queries import model_rule_status

    gpu = "trn-r01-n1:3"
    r = replay(f"cold_plate:{gpu}@2h+1h=2.0")
    for _ in range(12):
        r.minute()
    before = find_hotspots(r.store, site)
    assert gpu in {h.id for h in before.hotspots if h.reason == "above_model"}
    sigma = before.sigma_k[gpu]
    for _ in range(2):  # the hourly refits before the fault
        _refit(r.store, gpu)
    _refit(r.store, gpu, mae=6.0)  # the held-out minutes caught the step
    report = find_hotspots(r.store, site)
    assert report.sigma_k[gpu] == pytest.approx(sigma)  # the history's, not 7.5 K
    assert gpu in {h.id for h in report.hotspots if h.reason == "above_model"}
    first = r.store.latest_fit_run_id()
    refused = _refit(r.store, gpu, refused=True)
    report = find_hotspots(r.store, site)
    assert report.model_run == refused and gpu not in report.not_judged
    assert gpu in {h.id for h in report.hotspots if h.reason == "above_model"}
    assert f"1 GPU(s) judged by their newest usable fit (runs {first})" in report.model_note
    rules = load_rules(Path(__file__).resolve().parents[1] / "deploy" / "alert_rules.yaml")
    status = model_rule_status(r.store, rules)
    assert status is not None and status["gpus_judged_by_earlier_fit"] == 1
    assert status["gpus_not_judged"] == 0
    # what the note says of the temperature forecast holds: it forecasts with the newest
    # run's parameters, so it skips the GPU that run refused, and judges the others
    assert "the GPU temperature forecast skips them" in status["note"]
    forecasts = {
        o.entity_id
        for o in observations(detect(r.store, site))
        if o.metric == HEADROOM_GPU_TIME_TO_BREACH_P90_S
    }
    assert forecasts and gpu not in forecasts


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_cdu_losing_its_pumps_pages_once_mutes_its_gpus_and_resolves(
    site: Site, replay, tmp_path: Path
) -> None:
    recs = {s: Recorder(s) for s in ("webhook", "slack", "pagerduty", "alertmanager")}
    for rec in recs.values():
        rec.start()
    try:
        r = replay("pump_failure:cdu-1/pump1@125m+10m", "pump_failure:cdu-1/pump2@125m+10m")
        outbox = Outbox(r.store, hooks_for(recs))
        engine = AlertEngine(
            load_rules(REPO / "deploy" / "alert_rules.yaml"),
            Topology.from_site(site),
            outbox,
            clock=lambda: datetime.now(UTC),
        )
        gpu_hot = 0
        pumps_seen: list[float] = []
        for _ in range(30):
            r.minute()
            d = detect(r.store, site)
            obs = observations(d)
            pumps_seen += [o.value for o in obs if o.metric == "cdu.pumps_running"]
            gpu_hot += sum(o.value <= 5.0 for o in obs if o.metric == "headroom.gpu.k_to_slowdown")
            engine.evaluate(obs, now=d.now)
            outbox.deliver(d.now)
        check_schemas(recs)
        assert min(pumps_seen) == 0 and pumps_seen[-1] == 2
        assert gpu_hot > 0  # the GPUs did heat up to their limit: there was something to mute
        key = "dctwin/small/cdu_pump_lost/cdu/cdu-1"
        web = recs["webhook"].accepted()
        assert [(b["event"], b["dedup_key"]) for b in web] == [("firing", key), ("resolved", key)]
        page = web[0]["notification"]
        assert page["group"] == {"kind": "cdu", "id": "cdu-1"} and "r01" in page["description"]
        pd = [(b["event_action"], b["dedup_key"]) for b in recs["pagerduty"].accepted()]
        assert pd == [("trigger", key), ("resolve", key)]
        every = json.dumps([q.body for rec in recs.values() for q in rec.requests])
        assert "gpu_temp_high" not in every and "gpu_hotspot_residual" not in every
    finally:
        for rec in recs.values():
            rec.stop()


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_creeping_phase_is_forecast_to_breach_before_it_does(site: Site, replay) -> None:
    phase = "pdu-r01-a/L1"
    r = replay(f"phase_creep:{phase}@2h+1h")
    limit = 0.8 * 32
    forecasts: list[tuple[float, float]] = []  # (minute, predicted breach minute)
    breached_at = None
    for _ in range(60):
        batch = r.minute()
        for topic, payload in batch:
            if topic.endswith("/pdu-r01-a"):
                for s in json.loads(payload)["samples"]:
                    if s["id"] == phase and s["current_a"] >= limit and breached_at is None:
                        breached_at = r.minutes_in
        if breached_at is None:
            rep = compute_headroom(r.store, site)
            row = next(x for x in rep.rows if x.kind == "pdu_phase" and x.id == phase)
            assert row.limit == pytest.approx(limit)
            if row.breach_in_s_p50 is not None:
                forecasts.append((r.minutes_in, r.minutes_in + row.breach_in_s_p50 / 60.0))
    assert breached_at is not None
    early = [(m, p) for m, p in forecasts if m <= breached_at - 15]
    assert early, forecasts  # a time to breach was given at least 15 min ahead
    for m, p in early[-5:]:  # and the latest ones point at the real breach within 5 min
        assert abs(p - breached_at) <= 5.0, (m, p, breached_at)
    # the other phases of the rack see no breach coming
    rows = {x.id: x for x in compute_headroom(r.store, site).rows if x.kind == "pdu_phase"}
    assert rows["pdu-r01-a/L2"].breach_in_s_p50 is None
    assert rows["pdu-r01-b/L1"].breach_in_s_p50 is None


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_headroom_is_stored_and_covers_every_limit(site: Site, base_db: Path, tmp_path) -> None:
    db = tmp_path / "h.duckdb"
    shutil.copy(base_db, db)
    with Store(db) as store:
        report = compute_headroom(store, site)
        # two hours: too little for a forecast, and the basis says so
        assert report.load_basis == (
            "persistence (less than 24 h of node power history for a forecast)"
        )
        assert {r.basis for r in report.rows if r.kind == "rack"} == {report.load_basis}
        kinds = {(x.kind, x.quantity) for x in report.rows}
        assert kinds == {
            ("gpu", "temp_c"),
            ("pdu_phase", "current_a"),
            ("rack", "power_kw"),
            ("cdu", "heat_kw"),
            ("cdu", "flow_lpm"),
            ("loop", "return_temp_c"),
            ("link", "traffic_gbps"),
        }
        gpus = [x for x in report.rows if x.kind == "gpu"]
        assert len(gpus) == 24 and all("calibrated" in x.basis for x in gpus)
        for x in report.rows:  # healthy site: room everywhere, no breach within the hour
            assert x.headroom_now > 0, x
            assert x.breach_in_s_p50 is None, x
            assert x.headroom_min_p90 <= x.headroom_min_p50 + 1e-9, x
        # rack limit = its two feeds' 80 % together
        rack = next(x for x in report.rows if x.kind == "rack" and x.id == "r01")
        assert rack.limit == pytest.approx(2 * 3**0.5 * 415 * 0.8 * 32 / 1000, rel=0.03)
        n = save_headroom(store, report)
        stored = latest_headroom_rows(store)
        assert n == len(stored) == len(report.rows)


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_every_observation_is_a_registered_metric(site: Site, base_db: Path, tmp_path) -> None:
    from twin.alerts.metrics import METRICS, metric_problem

    db = tmp_path / "o.duckdb"
    shutil.copy(base_db, db)
    with Store(db) as store:
        obs = observations(detect(store, site))
    seen = {(o.metric, o.entity_kind) for o in obs}
    assert all(metric_problem(m, k) is None for m, k in seen), seen
    # a healthy site: every headroom metric, the pumps and the hot-spot residuals are reported
    assert {m for m, _ in seen} >= {m for m in METRICS if m.startswith("headroom.")} | {
        "cdu.pumps_running",
        "hotspot.gpu.residual_sigma",
    }


@pytest.mark.slow  # 2 simulated hours at 1 Hz (module fixture): out of the fast tier
def test_headroom_command_prints_json(base_db: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from twin.cli import app

    db = tmp_path / "c.duckdb"
    shutil.copy(base_db, db)
    res = CliRunner().invoke(
        app, ["headroom", "--db", str(db), "--site", str(SMALL_SITE), "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["load_basis"].startswith("persistence (less than 24 h of node power history")
    assert any(r["kind"] == "cdu" for r in out["rows"])
    n = len(out["rows"])
    args = ["headroom", "--db", str(db), "--site", str(SMALL_SITE)]
    # piped (CliRunner is not a terminal): every row as TSV with a header, worst first
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    head = lines[0].split("\t")
    assert head[:5] == ["kind", "id", "rack", "cdu", "quantity"] and "used_pct" in head
    assert len(lines) == n + 1 and all(len(ln.split("\t")) == len(head) for ln in lines)
    rows = [dict(zip(head, ln.split("\t"), strict=True)) for ln in lines[1:]]
    rank = {"red": 0, "amber": 1, "neutral": 2, "": 3}
    keys = [
        (rank[r["band"]], r["unit"], float(r["headroom_now"]))
        for r in rows
        if r["breach_in_s_p90"] == "" and r["headroom_now"] != ""
    ]
    assert keys == sorted(keys)
    # a terminal table: at most --limit rows, and it says how many it left out
    env = {"COLUMNS": "160", "LINES": "30"}
    res = CliRunner().invoke(app, [*args, "--format", "table", "--limit", "5"], env=env)
    assert res.exit_code == 0, res.output
    assert f"{n - 5:,} more limits hidden (5 of {n:,} shown)" in res.stdout
    res = CliRunner().invoke(app, [*args, "--format", "table"], env=env)  # what fits 30 lines
    assert f"(22 of {n:,} shown)" in res.stdout
    res = CliRunner().invoke(app, [*args, "--format", "json", "--limit", "3"])
    assert len(json.loads(res.stdout)) == 3
    res = CliRunner().invoke(
        app, ["hotspots", "--db", str(db), "--site", str(SMALL_SITE), "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["hotspots"] == []
    res = CliRunner().invoke(
        app, ["headroom", "--db", str(tmp_path / "none.duckdb"), "--site", str(SMALL_SITE)]
    )
    assert res.exit_code != 0 and "none.duckdb" in res.output


def test_a_fit_above_the_gpus_fit_history_is_capped_by_it() -> None:
    from twin.chain.params import history_capped_r

    fit = np.array([0.05, 0.05, np.nan, 0.05])
    hist = np.array([0.02, 0.08, 0.02, np.nan])
    # capped where the history is lower; a refused fit is not replaced by the history alone
    np.testing.assert_array_equal(history_capped_r(fit, hist), [0.02, 0.05, np.nan, 0.05])


def _with_gpu_r(store: Store, factor: float, gpu: str | None = None) -> tuple[str, list[dict]]:
    """Save the newest fit again with one GPU's R (``gpu``, default the first fitted)
    multiplied by ``factor`` (as a new fit run); the GPU's id and the fit's rows."""
    run = store.latest_fit_run_id()
    rows = store.calibration_param_rows(run)
    fitted = [r["id"] for r in rows if r["kind"] == "gpu" and r["param"] == "r_k_per_w"]
    gid = gpu if gpu is not None else fitted[0]
    assert gid in fitted, gid
    changed = [
        {**r, "value": r["value"] * factor}
        if (r["kind"], r["id"], r["param"]) == ("gpu", gid, "r_k_per_w")
        else r
        for r in rows
    ]
    meta = next(x for x in store.calibration_runs() if x["run_id"] == run)
    meta = {k: v for k, v in meta.items() if k != "run_id"}
    store.save_calibration_run(meta, changed, store.calibration_quality(run), [])
    return gid, rows


@pytest.mark.slow  # the module's two simulated hours
def test_headroom_forecasts_a_gpu_with_its_fit_history_not_a_fit_learned_in_a_fault(
    site: Site, base_db: Path, tmp_path: Path
) -> None:
    """A fit learned while a cold plate was fouled (R tripled) must not forecast a slowdown
    for a GPU whose earlier fits on this store say otherwise: its R is capped by their median.
    And whatever R the model has, its level error now is not headroom: at the present load
    the forecast stays at the measured temperature; R sets how far a heavier load takes it."""
    db = tmp_path / "h.duckdb"
    shutil.copy(base_db, db)

    def gpu_rows(store: Store) -> dict[str, Any]:
        rows = compute_headroom(store, site, now=P90_AT).rows
        return {r.id: r for r in rows if r.kind == "gpu"}

    with Store(db) as store:
        healthy = gpu_rows(store)
        run = store.latest_fit_run_id()
        # one fouled fit after one healthy one: the history's median (2 R) caps it at 2 R; an
        # inference GPU, whose rack's load over the last hour has a p90 above its present one
        gid, rows = _with_gpu_r(store, 3.0, INFERENCE_GPU)
        one = gpu_rows(store)
        meta = next(x for x in store.calibration_runs() if x["run_id"] == run)
        meta = {k: v for k, v in meta.items() if k != "run_id"}
        for _ in range(2):  # two healthy fits (history: R, 3 R, R, R, 3 R: median R) ...
            store.save_calibration_run(meta, rows, store.calibration_quality(run), [])
        _with_gpu_r(store, 3.0, INFERENCE_GPU)  # ... the newest learned in a fault
        assert store.latest_fit_run_id() > run
        now = gpu_rows(store)
    h, o = healthy[gid], one[gid]
    # the model's level is taken out: at the present load (p50 here: persistence) the path
    # holds the measured temperature, with R or 2 R; the p90 load takes a 2 R model further
    assert o.headroom_now == h.headroom_now
    assert o.headroom_min_p50 == pytest.approx(h.headroom_min_p50, abs=0.5)
    assert o.headroom_min_p90 < h.headroom_min_p90
    # ... and with more healthy fits than fouled ones, the GPU is forecast as its history says
    assert now[gid].headroom_min_p50 == pytest.approx(h.headroom_min_p50, abs=1e-6)
    assert now[gid].headroom_min_p90 == pytest.approx(h.headroom_min_p90, abs=1e-6)


@pytest.mark.slow  # the module's two simulated hours
def test_a_model_whose_level_is_far_off_forecasts_no_breach_for_a_healthy_gpu(
    site: Site, base_db: Path, tmp_path: Path
) -> None:
    """The demo's seeded calibration holds one GPU's R from a fouled cold plate (2.75 x its
    fleet's median): at 52 °C and a flat load its model path ran to the 87 °C limit within
    three minutes, on a healthy GPU. The model's level error now is taken out of the path: no
    breach, and at the present load the path holds the measured temperature."""
    db = tmp_path / "far.duckdb"
    shutil.copy(base_db, db)
    with Store(db) as store:
        gid, _ = _with_gpu_r(store, 8.0)  # capped by the fit history at 4.5 R: 100+ °C
        g = next(r for r in compute_headroom(store, site).rows if r.kind == "gpu" and r.id == gid)
    assert g.breach_in_s_p50 is None and g.breach_in_s_p90 is None, g
    assert g.headroom_min_p50 == pytest.approx(g.headroom_now, abs=0.5)
