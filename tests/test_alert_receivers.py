"""Alerts that every receiver accepts: label names Alertmanager takes (refused at load, not
lost at the first page) and dedup keys within PagerDuty's 255 characters that never collide."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from twin.alerts import RuleFileError, dedup_key, load_rules, parse_rules

from .helpers import REPO, serve_with_rules

RULE = (
    '  - {{name: {name}, metric: cdu.pumps_running, entity_kind: cdu, op: "<", value: 2{extra}}}\n'
)
GOOD = "rules:\n" + RULE.format(name="pumps", extra=", labels: {team: facilities, on_call: a}")
BAD = GOOD + RULE.format(name="pumps_page", extra=", labels: {on-call: facilities}")


@pytest.mark.parametrize(
    ("name", "hint"),
    [("on-call", "on_call"), ("team.name", "team_name"), ("9team", "_9team"), ("é", "_")],
)
def test_a_label_name_alertmanager_refuses_is_refused_naming_file_rule_and_label(
    tmp_path: Path, name: str, hint: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD + RULE.format(name="pumps_page", extra=f", labels: {{'{name}': x}}"))
    with pytest.raises(RuleFileError) as info:
        load_rules(path)
    msg = str(info.value)
    assert msg == (
        f"{path}: rule 'pumps_page' (rules[1]): labels: label name {name!r} is not valid:"
        f" Alertmanager accepts only [a-zA-Z_][a-zA-Z0-9_]* (try {hint!r})"
    )
    assert [(i.rule, i.field) for i in info.value.issues] == [("'pumps_page' (rules[1])", "labels")]


def test_valid_label_names_load() -> None:
    (rule,) = parse_rules(GOOD, "good.yaml")
    assert rule.labels == {"team": "facilities", "on_call": "a"}


def test_serve_with_a_bad_label_name_exits_with_one_line(tmp_path: Path) -> None:
    """`dctwin serve --rules` refuses the file before it opens the store or the broker."""
    p = serve_with_rules(tmp_path, BAD)
    path, db = tmp_path / "bad.yaml", tmp_path / "s.duckdb"
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(
        f"error: {path}: rule 'pumps_page' (rules[1]): labels: label name 'on-call' is not valid"
    )
    assert not db.exists()


def test_long_dedup_keys_keep_a_readable_head_and_never_collide() -> None:
    # Two groups whose ids differ only in their last character, far past 255.
    base = "fleet-" + "training-cluster-a-" * 20
    a = dedup_key("site-1", "fleet_underuse", ("fleet", base + "1"))
    b = dedup_key("site-1", "fleet_underuse", ("fleet", base + "2"))
    assert a != b
    whole = f"dctwin/site-1/fleet_underuse/fleet/{base}1"
    assert len(whole) > 255
    for key, full in ((a, whole), (b, whole[:-1] + "2")):
        assert len(key) == 255
        head, _, digest = key.rpartition("~")
        assert head == full[:238]  # readable: the site, rule, group kind and id's start
        assert head.startswith("dctwin/site-1/fleet_underuse/fleet/fleet-training-cluster-a-")
        assert digest == hashlib.sha256(full.encode()).hexdigest()[:16]
    # A key within the limit is unchanged, and the same group gives the same key.
    assert dedup_key("small", "gpu_temp_high", ("rack", "r01")) == (
        "dctwin/small/gpu_temp_high/rack/r01"
    )
    assert dedup_key("site-1", "fleet_underuse", ("fleet", base + "1")) == a


def test_a_key_of_exactly_255_is_kept_whole() -> None:
    prefix = "dctwin/s/r/rack/"
    key = dedup_key("s", "r", ("rack", "x" * (255 - len(prefix))))
    assert len(key) == 255 and "~" not in key and key.endswith("x")


def test_shipped_rule_files_load() -> None:
    files = sorted(
        [
            *(REPO / "deploy").glob("*rules*.yaml"),
            *(REPO / "sample_telemetry").rglob("*rules*.yaml"),
        ]
    )
    assert files
    for path in files:
        assert len(load_rules(path)) > 0, path


def test_an_observation_label_alertmanager_refuses_is_refused() -> None:
    """Observation labels become Alertmanager annotations: the same rule holds for them."""
    from datetime import UTC, datetime

    from pydantic import ValidationError

    from twin.alerts import Observation

    ok = Observation(
        metric="cdu.pumps_running",
        entity_kind="cdu",
        entity_id="cdu1",
        value=1.0,
        ts=datetime(2026, 12, 1, tzinfo=UTC),
        labels={"time_to_breach_s": "60"},
    )
    assert ok.labels == {"time_to_breach_s": "60"}
    with pytest.raises(ValidationError, match=r"label name 'time-to-breach' is not valid"):
        Observation.model_validate({**ok.model_dump(), "labels": {"time-to-breach": "60"}})
