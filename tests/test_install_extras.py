"""What each machine installs (pyproject.toml): the base (``dctwin[collector]``) runs the
collectors and ``dctwin collect`` on a GPU node without DuckDB, FastAPI or Streamlit; the
``service`` and ``console`` extras bring the rest; ``all`` and ``dev`` everything.

The fast tests read the dependency lists and the sources' imports; the slow one installs the
collector extra into a fresh virtual environment and runs the command line there.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from twin.cli.common import CONSOLE_MODULES, EXTRA_MODULES, SERVICE_MODULES, missing_extra

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("twin", "collectors", "models", "dashboards")
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

#: What a GPU node must not get (distribution names).
HEAVY = (
    *("duckdb", "fastapi", "uvicorn", "streamlit", "polars", "pandas", "pyarrow", "scipy"),
    *("plotly", "numpy", "amqtt", "jinja2", "bottleneck"),
)
#: Their import names, for the fresh environment.
HEAVY_MODULES = (
    *("duckdb", "fastapi", "uvicorn", "streamlit", "polars", "pandas", "pyarrow", "scipy"),
    *("plotly", "numpy", "amqtt", "jinja2", "bottleneck"),
)


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def base() -> set[str]:
    return names(project()["dependencies"])


def extra(name: str) -> set[str]:
    """The distributions of one extra, ``dctwin[...]`` self-references followed."""
    found: set[str] = set()
    for r in project()["optional-dependencies"][name]:
        req = Requirement(r)
        if canonicalize_name(req.name) == "dctwin":
            for inner in req.extras:
                found |= extra(inner)
        else:
            found.add(canonicalize_name(req.name))
    return found


def closure(dists: set[str]) -> set[str]:
    """``dists`` and everything they require (installed metadata; extras of theirs left out)."""
    seen: set[str] = set()
    todo = list(dists)
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue
        for r in requires:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


@functools.cache
def distributions_of() -> dict[str, frozenset[str]]:
    """{top-level import name: the installed distributions that provide it} (one scan)."""
    return {
        module: frozenset(canonicalize_name(d) for d in dists)
        for module, dists in md.packages_distributions().items()
    }


def providers(module: str) -> frozenset[str]:
    """The installed distributions that provide top-level import name ``module``."""
    return distributions_of().get(module, frozenset())


def module_file(module: str) -> Path | None:
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(path: Path, module_level_only: bool) -> set[str]:
    """Absolute module names ``path`` imports; with ``module_level_only``, not those inside
    function bodies (what runs when the module is imported). ``from a import b`` gives ``a.b``
    when that is a module of the project, else ``a``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if module_level_only and _type_checking_only(child):
                continue  # `if TYPE_CHECKING:` never runs
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                for a in child.names:
                    if module_file(f"{child.module}.{a.name}") is not None:
                        found.add(f"{child.module}.{a.name}")
            visit(child)

    visit(tree)
    return found


