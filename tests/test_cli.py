"""The `dctwin` command line end to end: simulator -> broker -> service -> store -> status."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from collectors.mqtt import wait_until
from twin.broker import LocalBroker
from twin.store import Store

from .helpers import SMALL_SITE

DCTWIN = [sys.executable, "-m", "twin.cli"]


def run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*DCTWIN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def broker_env(b: LocalBroker) -> dict:
    return b.client_env()


@pytest.mark.mqtt
@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_sim_to_serve_lands_exactly_the_published_samples(broker, tmp_path):
    db = tmp_path / "e2e.duckdb"
    log = tmp_path / "serve.log"
    serve = subprocess.Popen(
        [
            *DCTWIN,
            "serve",
            "--broker",
            broker.address,
            "--db",
            str(db),
            "--site",
            str(SMALL_SITE),
            "--calibrate-every",
            "2",
            "--calibrate-window",
            "60",
            "--calibrate-holdout",
            "10",
            "--api-port",
            "0",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **broker_env(broker)},
    )
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or serve.poll() is not None, 30)
        start = (datetime.now(UTC) - timedelta(seconds=60)).replace(microsecond=0)
        sim = run(
            "sim",
            "--site",
            str(SMALL_SITE),
            "--broker",
            broker.address,
            "--seed",
            "7",
            "--duration",
            "30",
            "--speed",
            "10",
            "--start",
            start.isoformat(),
            "--truth",
            str(tmp_path / "truth.json"),
            env=broker_env(broker),
        )
        assert sim.returncode == 0, sim.stderr
        stats = json.loads(sim.stdout.strip().splitlines()[-1])
        assert stats["ticks"] == 30
        time.sleep(3)  # let the calibration schedule (every 2 s) run on what has landed
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
    assert serve.returncode == 0, log.read_text()
    status = run("status", "--db", str(db), "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["samples"] == {k: stats["samples"].get(k, 0) for k in st["samples"]}
    assert all(st["samples"][k] > 0 for k in ("gpu", "node", "pdu", "cdu", "link"))
    assert st["dead_letters"] == {}
    assert st["unknown_ids"] == []
    assert st["seq_gaps"] == 0
    assert st["time_range"]["start"] == start.isoformat()
    with Store(db, read_only=True) as store:  # the service refitted on its schedule
        runs = store.con.execute("SELECT count(*) FROM calibration_runs").fetchall()[0][0]
        assert runs >= 1
        reasons = store.con.execute(
            "SELECT DISTINCT reason FROM calibration_params WHERE param = 'r_k_per_w'"
        ).fetchall()
        assert all("too few samples" in r[0] for r in reasons)  # 30 s is not enough to fit
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert "trn-r01-n1:0" in truth["gpus"]


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_sim_jsonl_then_ingest_file_then_export(tmp_path):
    jsonl = tmp_path / "sim.jsonl"
    start = (datetime.now(UTC) - timedelta(minutes=5)).replace(microsecond=0)
    sim = run(
        "sim",
        "--site",
        str(SMALL_SITE),
        "--no-mqtt",
        "--jsonl",
        str(jsonl),
        "--duration",
        "120",
        "--speed",
        "0",
        "--start",
        start.isoformat(),
    )
    assert sim.returncode == 0, sim.stderr
    stats = json.loads(sim.stdout.strip().splitlines()[-1])
    db = tmp_path / "file.duckdb"
    ing = run("ingest", "--file", str(jsonl), "--db", str(db), "--site", str(SMALL_SITE))
    assert ing.returncode == 0, ing.stderr
    counters = json.loads(ing.stdout)
    assert counters["samples"] == stats["samples"]
    st = json.loads(run("status", "--db", str(db), "--json").stdout)
    assert st["samples"] == stats["samples"]
    # without --json: tables a person reads, no Python dicts
    text = run("status", "--db", str(db), "--format", "table", env={"COLUMNS": "120"}).stdout
    assert "samples per kind" in text and "dead letters: none" in text and "{" not in text
    gpu_row = next(ln for ln in text.splitlines() if ln.strip("│ ").startswith("gpu "))
    assert f"{stats['samples']['gpu']:,}" in gpu_row
    # loading the same file twice stores nothing twice
    again = json.loads(run("ingest", "--file", str(jsonl), "--db", str(db)).stdout)
    assert again["stored_messages"] == 0
    assert again["duplicates"] == sum(stats["messages"].values())
    out = tmp_path / "export"
    exp = run("export", "--db", str(db), "--out", str(out))
    assert exp.returncode == 0, exp.stderr
    assert json.loads(exp.stdout)["samples"] == stats["samples"]
    day = start.strftime("%Y-%m-%d")
    assert (out / "kind=gpu" / f"day={day}").is_dir()


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_clear_errors(tmp_path):
    r = run("status", "--db", str(tmp_path / "missing.duckdb"), "--json")
    assert r.returncode == 2 and "no such store" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhalls: []\n")
    r = run("sim", "--site", str(bad), "--no-mqtt", "--jsonl", str(tmp_path / "x.jsonl"))
    assert r.returncode == 2 and "bad.yaml" in r.stderr and "halls" in r.stderr
    r = run(
        "sim",
        "--site",
        str(SMALL_SITE),
        "--fault",
        "meltdown:r01@1m",
        "--no-mqtt",
        "--jsonl",
        str(tmp_path / "x.jsonl"),
    )
    assert r.returncode == 2 and "meltdown" in r.stderr
    r = run("serve", "--broker", "127.0.0.1:notaport", "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 2 and "notaport" in r.stderr
    r = run("serve", "--broker", "127.0.0.1:1", "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 2 and "cannot reach MQTT broker at mqtt://127.0.0.1:1" in r.stderr


@pytest.mark.mqtt
@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_demo_runs_and_stops_cleanly(tmp_path):
    """The demo keeps its files in the data directory (XDG_DATA_HOME here), never the current
    one; says where demo.env is while it runs and removes it on stop (its ports and token are
    stale then); on a site without a bundle to seed its
    calibration from, says "detecting" after the first detection pass and when the first
    calibration (then "ready") is due."""
    work, xdg = tmp_path / "work", tmp_path / "xdg"
    work.mkdir()
    r = subprocess.run(
        [*DCTWIN, "demo", "--site", str(SMALL_SITE), "--duration", "20", "--detect-every", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
        env={**os.environ, "XDG_DATA_HOME": str(xdg)},
    )
    assert r.returncode == 0, r.stderr
    assert "broker" in r.stderr and "simulator" in r.stderr and "service" in r.stderr
    assert re.search(
        r"detecting \(\+\d+ s\): first detection pass done; headroom and alerts are live; no"
        r" calibration yet: first fit expected at (?:\d{4}-\d\d-\d\d )?\d\d:\d\d UTC",
        r.stderr,
    ), r.stderr
    assert "ready (+" not in r.stderr  # no calibration within 20 s on this site
    assert list(work.iterdir()) == []  # nothing in the current directory
    data = xdg / "dctwin" / "demo"
    db = data / "demo.duckdb"
    assert f"env        {data / 'demo.env'}" in r.stderr
    assert not (data / "demo.env").exists()  # removed on stop
    lines = {ln.split()[0]: ln.split()[1:] for ln in r.stderr.splitlines() if ln.strip()}
    assert lines["broker"][2].startswith("mqtt://127.0.0.1:")
    assert lines["api"][0].startswith("http://127.0.0.1:")
    st = json.loads(run("status", "--db", str(db), "--json").stdout)
    assert all(st["samples"][k] > 0 for k in ("gpu", "node", "pdu", "cdu", "link")), st
    assert st["dead_letters"] == {}
    # everything the simulator published landed, its first poll and its last included
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    sim_stats = next(x for x in lines if "ticks" in x)
    assert st["samples"] == {k: sim_stats["samples"].get(k, 0) for k in st["samples"]}


@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_every_command_has_help():
    commands = [
        *("sim", "serve", "ingest", "export", "status", "calibrate", "maintain", "broker"),
        *("demo", "headroom", "hotspots", "fleets", "forecast", "record", "replay", "whatif"),
        *("console", "site-view"),
        *("collect nvml", "collect dcgm", "collect redfish", "collect snmp"),
    ]
    for cmd in commands:
        r = run(*cmd.split(), "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, (cmd, r.stderr)


def _help_tree(group, path=()):  # type: ignore[no-untyped-def]
    """(path, click command) for every command under ``group``, groups included."""
    yield path, group
    for name, cmd in getattr(group, "commands", {}).items():
        yield from _help_tree(cmd, (*path, name))


#: A unit or other word in brackets, as help texts write them ("[kW]", "[s]", "[min]").
_BRACKETED = re.compile(r"\\?\[([^\]\s]+)\]")


def test_help_shows_every_bracketed_unit_and_lists_each_command_on_flowing_lines() -> None:
    """Rich markup took ``[kW]`` and ``[s]`` for style tags and dropped them from --help; a
    command listing kept the docstrings' hard line breaks. Every command's --help must show
    each bracketed word its docstring and its options' help hold."""
    import typer
    from typer.testing import CliRunner

    from twin.cli import app

    runner = CliRunner()
    env = {"COLUMNS": "400", "TERM": "dumb", "NO_COLOR": "1"}
    checked = 0
    for path, cmd in _help_tree(typer.main.get_command(app)):
        texts = [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]
        words = {m.group(1) for t in texts for m in _BRACKETED.finditer(t)}
        if not words:
            continue
        r = runner.invoke(app, [*path, "--help"], env=env)
        assert r.exit_code == 0, (path, r.output)
        shown = " ".join(r.output.split())
        for w in words:
            assert f"[{w}]" in shown, f"dctwin {' '.join(path)} --help lost [{w}]"
            checked += 1
    assert checked >= 5  # the forecast's [kW] among them
    listing = " ".join(runner.invoke(app, ["--help"], env=env).output.split())
    assert "the p90 and p95 peaks [kW] and when" in listing
    # one flowing summary: the serve line is not cut where its docstring's line ends
    assert "refit the model and recompute headroom" in listing


def test_an_error_message_is_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """Rich markup dropped bracketed words from error messages: a unit ``[s]``, an extra's
    ``dctwin[service]``; ``fail`` prints the message as it was written, each bracket kept."""
    import typer

    from twin.cli.common import fail, needs_extra

    assert isinstance(fail("--timeout must be above 0 [s] (got -1)"), typer.Exit)
    assert isinstance(needs_extra("serve", "service", "duckdb"), typer.Exit)
    err = " ".join(capsys.readouterr().err.split())
    assert "--timeout must be above 0 [s] (got -1)" in err
    assert "pip install 'dctwin[service]' (duckdb is not installed)" in err
    assert "\\[" not in err  # escaped once, not twice
