"""Recordings, replay and what-if scenarios, on the shipped 24-hour demo bundle.

The bundle (sample_telemetry/demo_bundle, made by sample_telemetry/make_demo_bundle.py) is the
demo site simulated for a day at 10 s with injected faults, calibrated on its last two hours.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from models import coolant
from twin.chain.propagate import pump_flow_ratio as _pump_flow_ratio
from twin.cli import app
from twin.ingest import Ingester, IngestLimits
from twin.replay.bundle import Bundle, BundleError, record
from twin.replay.replay import replay
from twin.replay.scenario import Scenario, ScenarioError, load_scenario
from twin.replay.whatif import component_results, load, run
from twin.simulator import SiteSimulator
from twin.site import load_site
from twin.store import Store

from .helpers import REPO, SMALL_SITE, simulated_bundle

BUNDLE = REPO / "sample_telemetry" / "demo_bundle"
SCENARIOS = REPO / "sample_telemetry" / "scenarios"


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return Bundle.load(BUNDLE)


@pytest.fixture(scope="module")
def data(bundle: Bundle):
    return load(bundle)


@pytest.fixture(scope="module")
def baseline(data):
    return run(data, None)


def _scenario(name: str, site) -> Scenario:
    return load_scenario(SCENARIOS / f"{name}.yaml", site)


def test_shipped_bundle_is_a_day_at_10_s_under_20_mb(bundle: Bundle) -> None:
    size = sum(f.stat().st_size for f in BUNDLE.iterdir())
    assert size <= 20_000_000, size
    m = bundle.manifest
    assert m.site == "demo" and m.resolution_s == 10.0
    assert m.end - m.start == timedelta(hours=24)
    assert set(m.rows) == {"gpu", "node", "pdu", "cdu", "link"}
    assert m.rows["gpu"] == 880 * 8640
    assert bundle.calibration is not None and bundle.params()
    assert "pump_failure:cdu-2/pump1" in m.notes  # it holds injected faults


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_facility_water_plus_3c_raises_steady_gpu_temperatures_about_3k(data, baseline) -> None:
    s = run(data, _scenario("facility-water-plus-3c", data.site))
    liquid = [gid for gid, c in zip(data.idx.gpu_ids, data.idx.gpu_cdu, strict=True) if c >= 0]
    air = [gid for gid, c in zip(data.idx.gpu_ids, data.idx.gpu_cdu, strict=True) if c < 0]
    d_liquid = np.array([s.gpu_mean_temp_c[g] - baseline.gpu_mean_temp_c[g] for g in liquid])
    d_air = np.array([s.gpu_mean_temp_c[g] - baseline.gpu_mean_temp_c[g] for g in air])
    assert np.median(d_liquid) == pytest.approx(3.0, abs=0.3)
    assert d_liquid.max() < 3.3
    # every GPU with room below its max operating temperature rises by about 3 K; the one with
    # the degrading cold plate already throttles part of the day, and can rise less
    faulty = liquid.index("trn-a03-n2:5")  # the bundle's cold_plate_decay fault
    healthy = np.delete(d_liquid, faulty)
    assert healthy.min() > 2.7
    assert 0 < d_liquid[faulty] < healthy.min()  # throttling holds it at 87 °C for hours
    assert np.abs(d_air).max() < 1e-6  # air-cooled racks do not see facility water
    for name, c in s.cdus.items():
        assert c["supply_c"] - baseline.cdus[name]["supply_c"] == pytest.approx(3.0, abs=0.05)


@pytest.mark.slow  # the demo bundle's day through what-if (module fixture): out of the fast tier
def test_losing_one_of_two_pumps_cuts_flow_as_the_pump_model_says(data, baseline) -> None:
    s = run(data, _scenario("cdu-2-loses-a-pump", data.site))
    cdu2 = data.site.cdu_by_name["cdu-2"]
    ratio = _pump_flow_ratio(cdu2, 1)
    assert 0.4 < ratio < 0.8
    b, f = baseline.cdus["cdu-2"], s.cdus["cdu-2"]
    # the recording has cdu-2 on one pump for 30 of its 1,440 minutes already
    assert f["flow_lpm"] / b["flow_lpm"] == pytest.approx(ratio, rel=0.03)
    # the loop's rise grows to carry the same heat: dT ~ Q / (rho V cp)
    rise_b, rise_f = b["return_c"] - b["supply_c"], f["return_c"] - f["supply_c"]
    assert rise_f / rise_b == pytest.approx(1.0 / ratio, rel=0.05)
    expected = coolant.return_temp_c(f["supply_c"], f["heat_kw"], f["flow_lpm"], cdu2.coolant)
    assert f["return_c"] == pytest.approx(float(expected), abs=0.3)
    assert s.cdus["cdu-1"] == baseline.cdus["cdu-1"]  # nothing else moves
    # less flow through the cold plates: the GPUs on cdu-2 run warmer
    on_cdu2 = [g for g, c in zip(data.idx.gpu_ids, data.idx.gpu_cdu, strict=True) if c == 1]
    assert min(s.gpu_mean_temp_c[g] - baseline.gpu_mean_temp_c[g] for g in on_cdu2) > 0.5


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_four_more_racks_on_a_cdu_at_80_percent_breach_it_and_say_when(data, baseline) -> None:
    assert baseline.cdus["cdu-3"]["peak_utilization"] == pytest.approx(0.8, abs=0.03)
    s = run(data, _scenario("four-more-b200-racks", data.site))
    assert s.verdict == "does not fit"
    heat = next(k for k in s.kinds if k.kind == "cdu_heat")
    assert heat.breaching == 1 and heat.worst_id == "cdu-3"
    assert heat.first_breach is not None and heat.time_over_s > 0
    when = f"{heat.first_breach:%Y-%m-%d %H:%M}"
    assert any(when in r and "cdu_heat" in r for r in s.reasons), s.reasons
    assert s.it_energy_kwh > baseline.it_energy_kwh


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_same_bundle_and_scenario_give_the_same_numbers(data, bundle) -> None:
    sc = _scenario("cdu-1-fails", data.site)
    a = run(data, sc).model_dump_json()
    b = run(load(bundle), sc).model_dump_json()
    assert a == b


@pytest.mark.slow  # the demo bundle's day through what-if (module fixture): out of the fast tier
def test_a_neutral_scenario_reproduces_the_recording(data, baseline) -> None:
    s = run(
        data,
        Scenario.model_validate(
            {
                "name": "neutral",
                "changes": [{"op": "scale_fleet", "fleet": "infer-chat", "factor": 1}],
            }
        ),
    )
    assert s.gpu_mean_temp_c == baseline.gpu_mean_temp_c
    assert s.cdus == baseline.cdus
    assert s.it_energy_kwh == baseline.it_energy_kwh


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"op": "fail_pump", "cdu": "cdu-9", "pump": "pump1"}, "'cdu-9'"),
        ({"op": "fail_pump", "cdu": "cdu-2", "pump": "pump7"}, "'pump7'"),
        ({"op": "fail_feed", "pdu": "pdu-z99-a"}, "'pdu-z99-a'"),
        ({"op": "cap_gpu_power", "limit_w": 500, "racks": ["zz9"]}, "'zz9'"),
        (
            {
                "op": "add_racks",
                "count": 1,
                "node_model": "HGX-Z900",
                "nodes_per_rack": 2,
                "cdu": "cdu-3",
                "fleet": "infer-chat",
                "like_rack": "c01",
            },
            "'HGX-Z900'",
        ),
    ],
)
def test_a_scenario_naming_what_does_not_exist_is_refused(
    bundle: Bundle, tmp_path: Path, change: dict, named: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(json.dumps({"name": "bad", "changes": [change]}))
    with pytest.raises(ScenarioError, match=named) as e:
        load_scenario(f, bundle.site)
    assert str(f) in str(e.value) and "changes[0]" in str(e.value)
    res = CliRunner().invoke(app, ["whatif", str(BUNDLE), str(f), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and named in res.output


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_whatif_command_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    res = CliRunner().invoke(
        app,
        [
            "whatif",
            str(BUNDLE),
            str(SCENARIOS / "four-more-b200-racks.yaml"),
            str(SCENARIOS / "facility-water-plus-3c.yaml"),
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    md = (out / "report.md").read_text()
    assert "## four-more-b200-racks: does not fit" in md
    assert "## facility-water-plus-3c:" in md
    html = (out / "report.html").read_text()
    assert "plotly" in html and "four-more-b200-racks" in html


def test_record_and_replay_round_trip_through_the_ingest_path(tmp_path: Path) -> None:
    site = load_site(SMALL_SITE)
    start = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    sim = SiteSimulator(site, seed=3, start=start)
    with Store(tmp_path / "src.duckdb") as src:
        ing = Ingester(src, site, IngestLimits(max_past_s=0))
        batch = []
        for _ in range(600):
            batch.extend(sim.step())
        ing.ingest(batch)
        m = record(
            src, SMALL_SITE, tmp_path / "b", start, start + timedelta(minutes=10), resolution_s=10.0
        )
        assert m.rows["gpu"] == 24 * 60
        with pytest.raises(BundleError, match="not empty"):
            record(src, SMALL_SITE, tmp_path / "b", start, start + timedelta(minutes=10))
        src_means = src.con.execute(
            "SELECT id, avg(power_w) FROM gpu GROUP BY id ORDER BY id"
        ).fetchall()
    b = Bundle.load(tmp_path / "b")
    with Store(tmp_path / "dst.duckdb") as dst:
        ing = Ingester(dst, b.site, IngestLimits(max_past_s=0))
        stats = replay(b, sink=ing.ingest)
        counters = ing.counters.as_dict()
        assert stats["messages"] == counters["stored_messages"] == counters["received"]
        assert counters["dead_letters"] == {} and counters["duplicates"] == 0
        n = dst.con.execute("SELECT count(*) FROM gpu").fetchall()[0][0]
        assert n == 24 * 60
        dst_means = dst.con.execute(
            "SELECT id, avg(power_w) FROM gpu GROUP BY id ORDER BY id"
        ).fetchall()
    for (i1, a), (i2, c) in zip(src_means, dst_means, strict=True):
        assert i1 == i2 and c == pytest.approx(a, abs=2.5)  # 5 W recording resolution


@pytest.mark.mqtt
def test_replay_over_mqtt_to_a_running_service_shifted_to_now(broker, tmp_path: Path) -> None:
    from collectors.mqtt import wait_until

    from .helpers import IngestService

    simulated_bundle(tmp_path / "b", minutes=2, seed=4)
    svc = IngestService(broker, tmp_path / "live.duckdb")
    try:
        asked = datetime.now(UTC)
        res = CliRunner().invoke(
            app,
            ["replay", str(tmp_path / "b"), "--broker", broker.address, "--shift-to-now"],
            env=broker.client_env(),
        )
        done = datetime.now(UTC)
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)  # progress lines are on stderr
        assert out["messages"] > 0
        rows = sum(Bundle.load(tmp_path / "b").manifest.rows.values())
        assert f"replay: {rows:,}/{rows:,} rows, recorded time 00:01:50 of 00:02:00" in res.stderr
        assert wait_until(lambda: svc.count() == 24 * 12, 20), svc.ingester.counters.as_dict()
    finally:
        svc.stop()
    with Store(tmp_path / "live.duckdb", read_only=True) as live:
        newest = live.con.execute("SELECT max(ts) FROM gpu").fetchall()[0][0]
        # shifted to now: the recording's end moved to the moment the replay began, and every
        # sample by the same amount (a message's ts has millisecond precision)
        ms = timedelta(milliseconds=1)
        shift = timedelta(seconds=out["shift_s"])
        bundle = Bundle.load(tmp_path / "b")
        assert asked - ms <= bundle.manifest.end + shift <= done + ms
        newest_recorded = max(bundle.table("gpu", [])["ts"].to_pylist())
        assert abs(newest - (newest_recorded + shift)) <= 2 * ms, (newest, newest_recorded, shift)
        assert live.status()["dead_letters"] == {}


@pytest.mark.slow  # the demo bundle's day through what-if (module fixture): out of the fast tier
def test_the_alerts_the_rule_file_would_have_sent(data) -> None:
    from twin.alerts import load_rules

    r = run(data, None, load_rules(REPO / "deploy" / "alert_rules.yaml"))
    pump = [(a["status"], a["group"]) for a in r.alerts if a["rule"] == "cdu_pump_lost"]
    # the recording's 30-min pump failure on cdu-2 (10:00-10:30): one page, one resolve
    assert pump == [("firing", "cdu cdu-2"), ("resolved", "cdu cdu-2")]
    first = next(a for a in r.alerts if a["rule"] == "cdu_pump_lost")
    assert first["at"].startswith("2026-11-23T10:0")
    # the degrading cold plate on trn-a03-n2:5 is paged (by its model-based detectors, which
    # then mute the temperature threshold), and no other GPU is
    gpu_rules = {"gpu_temp_high", "gpu_slowdown_forecast", "gpu_hotspot_residual", "gpu_r_drift"}
    hot = [a for a in r.alerts if a["rule"] in gpu_rules and a["status"] == "firing"]
    assert hot and all("a03" in a["group"] for a in hot)


@pytest.mark.slow  # the demo's day through what-if, every scenario twice: out of the fast tier
def test_a_replay_hands_the_engine_only_what_can_change_it_and_pages_the_same(data) -> None:
    """AlertFeed.evaluate leaves out the observations the engine would pass over (no rule's
    condition met, no open alert) and the minutes with nothing to do: every shipped scenario's
    notifications are those of the engine handed every value at every minute."""
    from twin.alerts import load_rules
    from twin.replay import whatif

    rules = load_rules(REPO / "deploy" / "alert_rules.yaml")
    paged = 0
    for name in [None, *sorted(p.stem for p in SCENARIOS.glob("*.yaml"))]:
        changes = list(_scenario(name, data.site).changes) if name else []
        feed = whatif._pass(data, changes, rules).feed
        sent = feed.evaluate()
        assert sent == feed.evaluate(every=True), name
        paged += len(sent)
    assert paged > 20  # the comparison saw pages and resolves, not an empty run


@pytest.mark.slow  # the demo's day through what-if, twice: out of the fast tier
def test_a_what_if_is_the_same_to_the_bit_on_one_core_or_two(bundle, monkeypatch) -> None:
    """The GPU pass, the hot-spot series, the trend fit and the bundle's read run a block per
    core (twin.blocks); their sums are taken in block order, so one worker gives the same
    result as two, the alerts included."""
    from twin import blocks
    from twin.alerts import load_rules

    rules = load_rules(REPO / "deploy" / "alert_rules.yaml")
    runs = {}
    for workers in (1, 2):
        monkeypatch.setattr(blocks, "WORKERS", workers)
        d = load(bundle)
        sc = _scenario("facility-water-plus-3c", d.site)
        runs[workers] = [run(d, None, rules).model_dump_json(), run(d, sc, rules).model_dump_json()]
    assert runs[1] == runs[2]


@pytest.mark.slow  # the demo's day through what-if, three runs twice: out of the fast tier
def test_gpu_blocks_kept_as_recorded_give_the_same_results_as_computed_again(
    bundle, monkeypatch
) -> None:
    """A run whose change leaves a block of GPUs as recorded (a pump lost on cdu-2 leaves
    the other CDUs' GPUs alone) takes the block a run before computed; with nothing kept it
    computes every block again, to the same bits."""
    from twin.alerts import load_rules
    from twin.replay import whatif

    rules = load_rules(REPO / "deploy" / "alert_rules.yaml")
    names = ["cdu-2-loses-a-pump", "facility-water-plus-3c"]
    results = {}
    for budget in (0, whatif.BLOCK_CACHE_BYTES):
        monkeypatch.setattr(whatif, "BLOCK_CACHE_BYTES", budget)
        d = load(bundle)
        base, runs = whatif.run_all(d, [_scenario(n, d.site) for n in names], rules)
        kept = [k for k in d.cache if isinstance(k, tuple) and k[0] == "gpu-block"]
        assert bool(kept) == (budget > 0)
        results[budget] = [r.model_dump_json() for r in [base, *runs]]
    assert results[0] == results[whatif.BLOCK_CACHE_BYTES]


def test_a_pdu_feeding_two_racks_follows_both_racks_load_in_a_what_if(tmp_path: Path) -> None:
    """A PDU shared by two racks (r02's A feed is r01's A PDU): scaling the fleet of one of
    them moves the shared phases by the load ratio of both racks weighted by their load
    (``twin.chain.propagate.phase_load_ratio``, the live headroom's rule too), not by the
    first rack's ratio alone."""
    text = (
        (SMALL_SITE)
        .read_text()
        .replace("pdus: [pdu-r02-a, pdu-r02-b]", "pdus: [pdu-r01-a, pdu-r02-b]")
    )
    site_file = tmp_path / "shared.yaml"
    site_file.write_text(text)
    d = load(Bundle.load(simulated_bundle(tmp_path / "b", site_file)))
    more = Scenario.model_validate(
        {"name": "more", "changes": [{"op": "scale_fleet", "fleet": "infer-small", "factor": 2}]}
    )
    base = {(c.kind, c.id): c.value_end for c in component_results(d)}
    scen = {(c.kind, c.id): c.value_end for c in component_results(d, more)}
    racks_b = base["rack", "r01"] + base["rack", "r02"]
    racks_s = scen["rack", "r01"] + scen["rack", "r02"]
    assert scen["rack", "r01"] == base["rack", "r01"] and racks_s > racks_b * 1.02
    for leg in ("L1", "cb1"):
        shared = ("pdu_phase", f"pdu-r01-a/{leg}")
        assert scen[shared] / base[shared] == pytest.approx(racks_s / racks_b, rel=1e-3)
        own = ("pdu_phase", f"pdu-r01-b/{leg}")  # feeds r01 alone: as recorded
        assert scen[own] == base[own]
