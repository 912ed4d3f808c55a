"""The alert-quality benchmark (bench/bench_alerts.py): its scoring on hand-made faults and
pages (attribution by topology and window, lead time, incidents with more than two pages, pages
per day per 1,000 GPUs), its ground truth on hand-made true series, its fault plan, and one
short run of the harness as a user runs it.

The scoring lives in the benchmark script, so the script is loaded from its path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from harness import fault_score as ba
from twin.simulator import SiteSimulator
from twin.site import load_site

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "bench_alerts.py"
DEMO_SITE = REPO / "sample_telemetry" / "demo_site.yaml"
T0 = datetime(2026, 11, 23, tzinfo=UTC)


@pytest.fixture(scope="module")
def site():
    return load_site(DEMO_SITE)


def _case(site, kind, target, start_s, end_s, crossing_s=None):
    c = ba.FaultCase(0, kind, target, start_s, end_s, f"{kind}:{target}")
    c.related = ba.related_entities(site, kind, target)
    c.crossing_s = crossing_s
    return c


def _alert(t_s, rule, group, summary="", status="firing"):
    at = (T0 + timedelta(seconds=t_s)).isoformat()
    return {"at": at, "status": status, "rule": rule, "severity": "warning", "group": group,
            "summary": summary}  # fmt: skip


def test_attribution_by_topology_and_window(site) -> None:
    """A page is tied to a fault only when it names a related entity inside the fault's
    window plus the margin; the others are untied, and resolves are never pages."""
    plate = _case(site, "cold_plate", "trn-a03-n2:5", 3600, 7200, crossing_s=5400)
    pump = _case(site, "pump_failure", "cdu-2/pump1", 10_000, 11_000)
    phase = _case(site, "phase_creep", "pdu-d08-a/L1", 20_000, 86_400, crossing_s=30_000)
    faults = [plate, pump, phase]
    known = ba.known_ids(site)
    alerts = [
        _alert(3000, "gpu_temp_high", "rack a03", "GPU trn-a03-n2:5 4 K"),  # before the start
        _alert(4800, "gpu_temp_high", "rack a03", "GPU trn-a03-n2:5 4 K"),  # tied (group)
        _alert(5000, "gpu_temp_high", "rack a03", status="resolved"),  # tied, not a page
        _alert(7200 + 1700, "gpu_hotspot_residual", "node trn-a03-n2"),  # within the margin
        _alert(7200 + 1900, "gpu_hotspot_residual", "node trn-a03-n2"),  # past the margin
        _alert(5000, "gpu_temp_high", "rack c01", "GPU inf-c01-n1:0"),  # another rack
        # a pump failure's page names a GPU it cools (rack grouping of another kind)
        _alert(10_200, "cdu_pump_lost", "cdu cdu-2"),
        _alert(10_500, "gpu_temp_high", "site demo", "GPU trn-b01-n1:0 4 K"),  # by summary id
        _alert(25_000, "pdu_phase_breach_1h", "pdu pdu-d08-a", "PDU phase pdu-d08-a/L1 ..."),
    ]
    untied = ba.attribute(faults, alerts, T0, known, margin_s=1800)
    assert plate.pages == [4800, 8900]
    assert plate.notifications == 3
    assert pump.pages == [10_200, 10_500]
    assert phase.pages == [25_000]
    assert sorted(u["t_s"] for u in untied) == [3000, 5000, 9100]
    s = ba.score(faults, untied, days=1.0, gpus=880)
    k = s["kinds"]
    # lead: crossing (or start, with no crossing) minus the first tied page, in minutes
    assert k["cold_plate"]["lead_min"]["median"] == pytest.approx((5400 - 4800) / 60, abs=0.01)
    assert k["pump_failure"]["lead_min"]["min"] == pytest.approx((10_000 - 10_200) / 60, abs=0.01)
    assert k["phase_creep"]["lead_to_crossing_min"]["median"] == pytest.approx(5000 / 60, abs=0.01)
    assert k["pump_failure"]["lead_to_crossing_min"]["median"] is None
    assert s["crossed"] == 2 and s["paged_before_crossing"] == 2
    assert s["untied_pages"] == 3
    assert s["untied_pages_per_day_per_1000_gpus"] == pytest.approx(3 / 0.88, abs=1e-3)
    assert s["incidents_over_2_pages"] == 0
    assert s["targets"]["paged_before_crossing_share >= 0.95"]
    assert not s["targets"]["untied pages/day/1000 GPUs <= 1"]


def test_paged_after_crossing_and_incidents_over_two_pages(site) -> None:
    """A fault paged after its crossing has a negative lead and misses; a fault with three
    pages, and three untied pages of one rule and group, are incidents with > 2 pages."""
    late = _case(site, "cold_plate_decay", "trn-a01-n1:0", 0, 86_400, crossing_s=6000)
    never = _case(site, "phase_overload", "pdu-a02-a/L2", 1000, 2000, crossing_s=1000)
    known = ba.known_ids(site)
    alerts = [_alert(t, "gpu_temp_high", "rack a01") for t in (6600, 9000, 12_000)]
    alerts += [_alert(t, "gpu_temp_high", "rack c03") for t in (100, 200, 300)]
    untied = ba.attribute([late, never], alerts, T0, known, margin_s=0)
    s = ba.score([late, never], untied, days=2.0, gpus=1000)
    decay = s["kinds"]["cold_plate_decay"]
    assert decay["lead_to_crossing_min"] == {"median": -10.0, "min": -10.0}
    assert decay["paged_before_crossing"] == 0 and decay["faults_over_2_pages"] == 1
    assert s["kinds"]["phase_overload"]["paged"] == 0
    assert s["paged_before_crossing_share"] == 0.0
    assert s["untied_keys_over_2_pages"] == {"gpu_temp_high rack c03": 3}
    assert s["incidents_over_2_pages"] == 2
    assert s["untied_pages_per_day_per_1000_gpus"] == pytest.approx(1.5)
    assert not s["targets"]["no incident with > 2 pages"]
    assert not s["targets"]["cold_plate_decay median lead to crossing >= 10 min"]


def test_info_severity_is_a_ticket_and_step_faults_are_scored_apart(site) -> None:
    """An info notification (fleet_underused: a ticket) is neither a fault's page nor an
    untied page; the share paged before the crossing is also given over the faults with a
    ramp, without the step kinds (cold_plate, phase_overload) that cross at once."""
    known = ba.known_ids(site)
    ticket = {**_alert(100, "fleet_underused", "fleet infer-chat"), "severity": "info"}
    assert ba.is_ticket(ticket) and not ba.is_page(ticket)
    assert ba.is_page(_alert(100, "fleet_drained", "fleet infer-chat"))
    idle = _case(site, "fleet_idle", "infer-chat", 0, 3600)
    assert ba.attribute([idle], [ticket], T0, known, 0) == [] and idle.pages == []
    assert ba.attribute([], [ticket], T0, known, 0) == []  # not an untied page either
    step = _case(site, "phase_overload", "pdu-a02-a/L2", 1000, 2000, crossing_s=1060)
    creep = _case(site, "phase_creep", "pdu-d08-a/L1", 1000, 86_400, crossing_s=9000)
    alerts = [
        _alert(1150, "pdu_phase_over_limit", "pdu pdu-a02-a"),  # after its step crossing
        _alert(6000, "pdu_phase_breach_1h", "pdu pdu-d08-a"),  # before the creep's
    ]
    ba.attribute([step, creep], alerts, T0, known, 0)
    s = ba.score([step, creep], [], days=1.0, gpus=880)
    assert s["paged_before_crossing_share"] == 0.5
    assert s["ramped_crossed"] == 1 and s["ramped_paged_before_crossing_share"] == 1.0
    assert not s["targets"]["paged_before_crossing_share >= 0.95"]
    assert s["targets"]["faults with a ramp: paged_before_crossing_share >= 0.95"]


def test_untied_incidents_are_counted_within_one_day(site) -> None:
    """Each day is its own replay: the same rule and group paging once on each of three days
    is three incidents of one page, not one incident of three."""
    known = ba.known_ids(site)
    untied = []
    for day in range(3):
        for a in ba.attribute(
            [], [_alert(100, "fleet_underused", "fleet infer-chat")], T0, known, 0
        ):
            untied.append({**a, "day": day})
    s = ba.score([], untied, days=3.0, gpus=1000)
    assert s["untied_pages"] == 3 and s["untied_keys_over_2_pages"] == {}
    assert s["incidents_over_2_pages"] == 0


def test_reminders_are_not_pages_and_members_name_entities(site) -> None:
    """A repeat-interval reminder is not a new page; a notification's members (where the
    replay lists them) and a group given as kind and id tie it like its group does."""
    plate = _case(site, "cold_plate", "trn-a05-n1:3", 0, 7200)
    known = ba.known_ids(site)
    alerts = [
        _alert(600, "gpu_temp_high", "site demo"),
        {**_alert(1200, "gpu_temp_high", "site demo"), "reminder": True},
        {**_alert(1800, "x", "site demo"), "members": [{"entity_kind": "gpu",
                                                        "entity_id": "trn-a05-n1:3"}]},
        {**_alert(2400, "y", "site demo"), "group": {"kind": "node", "id": "trn-a05-n1"}},
    ]  # fmt: skip
    untied = ba.attribute([plate], alerts, T0, known, margin_s=0)
    assert plate.pages == [1800, 2400]
    assert [u["t_s"] for u in untied] == [600]


def test_crossing_from_true_series(site) -> None:
    """Limit crossings come from the true series: a GPU at its max operating temperature less
    the controller's margin, a PDU line over its derated limit; none outside the window."""
    from twin.chain import phase_table

    ph = phase_table(site)
    t = np.arange(0, 7200, 60.0)
    gpus = ["trn-a01-n1:0", "trn-a01-n1:1"]
    temp = np.full((len(t), 2), 60.0, np.float32)
    temp[t >= 3000, 0] = 86.6  # H200: 87 °C max operating
    cur = np.full((len(t), len(ph.ids)), 10.0, np.float32)
    j = ph.ids.index("pdu-a01-a/L2")
    cur[t >= 4200, j] = ph.limit_a[j] + 0.5
    cdu = {k: np.full((len(t), len(site.cdus)), 1.0) for k in ("heat_kw", "supply_c")}
    cdu["flow_lpm"] = np.full((len(t), len(site.cdus)), 500.0)
    cdu["return_c"] = np.full((len(t), len(site.cdus)), 35.0)
    truth = ba.Truth(t, gpus, temp, list(ph.ids), cur, [c.name for c in site.cdus], cdu)
    plate = _case(site, "cold_plate", "trn-a01-n1:0", 600, 3600)
    assert ba.crossing(site, truth, plate, margin_s=0)[0] == 3000
    other = _case(site, "cold_plate", "trn-a01-n1:1", 600, 3600)
    assert ba.crossing(site, truth, other, margin_s=0) == (None, "")
    early = _case(site, "cold_plate", "trn-a01-n1:0", 600, 2000)
    assert ba.crossing(site, truth, early, margin_s=600)[0] is None
    creep = _case(site, "phase_creep", "pdu-a01-a/L1", 1000, 7200)  # delta/neighbour lines too
    at, what = ba.crossing(site, truth, creep, margin_s=0)
    assert at == 4200 and "pdu-a01-a/L2" in what
    pump = _case(site, "pump_failure", "cdu-1/pump1", 0, 7200)
    assert ba.crossing(site, truth, pump, margin_s=0)[0] == 3000  # trn-a01 is on cdu-1


