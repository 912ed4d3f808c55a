"""Severity routing (the hook file's ``receivers`` and ``route``): info is a ticket, never a page.

Through the service's real delivery path: a :class:`twin.service.Service` built from a rule file
and a hook file as ``dctwin serve --rules --hooks`` builds it, its alert engine evaluating
observations, its outbox delivering over HTTP to recording PagerDuty and webhook servers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from twin.alerts import Observation, RuleFileError
from twin.alerts.hooks import parse_hook_setup
from twin.cli import app
from twin.service import Service, ServiceConfig
from twin.site import load_site

from .helpers import REPO, ROUTING_KEY, SMALL_SITE, Recorder

RULES = """
rules:
  - name: pumps_low_page
    type: threshold
    metric: cdu.pumps_running
    entity_kind: cdu
    op: "<"
    value: 1
    severity: critical
    group_by: cdu
    summary: "CDU {entity_id}: no pump running"
  - name: pumps_low_ticket
    type: threshold
    metric: cdu.pumps_running
    entity_kind: cdu
    op: "<"
    value: 2
    severity: info
    group_by: cdu
    summary: "CDU {entity_id}: {value:g} pump(s) running (ticket)"
"""


def _hooks_yaml(pd_url: str, ticket_url: str, route: str) -> str:
    return f"""
hooks:
  - {{type: pagerduty, name: pd, url: "{pd_url}/v2/enqueue", routing_key: "{ROUTING_KEY}"}}
  - {{type: webhook, name: ticket-bus, url: "{ticket_url}/alerts"}}
receivers:
  - {{name: oncall, hooks: [pd], pages: true}}
  - {{name: tickets, hooks: [ticket-bus], pages: false}}
{route}
"""


ROUTE = """route:
  receiver: oncall
  routes:
    - {match: {severity: info}, receiver: tickets}
