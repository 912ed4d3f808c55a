"""Every limit covered twice (issue 16 item 2) and the same pages live and in replay (item 3).

The shipped rule file pairs a forecast_breach rule with a breached-now threshold rule per limit;
each inhibits the other on the same entity, so one fault pages once. The what-if replay
computes the time-to-breach forecasts per minute and is evaluated by the same engine.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from twin.alerts import AlertEngine, Observation, Topology, load_rules
from twin.alerts.metrics import METRICS
from twin.chain import breach
from twin.site import load_site

from .helpers import REPO, SMALL_SITE

RULES = REPO / "deploy" / "alert_rules.yaml"
BUNDLE = REPO / "sample_telemetry" / "demo_bundle"
T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)
#: forecast rule -> its breached-now rule, per limit, in the shipped file
PAIRS = {
    "gpu_slowdown_forecast": "gpu_temp_high",
    "pdu_phase_breach_1h": "pdu_phase_over_limit",
    "rack_feed_breach_1h": "rack_feed_over_limit",
    "cdu_heat_breach_1h": "cdu_capacity_low",
    "cdu_flow_breach_1h": "cdu_flow_short",
    "loop_return_breach_1h": "loop_return_high",
    "link_breach_1h": "link_saturated",
}


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.from_site(load_site(SMALL_SITE))


def _obs(
    metric: str, kind: str, sid: str, value: float, t_s: float, excess: float | None = None
) -> Observation:
    ts = T0 + timedelta(seconds=t_s)
    return Observation(
        metric=metric,
        entity_kind=kind,  # type: ignore[arg-type]
        entity_id=sid,
        value=value,
        excess=excess,
        ts=ts,
    )


def _drift(sid: str, value: float, t_s: float, heat_w: float = 700.0) -> Observation:
    """An R-drift observation of a 0.03 K/W plate at ``heat_w``: its excess is the drift's K."""
    return _obs("drift.gpu.r_k_per_w", "gpu", sid, value, t_s, excess=value * 0.03 * heat_w)


def _run(engine: AlertEngine, minutes: list[list[Observation]]) -> list[tuple[int, str, str]]:
    """Evaluate one list of observations per minute; (minute, status, rule) of each page."""
    out = []
    for i, obs in enumerate(minutes):
        for n in engine.evaluate(obs, now=T0 + timedelta(seconds=60 * i)):
            out.append((i, n.status, n.rule))
    return out


def test_every_limit_has_a_forecast_and_a_breached_now_rule_inhibiting_each_other() -> None:
    rules = load_rules(RULES).by_name()
    for fc, now in PAIRS.items():
        assert rules[fc].type == "forecast_breach", fc
        assert rules[fc].metric.endswith("time_to_breach_p50_s") or fc == "gpu_slowdown_forecast"
        assert rules[now].type == "threshold", now
        assert now in {i.rule for i in rules[fc].inhibits}, f"{fc} must mute {now}"
        assert fc in {i.rule for i in rules[now].inhibits}, f"{now} must mute {fc}"
        # a sudden step pages through the breached-now rule: it fires first
        assert rules[now].for_s < rules[fc].for_s, (now, fc)
        assert rules[fc].entity_kind == rules[now].entity_kind
    watched = {(r.metric, r.entity_kind) for r in rules.values()}
    for name, spec in METRICS.items():
        if name.startswith("headroom."):  # every headroom metric is watched by some rule
            assert any((name, k) in watched for k in spec.kinds), name


def test_inhibition_covers_the_entity_itself_and_a_breaker_under_its_phase(topo) -> None:
    phase, breaker = ("pdu_phase", "pdu-r01-a/L1"), ("pdu_phase", "pdu-r01-a/cb1")
    assert topo.is_under(phase, phase, "power")  # X itself counts
    assert topo.is_under(breaker, phase, "power")  # a breaker sits under its phase
    assert not topo.is_under(phase, breaker, "power")
    # phases and breakers of one PDU are one incident when a rule groups by pdu
    assert topo.group_of(breaker, "pdu") == ("pdu", "pdu-r01-a")
    assert topo.group_of(phase, "pdu") == ("pdu", "pdu-r01-a")
    link = ("link", "lnk-r01-s1")
    assert topo.is_under(link, link, "power") and topo.group_of(link, "none") == link