def test_untied_pages_are_classified_by_the_simulated_truth(site) -> None:
    """A page tied to no fault is a true limit state when the simulator's true quantity met the
    rule's condition over the minute before it (cdu-3 at 95 % of its heat capacity against
    cdu_capacity_low's 10 % margin), false when it did not (the same page at 40 % free); a
    forecast page is a limit state only when the true current reached its limit within the
    rule's horizon."""
    from twin.alerts import load_rules
    from twin.chain import phase_table
    from twin.chain.propagate import cdu_capacity_kw

    rules = load_rules(REPO / "deploy" / "alert_rules.yaml")
    ph = phase_table(site)
    t = np.arange(0, 4 * 3600, 10.0)
    names = [c.name for c in site.cdus]
    i = names.index("cdu-3")
    c3 = site.cdus[i]
    flow = np.full((len(t), len(names)), float(c3.max_flow_lpm))
    cap = float(cdu_capacity_kw(c3.capacity_kw, c3.max_flow_lpm, c3.max_flow_lpm))
    heat = np.full((len(t), len(names)), 1.0)
    heat[:, i] = np.where(t < 3600, 0.95 * cap, 0.60 * cap)  # 5 % free, then 40 % free
    cdu = {"heat_kw": heat, "flow_lpm": flow}
    cdu["supply_c"] = np.full_like(heat, 30.0)
    cdu["return_c"] = np.full_like(heat, 40.0)
    cur = np.full((len(t), len(ph.ids)), 10.0, np.float32)
    j = ph.ids.index("pdu-a01-a/L2")
    cur[t >= 9000, j] = ph.limit_a[j] + 1.0  # crosses at 2:30
    truth = ba.Truth(t, [], np.zeros((len(t), 0)), list(ph.ids), cur, names, cdu)
    known = ba.known_ids(site)

    def page(rule, group, summary, t_s):
        return {"rule": rule, "group": group, "summary": summary, "t_s": t_s, "at": ""}

    pages = [
        page("cdu_capacity_low", "cdu cdu-3", "CDU cdu-3: 5% of heat capacity left", 1800),
        page("cdu_capacity_low", "cdu cdu-3", "CDU cdu-3: 5% of heat capacity left", 7200),
        page("pdu_phase_breach_1h", "pdu pdu-a01-a", "PDU phase pdu-a01-a/L2 forecast", 7200),
        page("pdu_phase_breach_1h", "pdu pdu-a01-a", "PDU phase pdu-a01-a/L2 forecast", 1800),
        page("fleet_drained", "fleet infer-chat", "fleet infer-chat drained", 1800),
    ]
    ba.classify_untied(site, truth, rules, pages, known)
    assert [p["truth_class"] for p in pages] == [
        "limit_state",
        "false",
        "limit_state",
        "false",
        "false",
    ]
    assert pages[0]["truth_value"] == pytest.approx(0.05) and pages[1]["truth_value"] == (
        pytest.approx(0.40)
    )
    res = ba.score([], pages, days=1.0, gpus=1000)
    assert res["untied_pages_by_class"] == {"limit_state": 2, "false": 3}
    assert res["false_pages_per_day_per_1000_gpus"] == 3.0


