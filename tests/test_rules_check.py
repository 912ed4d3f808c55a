"""`dctwin rules check FILE`: validation naming rule and field, and the limits no rule covers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from twin.cli import app

from .helpers import REPO

# (limit, entity kind, breached-now metric, op, value, forecast metric): every limit twice
LIMITS = [
    ("gpu", "gpu", "headroom.gpu.k_to_slowdown", "<=", 5, "headroom.gpu.time_to_breach_p90_s"),
    (
        "pdu",
        "pdu_phase",
        "headroom.pdu_phase.a_to_limit",
        "<=",
        0,
        "headroom.pdu_phase.time_to_breach_p50_s",
    ),
    ("rack", "rack", "headroom.rack.kw_to_limit", "<=", 0, "headroom.rack.time_to_breach_p50_s"),
    (
        "cdu_heat",
        "cdu",
        "headroom.cdu.capacity_free_fraction",
        "<",
        0.05,
        "headroom.cdu.time_to_breach_p50_s",
    ),
    (
        "cdu_flow",
        "cdu",
        "headroom.cdu.flow_lpm_to_limit",
        "<=",
        0,
        "headroom.cdu.flow_time_to_breach_p50_s",
    ),
    (
        "loop",
        "cdu",
        "headroom.loop.k_to_return_limit",
        "<=",
        0,
        "headroom.loop.time_to_breach_p50_s",
    ),
    ("link", "link", "headroom.link.gbps_to_limit", "<=", 0, "headroom.link.time_to_breach_p50_s"),
]


def rule_file(skip: str = "", inhibit: bool = True) -> str:
    lines = ["rules:"]
    for name, kind, now, op, value, forecast in LIMITS:
        if name == skip:
            continue
        inh = f", inhibits: [{{rule: {name}_soon, along: power}}]" if inhibit else ""
        lines.append(
            f'  - {{name: {name}_now, metric: {now}, entity_kind: {kind}, op: "{op}",'
            f" value: {value}{inh}}}"
        )
        lines.append(
            f"  - {{name: {name}_soon, type: forecast_breach, metric: {forecast},"
            f" entity_kind: {kind}, horizon_s: 3600}}"
        )
    return "\n".join(lines) + "\n"


def check(tmp_path: Path, text: str, *args: str):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return path, CliRunner().invoke(app, ["rules", "check", str(path), *args])


def test_a_full_rule_file_passes(tmp_path: Path) -> None:
    path, r = check(tmp_path, rule_file())
    assert r.exit_code == 0, r.output
    assert f"{path}: 14 rules valid; every limit covered" in r.stdout
    assert "MISSING" not in r.stdout and "warning" not in r.stderr
    _, rj = check(tmp_path, rule_file(), "--json")
    report = json.loads(rj.stdout)
    assert rj.exit_code == 0 and report["valid"] and report["uncovered"] == []
    assert len(report["coverage"]) == 7 and all(c["covered"] for c in report["coverage"])


def test_a_file_without_link_rules_lists_link_as_uncovered(tmp_path: Path) -> None:
    _, r = check(tmp_path, rule_file(skip="link"))
    assert r.exit_code == 3, r.output
    assert "uncovered limits: network link (breached-now and forecast)" in r.stdout
    assert "MISSING (headroom.link.gbps_to_limit)" in r.stdout
    _, rj = check(tmp_path, rule_file(skip="link"), "--json")
    report = json.loads(rj.stdout)
    assert rj.exit_code == 3 and report["uncovered"] == ["link"]
    [link] = [c for c in report["coverage"] if c["limit"] == "link"]
    assert link["missing"] == ["breached-now", "forecast"]


def test_a_missing_half_is_named(tmp_path: Path) -> None:
    lines = rule_file().replace(", inhibits: [{rule: rack_soon, along: power}]", "").splitlines()
    text = "\n".join(line for line in lines if "name: rack_soon" not in line) + "\n"
    _, r = check(tmp_path, text, "--json")
    report = json.loads(r.stdout)
    assert r.exit_code == 3 and report["uncovered"] == ["rack_feed"]
    [rack] = [c for c in report["coverage"] if c["limit"] == "rack_feed"]
    assert rack["missing"] == ["forecast"] and rack["now_rules"] == ["rack_now"]


def test_a_forecast_rule_nothing_inhibits_is_a_warning(tmp_path: Path) -> None:
    _, r = check(tmp_path, rule_file(inhibit=False))
    assert r.exit_code == 0, r.output  # a warning, not a failure
    assert "rule 'link_soon': no breached-now rule on headroom.link.gbps_to_limit" in r.stderr


@pytest.mark.parametrize(
    ("edit", "rule", "field"),
    [
        (("horizon_s: 3600}", "horizon_s: -1}"), "'gpu_soon' (rules[1])", "horizon_s"),
        (("metric: headroom.link.gbps_to_limit", "metric: link.gbps"), "'link_now'", "metric"),
        (("entity_kind: link, op", "entity_kind: rack, op"), "'link_now'", "entity_kind"),
        (("{rule: gpu_soon,", "{rule: gpu_later,"), "'gpu_now' (rules[0])", "inhibits[0].rule"),
        (("{rule: gpu_soon,", "{rule: gpu_now,"), "'gpu_now' (rules[0])", "inhibits[0].rule"),
        (("value: 5,", "value: 5, labels: {on-call: me},"), "'gpu_now'", "labels"),
    ],
)
def test_a_bad_file_is_refused_naming_rule_and_field(
    tmp_path: Path, edit: tuple[str, str], rule: str, field: str
) -> None:
    text = rule_file()
    assert edit[0] in text
    path, r = check(tmp_path, text.replace(edit[0], edit[1], 1))
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: rule {rule}") and f": {field}: " in line, line
    _, rj = check(tmp_path, text.replace(edit[0], edit[1], 1), "--json")
    report = json.loads(rj.stdout)
    assert rj.exit_code == 1 and not report["valid"] and report["errors"][0]["field"] == field


def test_a_self_inhibiting_rule_says_why(tmp_path: Path) -> None:
    _, r = check(tmp_path, rule_file().replace("{rule: cdu_flow_soon,", "{rule: cdu_flow_now,"))
    assert r.exit_code == 1 and "a rule cannot inhibit itself" in r.stderr


def test_the_shipped_rule_file_covers_every_limit() -> None:
    r = CliRunner().invoke(app, ["rules", "check", str(REPO / "deploy" / "alert_rules.yaml")])
    assert r.exit_code == 0, r.output
    assert "every limit covered" in r.stdout and "MISSING" not in r.stdout
