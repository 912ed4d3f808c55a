"""Nothing outlives a stop: every long-running command, started as users start it (a
subprocess of `python -m twin.cli`), stops on SIGTERM (and `demo` on SIGHUP) with exit code 0,
within 15 s, taking every process it started with it; stores open cleanly afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from collectors.mqtt import wait_until
from twin.broker import LocalBroker, free_port, port_open
from twin.procs import stop_processes
from twin.store import Store

from .helpers import REPO, SMALL_SITE

DCTWIN = [sys.executable, "-m", "twin.cli"]
STOP_DEADLINE_S = 15.0


def spawn(args: list[str], log: Path, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*DCTWIN, *args],
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        env={**os.environ, **(env or {})},
        **kw,
    )


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below ``pid`` now."""
    out = {}
    for c in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            out[c.pid] = " ".join(c.cmdline())
    return out


def running(pids) -> list[int]:
    """Those of ``pids`` still alive (a zombie is dead: it only waits to be reaped)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def stop_and_check(p: subprocess.Popen, sig: int, tree: dict[int, str], log: Path) -> str:
    """Send ``sig``; the process must exit 0 within the deadline, and every process of
    ``tree`` must be gone by then. Returns its stdout."""
    t0 = time.monotonic()
    p.send_signal(sig)
    try:
        out, _ = p.communicate(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"still running {STOP_DEADLINE_S:.0f} s after {sig!r}: {log.read_text()}")
    left = wait_until(
        lambda: not running(tree), max(0.1, STOP_DEADLINE_S - (time.monotonic() - t0))
    )
    survivors = {pid: tree[pid] for pid in running(tree)}
    for pid in survivors:  # do not leave them to the next test
        psutil.Process(pid).kill()
    assert left and not survivors, f"survived {sig!r}: {survivors}"
    text = log.read_text()
    assert p.returncode == 0, text
    assert "Traceback" not in text, text
    return out.decode()


def wait_log(log: Path, marker: str, p: subprocess.Popen, timeout_s: float = 60) -> None:
    ok = wait_until(lambda: marker in log.read_text() or p.poll() is not None, timeout_s, 0.1)
    if not ok or p.poll() is not None:
        p.kill()
        pytest.fail(f"no {marker!r} in the log: {log.read_text()[-3000:]}")


def store_opens(db: Path) -> int:
    """The store opens for writing (no lock left) and holds GPU samples; their count."""
    with Store(db) as store:
        return store.con.execute("SELECT count(*) FROM gpu").fetchall()[0][0]


def serve_args(b: LocalBroker, db: Path) -> list[str]:
    return [
        *("serve", "--broker", b.address, "--db", str(db), "--site", str(SMALL_SITE)),
        *("--api-port", "0", "--calibrate-every", "0"),
    ]


def demo_tree_up(p: subprocess.Popen, want: tuple[str, ...]) -> dict[int, str]:
    ok = wait_until(
        lambda: (
            p.poll() is None
            and all(any(w in cmd for cmd in descendants(p.pid).values()) for w in want)
        ),
        90,
        0.2,
    )
    assert ok, descendants(p.pid) if p.poll() is None else p.returncode
    return descendants(p.pid)


# -- demo ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.mqtt
def test_demo_sigterm_stops_broker_service_simulator_and_console(tmp_path):
    db = tmp_path / "demo.duckdb"
    log = tmp_path / "demo.log"
    args = ["demo", "--site", str(SMALL_SITE), "--db", str(db), "--speed", "10"]
    p = spawn([*args, "--api-port", str(free_port()), "--console-port", str(free_port())], log)
    want = (" serve ", " sim ", " console ", "mosquitto" if _mosquitto() else "amqtt")
    demo_tree_up(p, want)
    wait_log(log, "serving:", p)
    port = int(log.read_text().split("console    http://127.0.0.1:")[1].split()[0])
    assert wait_until(lambda: port_open("127.0.0.1", port), 60, 0.2), log.read_text()
    tree = descendants(p.pid)
    assert len(tree) >= 4, tree
    out = stop_and_check(p, signal.SIGTERM, tree, log)
    assert "demo stopped." in log.read_text()
    sim_stats = next(json.loads(x) for x in out.splitlines() if '"ticks"' in x)
    assert sim_stats["stopped"] is True and sim_stats["unacknowledged"] == 0
    assert store_opens(db) > 0


@pytest.mark.slow
@pytest.mark.mqtt
def test_demo_sighup_when_the_terminal_closes_stops_everything(tmp_path):
    db = tmp_path / "demo.duckdb"
    log = tmp_path / "demo.log"
    args = ["demo", "--site", str(SMALL_SITE), "--db", str(db), "--no-console"]
    # SIGHUP at its default, as a terminal's child has it: a suite run under nohup would hand
    # the demo an ignored SIGHUP, which it rightly keeps ignoring (CI of 2026-12-06, run so)
    p = spawn(
        [*args, "--api-port", str(free_port())],
        log,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    demo_tree_up(p, (" serve ", " sim "))
    wait_log(log, "serving:", p)
    tree = descendants(p.pid)
    stop_and_check(p, signal.SIGHUP, tree, log)
    assert store_opens(db) > 0


# -- serve ----------------------------------------------------------------------------------------


def test_a_stop_signal_that_lands_while_the_main_thread_holds_the_events_lock_still_stops():
    """The stop handler runs in the main thread between two bytecodes, possibly inside
    ``stop.wait()`` while that thread holds the event's lock (right after a timeout). Setting
    the event there must not wait for that lock: ``dctwin demo`` once hung 15 s after SIGHUP
    this way (CI of 2026-12-06). Run in a process of its own: the old handler hangs it."""
    code = (
        "import signal, threading\n"
        "from twin.procs import on_stop_signals\n"
        "stop = threading.Event()\n"
        "on_stop_signals(stop)\n"
        "handler = signal.getsignal(signal.SIGTERM)\n"
        "with stop._cond:  # the lock Event.wait holds around its timeout\n"
        "    handler(signal.SIGTERM, None)\n"
        "print('set' if stop.wait(5) else 'not set')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, cwd=REPO
    )
    assert out.returncode == 0 and out.stdout.strip() == "set", (out.stdout, out.stderr)


@pytest.mark.mqtt
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_serve_stops_on_sigterm_and_sigint(broker, tmp_path, sig):
    db = tmp_path / "s.duckdb"
    log = tmp_path / "serve.log"
    p = spawn(serve_args(broker, db), log, broker.client_env())
    wait_log(log, "serving:", p)
    out = stop_and_check(p, sig, descendants(p.pid), log)
    assert "received" in json.loads(out.strip().splitlines()[-1])
    store_opens(db)


@pytest.mark.mqtt
@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_serve_as_a_background_job_ignores_sigint_and_stops_on_sigterm(broker, tmp_path):
    """A script's `dctwin serve &` starts with SIGINT ignored: SIGTERM is how it stops."""
    db = tmp_path / "bg.duckdb"
    log = tmp_path / "serve.log"
    p = spawn(
        serve_args(broker, db),
        log,
        broker.client_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    wait_log(log, "serving:", p)
    p.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert p.poll() is None, "a background job must keep ignoring SIGINT"
    stop_and_check(p, signal.SIGTERM, descendants(p.pid), log)
    store_opens(db)


# -- sim, broker, collect, replay, console ---------------------------------------------------------


@pytest.mark.slow  # a dctwin subprocess: out of the fast tier
@pytest.mark.mqtt
def test_sim_stops_on_sigterm_after_its_last_acknowledgements(broker, tmp_path):
    log = tmp_path / "sim.log"
    p = spawn(
        ["sim", "--site", str(SMALL_SITE), "--broker", broker.address, "--speed", "5"],
        log,
        broker.client_env(),
    )
    wait_log(log, "connected to", p)
    time.sleep(1.0)
    stats = json.loads(stop_and_check(p, signal.SIGTERM, descendants(p.pid), log).strip())
    assert stats["stopped"] is True
    assert stats["published_mqtt"] > 0 and stats["unacknowledged"] == 0
    assert stats["acknowledged"] == stats["published_mqtt"] == sum(stats["messages"].values())


def _mosquitto() -> bool:
    import shutil

    return os.environ.get("DCTWIN_TEST_BROKER", "auto") != "embedded" and bool(
        shutil.which("mosquitto")
    )


def test_broker_command_takes_its_broker_process_with_it(tmp_path):
    log = tmp_path / "broker.log"
    port = free_port()
    p = spawn(["broker", "--port", str(port)], log)
    wait_log(log, "broker on", p)
    tree = descendants(p.pid)
    assert tree and port_open("127.0.0.1", port)
    stop_and_check(p, signal.SIGTERM, tree, log)
    assert not port_open("127.0.0.1", port)


class _Exporter(ThreadingHTTPServer):
    body = b""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.server.body)))  # type: ignore[attr-defined]
        self.end_headers()
        self.wfile.write(self.server.body)  # type: ignore[attr-defined]

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter() -> Iterator[str]:
    srv = _Exporter(("127.0.0.1", 0), _Handler)
    # a dcgm-exporter /metrics body of one H100 and one MIG slice (what test_collect_dcgm's
    # scrape() writes, kept as a file so that no test imports another)
    srv.body = (REPO / "tests" / "fixtures" / "dcgm" / "metrics-h100-and-mig.txt").read_bytes()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()
    srv.server_close()


