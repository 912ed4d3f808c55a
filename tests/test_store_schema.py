"""The store owns its DDL (twin/store/schema.py) and the reads and writes of its tables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import duckdb
import pytest

from twin.alerts import AlertDb, ensure_alert_tables
from twin.store import Store
from twin.store.schema import ALERT_DDL

from .helpers import REPO

CREATE = re.compile(r"\bCREATE\s+(OR\s+REPLACE\s+)?(TABLE|SEQUENCE|VIEW|INDEX)\b", re.I)


def _string_constants(path: Path) -> list[tuple[int, str]]:
    return [
        (n.lineno, n.value)
        for n in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def test_every_create_statement_lives_in_the_store_schema() -> None:
    schema = REPO / "twin" / "store" / "schema.py"
    offenders = [
        f"{p.relative_to(REPO)}:{line}"
        for pkg in ("twin", "collectors", "models", "dashboards")
        for p in sorted((REPO / pkg).rglob("*.py"))
        if p != schema
        for line, text in _string_constants(p)
        if CREATE.search(text)
    ]
    assert not offenders, offenders


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def test_a_new_store_has_the_alert_tables(tmp_path: Path) -> None:
    wanted = {m.group(1) for s in ALERT_DDL if (m := re.search(r"TABLE IF NOT EXISTS (\w+)", s))}
    assert wanted == {
        "alert_outbox",
        "alert_history",
        "alert_state",
        "alert_silences",
        "alert_acks",
    }
    with Store(tmp_path / "s.duckdb") as store:
        assert wanted <= _tables(store.con)
        AlertDb(store).query("SELECT count(*) FROM alert_outbox")  # idempotent on a store
    con = duckdb.connect(":memory:")  # a bare connection gets them from the same DDL
    ensure_alert_tables(con)
    ensure_alert_tables(con)
    assert _tables(con) == wanted


# ---- calibration tables ----------------------------------------------------------------------

CAL_SQL = re.compile(
    r"\b(FROM|INTO|JOIN|UPDATE)\s+calibration_(runs|params|quality|events)\b", re.I
)
#: modules another change is moving onto the store's methods (issue 13)
CAL_SQL_PENDING: set[str] = set()  # every module reads them through the store


def test_only_the_store_reads_and_writes_the_calibration_tables() -> None:
    offenders = [
        f"{p.relative_to(REPO)}:{line}"
        for p in sorted((REPO / "twin").rglob("*.py"))
        if p.parent.name != "store" and str(p.relative_to(REPO)) not in CAL_SQL_PENDING
        for line, text in _string_constants(p)
        if CAL_SQL.search(text)
    ]
    assert not offenders, offenders


def _run(fitted_at: str) -> dict[str, object]:
    return {
        "fitted_at": fitted_at,
        "window_start": "2026-01-01T00:00:00Z",
        "window_end": "2026-01-01T01:00:00Z",
        "holdout_start": "2026-01-01T00:50:00Z",
        "gpus": 2,
        "seconds": 0.5,
    }


def _param(sid: str, param: str, value: float | None, usable: bool = True) -> dict[str, object]:
    return {
        "kind": "gpu",
        "id": sid,
        "param": param,
        "value": value,
        "stderr": None,
        "usable": usable,
        "reason": None if usable else "too few samples",
    }


def test_calibration_runs_are_versions_read_back_through_the_store(tmp_path: Path) -> None:
    with Store(tmp_path / "c.duckdb") as store:
        assert store.latest_calibration_run_id() is None
        assert store.latest_calibration_params() == {}
        assert store.calibration_runs() == []
        first = store.save_calibration_run(
            _run("2026-01-01T01:00:00Z"),
            [_param("n:0", "r_k_per_w", 0.10), _param("n:1", "r_k_per_w", 0.20)],
            [{"kind": "gpu", "id": "n:0", "quantity": "temp_c@600s", "mae": 0.4, "n": 10}],
            [],
        )
        second = store.save_calibration_run(
            _run("2026-01-01T02:00:00Z"),
            [
                _param("n:0", "r_k_per_w", 0.12),
                _param("n:0", "c_j_per_k", 900.0),
                _param("n:1", "r_k_per_w", 0.5, usable=False),
                _param("n:1", "c_j_per_k", None, usable=False),
            ],
            [],
            [{"kind": "gpu", "id": "n:0", "param": "r_k_per_w", "value": 0.12, "group": "g"}],
        )
        assert (first, second) == (1, 2)
        assert [r["run_id"] for r in store.calibration_runs()] == [2, 1]
        assert store.latest_calibration_run_id() == 2
        assert store.latest_calibration_params() == {
            ("gpu", "n:0", "r_k_per_w"): 0.12,
            ("gpu", "n:0", "c_j_per_k"): 900.0,
        }
        assert store.latest_calibration_params(usable_only=False, params=["r_k_per_w"]) == {
            ("gpu", "n:0", "r_k_per_w"): 0.12,
            ("gpu", "n:1", "r_k_per_w"): 0.5,
        }
        assert store.calibration_params(1, kind="pdu") == {}
        # the history median is over usable values of every run
        assert store.calibration_param_medians("gpu", "r_k_per_w") == {
            "n:0": 0.11,
            "n:1": 0.20,
        }
        assert len(store.calibration_param_rows(2)) == 4
        assert store.calibration_quality(1)[0]["mae"] == 0.4
        [event] = store.calibration_events(2)
        assert event["id"] == "n:0" and event["fleet_median"] is None  # "group" is not stored
        # a run that fails half-way leaves nothing behind
        bad = [{**_param("n:0", "r_k_per_w", 0.3), "usable": None}]  # NOT NULL column
        with pytest.raises(duckdb.Error):
            store.save_calibration_run(_run("2026-01-01T03:00:00Z"), bad, [], [])
        assert store.latest_calibration_run_id() == 2
        assert len(store.calibration_param_rows(3)) == 0
