"""SNMP label grammars (profile data) and the neutral's place in the contract and the store.

The grammars are read here directly (no agent); the CLI runs of every profile on real and our
own captures are in tests/test_collect_snmp.py and tests/test_snmp_real_captures.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from collectors.contract import LONG_QUANTITIES, QUANTITIES, ContractError, decode, encode
from collectors.snmp_profiles import PROFILE_DIR, Grammar, ProfileError, load_profile, profiles
from twin.ingest import Ingester
from twin.store import Store


def _accepting(profile: str, table: str, label: str) -> list[Grammar]:
    p = profiles()[profile]
    lab = next(t for t in p.tables if t.name == table).labels[label]
    return [p.grammars[g] for g in lab.accept]


def _element(grammars: list[Grammar], text: str) -> str | None:
    return next((e for g in grammars if (e := g.element(text)) is not None), None)


@pytest.mark.parametrize(
    ("profile", "table", "label", "text", "element"),
    [
        # Vertiv/Geist: "Phase A" (a real MG02E4W1), any case; "Phase AB" a delta leg
        ("geist-v5", "pduPhaseTable", "leg", "Phase A", "L1"),
        ("geist-v5", "pduPhaseTable", "leg", "phase c", "L3"),
        ("geist-v5", "pduPhaseTable", "leg", "PHASE B", "L2"),
        ("geist-v5", "pduPhaseTable", "leg", "Phase CA", "L3-L1"),
        ("geist-v5", "pduPhaseTable", "leg", "L2-N", "L2"),
        ("geist-v5", "pduPhaseTable", "leg", "L1-L2", "L1-L2"),
        ("geist-v5", "pduPhaseTable", "leg", "Phase D", None),
        ("geist-v5", "pduPhaseTable", "leg", "Phase AA", None),
        ("geist-v5", "pduLineTable", "line", "Line 2", "L2"),
        # ServerTech Sentry4: the unit/cord prefix before the line
        ("sentry4", "st4PhaseMonitorTable", "leg", "AA:L1-L2", "L1-L2"),
        ("sentry4", "st4PhaseMonitorTable", "leg", "BA:L3-N", "L3"),
        ("sentry4", "st4PhaseMonitorTable", "leg", "ab:l2-l3", "L2-L3"),
        ("sentry4", "st4PhaseMonitorTable", "leg", "L1-L2", "L1-L2"),
        ("sentry4", "st4PhaseMonitorTable", "leg", "AA", None),
        ("sentry4", "st4PhaseMonitorTable", "leg", "AA:L1-L1", None),
        ("sentry4", "st4LineMonitorTable", "line", "L3", "L3"),
        ("sentry4", "st4LineMonitorTable", "line", "AB:N", "N"),
        ("sentry4", "st4LineMonitorTable", "line", "4", None),
        # Sentry3: PIPS ids, else the infeed's name with any tower name before it
        ("sentry3", "infeedTable", "line", "L2", "L2"),
        ("sentry3", "infeedTable", "line", "N", "N"),
        ("sentry3", "infeedTable", "line", "TowerA_InfeedA", "L1"),
        ("sentry3", "infeedTable", "line", "TowerB_InfeedC", "L3"),
        ("sentry3", "infeedTable", "line", "Master_InfeedB", "L2"),
        ("sentry3", "infeedTable", "line", "towera_neutral", "N"),
        ("sentry3", "infeedTable", "line", "TowerA_InfeedD", None),
        ("sentry3", "infeedTable", "line", "rack 3 feed", None),
    ],
)
def test_profile_grammars_read_vendor_labels(
    profile: str, table: str, label: str, text: str, element: str | None
) -> None:
    assert _element(_accepting(profile, table, label), text) == element


def _profile_file(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """The shipped geist-v5 profile, edited, in ``tmp_path``."""
    data = yaml.safe_load((PROFILE_DIR / "geist-v5.yaml").read_text())
    edit(data)
    path = tmp_path / "geist-v5.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_label_may_not_take_an_index_parts_name(tmp_path: Path) -> None:
    """A label named like an index part would let the row number fill the id."""

    def edit(data: dict) -> None:
        table = next(t for t in data["tables"] if t["name"] == "pduLineTable")
        table["index"] = ["line"]

    with pytest.raises(ProfileError, match="label 'line' has the name of an index part"):
        load_profile(_profile_file(tmp_path, edit))


def test_a_label_names_only_grammars_the_profile_has(tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        table = next(t for t in data["tables"] if t["name"] == "pduPhaseTable")
        table["labels"]["leg"]["accept"] = ["bare", "roman"]

    with pytest.raises(ProfileError, match="accepts grammar 'roman'"):
        load_profile(_profile_file(tmp_path, edit))


def test_a_grammar_must_say_what_it_names(tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        data["grammars"]["bad"] = {"match": "Phase (.)"}

    with pytest.raises(ProfileError, match="neither a group 'a'"):
        load_profile(_profile_file(tmp_path, edit))


def test_neutral_current_is_in_the_contract_and_stored(tmp_path: Path) -> None:
    """neutral_current_a: amperes, never negative, kept in the store's long table."""
    assert "neutral_current_a" not in QUANTITIES["pdu"]
    q = LONG_QUANTITIES["pdu"]["neutral_current_a"]
    assert (q.unit, q.nonnegative) == ("A", True)
    topic = "dctwin/v1/small/pdu/pdu-r01-a"
    now = datetime.now(UTC).replace(microsecond=0)

    def msg(seq: int, neutral: float) -> bytes:
        return encode(
            collector="snmp",
            source="pdu-r01-a",
            seq=seq,
            ts=now,
            samples=[{"id": "pdu-r01-a", "power_w": 900.0, "neutral_current_a": neutral}],
        )

    with pytest.raises(ContractError) as e:
        decode(topic, msg(1, -0.5))
    assert e.value.reason == "negative_value"
    with pytest.raises(ContractError) as e:
        decode(topic, msg(1, 2e6))  # beyond the ampere bound
    assert e.value.reason == "out_of_range"
    with Store(tmp_path / "t.duckdb") as store:
        Ingester(store).ingest([(topic, msg(1, 2.12)), (topic, msg(2, -1.0))])
        assert store.con.execute("SELECT id, quantity, value FROM extra_readings").fetchall() == [
            ("pdu-r01-a", "neutral_current_a", 2.12)
        ]
        assert store.con.execute("SELECT reason FROM dead_letters").fetchall() == [
            ("negative_value",)
        ]