@pytest.mark.slow  # a dctwin subprocess: out of the fast tier
@pytest.mark.mqtt
def test_collect_dcgm_stops_on_sigterm_with_its_spool_drained(broker, exporter, tmp_path):
    log = tmp_path / "collect.log"
    p = spawn(
        [
            *("collect", "dcgm", "--url", exporter, "--site", "demo"),
            *("--broker", broker.address, "--interval", "0.2", "--spool", str(tmp_path / "sp")),
        ],
        log,
        broker.client_env(),
    )
    wait_log(log, "collecting:", p)
    time.sleep(1.5)
    stats = json.loads(stop_and_check(p, signal.SIGTERM, descendants(p.pid), log).strip())
    assert stats["polls"] >= 2 and stats["published"] == stats["produced"] > 0
    assert stats["pending"] == 0


def _bundle(tmp_path: Path) -> Path:
    """A one-hour bundle of the small site at 10 s: sim -> ingest -> record."""
    jsonl, db, out = tmp_path / "b.jsonl", tmp_path / "b.duckdb", tmp_path / "bundle"
    for args in (
        [
            *("sim", "--site", str(SMALL_SITE), "--no-mqtt", "--jsonl", str(jsonl)),
            *("--duration", "3600", "--speed", "0", "--start", "2026-01-05T10:00:00Z"),
        ],
        [
            *("ingest", "--file", str(jsonl), "--db", str(db), "--site", str(SMALL_SITE)),
            *("--max-past", "0"),
        ],
        ["record", "--out", str(out), "--db", str(db), "--site", str(SMALL_SITE)],
    ):
        r = subprocess.run([*DCTWIN, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (args, r.stderr)
    return out


@pytest.mark.slow
def test_replay_into_a_store_stops_on_sigterm_and_the_store_opens(tmp_path):
    bundle = _bundle(tmp_path)
    db = tmp_path / "replay.duckdb"
    log = tmp_path / "replay.log"
    p = spawn(["replay", str(bundle), "--db", str(db), "--speed", "60"], log)
    assert wait_until(lambda: db.exists() or p.poll() is not None, 60, 0.1)
    time.sleep(4.0)
    assert p.poll() is None, log.read_text()
    stats = json.loads(stop_and_check(p, signal.SIGTERM, descendants(p.pid), log).strip())
    assert stats["stopped"] is True
    assert stats["messages"] > 0  # what it had read when stopped is all stored
    assert stats["ingest"]["stored_messages"] == stats["messages"]
    assert store_opens(db) > 0


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


@pytest.mark.slow
def test_console_listens_on_localhost_only_and_stops_on_sigterm(tmp_path):
    log = tmp_path / "console.log"
    port = free_port()
    env = {"DCTWIN_API_TOKEN": "the-service-write-token"}
    p = spawn(["console", "--port", str(port), "--api", "http://127.0.0.1:9"], log, env)
    if not wait_until(lambda: port_open("127.0.0.1", port) or p.poll() is not None, 90, 0.2):
        p.kill()
        pytest.fail(log.read_text())
    assert p.poll() is None, log.read_text()
    listening = [
        c.laddr
        for c in psutil.Process(p.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    other = _non_loopback_ipv4()
    if other is not None:
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((other, port)) != 0, f"reachable on {other}:{port}"
    assert "read-only (no DCTWIN_CONSOLE_TOKEN)" in log.read_text()
    stop_and_check(p, signal.SIGTERM, descendants(p.pid), log)


def test_console_refuses_a_bad_api_url_and_a_taken_port(tmp_path):
    r = subprocess.run(
        [*DCTWIN, "console", "--api", "127.0.0.1:8420"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "--api '127.0.0.1:8420'" in r.stderr, r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [*DCTWIN, "console", "--port", str(port)], capture_output=True, text=True
        )
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# -- the stop helpers --------------------------------------------------------------------------


def test_a_child_that_ignores_sigterm_is_killed_after_the_deadline():
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print(1, flush=True); time.sleep(120)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == b"1"
    killed = stop_processes([stubborn, polite], deadline_s=1.0)
    assert killed == [stubborn]
    assert stubborn.returncode == -signal.SIGKILL and polite.returncode == -signal.SIGTERM


@pytest.mark.slow  # a dctwin subprocess: out of the fast tier
def test_a_demo_child_stops_when_its_parent_is_killed(tmp_path):
    """SIGKILL gives a parent no chance to stop its children: they watch it themselves."""
    log = tmp_path / "broker.log"
    port = free_port()
    parent_code = (
        "import os, subprocess, sys, time\n"
        "env = {**os.environ, 'DCTWIN_PARENT_PID': str(os.getpid())}\n"
        f"c = subprocess.Popen([sys.executable, '-m', 'twin.cli', 'broker', '--port', '{port}'],"
        f" env=env, start_new_session=True, stderr=open({str(log)!r}, 'wb'))\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert wait_until(lambda: port_open("127.0.0.1", port), 30, 0.1), log.read_text()
    tree = {child: "broker", **descendants(child)}
    parent.kill()
    parent.wait()
    assert wait_until(lambda: not running(tree), STOP_DEADLINE_S, 0.1), (tree, log.read_text())
    assert not port_open("127.0.0.1", port)
