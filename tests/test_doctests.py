"""The examples in the shipped modules' docstrings (``>>>`` lines) are tests: every module of
the packages that has one is run through doctest here, so the README's `pytest -q` (and CI, and
the fast tier) fails when an example no longer holds."""

from __future__ import annotations

import doctest
import importlib
import io

import pytest

from .helpers import REPO

PACKAGES = ("models", "twin", "collectors", "dashboards")


def modules_with_examples() -> list[str]:
    """The dotted names of the packages' modules whose source has a ``>>> `` prompt."""
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if ">>> " in path.read_text():
                rel = path.relative_to(REPO).with_suffix("")
                parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                names.append(".".join(parts))
    return names


MODULES = modules_with_examples()


def run_examples(name: str) -> tuple[doctest.TestResults, str]:
    """Run the docstring examples of module ``name`` (as pytest's ``--doctest-modules`` would,
    with ELLIPSIS); returns the counts and doctest's report of the failures."""
    module = importlib.import_module(name)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=report.write)
    return runner.summarize(verbose=False), report.getvalue()


def test_every_model_module_with_examples_is_run() -> None:
    models = {m for m in MODULES if m.startswith("models.")}
    # the physics modules document their formulas with examples
    assert models >= {"models.cdu", "models.coolant", "models.electrical", "models.gpu_power"}
    assert {"twin.redact", "twin.simulator.faults"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name: str) -> None:
    result, report = run_examples(name)
    assert result.attempted > 0, f"{name} has a '>>> ' prompt but no example doctest can run"
    assert result.failed == 0, report
