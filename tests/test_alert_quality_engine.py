"""One incident per fault: keep_firing_for, flap detection and repeat intervals in the alert
engine, each on a hand-built observation series, and their state across an engine restart."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from twin.alerts import AlertEngine, Notification, Observation, Outbox, Topology, parse_rules
from twin.site import load_site
from twin.store import Store

from .helpers import SMALL_SITE, Recorder, check_schemas, hooks_for

T0 = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)
GPU = "trn-r01-n1:0"

# A temperature-like metric: fires at >= 84, clears below 80 (hysteresis), no for_s.
BASE = """
rules:
  - name: gpu_hot
    metric: hotspot.gpu.over_limit_k
    entity_kind: gpu
    op: ">="
    value: 84
    clear_value: 80
    severity: warning
    group_by: rack
"""


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.from_site(load_site(SMALL_SITE))


def at(t_s: float) -> datetime:
    return T0 + timedelta(seconds=t_s)


def rules(**fields: object) -> str:
    return BASE + "".join(f"    {k}: {v}\n" for k, v in fields.items())


def step(e: AlertEngine, t_s: float, value: float | None) -> list[Notification]:
    """One evaluation at ``t_s``: the GPU reports ``value`` (None: reports nothing)."""
    obs = (
        []
        if value is None
        else [
            Observation(
                metric="hotspot.gpu.over_limit_k",
                entity_kind="gpu",
                entity_id=GPU,
                value=value,
                ts=at(t_s),
            )
        ]
    )
    return e.evaluate(obs, at(t_s))


def run(e: AlertEngine, series: Iterable[tuple[float, float | None]]) -> list[Notification]:
    out: list[Notification] = []
    for t_s, v in series:
        out += step(e, t_s, v)
    return out


def oscillate(start_s: float, cycles: int, hot_s: float, cold_s: float, every_s: float = 60):
    """A cold plate on a training fleet: ``hot_s`` at 86, ``cold_s`` at 78 (checkpoint dips),
    sampled every ``every_s``; yields (t, value) and ends after the last cold spell."""
    t = start_s
    for _ in range(cycles):
        end = t + hot_s
        while t < end:
            yield t, 86.0
            t += every_s
        end = t + cold_s
        while t < end:
            yield t, 78.0
            t += every_s


def cold(start_s: float, dur_s: float, every_s: float = 60):
    t = start_s
    while t <= start_s + dur_s:
        yield t, 78.0
        t += every_s


# ---- keep_firing_for ---------------------------------------------------------------------


def test_keep_firing_for_holds_the_incident_across_a_short_clear(topo: Topology) -> None:
    e = AlertEngine(parse_rules(rules(keep_firing_for_s=300)), topo)
    [page] = step(e, 0, 86)
    assert page.status == "firing"
    # cleared at 60 s; back at 240 s (82: on the alert side of clear_value) within 300 s
    assert run(e, [(60, 79), (120, 79), (180, 79), (240, 82), (300, 79)]) == []
    [open_] = e.active()
    assert open_["dedup_key"] == page.dedup_key and open_["notified"]
    # cleared again at 300 s: still firing at 599 s, resolved by the first report past 600 s
    assert run(e, [(420, 79), (599, 79)]) == []
    [res] = step(e, 600, 79)
    assert (res.status, res.dedup_key, res.starts_at) == ("resolved", page.dedup_key, at(0))
    assert res.ends_at == at(600)
    assert e.active() == []
    # the same series without keep_firing_for: resolved at the first clear, paged again
    plain = AlertEngine(parse_rules(rules()), topo)
    notes = run(plain, [(0, 86), (60, 79), (240, 86)])
    assert [n.status for n in notes] == ["firing", "resolved", "firing"]


def test_keep_firing_for_runs_after_an_absent_resolve(topo: Topology) -> None:
    e = AlertEngine(parse_rules(rules(keep_firing_for_s=600, resolve_if_absent_s=120)), topo)
    assert [n.status for n in step(e, 0, 86)] == ["firing"]
    # nothing reported from 0 s: absent from 120 s, kept firing until 720 s
    assert run(e, [(300, None), (700, None)]) == []
    [res] = step(e, 800, None)
    assert res.status == "resolved" and res.ends_at == at(720)


# ---- flap detection -------------------------------------------------------------------------


def test_flapping_with_keep_firing_is_one_incident_two_notifications(topo: Topology) -> None:
    text = rules(keep_firing_for_s=300, flap_changes=4, flap_window_s=3600, flap_stable_s=1800)
    e = AlertEngine(parse_rules(text), topo)
    # 4 h of a cold plate dipping out every half hour, the dips growing past keep_firing_for
    series = [
        *oscillate(0, 4, hot_s=1560, cold_s=240),
        *oscillate(7200, 4, hot_s=1200, cold_s=600),
        *cold(14400, 1860),
    ]
    notes = run(e, series)
    assert [(n.status, n.flapping) for n in notes] == [("firing", False), ("resolved", True)]
    assert notes[0].dedup_key == notes[1].dedup_key and notes[1].starts_at == at(0)
    # resolved once clear for flap_stable_s from the start of the last dip (13800 s)
    assert notes[1].ends_at == at(13800 + 1800)
    # the control: keep_firing_for alone pages every long dip again
    plain = AlertEngine(parse_rules(rules(keep_firing_for_s=300)), topo)
    assert len(run(plain, series)) > 2


def test_flapping_incident_gives_at_most_two_notifications(topo: Topology) -> None:
    e = AlertEngine(parse_rules(rules(flap_changes=4, flap_window_s=3600)), topo)
    seen_flapping: list[bool] = []
    notes: list[Notification] = []
    for t_s, v in [*oscillate(0, 12, hot_s=600, cold_s=300), *cold(10800, 3660)]:
        notes += step(e, t_s, v)
        seen_flapping.append(any(a["flapping"] for a in e.active()))
    # fires (1), clears (2), fires (3), clears (4): flapping from the 4th change; the
    # incidents before it were paged as usual, the flapping one pages once and resolves once
    assert [n.status for n in notes] == ["firing", "resolved", "firing", "resolved"]
    incidents: dict[tuple[str, datetime], list[Notification]] = {}
    for n in notes:
        incidents.setdefault((n.dedup_key, n.starts_at), []).append(n)
    assert all(len(v) <= 2 for v in incidents.values())
    last = incidents[(notes[2].dedup_key, notes[2].starts_at)]
    assert [(n.status, n.flapping) for n in last] == [("firing", False), ("resolved", True)]
    # clear from the last dip (10500 s) for flap_stable_s (default: flap_window_s)
    assert last[1].ends_at == at(10500 + 3600)
    assert any(seen_flapping) and e.active() == []
    # flapping ended with the resolve: the count starts again, a new fault pages normally
    [again] = step(e, 20000, 86)
    assert (again.status, again.flapping) == ("firing", False)


def test_changes_spread_wider_than_the_flap_window_are_not_flapping(topo: Topology) -> None:
    e = AlertEngine(parse_rules(rules(flap_changes=4, flap_window_s=1800)), topo)
    notes = run(e, oscillate(0, 4, hot_s=1200, cold_s=1200))  # 4 changes per 2400 s
    assert [n.status for n in notes] == ["firing", "resolved"] * 4
    assert not any(n.flapping for n in notes)


# ---- repeat interval ------------------------------------------------------------------------


def test_repeat_interval_sends_reminders_with_the_same_key(topo: Topology) -> None:
    e = AlertEngine(parse_rules(rules(repeat_interval_s=900)), topo)
    notes = run(e, [(t, 86.0) for t in range(0, 3000, 60)])
    assert [n.status for n in notes] == ["firing"] * 4
    assert [n.repeat for n in notes] == [0, 1, 2, 3]
    assert {n.dedup_key for n in notes} == {notes[0].dedup_key}
    assert {n.starts_at for n in notes} == {at(0)}
    assert len({n.event_id for n in notes}) == 4  # each reminder its own event
    [res] = step(e, 3000, 70)
    assert (res.status, res.repeat) == ("resolved", 0)


def test_reminders_are_spaced_by_the_interval_and_stop_when_acknowledged(
    topo: Topology,
) -> None:
    e = AlertEngine(parse_rules(rules(repeat_interval_s=900)), topo)
    times: list[float] = []
    for t in range(0, 2000, 60):
        times += [t for n in step(e, t, 86) if n.repeat]
    assert times == [900, 1800]
    [open_] = e.active()
    assert open_["repeat"] == 2
    e.acknowledge(open_["dedup_key"], at(2000))
    assert run(e, [(t, 86.0) for t in range(2040, 5000, 60)]) == []


def test_a_flapping_incident_gets_no_reminders(topo: Topology) -> None:
    text = rules(keep_firing_for_s=300, repeat_interval_s=900, flap_changes=4)
    e = AlertEngine(parse_rules(text), topo)
    notes = run(e, oscillate(0, 6, hot_s=1200, cold_s=120))
    # reminders until flapping (the 4th change, at 2520 s), none after
    assert [n.repeat for n in notes] == [0, 1, 2]
    assert [n.flapping for n in notes] == [False, False, False]


# ---- restart -------------------------------------------------------------------------------


def test_keep_firing_flapping_and_reminders_survive_a_restart(
    topo: Topology, tmp_path: Path
) -> None:
    db = tmp_path / "twin.duckdb"
    text = rules(keep_firing_for_s=300, repeat_interval_s=900, flap_changes=4, flap_stable_s=1800)

    def engine(store: Store) -> AlertEngine:
        return AlertEngine(parse_rules(text), topo, Outbox(store, []))

    with Store(db) as store:  # fires, first reminder, then clears: keep_firing_for runs
        notes = run(engine(store), [(0, 86), (600, 86), (900, 86), (960, 78)])
        assert [n.repeat for n in notes] == [0, 1]
    with Store(db) as store:  # restart inside keep_firing_for: back hot is the same alert
        e = engine(store)
        assert run(e, [(1200, 86), (1260, 86)]) == []
        assert [(a["repeat"], a["flapping"]) for a in e.active()] == [(1, False)]
        [rem] = step(e, 1800, 86)  # the reminder clock survived too
        assert rem.repeat == 2
        assert run(e, [(1860, 78)]) == []  # clears: the 4th change, flapping
        e.acknowledge(rem.dedup_key, at(1870))
    with Store(db) as store:  # the acknowledgement is kept
        e = engine(store)
        assert [g.acknowledged for g in e._groups.values()] == [True]
    with Store(db) as store:  # restart while flapping: held open, no reminders
        e = engine(store)
        assert [a["flapping"] for a in e.active()] == [True]
        assert run(e, oscillate(1920, 3, hot_s=600, cold_s=900, every_s=300)) == []
    with Store(db) as store:  # and it resolves once, stable, as flapping
        e = engine(store)
        notes = run(e, cold(6420, 1800, every_s=300))
        assert [(n.status, n.flapping, n.starts_at) for n in notes] == [("resolved", True, at(0))]
        hist = store.con.execute("SELECT status FROM alert_history ORDER BY created_at").fetchall()
        assert [h[0] for h in hist] == ["firing", "firing", "firing", "resolved"]


# ---- what the hooks receive ----------------------------------------------------------------


def test_a_reminder_reaches_every_hook_as_the_same_incident(
    topo: Topology, tmp_path: Path, servers: dict[str, Recorder]
) -> None:
    now = [at(0)]
    with Store(tmp_path / "twin.duckdb") as store:
        outbox = Outbox(store, hooks_for(servers), lambda: now[0])
        e = AlertEngine(parse_rules(rules(repeat_interval_s=900)), topo, outbox)
        for t_s, v in [(0, 86), (600, 86), (900, 86), (1000, 70)]:
            now[0] = at(t_s)
            step(e, t_s, v)
            outbox.deliver()
    check_schemas(servers)
    pd = [r.body for r in servers["pagerduty"].requests]
    assert [b["event_action"] for b in pd] == ["trigger", "trigger", "resolve"]
    assert len({b["dedup_key"] for b in pd}) == 1
    assert [
        pd[0]["payload"]["custom_details"]["repeat"],
        pd[1]["payload"]["custom_details"]["repeat"],
    ] == [0, 1]
    am = [r.body[0] for r in servers["alertmanager"].requests]
    assert len(am) == 3 and all(a["labels"] == am[0]["labels"] for a in am)  # one alert
    assert [a["annotations"].get("repeat") for a in am] == [None, "1", None]
    hook = [r.body for r in servers["webhook"].requests]
    assert [(b["event"], b["notification"]["repeat"]) for b in hook] == [
        ("firing", 0),
        ("firing", 1),
        ("resolved", 0),
    ]
    assert len({b["event_id"] for b in hook}) == 3
    slack = [r.body["text"] for r in servers["slack"].requests]
    assert "[FIRING, REMINDER 1]" in slack[1] and "REMINDER" not in slack[0]
