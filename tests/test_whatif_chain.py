"""What-if on the one chain: verdicts relative to the recording, the thermal controller, and
live headroom agreeing with a neutral what-if on the same recording."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import twin.replay.whatif as whatif_mod
from twin.alerts import load_rules
from twin.alerts.metrics import (
    CDU_PUMPS_RUNNING,
    DRIFT_GPU_R,
    FLEET_DRAIN_DROP,
    FLEET_UNDERUSED_GPUS,
    HEADROOM_CDU_FREE_FRACTION,
    HEADROOM_GPU_K_TO_SLOWDOWN,
    HEADROOM_LINK_GBPS_TO_LIMIT,
    HEADROOM_PDU_PHASE_A_TO_LIMIT,
    HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S,
    HOTSPOT_GPU_RESIDUAL_SIGMA,
    MODEL_METRICS,
)
from twin.analysis.detect import detect, observations
from twin.analysis.headroom import compute_headroom
from twin.calibrate.calibrate import calibrate, save_run
from twin.chain import breach
from twin.cli import app
from twin.ingest import Ingester, IngestLimits
from twin.replay.alert_feed import AlertFeed
from twin.replay.bundle import Bundle, record
from twin.replay.replay import replay
from twin.replay.scenario import Scenario, load_scenario
from twin.replay.whatif import component_results, load, run
from twin.simulator import SiteSimulator, parse_fault
from twin.site import load_site
from twin.site.catalog import GPU_MODELS
from twin.store import Store

from .helpers import DEMO_SITE, REPO, SMALL_SITE

BUNDLE = REPO / "sample_telemetry" / "demo_bundle"
SCENARIOS = REPO / "sample_telemetry" / "scenarios"
RULES = REPO / "deploy" / "alert_rules.yaml"

pytestmark = pytest.mark.slow  # the demo day: 880 GPUs x 8,640 steps per run


def _neutral(fleet: str) -> Scenario:
    return Scenario.model_validate(
        {"name": "neutral", "changes": [{"op": "scale_fleet", "fleet": fleet, "factor": 1}]}
    )


@pytest.fixture(scope="module")
def demo():
    return load(Bundle.load(BUNDLE))


@pytest.fixture(scope="module")
def demo_baseline(demo):
    return run(demo, None)


def test_capping_only_the_training_fleet_fits_and_lowers_it_energy(demo, demo_baseline) -> None:
    cap = Scenario.model_validate(
        {"name": "cap", "changes": [{"op": "cap_gpu_power", "fleet": "train-llm", "limit_w": 500}]}
    )
    r = run(demo, cap)
    # the recording already breaches (a PDU phase over its limit): that is not the scenario's
    assert demo_baseline.recorded_breaches and r.recorded_breaches
    assert r.verdict != "does not fit", r.reasons
    assert r.it_energy_kwh < demo_baseline.it_energy_kwh - 100
    assert not [c for c in r.changes if c.change in ("new breach", "worse breach")]


def test_a_cdu_failing_throttles_gpus_at_their_limit_and_does_not_fit(demo) -> None:
    r = run(demo, load_scenario(SCENARIOS / "cdu-1-fails.yaml", demo.site))
    assert r.verdict == "does not fit"
    slowdown = min(g.slowdown_temp_c for g in GPU_MODELS.values())
    assert max(r.series["gpu_temp_max_c"]) <= slowdown
    gpu = next(k for k in r.kinds if k.kind == "gpu")
    assert gpu.worst_min_headroom > -0.05  # held at the max operating temperature, not past it
    assert r.throttled_gpu_s > 600  # GPU-seconds held by the controller
    assert r.undelivered_energy_kwh > 0
    assert any("GPU-hours" in x and "not delivered" in x for x in r.reasons), r.reasons
    assert any(c.change == "new breach" and c.kind == "cdu_heat" for c in r.changes)


def test_a_neutral_scenario_is_the_recording_and_fits(demo, demo_baseline) -> None:
    r = run(demo, _neutral("train-llm"))
    assert r.verdict == "fits"
    assert r.gpu_mean_temp_c == demo_baseline.gpu_mean_temp_c
    assert r.cdus == demo_baseline.cdus and r.it_energy_kwh == demo_baseline.it_energy_kwh
    # throttled GPU-hours have one definition (time at the max operating temperature): a
    # neutral scenario has the recording's, and no energy not delivered
    assert r.throttled_gpu_s == demo_baseline.throttled_gpu_s and r.undelivered_energy_kwh == 0
    assert not [c for c in r.changes if c.change != "already breaching"]


def test_removing_load_is_never_does_not_fit(demo) -> None:
    for fleet in ("train-llm", "infer-chat"):
        s = Scenario.model_validate(
            {"name": "less", "changes": [{"op": "scale_fleet", "fleet": fleet, "factor": 0.5}]}
        )
        assert run(demo, s).verdict != "does not fit"


def test_no_time_over_a_limit_exceeds_the_recording(demo, demo_baseline) -> None:
    length = demo.duration_s
    for f in sorted(SCENARIOS.glob("*.yaml")):
        r = run(demo, load_scenario(f, demo.site))
        assert r.duration_s == length
        for k in r.kinds:
            assert 0 <= k.time_over_s <= length, (f.name, k)
            assert k.component_over_s >= k.time_over_s
        for c in [*r.worst, *r.recorded_breaches]:
            assert c.time_over_s <= length, (f.name, c)
        for c in r.changes:
            assert c.time_over_s <= length and c.baseline_time_over_s <= length


#: Telemetry a device does not report, for the tests with a kind missing: sample id -> fields.
Missing = dict[str, tuple[str, ...]]
NO_ACTIVITY = ("sm_active", "util_pct")


def _without(msg: tuple[str, bytes], missing: Missing | None) -> tuple[str, bytes]:
    """A simulated message with the ``missing`` fields of its samples taken out."""
    topic, payload = msg
    text = payload.decode()
    if not missing or not any(f'"{sid}"' in text for sid in missing):
        return msg
    body = json.loads(text)
    for s in body.get("samples", []):
        for f in missing.get(s.get("id"), ()):
            s.pop(f, None)
    return topic, json.dumps(body).encode()


def _recorded(
    tmp_path: Path,
    site_file: Path = SMALL_SITE,
    minutes: int = 20,
    fit: bool = False,
    missing: Missing | None = None,
    missing_from: int = 0,
    faults: tuple[str, ...] = (),
) -> tuple[Bundle, datetime, dict | None]:
    """``minutes`` simulated minutes of the small site, ingested and recorded as a bundle; with
    ``fit``, calibrated on its store first (the last third held out), so the bundle carries
    that fit, which comes back too; ``missing``: telemetry some devices do not report (from
    minute ``missing_from`` on: a sensor that stops); ``faults``: the simulator's."""
    site = load_site(site_file)
    start = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    sim = SiteSimulator(site, seed=11, start=start, faults=[parse_fault(f) for f in faults])
    result = None
    with Store(tmp_path / "src.duckdb") as src:
        ing = Ingester(src, site, IngestLimits(max_past_s=0))
        for k in range(minutes):
            gone = missing if k >= missing_from else None
            ing.ingest([_without(m, gone) for _ in range(60) for m in sim.step()])
        if fit:
            result = calibrate(src, site, window_s=minutes * 60.0, holdout_s=minutes * 20.0)
            save_run(src, result)
        record(src, site_file, tmp_path / "b", start, start + timedelta(minutes=minutes))
    return Bundle.load(tmp_path / "b"), start, result


