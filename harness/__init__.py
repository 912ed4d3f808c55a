"""Test and benchmark support: code that tests/ and bench/ share and that dctwin does not ship.

- :mod:`harness.live_path`: the service's own live path over simulated time (bench_alerts'
  live path, tests/test_live_alerts.py);
- :mod:`harness.fault_score`: the alert benchmark's fault draws and its scoring of pages
  against the simulator's ground truth (bench/bench_alerts.py, tests/test_bench_alerts.py);
- :mod:`harness.recovery`: calibrated parameters against the simulator's truth
  (bench/recover_site.py, tests/test_recover_demo.py);
- :mod:`harness.pageload`: a console page's load time in a real browser (bench/bench_console.py,
  tests/test_browser.py).

It is not in the wheel (``[tool.hatch.build.targets.wheel]`` in pyproject.toml names the shipped
packages) and no shipped package imports it (tests/test_import_rules.py). It is imported from
the repository root: pytest puts the root on ``sys.path`` (``pythonpath`` in pyproject.toml),
each bench script puts it there itself (``PYTHONPATH=.`` works too), and an editable install
(``pip install -e '.[dev]'``) has the root on the path as well.
"""