def third_party_at_import(entry_points: list[str]) -> dict[str, str]:
    """The third-party top-level modules that importing ``entry_points`` (project modules) runs,
    following the project's own module-level imports and parent packages: {module: who}."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    todo = list(entry_points)
    while todo:
        mod = todo.pop()
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):  # a module's packages run first
            name = ".".join(parts[:i])
            path = module_file(name)
            if name in seen or path is None:
                continue
            seen.add(name)
            for dep in imported(path, module_level_only=True):
                top = dep.split(".")[0]
                if top in PACKAGES:
                    todo.append(dep)
                elif top not in STDLIB:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_the_base_has_nothing_heavy_and_dev_installs_everything():
    heavy = {canonicalize_name(h) for h in HEAVY}
    assert not base() & heavy, f"the base install pulls {sorted(base() & heavy)}"
    assert not extra("collector") & heavy, sorted(extra("collector") & heavy)
    assert not closure(base() | extra("collector")) & heavy, "a base dependency pulls one in"
    service, console = extra("service"), extra("console")
    assert {"duckdb", "fastapi", "uvicorn", "polars", "pandas", "pyarrow", "scipy"} <= service
    assert "polars" in service  # twin/ingest/nvidia_smi.py
    assert {"streamlit", "pandas"} <= console
    assert "plotly" not in console  # the console's charts are Streamlit's own Vega-Lite
    assert extra("all") == extra("collector") | service | console
    assert extra("all") <= extra("dev"), "dev must pull dctwin[all]"
    assert {"pytest", "ruff", "hypothesis"} <= extra("dev")


def test_the_collectors_and_the_command_line_import_only_the_base():
    collectors = [f"collectors.{p.stem}" for p in sorted((REPO / "collectors").glob("*.py"))]
    entry = [*collectors, "twin.cli", "twin.cli.__main__"]
    allowed = closure(base() | extra("collector"))
    outside = {
        module: who
        for module, who in third_party_at_import(entry).items()
        if not providers(module) & allowed
    }
    assert not outside, f"imported at module level outside the base install: {outside}"


@functools.cache
def third_party_anywhere() -> dict[str, str]:
    """Every third-party top-level module the project imports anywhere: {module: who}."""
    used: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for m in imported(path, module_level_only=False):
                top = m.split(".")[0]
                if top not in STDLIB and top not in PACKAGES:
                    used.setdefault(top, str(path.relative_to(REPO)))
    return used


def test_every_import_is_declared_and_every_declared_package_is_used():
    declared = base() | extra("all")
    used = third_party_anywhere()
    allowed = closure(declared)
    undeclared = {m: who for m, who in used.items() if not providers(m) & allowed}
    assert not undeclared, f"imported but declared in no dependency list: {undeclared}"
    used_dists = {d for m in used for d in providers(m)}
    # amqtt runs as a module in a child process (twin/broker.py), never imported
    assert "amqtt.scripts.broker_script" in (REPO / "twin" / "broker.py").read_text()
    unused = declared - used_dists - {"amqtt"}
    assert not unused, f"declared but imported nowhere: {sorted(unused)}"


def test_the_cli_knows_every_module_of_the_extras():
    # a missing module of the service or console extra is what the CLI turns into "dctwin X
    # needs the ... extra"; the base's modules never are (their absence is a broken install)
    extras = extra("service") | extra("console")
    used = set(third_party_anywhere()) | {"amqtt"}
    for module in used:
        if providers(module) & extras and not providers(module) & base():
            assert module in EXTRA_MODULES, (module, providers(module))
    assert set(SERVICE_MODULES + CONSOLE_MODULES) <= EXTRA_MODULES
    base_dists = closure(base())
    base_modules = {m for m in distributions_of() if providers(m) & base_dists}
    assert not EXTRA_MODULES & base_modules, sorted(EXTRA_MODULES & base_modules)


def test_a_missing_module_of_an_extra_names_the_extra_and_others_stay_errors():
    e = ModuleNotFoundError("No module named 'duckdb'", name="duckdb")
    assert missing_extra("serve", e) is not None
    assert missing_extra("import nvidia-smi", e) is not None
    # a module no extra brings is a bug: it keeps its traceback
    assert missing_extra("serve", ModuleNotFoundError("x", name="no_such_module")) is None


# --- the minimal install, simulated in this environment (fast) -----------------------------

BLOCK = """
import sys
for name in {modules!r}:
    sys.modules[name] = None  # `import name` now raises ModuleNotFoundError, as if not installed
from twin.cli import app
sys.argv[0] = "dctwin"
app()
"""


def run_without(modules: tuple[str, ...], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(modules=modules), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("serve",), "dctwin serve needs the service extra: pip install 'dctwin[service]'"),
        (("status",), "dctwin status needs the service extra: pip install 'dctwin[service]'"),
        (("console",), "dctwin console needs the console extra: pip install 'dctwin[console]'"),
        (("demo",), "dctwin demo needs the all extra: pip install 'dctwin[all]'"),
        (
            ("demo", "--no-console"),
            "dctwin demo --no-console needs the service extra: pip install 'dctwin[service]'",
        ),
        (
            ("import", "nvidia-smi", "log.csv", "--node", "n1"),
            "dctwin import nvidia-smi needs the service extra: pip install 'dctwin[service]'",
        ),
        (
            ("broker", "--kind", "embedded"),
            "the embedded broker needs the service extra: pip install 'dctwin[service]'",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
@pytest.mark.slow  # a dctwin subprocess per command: out of the fast tier
def test_a_command_without_its_extra_says_which_to_install(tmp_path, args, message):
    (tmp_path / "log.csv").write_text("timestamp, index, power.draw [W]\n", encoding="utf-8")
    r = run_without(HEAVY_MODULES, *args, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


# --- the real minimal install (slow) ---------------------------------------------------------

CHECK = """
import importlib, importlib.util, json, pkgutil, sys
import collectors, twin.cli
mods = [m.name for m in pkgutil.walk_packages(collectors.__path__, "collectors.")]
for m in mods:
    importlib.import_module(m)
