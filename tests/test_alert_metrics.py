"""The alert metric registry (twin/alerts/metrics.py) and the rule loader's check against it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from twin.alerts import AlertEngine, RuleFileError, Topology, load_rules, parse_rules
from twin.alerts.metrics import METRICS, metric_problem
from twin.alerts.model import EntityKind
from twin.site import load_site

from .helpers import REPO, SMALL_SITE, serve_with_rules

GOOD = """
rules:
  - {name: pumps, metric: cdu.pumps_running, entity_kind: cdu, op: "<", value: 2}
"""
UNKNOWN = GOOD + '  - {name: gpu_hot, metric: gpu.temp, entity_kind: gpu, op: ">", value: 85}\n'


def test_every_spec_is_well_formed() -> None:
    kinds = set(EntityKind.__args__)  # type: ignore[attr-defined]
    for name, spec in METRICS.items():
        assert spec.name == name
        assert spec.kinds and set(spec.kinds) <= kinds, spec
        assert spec.unit and spec.meaning, spec


def test_no_metric_name_is_spelled_out_in_the_twin() -> None:
    """Emitters use the registry's constants: no other module of twin/ holds the literal."""
    offenders = []
    for path in sorted((REPO / "twin").rglob("*.py")):
        if path.name == "metrics.py" and path.parent.name == "alerts":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in METRICS:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value}")
    assert not offenders, offenders


@pytest.mark.parametrize(
    "path",
    sorted(
        [
            *(REPO / "deploy").glob("*rules*.yaml"),
            *(REPO / "sample_telemetry").rglob("*rules*.yaml"),
        ]
    ),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_shipped_rule_files_use_registered_metrics(path: Path) -> None:
    for rule in load_rules(path):
        assert metric_problem(rule.metric, rule.entity_kind) is None, rule


def test_unknown_metric_is_refused_naming_file_rule_and_metric(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(UNKNOWN)
    with pytest.raises(RuleFileError) as info:
        load_rules(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: rule 'gpu_hot' (rules[1]): metric: unknown metric 'gpu.temp'")
    assert "headroom.gpu.k_to_slowdown" in msg  # the known names are listed
    assert [i.field for i in info.value.issues] == ["metric"]


def test_metric_on_the_wrong_entity_kind_is_refused() -> None:
    text = GOOD.replace("entity_kind: cdu", "entity_kind: rack")
    with pytest.raises(
        RuleFileError,
        match=r"rule 'pumps' \(rules\[0\]\): entity_kind: metric"
        r" 'cdu.pumps_running' is emitted for entity_kind cdu, not 'rack'",
    ):
        parse_rules(text, "r.yaml")


def test_service_reload_refuses_an_unknown_metric_and_keeps_its_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(GOOD)
    engine = AlertEngine(load_rules(path), Topology.from_site(load_site(SMALL_SITE)))
    before = engine.rules
    path.write_text(UNKNOWN)
    with pytest.raises(RuleFileError, match=r"rule 'gpu_hot' \(rules\[1\]\): metric: unknown"):
        engine.reload(path)
    assert engine.rules is before


def test_serve_with_an_unknown_metric_exits_with_one_line(tmp_path: Path) -> None:
    """`dctwin serve --rules` checks the file before it opens the store or the broker."""
    p = serve_with_rules(tmp_path, UNKNOWN)
    path, db = tmp_path / "bad.yaml", tmp_path / "s.duckdb"
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"error: {path}: rule 'gpu_hot' (rules[1]): metric: unknown")
    assert "'gpu.temp'" in lines[0]
    assert not db.exists()  # refused before anything started
