"""DESIGN.md's import rules, checked on the source: who may import whom."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
PACKAGES = ("twin", "collectors", "models", "dashboards")


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("path", files("models"), ids=lambda p: p.name)
def test_models_are_pure_numpy_scipy(path):
    bad = {m for m in imports(path) if m.split(".")[0] not in STDLIB | {"numpy", "scipy", "models"}}
    assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", files("collectors"), ids=lambda p: str(p.relative_to(REPO)))
def test_collectors_import_no_twin_store_or_console(path):
    # The simulator runs models/ physics on a site parsed by twin.site (pydantic + PyYAML only);
    # no collector imports the store, the ingest or the console, nor DuckDB or Streamlit.
    simulator = "simulator" in path.parts
    for m in imports(path):
        top = m.split(".")[0]
        assert top not in {"duckdb", "streamlit", "dashboards"}, (path, m)
        if top == "twin":
            ok = simulator and (m == "twin.site" or m.startswith("twin.site."))
            assert ok, f"{path.relative_to(REPO)} imports {m}"
        if top == "models":
            assert simulator, f"{path.relative_to(REPO)} imports {m}"


@pytest.mark.parametrize("path", files("twin"), ids=lambda p: str(p.relative_to(REPO)))
def test_twin_never_imports_dashboards(path):
    for m in imports(path):
        assert m.split(".")[0] != "dashboards", (path, m)
        # the CLI starts collectors and the simulator; the rest of the twin uses only the wire
        # contract, the MQTT client settings and the contract's message builder
        if m.startswith("collectors.") and not path.name.startswith("cli"):
            assert m in {"collectors.contract", "collectors.mqtt", "collectors.base"}, (path, m)


@pytest.mark.parametrize(
    "path", sorted((REPO / "tests").glob("*.py")), ids=lambda p: str(p.relative_to(REPO))
)
def test_no_test_imports_another_test_module_or_bench(path):
    # shared helpers live in tests/conftest.py (or the product); bench/ is not importable
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [("." * node.level) + (node.module or "")]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for m in names:
            leaf = m.lstrip(".").split(".")
            assert not (leaf[0] == "tests" and len(leaf) > 1 and leaf[1].startswith("test_")), m
            assert not leaf[0].startswith("test_"), (path.name, m)
            assert leaf[0] != "bench" and not leaf[0].startswith("bench_"), (path.name, m)
    if path.name != "test_import_rules.py":  # nor loads one by its file (importlib)
        assert "spec_from_file_location" not in path.read_text(), path.name