"""


def test_info_is_delivered_to_the_ticket_receiver_never_to_the_paging_one(
    tmp_path: Path,
) -> None:
    pd, ticket = Recorder("pagerduty"), Recorder("webhook")
    pd.start()
    ticket.start()
    try:
        rules = tmp_path / "rules.yaml"
        rules.write_text(RULES)
        hooks = tmp_path / "hooks.yaml"
        hooks.write_text(_hooks_yaml(pd.url, ticket.url, ROUTE))
        service = Service(
            ServiceConfig(
                db=tmp_path / "twin.duckdb",
                site=load_site(SMALL_SITE),
                calibrate_every_s=0,
                detect_every_s=3600.0,
                rules=rules,
                hooks=hooks,
                api=False,
            )
        )
        try:
            engine = service.engine
            assert engine is not None and engine.outbox is not None
            t0 = datetime(2026, 12, 1, 12, tzinfo=UTC)

            def obs(pumps: float, at: datetime) -> Observation:
                return Observation(
                    metric="cdu.pumps_running",
                    entity_kind="cdu",
                    entity_id="cdu-1",
                    value=pumps,
                    ts=at,
                )

            # one pump of two: only the info rule holds -> a ticket
            engine.evaluate([obs(1, t0)], now=t0)
            engine.outbox.deliver(t0)
            assert [r.body["event"] for r in ticket.requests] == ["firing"]
            ticket_note = ticket.requests[0].body["notification"]
            assert (ticket_note["rule"], ticket_note["severity"]) == ("pumps_low_ticket", "info")
            assert pd.requests == []  # the info alert never reached PagerDuty
            # no pump: the critical rule holds too -> paged, and only there
            t1 = t0 + timedelta(minutes=1)
            engine.evaluate([obs(0, t1)], now=t1)
            engine.outbox.deliver(t1)
            triggers = [r.body for r in pd.requests if r.body["event_action"] == "trigger"]
            assert [b["payload"]["class"] for b in triggers] == ["pumps_low_page"]
            assert all(b["payload"]["severity"] != "info" for b in triggers)
            assert all(
                r.body["notification"]["severity"] == "info" for r in ticket.requests
            )  # the page went to on-call only
            # pumps back: each incident resolves at the receiver it fired at
            t2 = t1 + timedelta(minutes=1)
            engine.evaluate([obs(2, t2)], now=t2)
            engine.outbox.deliver(t2)
            assert [r.body["event_action"] for r in pd.requests] == ["trigger", "resolve"]
            assert [r.body["event"] for r in ticket.requests] == ["firing", "resolved"]
            # an acknowledge of the ticket goes to its receiver only
            n_pd = len(pd.requests)
            engine.acknowledge(ticket_note["dedup_key"], now=t2)
            engine.outbox.deliver(t2)
            assert len(pd.requests) == n_pd
            assert ticket.requests[-1].body["event"] == "acknowledge"
        finally:
            service.stop()
    finally:
        pd.stop()
        ticket.stop()


@pytest.mark.parametrize(
    ("route", "where", "why"),
    [
        ("route:\n  receiver: oncall\n", "route.receiver", "which pages"),
        (
            "route:\n  receiver: tickets\n  routes:\n"
            "    - {match: {team: facilities}, receiver: oncall}\n",
            "route.routes[0]",
            "severity info can reach receiver 'oncall'",
        ),
        (
            "route:\n  receiver: nobody\n",
            "route.receiver",
            "no receiver 'nobody'",
        ),
    ],
)
def test_a_route_that_lets_info_page_or_names_nothing_is_refused(
    route: str, where: str, why: str
) -> None:
    import yaml

    data = yaml.safe_load(_hooks_yaml("http://127.0.0.1:1", "http://127.0.0.1:2", route))
    with pytest.raises(RuleFileError) as exc:
        parse_hook_setup(data, "hooks.yaml")
    text = str(exc.value)
    assert "hooks.yaml" in text and where in text and why in text


def test_a_receiver_naming_an_unknown_hook_is_refused() -> None:
    data = {
        "hooks": [{"type": "webhook", "name": "a", "url": "http://127.0.0.1:1/x"}],
        "receivers": [{"name": "r", "hooks": ["a", "b"], "pages": False}],
        "route": {"receiver": "r"},
    }
    with pytest.raises(RuleFileError, match="receiver 'r' names no hook b"):
        parse_hook_setup(data, "hooks.yaml")


def test_rules_check_reports_the_routing_and_refuses_a_paging_info_route(tmp_path: Path) -> None:
    runner = CliRunner()
    rules = REPO / "deploy" / "alert_rules.yaml"
    ok = runner.invoke(
        app, ["rules", "check", str(rules), "--hooks", str(REPO / "deploy" / "alert_hooks.yaml")]
    )
    assert ok.exit_code == 0, ok.output
    lines = [ln.split("\t") for ln in ok.output.splitlines() if ln.startswith("info\t")]
    assert lines and lines[0][1] == "tickets" and "pagerduty" not in lines[0][2]
    bad = tmp_path / "hooks.yaml"
    bad.write_text(
        _hooks_yaml("http://127.0.0.1:1", "http://127.0.0.1:2", "route:\n  receiver: oncall\n")
    )
    res = runner.invoke(app, ["rules", "check", str(rules), "--hooks", str(bad)])
    assert res.exit_code == 1
    assert "route.receiver" in res.output and "which pages" in res.output
    assert "Traceback" not in res.output


def test_a_reload_swaps_the_route_in_and_refuses_one_that_lets_info_page(tmp_path: Path) -> None:
    """SIGHUP's reload (twin.alerts.reload.AlertReloader): a hook file whose route lets info
    reach a paging receiver is refused and the running route stays; a good one is swapped in."""
    from twin.alerts import AlertEngine, Delivery, Outbox, Topology, parse_rules
    from twin.alerts.reload import AlertReloader
    from twin.store import Store

    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(_hooks_yaml("http://127.0.0.1:1", "http://127.0.0.1:2", ROUTE))
    with Store(tmp_path / "t.duckdb") as store:
        outbox = Outbox(store.cursor(), [])
        engine = AlertEngine(parse_rules(RULES), Topology.from_site(load_site(SMALL_SITE)), outbox)
        reloader = AlertReloader(engine, Delivery(outbox), rules, hooks)
        assert reloader.reload()
        info = {"severity": "info"}
        rec = outbox.router.receiver_for(info)
        assert rec is not None and rec.name == "tickets"
        hooks.write_text(
            _hooks_yaml("http://127.0.0.1:1", "http://127.0.0.1:2", "route:\n  receiver: oncall\n")
        )
        assert not reloader.reload()
        rec = outbox.router.receiver_for(info)
        assert rec is not None and rec.name == "tickets"  # the running route stays
