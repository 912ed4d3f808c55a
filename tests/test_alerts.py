"""Alert engine: rules, for-duration, hysteresis, grouping, inhibition, silences, restart,
bad rule files and the example rule file. Hooks and the outbox over HTTP: test_alerts_hooks.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from twin.alerts import (
    AlertDb,
    AlertEngine,
    Notification,
    Observation,
    Outbox,
    RuleFileError,
    Silence,
    Topology,
    load_hooks,
    load_rules,
    parse_rules,
)
from twin.site import load_site
from twin.store import Store

from .helpers import REPO, SMALL_SITE

T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)

# The engine is metric-agnostic: these rules drive one registered GPU metric
# (twin.alerts.metrics) with temperature-like values, and the CDU pump count.
RULES = """
rules:
  - name: gpu_temp_high
    metric: hotspot.gpu.over_limit_k
    entity_kind: gpu
    op: ">="
    value: 84
    clear_value: 80
    for_s: 30
    severity: warning
    group_by: rack
    summary: "GPU {entity_id} {value:.1f} K over its limit"
  - name: cdu_pump_lost
    metric: cdu.pumps_running
    entity_kind: cdu
    op: "<"
    value: 2
    severity: critical
    group_by: cdu
    summary: "CDU {entity_id}: {value:g} pumps running"
    inhibits:
      - {rule: gpu_temp_high, along: cooling}