def test_a_sudden_breach_pages_once_its_forecast_muted(topo) -> None:
    """A step over the limit: breached-now pages; the forecast (0 s) fires later, muted."""
    engine = AlertEngine(load_rules(RULES), topo)
    ph = "pdu-r01-a/L1"
    minutes = []
    for i in range(30):
        over = 3 <= i < 9
        minutes.append(
            [
                _obs("headroom.pdu_phase.a_to_limit", "pdu_phase", ph, -4.0 if over else 8, 60 * i),
                _obs(
                    "headroom.pdu_phase.time_to_breach_p50_s",
                    "pdu_phase",
                    ph,
                    0.0 if over else 7200.0,
                    60 * i,
                ),
            ]
        )
    sent = _run(engine, minutes)
    # resolved once clear for the rule's keep_firing_for_s (900 s) after minute 9, not at once
    keep_min = load_rules(RULES).by_name()["pdu_phase_over_limit"].keep_firing_for_s / 60
    assert sent == [
        (4, "firing", "pdu_phase_over_limit"),
        (9 + keep_min, "resolved", "pdu_phase_over_limit"),
    ]


def test_a_forecast_breach_pages_once_the_breach_it_foresaw_muted(topo) -> None:
    """A creep: the forecast pages ahead of the crossing; the breach that follows is muted."""
    engine = AlertEngine(load_rules(RULES), topo)
    ph = "pdu-r01-a/L1"
    minutes = []
    for i in range(40):
        a_left = 10.0 - i  # crosses the limit at minute 10, and stays over
        ttb = 0.0 if a_left <= 0 else (600.0 - 60 * i if i < 10 else 0.0)
        minutes.append(
            [
                _obs("headroom.pdu_phase.a_to_limit", "pdu_phase", ph, a_left, 60 * i),
                _obs("headroom.pdu_phase.time_to_breach_p50_s", "pdu_phase", ph, ttb, 60 * i),
            ]
        )
    sent = _run(engine, minutes)
    assert sent == [(2, "firing", "pdu_phase_breach_1h")]  # 8 minutes before the crossing
    active = {a["rule"] for a in engine.active()}
    assert active == {"pdu_phase_breach_1h", "pdu_phase_over_limit"}  # both fire, one paged


def test_phase_forecast_finds_a_creep_causally() -> None:
    """The replay's phase forecast: a creeping current is forecast to cross before it does, and
    no minute's forecast uses data after it."""
    m = 120
    t = np.arange(m, dtype=float)
    cur = 60.0 + 0.5 * np.maximum(t - 30, 0)  # +0.5 A/min from minute 30; 100 A at minute 110
    cur = (cur + np.random.default_rng(0).normal(0, 0.3, m))[:, None]
    load = np.ones((m, 1))
    b = breach.trend_breach_in_s(cur, load, np.array([100.0]))
    first = int(np.flatnonzero(np.isfinite(b[:, 0]))[0])
    # seen coming about an hour ahead (the horizon; noise on the slope), before the crossing
    assert 110 - 70 <= first < 110 - 45
    assert np.all(b[:30, 0] != b[:30, 0])  # flat before the creep: no forecast
    cut = breach.trend_breach_in_s(cur[:80], load[:80], np.array([100.0]))
    np.testing.assert_array_equal(cut, b[:80])  # causal: the future does not change the past