print(json.dumps({
    "collectors": mods,
    "loaded": sorted({m.split(".")[0] for m in sys.modules}),
    "installed": [m for m in HEAVY if importlib.util.find_spec(m) is not None],
}))
"""

#: pip's words when it could not reach an index or find a distribution there.
OFFLINE = re.compile(
    r"Could not find a version|No matching distribution|Failed to establish|NewConnectionError"
    r"|Temporary failure in name resolution|Network is unreachable|ProxyError|Max retries"
)


@pytest.fixture(scope="module")
def collector_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with ``pip install -e '<repo>[collector]'``, nothing else."""
    venv = tmp_path_factory.mktemp("collector") / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=180
    )
    if made.returncode != 0:
        pytest.skip(f"python -m venv failed (no ensurepip?): {made.stderr.strip()[-300:]}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", f"{REPO}[collector]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if r.returncode != 0 and OFFLINE.search(r.stderr):
        pytest.skip(f"no package index reachable to install the base: {r.stderr.strip()[-300:]}")
    assert r.returncode == 0, r.stderr
    return venv


def in_venv(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the fixture's fresh venv and install count here
def test_the_collector_install_has_no_service_and_imports_every_collector(collector_venv, tmp_path):
    script = f"HEAVY = {HEAVY_MODULES!r}\n{CHECK}"
    r = in_venv(collector_venv, str(collector_venv / "bin" / "python"), "-c", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    on_disk = {f"collectors.{p.stem}" for p in (REPO / "collectors").glob("*.py")} - {
        "collectors.__init__"
    }
    assert on_disk <= set(got["collectors"]), got["collectors"]
    assert got["installed"] == [], f"the collector install has {got['installed']}"
    assert not set(got["loaded"]) & set(HEAVY_MODULES)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_collector_install_runs_dctwin_collect_and_refuses_serve(collector_venv, tmp_path):
    dctwin = str(collector_venv / "bin" / "dctwin")
    top = in_venv(collector_venv, dctwin, "--help", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    assert "collect" in top.stdout and "serve" in top.stdout
    group = in_venv(collector_venv, dctwin, "collect", "--help", cwd=tmp_path)
    assert group.returncode == 0, group.stderr
    for name in ("nvml", "dcgm", "redfish", "snmp"):
        assert name in group.stdout
        sub = in_venv(collector_venv, dctwin, "collect", name, "--help", cwd=tmp_path)
        assert sub.returncode == 0, (name, sub.stderr)
        assert "--broker" in sub.stdout, name
    # one poll of this machine's GPUs: JSON where there is a driver, a clear error where not
    once = in_venv(collector_venv, dctwin, "collect", "nvml", "--once", "--stdout", cwd=tmp_path)
    assert "Traceback" not in once.stderr, once.stderr
    if once.returncode == 0:
        assert json.loads(once.stdout.splitlines()[0])["collector"]
    else:
        assert "error:" in once.stderr and "NVML" in once.stderr, once.stderr
    serve = in_venv(collector_venv, dctwin, "serve", "--db", "x.duckdb", cwd=tmp_path)
    assert serve.returncode == 2, (serve.stdout, serve.stderr)
    assert "dctwin serve needs the service extra: pip install 'dctwin[service]'" in serve.stderr
    assert "Traceback" not in serve.stderr
    assert not (tmp_path / "x.duckdb").exists()
    console = in_venv(collector_venv, dctwin, "console", cwd=tmp_path)
    assert console.returncode == 2, console.stderr
    assert "pip install 'dctwin[console]'" in console.stderr
    assert "Traceback" not in console.stderr