"""


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.from_site(load_site(SMALL_SITE))


def gpus(node: str, n: int = 8) -> list[str]:
    return [f"{node}:{i}" for i in range(n)]


R01_GPUS = gpus("trn-r01-n1") + gpus("trn-r01-n2")


def obs(metric: str, kind: str, ids: list[str], value: float, t_s: float) -> list[Observation]:
    ts = T0 + timedelta(seconds=t_s)
    return [
        Observation(metric=metric, entity_kind=kind, entity_id=i, value=value, ts=ts) for i in ids
    ]  # type: ignore[arg-type]


def temps(ids: list[str], value: float, t_s: float) -> list[Observation]:
    return obs("hotspot.gpu.over_limit_k", "gpu", ids, value, t_s)


def at(t_s: float) -> datetime:
    return T0 + timedelta(seconds=t_s)


def engine(topo: Topology, text: str = RULES, **kw: object) -> AlertEngine:
    return AlertEngine(parse_rules(text, "test.yaml"), topo, **kw)  # type: ignore[arg-type]


# ---- topology ------------------------------------------------------------------------------


def test_topology_places_gpus_in_both_trees(topo: Topology) -> None:
    g = ("gpu", "trn-r01-n2:3")
    assert topo.ancestors(g, "cooling") == [
        ("node", "trn-r01-n2"),
        ("rack", "r01"),
        ("cdu", "cdu-1"),
    ]
    power = topo.ancestors(g, "power")
    assert ("pdu_phase", "pdu-r01-a/L2") in power  # node phase L2 on each feed
    assert ("pdu_phase", "pdu-r01-b/L2") in power
    assert ("pdu", "pdu-r01-a") in power and ("pdu", "pdu-r01-b") in power
    assert topo.group_of(g, "cdu") == ("cdu", "cdu-1")
    assert topo.group_of(g, "fleet") == ("fleet", "train-small")
    assert topo.group_of(("pdu_phase", "pdu-r02-a/L1"), "pdu") == ("pdu", "pdu-r02-a")
    # air-cooled rack: no CDU; an unknown entity is its own group
    assert topo.group_of(("gpu", "inf-r02-n1:0"), "cdu") == ("gpu", "inf-r02-n1:0")
    assert topo.ancestors(("gpu", "nowhere:0"), "power") == []
    assert topo.children_of_kind(("cdu", "cdu-1"), ["rack"]) == ["r01"]


# ---- for-duration, hysteresis, grouping ---------------------------------------------------


def test_for_duration_counts_from_first_breach_and_resets(topo: Topology) -> None:
    e = engine(topo)
    g = ["trn-r01-n1:0"]
    assert e.evaluate(temps(g, 90, 0), at(0)) == []
    assert e.evaluate(temps(g, 90, 20), at(20)) == []
    assert e.evaluate(temps(g, 70, 25), at(25)) == []  # reset while pending
    assert e.evaluate(temps(g, 90, 30), at(30)) == []
    assert e.evaluate(temps(g, 90, 50), at(50)) == []  # 20 s since the new breach
    fired = e.evaluate(temps(g, 90, 60), at(60))
    assert [n.status for n in fired] == ["firing"]
    assert fired[0].starts_at == at(30)


def test_hysteresis_does_not_flap(topo: Topology) -> None:
    e = engine(topo, RULES.replace("for_s: 30", "for_s: 0"))
    g = ["trn-r01-n1:0"]
    first = e.evaluate(temps(g, 85, 0), at(0))
    assert [n.status for n in first] == ["firing"]
    for i, v in enumerate([83, 84.5, 81, 80.5, 83.9, 84.1, 81]):  # between clear and fire
        assert e.evaluate(temps(g, v, 10 + i), at(10 + i)) == []
    resolved = e.evaluate(temps(g, 79.5, 30), at(30))
    assert [n.status for n in resolved] == ["resolved"]
    assert resolved[0].dedup_key == first[0].dedup_key
    assert resolved[0].ends_at == at(30)
    assert e.evaluate(temps(g, 83, 40), at(40)) == []  # below the firing value: stays quiet
    again = e.evaluate(temps(g, 86, 50), at(50))
    assert [n.status for n in again] == ["firing"]
    assert again[0].dedup_key == first[0].dedup_key  # same incident key ...
    assert again[0].event_id != first[0].event_id  # ... a new event


def test_group_by_rack_gives_one_notification_listing_members(topo: Topology) -> None:
    e = engine(topo, RULES.replace("for_s: 30", "for_s: 0"))
    hot = ["trn-r01-n1:0", "trn-r01-n1:5", "trn-r01-n2:7"]
    out = e.evaluate(
        [*temps(hot, 88, 0), *temps(["inf-r02-n1:2"], 86, 0), *temps(["trn-r01-n2:1"], 60, 0)],
        at(0),
    )
    by_group = {(n.group.kind, n.group.id): n for n in out}
    assert set(by_group) == {("rack", "r01"), ("rack", "r02")}
    r01 = by_group[("rack", "r01")]
    assert sorted(m.entity_id for m in r01.members) == sorted(hot)
    assert r01.dedup_key == "dctwin/small/gpu_temp_high/rack/r01"
    assert "r01" in r01.description and all(g in r01.description for g in hot)
    # a member joining later is not paged again, but is listed in the resolve
    assert e.evaluate(temps(["trn-r01-n2:2"], 90, 10), at(10)) == []
    out = e.evaluate(temps([*hot, "trn-r01-n2:2", "inf-r02-n1:2"], 70, 20), at(20))
    res = {n.group.id: n for n in out}
    assert {n.status for n in out} == {"resolved"} and set(res) == {"r01", "r02"}
    assert "trn-r01-n2:2" in {m.entity_id for m in res["r01"].members}


def test_group_wait_collects_members_before_the_first_page(topo: Topology) -> None:
    text = RULES.replace("for_s: 30", "for_s: 0\n    group_wait_s: 30")
    e = engine(topo, text)
    assert e.evaluate(temps(["trn-r01-n1:0"], 90, 0), at(0)) == []
    assert e.evaluate(temps(["trn-r01-n1:0", "trn-r01-n1:1"], 90, 20), at(20)) == []
    out = e.evaluate(temps(["trn-r01-n1:0", "trn-r01-n1:1"], 90, 30), at(30))
    assert len(out) == 1 and len(out[0].members) == 2


def test_cdu_failure_one_page_gpu_alerts_inhibited(topo: Topology) -> None:
    e = engine(topo)
    sent: list[Notification] = []
    sent += e.evaluate([*obs("cdu.pumps_running", "cdu", ["cdu-1"], 2, 0), *temps(R01_GPUS, 60, 0)])
    sent += e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 0, 10), at(10))
    for t in range(20, 200, 10):
        sent += e.evaluate(
            [*obs("cdu.pumps_running", "cdu", ["cdu-1"], 0, t), *temps(R01_GPUS, 92, t)], at(t)
        )
    assert [(n.rule, n.status) for n in sent] == [("cdu_pump_lost", "firing")]
    page = sent[0]
    assert (page.group.kind, page.group.id) == ("cdu", "cdu-1")
    assert "cdu-1" in page.description and "r01" in page.description
    assert page.labels["racks"] == "r01"
    assert {a["rule"] for a in e.active()} == {"cdu_pump_lost", "gpu_temp_high"}
    # pumps back, temperatures fall: one resolve, same key; the muted GPU incident is dropped
    out = e.evaluate(
        [*obs("cdu.pumps_running", "cdu", ["cdu-1"], 2, 200), *temps(R01_GPUS, 70, 200)], at(200)
    )
    assert [(n.rule, n.status, n.dedup_key) for n in out] == [
        ("cdu_pump_lost", "resolved", page.dedup_key)
    ]
    assert e.active() == []


def test_gpu_alert_pages_once_inhibition_ends_if_still_hot(topo: Topology) -> None:
    e = engine(topo, RULES.replace("for_s: 30", "for_s: 0"))
    e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 1, 0), at(0))
    assert e.evaluate(temps(R01_GPUS[:2], 90, 10), at(10)) == []  # muted
    out = e.evaluate(
        [*obs("cdu.pumps_running", "cdu", ["cdu-1"], 2, 20), *temps(R01_GPUS[:2], 90, 20)], at(20)
    )
    assert sorted((n.rule, n.status) for n in out) == [
        ("cdu_pump_lost", "resolved"),
        ("gpu_temp_high", "firing"),
    ]


def test_inhibition_hold_keeps_muting_after_the_source_clears(topo: Topology) -> None:
    text = RULES.replace("for_s: 30", "for_s: 0").replace(
        "along: cooling}", "along: cooling, hold_s: 120}"
    )
    e = engine(topo, text)
    e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 1, 0), at(0))
    e.evaluate(temps(R01_GPUS[:2], 90, 10), at(10))
    out = e.evaluate(
        [*obs("cdu.pumps_running", "cdu", ["cdu-1"], 2, 20), *temps(R01_GPUS[:2], 90, 20)], at(20)
    )
    assert [(n.rule, n.status) for n in out] == [("cdu_pump_lost", "resolved")]
    assert e.evaluate(temps(R01_GPUS[:2], 88, 100), at(100)) == []  # still held
    out = e.evaluate(temps(R01_GPUS[:2], 88, 150), at(150))  # hold over, still hot
    assert [(n.rule, n.status) for n in out] == [("gpu_temp_high", "firing")]


@pytest.mark.parametrize("later_k", [90.0, 70.0])
def test_an_alert_freed_from_inhibition_pages_only_on_a_value_seen_since(
    topo: Topology, later_k: float
) -> None:
    """A GPU alert muted by its CDU's page, not observed since (its fleet drained, say), does
    not page with the value it was muted with when the CDU's page resolves: the next
    observation decides, a page if still hot, nothing if it cooled meanwhile."""
    e = engine(topo, RULES.replace("for_s: 30", "for_s: 0"))
    e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 1, 0), at(0))
    assert e.evaluate(temps(R01_GPUS[:2], 90, 10), at(10)) == []  # muted
    out = e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 2, 20), at(20))
    assert [(n.rule, n.status) for n in out] == [("cdu_pump_lost", "resolved")]
    assert e.evaluate([], at(600)) == []  # freed, but its last value is from t=10
    out = e.evaluate(temps(R01_GPUS[:2], later_k, 660), at(660))
    if later_k >= 84:
        assert [(n.rule, n.status) for n in out] == [("gpu_temp_high", "firing")]
        assert out[0].members[0].value == later_k
    else:
        assert out == [] and e.active() == []


def test_a_page_after_a_mute_is_headed_by_the_member_seen_since(topo: Topology) -> None:
    """When a mute ends and one member is seen hot again, the page's summary quotes that member
    and its new value, not another member's value from before the mute (still listed)."""
    e = engine(topo, RULES.replace("for_s: 30", "for_s: 0"))
    e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 1, 0), at(0))
    assert e.evaluate(temps(R01_GPUS[:2], 90, 10), at(10)) == []  # both muted at 90
    e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 2, 20), at(20))  # pump back
    out = e.evaluate(temps(R01_GPUS[:1], 86, 660), at(660))  # only the first seen since
    assert [(n.rule, n.status) for n in out] == [("gpu_temp_high", "firing")]
    page = out[0]
    assert R01_GPUS[0] in page.summary and "86" in page.summary
    assert R01_GPUS[1] not in page.summary and "90" not in page.summary
    assert page.description.index(f"{R01_GPUS[0]} (86)") < page.description.index(R01_GPUS[1])