def test_phase_climbing_back_to_its_level_is_not_a_creep() -> None:
    """A phase that held 34 A, dipped to 9 A for 5 minutes (the other feed's fault ending, in
    bench_alerts) and climbs back is recovering: no breach forecast of its 48 A limit, though
    the climb alone is steep; the same climb to new highs is a creep and is forecast."""
    rng = np.random.default_rng(1)
    m = 120
    cur = np.full(m, 34.4) + rng.normal(0, 0.2, m)
    cur[70:75] = 9.4
    cur[75:85] = np.linspace(9.4, 34.4, 10)  # back within 10 minutes
    load = np.ones((m, 1))
    limit = np.array([48.0])
    b = breach.trend_breach_in_s(cur[:, None], load, limit)
    seen = np.isfinite(b[:, 0])
    # at most a lone minute where noise tops the hour's high: never the two minutes the
    # shipped pdu_phase_breach_1h holds (for_s 120) before it pages
    assert not (seen[1:] & seen[:-1]).any(), np.flatnonzero(seen)
    assert seen.sum() <= 2
    creep = np.full(m, 20.0) + rng.normal(0, 0.2, m)
    creep[70:] = np.linspace(20.0, 45.0, 50)  # new highs, towards the limit
    b = breach.trend_breach_in_s(creep[:, None], load, limit)
    assert np.isfinite(b[80:, 0]).any()


def test_gpu_forecast_is_the_rc_model_crossing() -> None:
    """Closed form against the chain's RC model stepped minute by minute."""
    from models.gpu_thermal import rc_simulate

    r, c, ref, p, t0, tmax = np.array([0.02]), np.array([3000.0]), 40.0, 2400.0, 60.0, 87.0
    b = breach.gpu_breach_in_s(
        np.array([[t0]]), np.array([[ref]]), np.array([[p]]), r[None, :], c[None, :], tmax
    )
    path = rc_simulate(
        np.array([t0]), np.full((61, 1), ref), np.full((61, 1), p), np.full((61, 1), r), c, 60.0
    )
    k = int(np.argmax(path[:, 0] >= tmax))
    assert path[k, 0] >= tmax > path[k - 1, 0]
    assert b[0, 0] == k * 60.0