def test_fault_plan_deterministic_every_kind_distinct(site) -> None:
    """The same seed draws the same faults: every kind, targets the simulator accepts, no two
    faults sharing a related entity."""
    from twin.simulator.faults import FAULT_KINDS

    a = ba.draw_faults(site, np.random.default_rng([3, 0]), 86_400, 2, 7200)
    b = ba.draw_faults(site, np.random.default_rng([3, 0]), 86_400, 2, 7200)
    c = ba.draw_faults(site, np.random.default_rng([4, 0]), 86_400, 2, 7200)
    assert [str(f) for f in a] == [str(f) for f in b] != [str(f) for f in c]
    assert sorted({f.kind for f in a}) == sorted(FAULT_KINDS)
    assert all(f.start_s >= 7200 for f in a)
    rel = [ba.related_entities(site, f.kind, f.target) for f in a]
    assert all(not (rel[i] & rel[j]) for i in range(len(a)) for j in range(i))
    SiteSimulator(site, seed=0, start=T0, rate_hz=1 / 60, faults=a)  # targets check out


def test_true_state_tracks_the_measurements(site) -> None:
    """The simulator's true_state is the noise-free value behind its messages."""
    sim = SiteSimulator(site, seed=1, start=T0, rate_hz=1 / 60)
    assert sim.true_state() == {}
    msgs = sim.step()
    st = sim.true_state()
    assert len(st["gpu_ids"]) == len(st["gpu_temp_c"]) == 880
    sample = json.loads(next(p for t, p in msgs if t.endswith("/gpu/trn-a01-n1")))
    measured = {s["id"]: s["temp_c"] for s in sample["samples"]}
    g = st["gpu_ids"].index("trn-a01-n1:0")
    assert measured["trn-a01-n1:0"] == pytest.approx(st["gpu_temp_c"][g], abs=1.5)
    assert len(st["phase_ids"]) == len(st["line_current_a"]) == 3 * len(site.pdus)
    assert len(st["breaker_ids"]) == len(st["breaker_current_a"])
    # advance() is a step without its messages: the next step's messages are the same
    other = SiteSimulator(site, seed=1, start=T0, rate_hz=1 / 60)
    other.advance()

    def samples(msgs):
        return [(t, json.loads(p)["samples"]) for t, p in msgs]

    assert samples(other.step()) == samples(sim.step())
    assert other.true_state()["gpu_temp_c"].tolist() == sim.true_state()["gpu_temp_c"].tolist()