def test_live_headroom_and_a_neutral_whatif_agree_on_every_component(tmp_path: Path) -> None:
    bundle, _, _ = _recorded(tmp_path)
    with Store(tmp_path / "dst.duckdb") as dst:  # the recording, as the live twin stores it
        replay(bundle, sink=Ingester(dst, bundle.site, IngestLimits(max_past_s=0)).ingest)
        live = compute_headroom(dst, bundle.site, use_forecast=False)
    whatif = component_results(load(bundle), _neutral("train"))
    key = {
        "gpu": ("gpu", "temp_c"),
        "pdu_phase": ("pdu_phase", "current_a"),
        "rack": ("rack", "power_kw"),
        "cdu_heat": ("cdu", "heat_kw"),
        "cdu_flow": ("cdu", "flow_lpm"),
        "loop": ("loop", "return_temp_c"),
        "link": ("link", "traffic_gbps"),
    }
    rows = {(r.kind, r.quantity, r.id): r for r in live.rows}
    seen = set()
    for c in whatif:
        kind, q = key[c.kind]
        row = rows.get((kind, q, c.id))
        assert row is not None, f"live headroom has no row for {c.kind} {c.id}"
        seen.add((kind, q, c.id))
        assert c.value_end is not None and row.value_now is not None
        assert c.value_end == pytest.approx(row.value_now, rel=0.01, abs=0.05), (c, row)
        if c.kind in ("gpu", "pdu_phase", "rack", "loop", "link"):  # limits that do not move
            assert c.limit == pytest.approx(row.limit, rel=1e-9), (c, row)
    assert seen == set(rows), set(rows) - seen
    assert len(seen) > 40 and {k for k, _, _ in seen} >= {"gpu", "pdu_phase", "rack", "cdu"}