@pytest.mark.slow  # the demo bundle's day through what-if: out of the fast tier
def test_demo_day_replay_pages_each_fault_as_one_incident_before_its_crossing(
    tmp_path: Path,
) -> None:
    import json

    from typer.testing import CliRunner

    from twin.cli import app

    res = CliRunner().invoke(
        app,
        [
            "whatif",
            str(BUNDLE),
            str(REPO / "sample_telemetry" / "scenarios" / "cdu-2-loses-a-pump.yaml"),
            "--out",
            str(tmp_path / "r"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    runs = json.loads(res.stdout[res.stdout.index("[") :])
    base = next(r for r in runs if r["name"] == "baseline")
    alerts = base["alerts"]
    pump = [(a["status"], a["group"]) for a in alerts if a["rule"] == "cdu_pump_lost"]
    assert pump == [("firing", "cdu cdu-2"), ("resolved", "cdu cdu-2")]
    # nothing else pages for cdu-2: its capacity, flow and return rules are muted by the pump
    assert {a["rule"] for a in alerts if a["group"] == "cdu cdu-2"} == {"cdu_pump_lost"}
    phase = [a for a in alerts if a["group"] == "pdu pdu-d08-a"]
    assert phase, "the phase creep on pdu-d08-a pages"
    first = phase[0]
    assert first["status"] == "firing" and first["rule"] == "pdu_phase_breach_1h"
    assert first["at"] <= "2026-11-23T15:38:00+00:00"  # the crossing: lead time, not a late page
    # one incident for the phase fault: one page, one resolve (keep_firing_for, flap detection)
    assert [(a["status"], a["rule"]) for a in phase] == [
        ("firing", "pdu_phase_breach_1h"),
        ("resolved", "pdu_phase_breach_1h"),
    ]
    # the degrading cold plate (trn-a03-n2:5, from 06:00) is one incident, first paged by the
    # model-based detectors (residual or R drift), not by the temperature threshold
    plate = [a for a in alerts if "trn-a03-n2" in a["group"] or "a03" in a["group"]]
    pages = [a for a in plate if a["status"] == "firing" and not a.get("repeat")]
    assert len(pages) == 1, pages
    assert pages[0]["rule"] in {"gpu_hotspot_residual", "gpu_r_drift"}
    assert pages[0]["at"] >= "2026-11-23T06:00:00+00:00"  # not before the fault began
    assert "trn-a03-n2:5" in pages[0]["summary"]
    assert re.search(r"K above its thermal model|thermal resistance", pages[0]["summary"])
    # every page is one of the four faults (no page not tied to a fault, reminders aside)
    firing = {a["group"] for a in alerts if a["status"] == "firing"}
    assert firing <= {
        "cdu cdu-2",
        "pdu pdu-d08-a",
        "rack a03",  # the residual and R drift group by rack (one page per rack, naming it)
        "fleet infer-chat",
        "fleet infer-embed",
    }, firing
    # fleet underuse is judged as live, on a day of data (min_coverage_s, and the report's own
    # 20 h of 24 h): none is judged on its first hours of data; by the rule of issue 29 (mean
    # activity under 0.4 and a GPU to give back at 0.7 of the p95 load) infer-chat, busy by
    # day and idle at night, is underused over the day (a ticket: info), infer-embed is not
    under = [a for a in alerts if a["rule"] == "fleet_underused"]
    assert {(a["group"], a["severity"]) for a in under} <= {("fleet infer-chat", "info")}, under
    assert all(a["at"] >= "2026-11-23T20:00:00+00:00" for a in under), under
    # the fleet drained at 18:00 for four hours (infer-embed) pages once, by the drain
    # detector, within 20 minutes, saying what it saw; no other fleet pages
    drained = [a for a in alerts if a["rule"] == "fleet_drained"]
    assert [(a["status"], a["group"]) for a in drained] == [
        ("firing", "fleet infer-embed"),
        ("resolved", "fleet infer-embed"),
    ], drained
    assert "2026-11-23T18:00:00+00:00" < drained[0]["at"] <= "2026-11-23T18:20:00+00:00"
    assert "(previous 1 h)" in drained[0]["summary"] and "% down" in drained[0]["summary"]
    # the forecast and the breached-now rule never stand paged at the same time
    open_: set[str] = set()
    for a in phase:
        if a["status"] == "firing":
            assert not open_, f"{a['rule']} paged while {open_} was open"
            open_.add(a["rule"])
        else:
            open_.discard(a["rule"])


def test_live_detector_emits_every_limit_now_and_its_time_to_breach() -> None:
    """twin.analysis.detect.observations: each headroom row gives its metric now and its forecast;
    no breach within the horizon is twice the horizon, labelled beyond_horizon."""
    from twin.analysis.detect import Detection, observations
    from twin.analysis.headroom import HeadroomReport, HeadroomRow
    from twin.analysis.hotspots import HotSpotReport

    def row(kind: str, rid: str, quantity: str, limit: float, now: float, b50, b90=None):
        return HeadroomRow(
            kind=kind,  # type: ignore[arg-type]
            id=rid,
            quantity=quantity,
            unit="",
            limit=limit,
            value_now=now,
            headroom_now=limit - now,
            headroom_min_p50=None,
            headroom_min_p90=None,
            breach_in_s_p50=b50,
            breach_in_s_p90=b90,
            basis="persistence, calibrated" if kind == "gpu" else "",
        )

    rows = [
        row("gpu", "n1:0", "temp_c", 87.0, 80.0, None, 600.0),
        row("pdu_phase", "pdu-a/cb1", "current_a", 100.0, 90.0, 1200.0),
        row("rack", "r01", "power_kw", 40.0, 41.0, 0.0),
        row("cdu", "cdu-1", "heat_kw", 500.0, 400.0, None),
        row("cdu", "cdu-1", "flow_lpm", 900.0, 700.0, 1800.0),
        row("loop", "cdu-1", "return_temp_c", 45.0, 40.0, None),
        row("link", "lnk-1", "traffic_gbps", 400.0, 100.0, None),
    ]
    now = T0
    d = Detection(
        now=now,
        headroom=HeadroomReport(
            computed_at=now,
            data_until=now,
            horizon_s=3600.0,
            step_s=60.0,
            load_basis="persistence",
            rows=rows,
            problems=[],
        ),
        hotspots=HotSpotReport(
            computed_at=now,
            data_until=now,
            k_sigma=3.0,
            minutes=5,
            hotspots=[],
            residual_sigma={},
            rack_inlet_c={},
            problems=[],
            model_run=2,  # a fit on this site's telemetry: the GPU forecast is armed
        ),
        pumps=[],
        fleets=None,
    )
    got = {(o.metric, o.entity_kind, o.entity_id): o for o in observations(d)}
    want = {
        ("headroom.gpu.time_to_breach_p90_s", "gpu", "n1:0"): 600.0,
        ("headroom.pdu_phase.a_to_limit", "pdu_phase", "pdu-a/cb1"): 10.0,
        ("headroom.pdu_phase.time_to_breach_p50_s", "pdu_phase", "pdu-a/cb1"): 1200.0,
        ("headroom.rack.kw_to_limit", "rack", "r01"): -1.0,
        ("headroom.rack.time_to_breach_p50_s", "rack", "r01"): 0.0,
        ("headroom.cdu.capacity_free_fraction", "cdu", "cdu-1"): 0.2,
        ("headroom.cdu.time_to_breach_p50_s", "cdu", "cdu-1"): 7200.0,
        ("headroom.cdu.flow_lpm_to_limit", "cdu", "cdu-1"): 200.0,
        ("headroom.cdu.flow_time_to_breach_p50_s", "cdu", "cdu-1"): 1800.0,
        ("headroom.loop.k_to_return_limit", "cdu", "cdu-1"): 5.0,
        ("headroom.loop.time_to_breach_p50_s", "cdu", "cdu-1"): 7200.0,
        ("headroom.link.gbps_to_limit", "link", "lnk-1"): 300.0,
        ("headroom.link.time_to_breach_p50_s", "link", "lnk-1"): 7200.0,
    }
    for key, value in want.items():
        assert key in got, key
        assert got[key].value == pytest.approx(value), key
        beyond = got[key].labels.get("beyond_horizon") == "true"
        assert beyond == (value == 7200.0), key
    for o in got.values():
        assert o.metric in METRICS and o.entity_kind in METRICS[o.metric].kinds


def test_replay_feed_takes_per_minute_series() -> None:
    """offer_series: one row per evaluation minute, NaN for no observation, evaluated by the
    engine like any metric."""
    from types import SimpleNamespace

    from twin.alerts import parse_rules
    from twin.replay import alert_feed

    site = load_site(SMALL_SITE)
    n, dt = 60 * 6, 10.0  # an hour at 10 s
    d = SimpleNamespace(
        n=n, dt_s=dt, site=site, times=lambda: [T0 + timedelta(seconds=k * dt) for k in range(n)]
    )
    rules = parse_rules(
        """
rules:
  - name: gpu_hotspot_residual
    type: residual
    metric: hotspot.gpu.residual_sigma
    entity_kind: gpu
    op: ">="
    value: 4
    clear_value: 2
    for_s: 600
    group_by: node
"""
    )
    feed = alert_feed.AlertFeed(rules, d)
    assert len(feed.rows) == 60 and feed.eval_times[1] == T0 + timedelta(minutes=1)
    z = np.full((60, 2), np.nan)
    z[20:40, 0] = 5.0  # 20 minutes over 4 sigma, then no report
    z[:, 1] = 1.0
    ids = ["trn-r01-n1:0", "trn-r01-n1:1"]
    feed.offer_series("hotspot.gpu.residual_sigma", "gpu", ids, z, excess=z * 1.0)
    assert [w[2] for w in feed.watched] == ["trn-r01-n1:0"]  # the quiet GPU is not kept
    sent = feed.evaluate()
    assert [(a["status"], a["at"][11:16]) for a in sent] == [("firing", "14:30")]
    # 5 sigma of a 0.5 K sigma is 2.5 K: under the rule's default 3 K excess, no page
    small = alert_feed.AlertFeed(rules, d)
    small.offer_series("hotspot.gpu.residual_sigma", "gpu", ids, z, excess=z * 0.5)
    assert small.evaluate() == []
    with pytest.raises(ValueError, match="one row per evaluation minute"):
        feed.offer_series("hotspot.gpu.residual_sigma", "gpu", ["x"], np.zeros((59, 1)))
    # labels per column, (M, N) arrays formatted per name, rendered for the kept columns only
    feed2 = alert_feed.AlertFeed(rules, d)
    measured = np.full((60, 2), 80.04)
    measured[:, 1] = np.nan
    feed2.offer_series(
        "hotspot.gpu.residual_sigma",
        "gpu",
        ["trn-r01-n1:0", "trn-r01-n1:1"],
        z,
        {"measured_c": measured, "basis": ["x"] * 60},
        {"measured_c": ".1f"},
    )
    assert len(feed2.watched) == 1
    assert feed2.labels[0]["measured_c"][25] == "80.0" and feed2.labels[0]["basis"][0] == "x"
    with pytest.raises(ValueError, match="label 'measured_c' of shape"):
        feed2.offer_series(
            "hotspot.gpu.residual_sigma", "gpu", ["a", "b"], z, {"measured_c": measured[:, :1]}
        )


def test_a_step_when_the_other_feeds_fault_ends_is_not_a_creep() -> None:
    """The shape of seed 0's untied phase forecasts (bench_alerts, pdu-d07-b/L3): a phase that
    held 19 A steps to 45 A as the other feed's overload trips onto it, the racks' load steps
    with it, and 5 minutes later the load falls back while this feed keeps its new share (the
    other feed's fault ended). The load does not explain the current there, but a level shift
    is a step, not a trend: no breach forecast of its 100 A limit, though the current is at
    new highs. The same window with a real creep onto the new level still forecasts one."""
    rng = np.random.default_rng(2)
    m = 120
    cur = 19.0 + rng.normal(0, 0.6, m)
    load = 26_800.0 + rng.normal(0, 400, m)
    load[50:65] += 23_000  # the racks' load reading moves with the other feed's fault
    cur[65:71] = 46.0 + rng.normal(0, 1.5, 6)  # tripped onto this feed
    load[65:71] = 88_000 + rng.normal(0, 2500, 6)
    cur[71:] = 42.0 + rng.normal(0, 2.5, m - 71)  # the fault ended: this feed keeps its share
    load[71:] = 57_000 + rng.normal(0, 3500, m - 71)
    limit = np.array([100.0])
    b = breach.trend_breach_in_s(cur[:, None], load[:, None], limit)
    seen = np.isfinite(b[:, 0])
    # never the two minutes in a row that the shipped pdu_phase_breach_1h holds (for_s 120)
    assert not (seen[1:] & seen[:-1]).any(), np.flatnonzero(seen)
    # a creep onto the same phase after the same step: forecast, before it crosses
    creep = cur.copy()
    creep[80:] = 42.0 + 1.0 * np.arange(m - 80) + rng.normal(0, 0.6, m - 80)  # 100 A at ~138
    b = breach.trend_breach_in_s(creep[:, None], load[:, None], limit)
    found = np.flatnonzero(np.isfinite(b[:, 0]))
    assert found.size and 80 < found[0] <= 100, found


def test_a_decaying_plate_idle_for_hours_stays_one_incident(topo) -> None:
    """Seed 1's 3-page incident (bench_alerts, trn-a08-n3:0): R drift pages a decaying cold
    plate; its GPU then idles for almost 4 hours (its fleet drained), when R cannot be
    re-estimated, so the drift detector reports nothing; the plate has not healed, and once
    the load is back the GPU is at its limit at once. One fault, one incident: the drift stays
    open while unmeasured, and it mutes the temperature page that follows."""
    rules = load_rules(RULES)
    engine = AlertEngine(rules, topo)
    gpu = "trn-r01-n1:0"
    minutes: list[list[Observation]] = []
    for i in range(360):
        t = 60 * i
        if i < 50:  # loaded, R climbing past +35 %
            obs = [
                _drift(gpu, 0.30 + 0.01 * i, t),
                _obs("headroom.gpu.k_to_slowdown", "gpu", gpu, 20.0 - 0.1 * i, t),
            ]
        elif i < 280:  # idle: no R estimate, cool
            obs = [_obs("headroom.gpu.k_to_slowdown", "gpu", gpu, 40.0, t)]
        else:  # loaded again: at its limit at once, R re-estimated at +210 %
            obs = [_obs("headroom.gpu.k_to_slowdown", "gpu", gpu, 0.0, t)]
            if i >= 285:
                obs.append(_drift(gpu, 2.1, t))
        minutes.append(obs)
    sent = _run(engine, minutes)
    firing = [(i, r) for i, s, r in sent if s == "firing"]
    assert len(firing) == 1 and firing[0][1] == "gpu_r_drift", sent
    assert not [s for s in sent if s[1] == "resolved"], sent  # still open: not fixed


def test_minute_means_are_the_trailing_window_means_with_or_without_gaps() -> None:
    """The live "now" value per evaluation row: the mean of the finite samples of the last
    NOW_WINDOW_S up to it (NaN where none); a column's figures do not depend on whether another
    column has gaps."""
    from twin.chain.breach import NOW_WINDOW_S

    rng = np.random.default_rng(3)
    dt = 10.0
    w = round(NOW_WINDOW_S / dt)
    x = (300.0 + 100.0 * rng.random((600, 4))).astype(np.float32)
    rows = np.arange(0, 600, 6) + 5
    rows[0] = 0  # a row before a whole window
    full = breach.minute_means(x, rows, dt)
    for i, r in enumerate(rows):
        want = x[max(0, r + 1 - w) : r + 1].astype(float).mean(axis=0)
        np.testing.assert_allclose(full[i], want, rtol=1e-12)
    gappy = x.copy()
    gappy[:, 3] = np.nan
    gappy[100:130, 2] = np.nan
    part = breach.minute_means(gappy, rows, dt)
    np.testing.assert_array_equal(part[:, :2], full[:, :2])
    assert np.isnan(part[:, 3]).all()
    i = int(np.flatnonzero(rows == 119)[0])  # a window wholly in the gap: no value
    assert np.isnan(part[i, 2]) and np.isfinite(part[i + 2, 2])


def test_minute_means_of_a_replays_minutes_are_the_general_paths_to_the_bit() -> None:
    """A replay's rows (one every window, from row 0) take the tiled path of minute_means: the
    same sums in the same order as the gathers of any other rows, so the same bits, with gaps
    or none, float32 or float64, one column or many, and steps that do not divide a minute."""
    rng = np.random.default_rng(11)
    for dt in (1.0, 7.0, 10.0, 15.0, 60.0):
        per = max(1, round(60.0 / dt))
        for n in (1, per, per + 1, 97, 1001):
            for shape, dtype, gaps in (
                ((n,), np.float64, 0.2),
                ((n, 5), np.float32, 0.2),
                ((n, 5), np.float32, 0.0),  # no gap: the path that adds without a mask
            ):
                x = (50.0 + 10.0 * rng.standard_normal(shape)).astype(dtype)
                x[rng.random(shape) < gaps] = np.nan
                rows = np.arange(0, n, per)
                tiled = breach.minute_means(x, rows, dt)
                # the same rows as a gather: one row prepended and dropped takes the general path
                general = breach.minute_means(x, np.concatenate([[0], rows]), dt)[1:]
                np.testing.assert_array_equal(tiled, general)


def test_the_replay_takes_the_live_headrooms_last_minute_slope_and_model_bias() -> None:
    """The replay's per-row slope over the trailing minute is the live headroom's (the minute
    aggregates of the window ending at the newest sample), and its GPU forecast is the closed
    form from the measured temperature less the model's level error, against the limit less
    it: a model 49 K too hot at a flat load forecasts no breach."""
    from models import thermal_watch as tw

    rng = np.random.default_rng(5)
    dt = 10.0
    x = 50.0 + np.cumsum(rng.normal(0, 0.3, (600, 3)), axis=0)
    rows = np.arange(5, 600, 6)
    slopes = breach.minute_slopes(x, rows, dt)
    for i, r in enumerate(rows):
        _, _, live = tw.minute_aggregates(x[r - 5 : r + 1], x[r - 5 : r + 1], dt)
        np.testing.assert_allclose(slopes[i], live[-1], rtol=1e-12)
    # 700 W at 51 °C over 30 °C coolant: the true R is 0.03 K/W, the model's 0.1 (100 °C)
    t, ref, p, r, c = (np.array([[v]]) for v in (51.0, 30.0, 700.0, 0.1, 400.0))
    bias = tw.model_bias_k(t, p, np.zeros((1, 1)), ref, r, c)
    assert float(bias[0, 0]) == pytest.approx(-49.0)
    raw = breach.gpu_breach_in_s(t, ref, p, r, c, np.array([[87.0]]))
    fixed = breach.gpu_breach_in_s(t - bias, ref, p, r, c, 87.0 - bias)
    assert np.isfinite(raw[0, 0]) and np.isnan(fixed[0, 0])


def test_the_replay_forecasts_a_gpu_as_the_live_headroom_does() -> None:
    """One figure, one answer: ``headroom.gpu.time_to_breach_p90_s`` from the replay's closed
    form (every minute's row) equals the live headroom's stepped path for the same present
    values and a flat p90 load ratio, on GPUs near their limit at various activities: the
    ratio scales their activity on the calibrated curve in both (not their power), one breaches
    now, one never, the rest within the hour or past it."""
    from models import thermal_watch as tw
    from twin.chain import propagate, resolve
    from twin.site.index import index_site

    site = load_site(SMALL_SITE)
    idx = index_site(site)
    gp = resolve(site, idx, {}).gpu
    g = len(idx.gpu_ids)
    rng = np.random.default_rng(11)
    act = rng.uniform(0.35, 0.95, g)
    act[-1] = np.nan  # no activity telemetry: its power scales with the ratio
    power = np.where(np.isfinite(act), propagate.gpu_power_w(np.nan_to_num(act), gp), 600.0)
    ref = np.full(g, 32.0)
    r = np.asarray(gp.r_k_per_w, float) * rng.uniform(0.9, 1.1, g)
    temp = gp.max_temp_c - rng.uniform(0.5, 12.0, g)
    temp[0] = gp.max_temp_c[0] + 1.0  # over its limit now
    ratio = np.full(g, 1.35)
    ratio[1] = 1.0  # a flat load on a GPU far below its limit: never
    temp[1] = gp.max_temp_c[1] - 30.0
    cap = np.asarray(gp.limit_w, float)

    # live: the stepped p90 path of twin.analysis.headroom from the last minute's values
    bias = tw.model_bias_k(temp, power, np.zeros(g), ref + gp.offset_k, r, gp.c_j_per_k)
    path = breach.gpu_temp_path(
        temp, ref, power, act, bias, np.tile(ratio, (61, 1)), cap, r, gp, 60.0
    )
    live = breach.breach_in_s(gp.max_temp_c[None, :] - path, 60.0)

    # replay: two minutes of the same constant values at 10 s, judged at the last row
    def series(v: np.ndarray) -> np.ndarray:
        return np.tile(v, (12, 1))

    s = breach.GpuSeries(
        series(temp), series(power), series(act), series(ref + gp.offset_k), np.array([11]), 10.0
    )
    replay = breach.gpu_p90_breach_in_s(s, r[None, :], ratio[None, :], cap[None, :], gp)[0]

    expect = np.where(np.isfinite(live), live, 2 * breach.HORIZON_S)
    np.testing.assert_array_equal(replay, expect)
    assert replay[0] == 0.0 and replay[1] == 2 * breach.HORIZON_S
    inside = (replay > 0) & (replay <= breach.HORIZON_S)
    assert inside.sum() >= 2 and (replay[2:] == 2 * breach.HORIZON_S).any()