@pytest.mark.slow  # 3 simulated hours on the live path: about 140 CPU-s, minutes on 2 vCPUs
@pytest.mark.timeout(900)
def test_harness_short_day(tmp_path) -> None:
    """The harness on one 3-hour day on the live path (the default): exit 0, the table and the
    JSON, every kind scored, the overloads (taken to 95 % of their rating) crossing their 80 %
    limit; bad input exits 1."""
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(SCRIPT), "--days", "1", "--hours", "3", "--seed", "5"]
    p = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert "targets:" in p.stdout and "| phase_creep |" in p.stdout
    r = json.loads(out.read_text())
    s = r["score"]
    assert s["faults"] == 12 and len(r["faults"]) == 12
    assert all(s["kinds"][k]["faults"] == 2 for k in s["kinds"])
    over = [f for f in r["faults"] if f["kind"] == "phase_overload"]
    assert all(f["crossing_s"] is not None and f["crossing_s"] >= f["start_s"] for f in over)
    assert r["per_day"][0]["notifications"] >= r["per_day"][0]["pages"] > 0
    assert set(s["targets"]) >= {"no incident with > 2 pages", "untied pages/day/1000 GPUs <= 1"}
    bad = subprocess.run([*cmd[:2], "--days", "0"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 1 and "--days 0" in bad.stderr and "Traceback" not in bad.stderr
    # --merge scores the days of several runs together (another seed's copy of the day here)
    twin_day = tmp_path / "r6.json"
    twin_day.write_text(json.dumps({**r, "seed": 6}))
    merged = tmp_path / "m.json"
    m = subprocess.run(
        [sys.executable, str(SCRIPT), "--merge", str(out), str(twin_day), "--json", str(merged)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert m.returncode == 0, m.stderr
    assert "merged (live): seed 5 day 0, seed 6 day 0" in m.stdout
    both = json.loads(merged.read_text())
    assert both["days"] == 2 and both["score"]["faults"] == 24
    assert both["score"]["tied_pages"] == 2 * s["tied_pages"]
    assert both["score"]["untied_pages_per_day_per_1000_gpus"] == pytest.approx(
        s["untied_pages_per_day_per_1000_gpus"], abs=1e-3
    )
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--merge", str(out), str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert again.returncode == 1 and "seed 5 day 0 is in two results" in again.stderr


def test_merge_compares_the_pages_of_the_days_both_paths_ran(tmp_path) -> None:
    """--merge of live runs beside a replay run: each path scored apart, and the pages of the
    (seed, day) pairs both ran compared; a day only one path ran is not compared."""

    def result(path: str, seed: int, days: list[tuple[int, list[str]]]) -> Path:
        f = tmp_path / f"{path}{seed}.json"
        res = {
            "path": path,
            **{"hours": 24.0, "resolution_s": 10.0, "tick_s": 10.0, "faults_per_kind": 2},
            **{"margin_min": 30.0, "gpus": 880, "site": "s", "rules": "r", "seed": seed},
            **{"wall_s": 1.0, "faults": [], "untied_pages": []},
            "per_day": [
                {"day": d, "page_keys": keys, "tickets": 0, "tickets_by_rule": {}}
                for d, keys in days
            ],
        }
        f.write_text(json.dumps(res))
        return f

    files = [
        result("live", 0, [(0, ["a|rack a01", "b|cdu cdu-1"]), (1, ["c|gpu x"])]),
        result("live", 2, [(0, ["a|rack a01"])]),
        result("replay", 0, [(0, ["a|rack a01", "d|pdu p"])]),
    ]
    out = tmp_path / "m.json"
    m = subprocess.run(
        [sys.executable, str(SCRIPT), "--merge", *map(str, files), "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert m.returncode == 0, m.stderr
    assert "merged (live): seed 0 day 0, seed 0 day 1, seed 2 day 0" in m.stdout
    assert "merged (replay): seed 0 day 0" in m.stdout
    # which code each day ran: these hand-made results record no commit
    assert "code: seed 0 days 0, 1 at not recorded; seed 2 day 0 at not recorded" in m.stdout
    res = json.loads(out.read_text())
    assert res["live"]["days"] == 3 and res["replay"]["days"] == 1
    assert res["comparison"] == {
        "days": ["seed 0 day 0"],
        "live": 2,
        "replay": 2,
        "both": 1,
        "only_live": ["seed 0 day 0: b|cdu cdu-1"],
        "only_replay": ["seed 0 day 0: d|pdu p"],
    }


def test_split_writes_each_day_apart_and_merges_to_the_same_figures(tmp_path) -> None:
    """--split of a two-day live result (two committed days of seed 2 as one run had written
    them): one result per day beside it (an existing file is not overwritten), and the days
    merged again score exactly as the whole did, so a day run again can replace that day
    alone."""
    live = REPO / "bench" / "alerts-live"
    d2, d3 = (json.loads((live / f"seed2-day{d}.json").read_text()) for d in (2, 3))
    joined = {
        **d2,
        "days": 2,
        **{k: d2[k] + d3[k] for k in ("faults", "untied_pages", "per_day")},
    }
    joined.pop("split_from", None)
    whole = tmp_path / "seed2-days2-3.json"
    whole.write_text(json.dumps(joined))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO
        )

    r = run("--split", str(whole))
    assert r.returncode == 0, r.stderr
    days = [tmp_path / "seed2-day2.json", tmp_path / "seed2-day3.json"]
    assert all(p.is_file() for p in days)
    one = json.loads(days[0].read_text())
    assert one["days"] == 1 and [d["day"] for d in one["per_day"]] == [2]
    assert {f["day"] for f in one["faults"]} == {2} and one["split_from"] == whole.name
    again = run("--split", str(whole))
    assert again.returncode == 1 and "exists: not overwritten" in again.stderr
    merged = {}
    for name, files in (("whole", [whole]), ("days", days)):
        out = tmp_path / f"{name}.out.json"
        m = run("--merge", *map(str, files), "--json", str(out))
        assert m.returncode == 0, m.stderr
        merged[name] = json.loads(out.read_text())
    for key in ("score", "faults", "untied_pages", "per_day", "tickets", "step_faults"):
        assert merged["days"][key] == merged["whole"][key], key
