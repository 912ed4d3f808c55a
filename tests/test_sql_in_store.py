"""No SQL outside the store (DESIGN.md "One data plane"): every statement the shipped packages
run lives in twin/store/, or in the API's query module (twin/api/queries.py). harness/, bench/
and tests/ are not shipped and are exempt."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("twin", "collectors", "models", "dashboards")
#: the calls that run SQL on a DuckDB connection, cursor, relation or the alert tables' handle
SQL_CALLS = {"execute", "executemany", "sql", "query", "from_query"}
ALLOWED = {"twin/api/queries.py"}


def sql_calls(source: str, name: str = "<src>") -> list[int]:
    """Line numbers of the calls in ``source`` that run SQL (``x.execute(...)`` and the like)."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
        ):
            out.append(node.lineno)
    return sorted(out)


def shipped_modules() -> list[Path]:
    return sorted(p for pkg in SHIPPED for p in (REPO / pkg).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_the_scan_finds_sql_calls() -> None:
    src = 'con.execute("SELECT 1")\nstore.con.sql("SELECT 2").fetchall()\ndb.query("x")\nf(1)\n'
    assert sql_calls(src) == [1, 2, 3]


@pytest.mark.parametrize("path", shipped_modules(), ids=rel)
def test_no_module_outside_the_store_runs_sql(path: Path) -> None:
    name = rel(path)
    if name.startswith("twin/store/") or name in ALLOWED:
        return
    lines = sql_calls(path.read_text(), name)
    assert not lines, f"{name} runs SQL at lines {lines}: move it into twin/store/"