class _Offered(AlertFeed):
    """The what-if's alert feed, keeping the last evaluation minute's value of everything
    offered (every metric: ``wants`` is true for all)."""

    last: ClassVar[dict[tuple[str, str, str], float]] = {}

    def wants(self, metric: str, kind: str) -> bool:
        return True

    def offer_series(self, metric, kind, ids, values, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        for i, v in zip(ids, np.atleast_2d(np.asarray(values, dtype=float))[-1], strict=True):
            self.last[(metric, kind, i)] = float(v)
        super().offer_series(metric, kind, ids, values, *args, **kwargs)


def _live_and_replayed(
    bundle: Bundle,
    start: datetime,
    scenario: Scenario | None,
    db: Path,
    monkeypatch: pytest.MonkeyPatch,
    fit: dict | None = None,
) -> tuple[list[Any], dict[tuple[str, str, str], float], Any]:
    """The live detection pass's observations over the bundle's data ingested into a store
    (holding ``fit`` as its calibration, if given) at the what-if's last evaluation minute,
    what the what-if of ``scenario`` offered the engine at that minute (finite values) and the
    pass itself."""
    monkeypatch.setattr(whatif_mod, "AlertFeed", _Offered)
    _Offered.last = {}
    d = load(bundle)
    run(d, scenario, load_rules(RULES))
    at = start + timedelta(seconds=float(_Offered(None, d).rows[-1]) * d.dt_s)
    with Store(db) as dst:
        replay(bundle, sink=Ingester(dst, bundle.site, IngestLimits(max_past_s=0)).ingest)
        if fit is not None:
            save_run(dst, fit)
        det = detect(dst, bundle.site, now=at)
    offered = {k: v for k, v in _Offered.last.items() if np.isfinite(v)}
    return observations(det), offered, det


#: One kind of telemetry a device does not report, for the live/what-if comparisons.
ONE_MISSING: dict[str, Missing] = {
    "no-cdu-flow": {"cdu-1": ("flow_lpm",)},
    "no-cdu-supply": {"cdu-1": ("supply_temp_c",)},
    "no-cdu-heat": {"cdu-1": ("heat_kw",)},
    "no-cdu-return": {"cdu-1": ("return_temp_c",)},
    "no-pump-speed": {"cdu-1/pump1": ("pump_speed_pct",)},
    "no-pdu-power": {"pdu-r01-a": ("power_w", "power_factor")},
    "no-phase-current": {"pdu-r01-a/L1": ("current_a",)},
    "no-gpu-temp": {"trn-r01-n1:0": ("temp_c",)},
    "no-gpu-power": {"trn-r01-n1:0": ("power_w",)},
    "no-link": {"lnk-r01-s1": ("tx_bps", "rx_bps")},
    "no-node-inlet-or-power": {"inf-r02-n1": ("inlet_temp_c", "power_w")},
}


@pytest.mark.parametrize("missing_from", [0, 15], ids=["never", "stops"])
@pytest.mark.parametrize("missing", [None, *ONE_MISSING.values()], ids=["all", *ONE_MISSING])
def test_live_detection_and_a_neutral_whatif_offer_the_engine_the_same_observations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: Missing | None, missing_from: int
) -> None:
    """The alert engine's input from the live detection pass over the store and from a neutral
    what-if over the bundle of the same minutes, at the what-if's last evaluation minute: the
    same (metric, entity) pairs for every metric a shipped rule watches that both compute
    without a fit, with the same values (both take a current, power, heat, flow or traffic
    "now" as the mean of the last minute's samples; a link's within 1 %: live takes the busier
    direction of the two means, the recording holds the busier direction); also with one kind
    of telemetry missing (:data:`ONE_MISSING`): the what-if took a reading no device sent as 0
    (a CDU's flow and heat, a phase current, a link's traffic), a supply as a
    change, a silent feed's rack as the other feed's load, a silent pump as stopped and a GPU
    without a sensor at its model's temperature, and paged where live said nothing; and with
    the reading stopping 5 minutes before the end (the recording holds its last value for
    the model; a held value older than the live pass's minute is no headroom figure)."""
    if missing is None and missing_from:
        pytest.skip("nothing stops")
    bundle, start, _ = _recorded(tmp_path, missing=missing, missing_from=missing_from)
    ours = _same_observations(bundle, start, "train", tmp_path, monkeypatch)
    expected = {CDU_PUMPS_RUNNING, HEADROOM_GPU_K_TO_SLOWDOWN, HEADROOM_PDU_PHASE_A_TO_LIMIT}
    if missing not in (ONE_MISSING["no-cdu-flow"], ONE_MISSING["no-cdu-heat"]):
        expected.add(HEADROOM_CDU_FREE_FRACTION)  # a CDU's capacity needs its flow and heat
    assert {m for m, _, _ in ours} >= expected


