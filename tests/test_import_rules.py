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


#: What models/ may import beside the standard library and itself: numerical libraries without
#: I/O. DESIGN.md says numpy/scipy; bottleneck (the forecast's moving median, seven times
#: numpy's sort of the windows at the same result) is of their kind.
MODELS_MAY_IMPORT = {"numpy", "scipy", "bottleneck", "models"}


@pytest.mark.parametrize("path", files("models"), ids=lambda p: p.name)
def test_models_are_pure_numpy_scipy(path):
    bad = {m for m in imports(path) if m.split(".")[0] not in STDLIB | MODELS_MAY_IMPORT}
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


#: The modules of tests/ a test may import: what the tests share that is neither a test nor a
#: fixture (fixtures live in tests/conftest.py, which pytest loads and nothing imports).
TEST_HELPERS = {"helpers", "snmp_agent"}


def imported_modules(source: str) -> list[tuple[str, ...]]:
    """Each module ``source`` imports, as its dotted parts; a relative import of tests/ (the
    package of the tests) is spelled from ``tests``: ``from .helpers import x`` and ``from .
    import helpers`` both give ("tests", "helpers")."""
    found: list[tuple[str, ...]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = tuple(node.module.split(".")) if node.module else ()
            base = ("tests", *module) if node.level else module
            if len(base) == 1 and base[0] == "tests":
                found.extend((*base, a.name) for a in node.names)
            else:
                found.append(base)
        elif isinstance(node, ast.Import):
            found.extend(tuple(a.name.split(".")) for a in node.names)
    return found


def import_faults(source: str) -> list[str]:
    """The imports of ``source`` a test file may not make: a module of tests/ other than
    :data:`TEST_HELPERS` (another test module, conftest), a test module by its bare name, or
    bench/."""
    faults = []
    for parts in imported_modules(source):
        name = ".".join(parts)
        if (
            (parts[0] == "tests" and len(parts) > 1 and parts[1] not in TEST_HELPERS)
            or parts[0].startswith("test_")
            or parts[0] == "conftest"
            or parts[0] == "bench"
            or parts[0].startswith("bench_")
        ):
            faults.append(name)
    return faults


def test_the_import_rule_allows_the_helpers_and_nothing_else_of_tests() -> None:
    allowed = (
        "from .helpers import REPO\nfrom tests.helpers import Recorder\nfrom . import helpers\n"
        "from tests.snmp_agent import RESPONDER\nimport tests.helpers\n"
        "from twin.store import Store\nimport numpy as np\n"
    )
    assert import_faults(allowed) == []
    refused = (
        "from .test_api import x\nfrom tests.test_api import x\nimport tests.test_api\n"
        "from . import test_api\nfrom .conftest import REPO\nfrom tests.conftest import REPO\n"
        "import test_api\nfrom bench.bench_api import main\nimport bench_api\n"
    )
    assert import_faults(refused) == [
        "tests.test_api",
        "tests.test_api",
        "tests.test_api",
        "tests.test_api",
        "tests.conftest",
        "tests.conftest",
        "test_api",
        "bench.bench_api",
        "bench_api",
    ]
    for name in TEST_HELPERS:  # each a module of tests/ that is not itself a test
        assert (REPO / "tests" / f"{name}.py").is_file() and not name.startswith("test_"), name


@pytest.mark.parametrize(
    "path", sorted((REPO / "tests").glob("*.py")), ids=lambda p: str(p.relative_to(REPO))
)
def test_no_test_imports_another_test_module_conftest_or_bench(path):
    # what tests share lives in tests/helpers.py (fixtures in tests/conftest.py) or the
    # product; bench/ is not importable
    assert import_faults(path.read_text()) == [], path.name
    if path.name != "test_import_rules.py":  # nor loads one by its file (importlib)
        assert "spec_from_file_location" not in path.read_text(), path.name


def _imports_anywhere(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function (``from twin import
    calibrate`` counts as ``twin.calibrate``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


#: The data plane below calibration (DESIGN.md "One data plane"): the site index, the chain and
#: the detection that runs on them read the index from twin/site and windows from twin/store;
#: calibration is a consumer above them.
BELOW_CALIBRATE = [
    *files("twin/chain"),
    *files("twin/site"),
    *files("twin/store"),
    *files("twin/alerts"),
    *files("twin/analysis"),
]


@pytest.mark.parametrize("path", BELOW_CALIBRATE, ids=lambda p: str(p.relative_to(REPO)))
def test_the_chain_site_and_detection_never_import_calibrate(path):
    bad = {
        m
        for m in _imports_anywhere(path)
        if m == "twin.calibrate" or m.startswith("twin.calibrate.")
    }
    assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"
