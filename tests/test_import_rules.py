"""DESIGN.md's import rules, checked on the source: who may import whom."""

from __future__ import annotations

import ast
import sys
import tomllib
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
def test_collectors_import_only_collectors_and_third_party(path):
    # A GPU node installs the collectors without the twin: nothing of twin/, models/ or the
    # console, nor DuckDB or Streamlit (the simulator, which needs the site model, is twin's).
    for m in imports(path):
        top = m.split(".")[0]
        assert top not in {"twin", "models", "dashboards", "duckdb", "streamlit"}, (
            f"{path.relative_to(REPO)} imports {m}"
        )


def test_the_shipped_packages_are_the_wheels():
    """PACKAGES (what the rules below call shipped) is what the wheel holds, and harness/
    (test and benchmark support) is not in it."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert sorted(wheel) == sorted(PACKAGES)
    assert (REPO / "harness" / "__init__.py").is_file()


def any_imports(path: Path) -> set[str]:
    """Every module ``path`` names in an import, at any level of the code (a function's own
    imports included), and every string literal it hands to ``importlib.import_module`` or
    ``__import__``."""
    found = imports(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in {"import_module", "__import__"}
                )
            )
        ):
            found.add(node.args[0].value)
    return found


@pytest.mark.parametrize(
    "path",
    [p for pkg in PACKAGES for p in files(pkg)],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_shipped_packages_never_import_the_harness_tests_or_bench(path):
    # harness/, tests/ and bench/ are not in the wheel: an installed dctwin that imported them
    # would fail where it runs (an editable install has the repository root on sys.path, so
    # only the source can tell)
    for m in any_imports(path):
        assert m.split(".")[0] not in {"harness", "tests", "bench"}, (
            f"{path.relative_to(REPO)} imports {m}"
        )


def in_cli(path: Path) -> bool:
    return path.relative_to(REPO / "twin").parts[0] == "cli"


@pytest.mark.parametrize("path", files("twin"), ids=lambda p: str(p.relative_to(REPO)))
def test_twin_never_imports_dashboards(path):
    for m in imports(path):
        assert m.split(".")[0] != "dashboards", (path, m)
        # the CLI (twin/cli/) starts collectors; the rest of the twin uses only the wire
        # contract, the MQTT client settings and the contract's message builder
        if m.startswith("collectors.") and not in_cli(path):
            assert m in {"collectors.contract", "collectors.mqtt", "collectors.base"}, (path, m)
        # the CLI is the top: nothing else of the twin imports it
        if not in_cli(path):
            assert m != "twin.cli" and not m.startswith("twin.cli."), (path, m)


def cli_module(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def cli_imports(path: Path, modules: set[str]) -> set[str]:
    """The twin.cli modules ``path`` imports (at module level or inside a function):
    ``from twin.cli import x`` names submodule ``twin.cli.x`` when there is one, else the
    package ``twin.cli`` itself."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module in modules and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
    return found


def test_the_cli_modules_import_each_other_without_a_cycle():
    paths = files("twin/cli")
    modules = {cli_module(p) for p in paths}
    assert "twin.cli.common" in modules, sorted(modules)
    graph = {cli_module(p): cli_imports(p, modules) - {cli_module(p)} for p in paths}
    # only the package (the assembled app) and __main__ import command modules; those import
    # at most the shared modules (options and errors; how rows are printed; where a read
    # command reads: store or API), which import no
    # command module
    shared = {"twin.cli.common", "twin.cli.output", "twin.cli.source"}
    for mod, deps in graph.items():
        if mod not in {"twin.cli", "twin.cli.__main__"}:
            assert deps <= shared, f"{mod} imports {sorted(deps)}"
    done: set[str] = set()

    def visit(mod: str, stack: tuple[str, ...]) -> None:
        assert mod not in stack, "import cycle: " + " -> ".join((*stack, mod))
        if mod in done:
            return
        for dep in graph[mod]:
            visit(dep, (*stack, mod))
        done.add(mod)

    for mod in graph:
        visit(mod, ())


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
