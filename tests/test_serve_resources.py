"""`dctwin serve` on a machine it shares: DuckDB's memory and threads capped by the options, and
the calibration and detection threads run nicer than ingest and the API (issue 17: four
shards' services on one machine)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from collectors.mqtt import wait_until

from .helpers import SMALL_SITE

DCTWIN = [sys.executable, "-m", "twin.cli"]

pytestmark = [pytest.mark.mqtt, pytest.mark.slow]  # a dctwin subprocess: out of the fast tier


def _thread_nices(pid: int) -> list[int]:
    out = []
    for t in psutil.Process(pid).threads():
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            out.append(os.getpriority(os.PRIO_PROCESS, t.id))
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread nice is Linux's")
def test_serve_caps_the_store_and_runs_its_loops_nicer(broker, tmp_path):
    db, log = tmp_path / "s.duckdb", tmp_path / "serve.log"
    args = [
        *("serve", "--broker", broker.address, "--db", str(db), "--site", str(SMALL_SITE)),
        *("--api-port", "0", "--calibrate-every", "3600", "--detect-every", "60"),
        *("--store-memory-mb", "256", "--store-threads", "1", "--background-nice", "7"),
    ]
    p = subprocess.Popen(
        [*DCTWIN, *args],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env={**os.environ, **broker.client_env()},
    )
    try:
        assert wait_until(lambda: "serving:" in log.read_text() or p.poll() is not None, 60, 0.1)
        assert p.poll() is None, log.read_text()
        _check_store_and_nices(p, log.read_text())
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            assert p.wait(timeout=30) == 0, log.read_text()
        finally:
            if p.poll() is None:
                p.kill()


def _check_store_and_nices(p: subprocess.Popen, text: str) -> None:
    m = re.search(r"store: DuckDB memory limit ([\d.]+) (MiB|MB), (\d+) threads", text)
    assert m, text
    # 256 MB is 244.1 MiB as DuckDB reports it: the cap, not DuckDB's 80 % of RAM
    assert 240 <= float(m.group(1)) <= 260 and m.group(3) == "1", m.group(0)
    assert "calibration and detection at nice +7" in text
    base = os.getpriority(os.PRIO_PROCESS, p.pid)
    # the calibration and the detection loop lower themselves once started: two threads at
    # base + 7, every other thread (ingest's writer, the API) left at the process's own
    assert wait_until(lambda: _thread_nices(p.pid).count(min(19, base + 7)) >= 2, 10, 0.1), (
        _thread_nices(p.pid)
    )
    nices = _thread_nices(p.pid)
    assert nices.count(base) >= 3, nices


def test_serve_refuses_a_store_memory_cap_too_small_to_run(tmp_path):
    r = subprocess.run(
        [*DCTWIN, "serve", "--db", str(tmp_path / "x.duckdb"), "--store-memory-mb", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert "--store-memory-mb" in r.stderr and "Traceback" not in r.stderr


def test_a_refused_store_setting_is_named_and_a_good_one_is_applied(tmp_path):
    from twin.store import Store, StoreError

    db = tmp_path / "s.duckdb"
    with pytest.raises(StoreError, match=r"memory limit 10 MB: expected 64 or more"):
        Store(db, memory_limit_mb=10)
    with pytest.raises(StoreError, match=r"threads 0: expected 1 or more"):
        Store(db, threads=0)
    with Store(db, memory_limit_mb=128, threads=1) as store:
        assert store.settings()["threads"] == "1"