def test_live_detection_and_a_neutral_whatif_agree_on_the_demo_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on 20 minutes of the demo site (880 GPUs, four CDUs two of which share a loop,
    air and liquid racks): its CDU 2's heat moves within a minute, so the what-if's sample at
    the minute gave 0.402 of capacity free where live said 0.425 (the minute's mean)."""
    bundle, start, _ = _recorded(tmp_path, DEMO_SITE, minutes=20)
    ours = _same_observations(bundle, start, bundle.site.fleets[0].name, tmp_path, monkeypatch)
    assert len({k for _, k, _ in ours}) >= 5 and len(ours) > 1000


def test_a_phase_with_load_creeping_onto_it_is_forecast_alike_live_and_in_a_whatif(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Load creeping onto one phase (3 kW more over 80 min, from minute 10; 50 min recorded):
    the live pass and a neutral what-if forecast its breach at the same minute. The trend is
    the current the racks' IT load (their nodes' power) does not explain, over the same minute
    means on both paths: the what-if took the rack's PDU power, which the creeping load itself
    raises, and the live pass one sample a minute, so the what-if paged 6 minutes late (1,380 s
    against 1,020 s)."""
    creep = "phase_creep:pdu-r01-a/L1@10m+80m=3000"
    bundle, start, _ = _recorded(tmp_path, minutes=50, faults=(creep,))
    ours = _same_observations(bundle, start, "train", tmp_path, monkeypatch)
    for phase in ("pdu-r01-a/L1", "pdu-r01-a/cb1"):
        b = ours[(HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S, "pdu_phase", phase)]
        assert 0 < b < breach.HORIZON_S, (phase, b)  # a trend forecast, not a flat path
    calm = ours[(HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S, "pdu_phase", "pdu-r01-a/L2")]
    assert calm == 2 * breach.HORIZON_S


def _same_observations(
    bundle: Bundle, start: datetime, fleet: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[tuple[str, str, str], float]:
    """Asserts that the live pass and a neutral what-if (``fleet`` scaled by 1) offer the alert
    engine the same (metric, entity) pairs and values for every shipped rule's metric both
    compute without a fit; returns the live ones."""
    obs, offered, _ = _live_and_replayed(
        bundle, start, _neutral(fleet), tmp_path / "dst.duckdb", monkeypatch
    )
    live = {(o.metric, o.entity_kind, o.entity_id): o.value for o in obs}
    watched = {r.metric for r in load_rules(RULES).rules}
    # the model's metrics wait for a fit (none here); the fleets' need an hour of data
    compared = watched - MODEL_METRICS - {FLEET_UNDERUSED_GPUS, FLEET_DRAIN_DROP}
    ours = {k: v for k, v in live.items() if k[0] in compared}
    theirs = {k: v for k, v in offered.items() if k[0] in compared}
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))[:10]
    for k, v in ours.items():
        loose = k[0] == HEADROOM_LINK_GBPS_TO_LIMIT
        tol = {"rel": 0.01, "abs": 0.01} if loose else {"rel": 1e-6, "abs": 1e-3}
        assert theirs[k] == pytest.approx(v, **tol), k
    return ours


#: A GPU's temperature or its CDU's supply missing: its fit is refused (not judged live)
REFUSED: dict[str, Missing] = {
    "no-gpu-temp": {"trn-r01-n1:0": ("temp_c",)},
    "no-cdu-supply": {"cdu-1": ("supply_temp_c",)},
}


#: A reading that stops 5 minutes before the end (fitted on: the fit holds out its last third)
STOPS: dict[str, Missing] = {
    "gpu-temp-stops": {"trn-r01-n1:0": ("temp_c",)},
    "gpu-power-stops": {"trn-r01-n1:0": ("power_w",)},
    "cdu-supply-stops": {"cdu-1": ("supply_temp_c",)},
    "cdu-flow-stops": {"cdu-1": ("flow_lpm",)},
    "node-inlet-stops": {"inf-r02-n1": ("inlet_temp_c",)},
}


@pytest.mark.parametrize(
    ("missing", "missing_from"),
    [
        (None, 0),
        ({"inf-r02-n1": ("inlet_temp_c",)}, 0),
        *((m, 0) for m in REFUSED.values()),
        *((m, 55) for m in STOPS.values()),
    ],
    ids=["all", "no-node-inlet", *REFUSED, *STOPS],
)
def test_live_detection_with_its_fit_and_a_replay_give_the_same_model_observations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: Missing | None, missing_from: int
) -> None:
    """The model-based metrics (residual, R drift, GPU temperature forecast), which wait for a
    fit: an hour of the small site fitted on its store and recorded with that calibration,
    then live detection over the bundle's data in a store holding the same fit, and the
    bundle's baseline replay, at the replay's last evaluation minute. Both take the minute
    means that end with the newest sample, coolant and inlet air included; an air-cooled node
    without an inlet sensor takes its rack's PDU inlet on both paths
    (``twin.site.index.node_inlet_c``; the replay held 25 °C for it before). A GPU whose fit
    is refused (no temperature, no coolant supply) gets no model metric on either path (the
    replay forecast it on the catalog's R before); a GPU whose temperature or power stops has
    no minute means after it, on both paths (the replay took the held value's)."""
    bundle, start, fit = _recorded(
        tmp_path, minutes=60, fit=True, missing=missing, missing_from=missing_from
    )
    site = bundle.site
    obs, offered, det = _live_and_replayed(
        bundle, start, None, tmp_path / "dst.duckdb", monkeypatch, fit
    )
    refused = not missing_from and missing in REFUSED.values()
    assert det.hotspots.model_run is not None and bool(det.hotspots.not_judged) == refused
    live = {(o.metric, o.entity_id): o.value for o in obs if o.metric in MODEL_METRICS}
    ours = {(m, i): v for (m, _, i), v in offered.items() if m in MODEL_METRICS}
    assert set(live) == set(ours), sorted(set(live) ^ set(ours))[:10]
    gpus = sum(len(nd.gpu_ids()) for nd in site.nodes) - len(det.hotspots.not_judged)
    assert {m for m, _ in live} == set(MODEL_METRICS)
    assert len(live) == 3 * gpus or missing_from  # a stopped reading: that GPU's minutes go
    tol = {DRIFT_GPU_R: 1e-3, HOTSPOT_GPU_RESIDUAL_SIGMA: 0.05}  # float32 series in replay
    for k, v in live.items():
        assert ours[k] == pytest.approx(v, abs=tol.get(k[0], 1e-9)), (k, v, ours[k])
    # an hour is enough for each fleet's drain (15 min against the trailing 45 of the hour):
    # the minute means end with the newest sample on both paths
    drain = {o.entity_id: o.value for o in obs if o.metric == FLEET_DRAIN_DROP}
    theirs = {i: v for (m, _, i), v in offered.items() if m == FLEET_DRAIN_DROP}
    assert set(drain) == set(theirs) == {f.name for f in site.fleets}, (drain, theirs)
    for name, v in drain.items():
        assert theirs[name] == pytest.approx(v, abs=1e-6), (name, v, theirs[name])


#: Faults of the simulator on the small site, one device each, from the middle of the hour
FAULTS = {
    "pump": "pump_failure:cdu-1/pump1@40m",
    "phase": "phase_overload:pdu-r02-a/L1@45m",
    "cold-plate": "cold_plate:trn-r01-n1:3@20m",
    "cold-plate-decay": "cold_plate_decay:trn-r01-n2:1@10m+40m",
    "fleet-idle": "fleet_idle:infer-small@30m",
}


@pytest.mark.parametrize(
    ("faults", "missing"),
    [
        *(((f,), None) for f in FAULTS.values()),
        (tuple(FAULTS.values()), None),
        ((FAULTS["cold-plate"],), {"cdu-1": ("flow_lpm",)}),
    ],
    ids=[*FAULTS, "all", "cold-plate-flow-meter-stops"],
)
def test_live_detection_and_a_replay_agree_on_a_faulted_hour(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    faults: tuple[str, ...],
    missing: Missing | None,
) -> None:
    """An hour of the small site with a fault, fitted and recorded: the live pass and the
    bundle's baseline replay offer the alert engine the same value of every metric a shipped
    rule watches, the model's included. Two faults found two differences: after a pump's loss
    the live residual took R at the fitted flow (it looked the CDU's fitted flow up among the
    GPUs' parameters and never found it), 0.7-1.0 sigma above the replay's on every GPU of the
    loop; and a GPU whose fit was refused (its cold plate failing within the fit's hour) had
    its R re-estimated with the catalog's heat capacity in the replay and none live (R drift
    3.70 against 3.66). With the loop's flow meter silent for the last 10 minutes, the replay's
    minute means counted the value held over the gap as readings for a minute after the last
    one, so the first silent minute's mean was the meter's last sample where live has none and
    holds the mean of the minute before: 0.06 sigma on every GPU of the loop (0.12 sigma when a
    node's inlet sensor stops, ``…_same_model_observations``)."""
    bundle, start, fit = _recorded(
        tmp_path, minutes=60, fit=True, faults=faults, missing=missing, missing_from=50
    )
    _same_on_a_faulted_hour(bundle, start, fit, tmp_path, monkeypatch)


def test_live_detection_and_a_replay_agree_on_a_faulted_hour_of_the_demo_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on an hour of the demo site (880 GPUs) with four faults at once: a pump lost on
    a CDU that shares its loop, load creeping onto a phase, a cold plate failing and an
    inference fleet going idle."""
    faults = (
        "pump_failure:cdu-2/pump1@35m",
        "phase_creep:pdu-d08-a/L1@10m+60m",
        "cold_plate:trn-a03-n2:5@20m",
        "fleet_idle:infer-chat@30m",
    )
    bundle, start, fit = _recorded(tmp_path, DEMO_SITE, minutes=60, fit=True, faults=faults)
    assert len(_same_on_a_faulted_hour(bundle, start, fit, tmp_path, monkeypatch)) > 4000


def _same_on_a_faulted_hour(
    bundle: Bundle, start: datetime, fit: dict | None, tmp_path: Path, monkeypatch
) -> dict[tuple[str, str, str], float]:
    """Asserts that the live pass and the bundle's baseline replay offer the same value of
    every watched metric, the model's included (a link's traffic within 1 %: the recording
    keeps it as float32); returns the live ones."""
    obs, offered, det = _live_and_replayed(
        bundle, start, None, tmp_path / "dst.duckdb", monkeypatch, fit
    )
    assert not det.failures
    watched = {r.metric for r in load_rules(RULES).rules}
    live = {(o.metric, o.entity_kind, o.entity_id): o.value for o in obs if o.metric in watched}
    ours = {k: v for k, v in offered.items() if k[0] in watched}
    assert set(live) == set(ours), sorted(set(live) ^ set(ours))[:10]
    assert len({k[0] for k in live} & set(MODEL_METRICS)) == len(MODEL_METRICS)
    tol = {DRIFT_GPU_R: 1e-3, HOTSPOT_GPU_RESIDUAL_SIGMA: 0.05}  # float32 series in replay
    for k, v in live.items():
        rel = 0.01 if k[0] == HEADROOM_LINK_GBPS_TO_LIMIT else 1e-6
        assert ours[k] == pytest.approx(v, rel=rel, abs=tol.get(k[0], 1e-6)), (k, v, ours[k])
    return live


def test_a_cdu_without_a_flow_meter_has_an_unknown_flow_in_a_what_if_not_a_stopped_one(
    tmp_path: Path,
) -> None:
    """A CDU that reports no flow: the what-if took its flow as 0 (capacity 0, so the recording
    "breached" its heat and flow limits, and its GPUs' R at no flow). Its flow is unknown, as
    the live pass takes it: no heat or flow breach, R at its fitted flow, and losing a pump
    still raises its GPUs' temperatures by the pump model's ratio."""
    bundle, _, _ = _recorded(tmp_path, missing={"cdu-1": ("flow_lpm",)})
    d = load(bundle)
    base = run(d, None)
    assert not [c for c in base.recorded_breaches if c.kind.startswith("cdu")], base.reasons
    assert any("no flow reading from cdu-1" in r for r in base.reasons), base.reasons
    scenario = tmp_path / "pump.yaml"
    scenario.write_text("name: pump\nchanges:\n  - {op: fail_pump, cdu: cdu-1, pump: pump1}\n")
    out = CliRunner().invoke(
        app, ["whatif", str(tmp_path / "b"), str(scenario), "--out", str(tmp_path / "r"), "--json"]
    )
    assert out.exit_code == 0, out.output

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON output")

    _, lost = json.loads(out.stdout, parse_constant=refuse)  # strict JSON: no NaN
    assert lost["cdus"]["cdu-1"]["flow_lpm"] is None  # unknown, not 0
    liquid = {g for g, c in zip(d.idx.gpu_ids, d.idx.gpu_cdu, strict=True) if c >= 0}
    temps = lost["gpu_mean_temp_c"]
    rise = [temps[g] - base.gpu_mean_temp_c[g] for g in sorted(liquid)]
    assert min(rise) > 0.1 and max(rise) < 20, rise  # R at the lower flow, not at no flow
    assert all(temps[g] == base.gpu_mean_temp_c[g] for g in d.idx.gpu_ids if g not in liquid)


def test_a_gpu_without_activity_telemetry_is_forecast_on_its_power_in_replay_as_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU that reports neither SM activity nor GPU-Util: the live forecast scales its power
    by the load ratio (``gpu_power_at_ratio_w`` with no activity); the replay's recording fills
    its activity with 0, so it must say the GPU reported none, and its forecast must hand that
    GPU's activity on as unknown, not as 0 (which would hold its power)."""
    gpu = "inf-r02-n1:0"
    bundle, _, _ = _recorded(tmp_path, missing={gpu: NO_ACTIVITY})
    d = load(bundle)
    j = d.idx.gpu_ids.index(gpu)
    assert d.gpu_activity_reported is not None
    assert (
        not d.gpu_activity_reported[j] and d.gpu_activity_reported.sum() == len(d.idx.gpu_ids) - 1
    )
    handed: list[np.ndarray] = []
    real = breach.gpu_p90_breach_in_s

    def spy(s: breach.GpuSeries, *args: Any, **kwargs: Any) -> np.ndarray:
        handed.append(np.asarray(s.activity))
        return real(s, *args, **kwargs)

    monkeypatch.setattr(breach, "gpu_p90_breach_in_s", spy)
    run(d, None, load_rules(RULES))
    act = np.concatenate(handed, axis=1)  # the chunks of GPUs, in site order
    assert act.shape[1] == len(d.idx.gpu_ids)
    assert np.isnan(act[:, j]).all() and np.isfinite(np.delete(act, j, axis=1)).all()


def test_a_fleets_own_underuse_rule_judges_it_live_and_in_replay_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's ``underuse`` block in the site file (here: judged on 10 min of data, flagged
    under 99 % activity, sized at 99 % of its p95) is the rule in a replay as it is live: the
    neutral what-if offers the engine the GPUs to reclaim the live detection pass reports at
    the same minute."""
    raw = yaml.safe_load(SMALL_SITE.read_text())
    inference = [fl for fl in raw["fleets"] if fl["role"] == "inference"]
    for fl in inference:
        fl["underuse"] = {"threshold": 0.99, "target_util": 0.99, "min_coverage_s": 600}
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump(raw))
    bundle, start, _ = _recorded(tmp_path, site_file)
    obs, offered, _ = _live_and_replayed(
        bundle, start, _neutral("train"), tmp_path / "dst.duckdb", monkeypatch
    )
    live = {o.entity_id: o.value for o in obs if o.metric == FLEET_UNDERUSED_GPUS}
    ours = {i: v for (m, _, i), v in offered.items() if m == FLEET_UNDERUSED_GPUS}
    assert live == ours and set(live) == {fl["name"] for fl in inference}, (live, ours)
    assert all(v >= 1 for v in live.values())


def test_facility_water_moves_liquid_gpus_about_3k_and_not_air(demo, demo_baseline) -> None:
    r = run(demo, load_scenario(SCENARIOS / "facility-water-plus-3c.yaml", demo.site))
    idx = demo.idx
    d = np.array([r.gpu_mean_temp_c[g] - demo_baseline.gpu_mean_temp_c[g] for g in idx.gpu_ids])
    liquid = idx.gpu_cdu >= 0
    assert np.median(d[liquid]) == pytest.approx(3.0, abs=0.3)
    assert np.abs(d[~liquid]).max() < 1e-6


def test_a_failed_link_moves_its_traffic_to_its_parallel_links(demo) -> None:
    from twin.chain.propagate import parallel_links

    names = [lk.name for lk in demo.site.links]
    j = next(i for i in range(len(names)) if len(parallel_links(demo.site, i)) >= 1)
    s = Scenario.model_validate(
        {"name": "link", "changes": [{"op": "fail_link", "link": names[j], "at": 0}]}
    )
    moved = {c.id: c for c in run(demo, s).changes}
    assert names[j] in moved and moved[names[j]].delta > 0  # it carries nothing any more
    peers = [names[k] for k in parallel_links(demo.site, j)]
    assert any(p in moved and moved[p].delta < 0 for p in peers)  # they carry its traffic
    others = set(moved) - {names[j], *peers}
    assert not [o for o in others if o.startswith("lnk")], others


def test_rack_heat_goes_to_liquid_and_to_air(demo, demo_baseline) -> None:
    s = demo_baseline.series
    it, liquid, air = (np.mean(s[k]) for k in ("it_power_kw", "liquid_heat_kw", "air_heat_kw"))
    # what the cold plates do not capture goes to the room; the CDUs' heat is measured, so the
    # two add up to the IT power only within the meters' and the capture fit's error
    assert 0 < air < it and liquid + air == pytest.approx(it, rel=0.05)
    r = run(demo, load_scenario(SCENARIOS / "four-more-b200-racks.yaml", demo.site))
    assert np.mean(r.series["air_heat_kw"]) > air  # the new racks' uncaptured share