# ---- silences ------------------------------------------------------------------------------


def test_silence_mutes_until_it_expires(topo: Topology) -> None:
    e = engine(topo, RULES.replace("for_s: 30", "for_s: 0"))
    e.silences.add(
        Silence(
            matchers={"rule": "gpu_temp_high", "group_id": "r01"},
            starts_at=at(0),
            ends_at=at(300),
            created_by="ops",
            comment="maintenance",
        )
    )
    e.silences.add(  # expired before: mutes nothing
        Silence(matchers={"rule": "cdu_pump_lost"}, starts_at=T0 - timedelta(hours=2), ends_at=T0)
    )
    assert e.evaluate(temps(["trn-r01-n1:0"], 90, 10), at(10)) == []
    pumps = e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 1, 20), at(20))
    assert [n.rule for n in pumps] == ["cdu_pump_lost"]  # not silenced ...
    e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 2, 30), at(30))  # ... and resolved
    assert e.evaluate(temps(["trn-r01-n1:0"], 90, 299), at(299)) == []
    out = e.evaluate(temps(["trn-r01-n1:0"], 90, 300), at(300))  # silence over, still hot
    assert [(n.rule, n.status) for n in out] == [("gpu_temp_high", "firing")]


def test_silence_on_one_entity_leaves_the_rest_of_its_group(topo: Topology) -> None:
    e = engine(topo, RULES.replace("for_s: 30", "for_s: 0"))
    e.silences.add(
        Silence(matchers={"entity_id": "trn-r01-n1:0"}, starts_at=at(0), ends_at=at(3600))
    )
    assert e.evaluate(temps(["trn-r01-n1:0"], 90, 0), at(0)) == []
    out = e.evaluate(temps(["trn-r01-n1:0", "trn-r01-n1:1"], 90, 10), at(10))
    assert [m.entity_id for m in out[0].members] == ["trn-r01-n1:1"]


