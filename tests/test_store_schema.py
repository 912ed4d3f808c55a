"""The store owns its DDL (twin/store/schema.py) and the reads and writes of its tables."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import duckdb

from twin.alerts import AlertDb, ensure_alert_tables
from twin.store import Store
from twin.store.schema import ALERT_DDL

from .conftest import REPO

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