def test_silences_live_in_the_store_and_expire(topo: Topology, tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as store:
        e = engine(topo, db=AlertDb(store))
        s = e.silences.add(Silence(matchers={"rule": "x"}, starts_at=at(0), ends_at=at(60)))
        e.silences.expire(s.id or "", at(30))
    with Store(tmp_path / "s.duckdb") as store:
        e = engine(topo, db=AlertDb(store))
        [back] = e.silences.all()
        assert back.ends_at == at(30) and back.matchers == {"rule": "x"}
        assert e.silences.active(at(10)) != [] and e.silences.active(at(30)) == []


# ---- event-like rules ----------------------------------------------------------------------


def test_drift_event_resolves_when_absent(topo: Topology) -> None:
    text = """
rules:
  - name: r_drift
    type: drift
    metric: drift.gpu.r_k_per_w
    entity_kind: gpu
    resolve_if_absent_s: 3600
    summary: "GPU {entity_id}: R drifted {value:.0%} (fleet {labels[fleet_r_k_per_w]} K/W)"
"""
    e = engine(topo, text)
    ev = Observation(
        metric="drift.gpu.r_k_per_w",
        entity_kind="gpu",
        entity_id="trn-r01-n1:3",
        value=0.25,
        ts=at(0),
        labels={"r_k_per_w": "0.0500", "fleet_r_k_per_w": "0.0400"},
    )
    [n] = e.evaluate([ev], at(0))
    assert n.summary == "GPU trn-r01-n1:3: R drifted 25% (fleet 0.0400 K/W)"
    assert n.context == {"r_k_per_w": "0.0500", "fleet_r_k_per_w": "0.0400"}
    assert e.evaluate([], at(1800)) == []
    [r] = e.evaluate([], at(4000))
    assert r.status == "resolved" and r.ends_at == at(3600)


# ---- restart -------------------------------------------------------------------------------


def test_restart_neither_repages_nor_forgets_to_resolve(topo: Topology, tmp_path: Path) -> None:
    db_path = tmp_path / "twin.duckdb"
    text = RULES.replace("for_s: 30", "for_s: 20")
    with Store(db_path) as store:
        e = AlertEngine(parse_rules(text), topo, Outbox(store, []))
        e.evaluate(temps(["trn-r01-n1:0"], 90, 0), at(0))  # pending
    with Store(db_path) as store:  # restart while pending: the timer is kept
        e = AlertEngine(parse_rules(text), topo, Outbox(store, []))
        fired = e.evaluate(temps(["trn-r01-n1:0"], 90, 20), at(20))
        assert [n.status for n in fired] == ["firing"]
    with Store(db_path) as store:  # restart while firing: no second page
        e = AlertEngine(parse_rules(text), topo, Outbox(store, []))
        assert e.evaluate(temps(["trn-r01-n1:0"], 91, 30), at(30)) == []
        assert [a["dedup_key"] for a in e.active()] == [fired[0].dedup_key]
    with Store(db_path) as store:  # and it still resolves, with the same key and start
        e = AlertEngine(parse_rules(text), topo, Outbox(store, []))
        [r] = e.evaluate(temps(["trn-r01-n1:0"], 70, 40), at(40))
        assert (r.status, r.dedup_key, r.starts_at) == (
            "resolved",
            fired[0].dedup_key,
            fired[0].starts_at,
        )
        assert e.active() == []
        # with no hooks at all, every notification is still in the history
        hist = store.con.execute(
            "SELECT status, dedup_key FROM alert_history ORDER BY created_at"
        ).fetchall()
        assert hist == [("firing", fired[0].dedup_key), ("resolved", fired[0].dedup_key)]


# ---- rule files ----------------------------------------------------------------------------


GOOD = """
rules:
  - {name: a, metric: hotspot.gpu.over_limit_k, entity_kind: gpu, op: ">", value: 80}
  - {name: b, metric: cdu.pumps_running, entity_kind: cdu, op: "<", value: 2}
"""


@pytest.mark.parametrize(
    ("text", "rule", "field"),
    [
        (GOOD.replace("value: 80}", "value: 80, colour: red}"), "'a'", "colour"),
        (GOOD.replace('op: ">"', 'op: "=>"'), "'a'", "op"),
        (GOOD.replace("name: b", "name: a"), "'a' (rules[1])", "name"),
        (
            GOOD.replace("value: 2}", "value: 2, inhibits: [{rule: zz, along: cooling}]}"),
            "'b'",
            "inhibits[0].rule",
        ),
        (
            GOOD.replace("value: 2}", "value: 2, inhibits: [{rule: a, along: sideways}]}"),
            "'b'",
            "inhibits[0].along",
        ),
        (GOOD.replace("value: 80}", "value: 80, clear_value: 85}"), "'a'", "clear_value"),
        (GOOD.replace("value: 80}", "value: 80, summary: '{nope}'}"), "'a'", "summary"),
        (
            GOOD.replace(
                "name: a, metric: hotspot.gpu.over_limit_k, ", "metric: hotspot.gpu.over_limit_k, "
            ),
            "rules[0]",
            "name",
        ),
        (
            GOOD.replace(
                'entity_kind: cdu, op: "<", value: 2',
                "entity_kind: pdu_phase, type: forecast_breach",
            ),
            "'b'",
            "horizon_s",
        ),
        (
            GOOD.replace("severity", "x") + "      - {name: c, severity: loud, metric: m,"
            " entity_kind: gpu, op: '>', value: 1}",
            "",
            "",
        ),  # wrong indentation: YAML error
    ],
)
def test_bad_rule_file_names_file_rule_and_field(
    tmp_path: Path, text: str, rule: str, field: str
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RuleFileError) as info:
        load_rules(path)
    msg = str(info.value)
    assert msg.startswith(str(path))
    if rule:
        assert f"rule {rule}" in msg and f": {field}: " in msg, msg
    else:
        assert "YAML" in msg and f"{path}:" in msg, msg


def test_reload_keeps_running_rules_when_new_file_is_bad(topo: Topology, tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.replace("for_s: 30", "for_s: 0"))
    e = AlertEngine(load_rules(path), topo)
    before = e.rules
    path.write_text(RULES.replace('op: ">="', 'op: "≥"'))
    with pytest.raises(RuleFileError, match=r"rule 'gpu_temp_high' \(rules\[0\]\): op:"):
        e.reload(path)
    assert e.rules is before
    assert [n.rule for n in e.evaluate(temps(["trn-r01-n1:0"], 90, 0), at(0))] == ["gpu_temp_high"]
    path.write_text(RULES.replace("value: 84", "value: 95"))
    assert e.reload(path).by_name()["gpu_temp_high"].threshold == 95


def test_example_rule_and_hook_files_load(topo: Topology) -> None:
    rules = load_rules(REPO / "deploy" / "alert_rules.yaml")
    assert {r.type for r in rules} == {
        "threshold",
        "forecast_breach",
        "residual",
        "drift",
        "fleet_underuse",
    }
    by = rules.by_name()
    assert by["cdu_pump_lost"].inhibits[0].rule == "gpu_temp_high"
    hooks = load_hooks(
        REPO / "deploy" / "alert_hooks.yaml",
        env={
            "DCTWIN_SLACK_WEBHOOK_URL": "http://127.0.0.1:9/slack",
            "DCTWIN_PAGERDUTY_ROUTING_KEY": "R" * 32,
        },
    )
    assert sorted(h.config.type for h in hooks) == [  # type: ignore[attr-defined]
        "alertmanager",
        "pagerduty",
        "slack",
        "webhook",
    ]
    with pytest.raises(RuleFileError, match="routing_key_env: environment variable"):
        load_hooks(REPO / "deploy" / "alert_hooks.yaml", env={"DCTWIN_SLACK_WEBHOOK_URL": "x"})
    # the example rules run on the small site
    e = AlertEngine(rules, topo)
    out = e.evaluate(obs("cdu.pumps_running", "cdu", ["cdu-1"], 1, 0), at(0))
    assert [n.rule for n in out] == ["cdu_pump_lost"]
