"""`dctwin sim --speed 0` against a real broker: at most DCTWIN_MQTT_MAX_INFLIGHT QoS 1
messages unacknowledged (it waits for PUBACKs instead of overflowing paho's 16-bit packet ids),
every message stored by a running `dctwin serve`, and one clear line, exit 2, when the broker
goes away or the file cannot be written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from collectors.mqtt import wait_until
from twin.broker import start_broker

from .helpers import SMALL_SITE, TEST_BROKER

DCTWIN = [sys.executable, "-m", "twin.cli"]


def sim_args(address: str, duration_s: int, start: datetime | None = None) -> list[str]:
    start = start or datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=duration_s)
    return [
        *("sim", "--site", str(SMALL_SITE), "--broker", address, "--speed", "0"),
        *("--duration", str(duration_s), "--start", start.isoformat()),
    ]


@pytest.fixture
def plain_broker(tmp_path: Path):
    """Mosquitto with its stock limits, as a site broker runs (else the embedded one)."""
    b = start_broker(TEST_BROKER, log_path=tmp_path / "broker.log", raise_limits=False)  # type: ignore[arg-type]
    yield b
    b.stop()


@pytest.mark.slow
@pytest.mark.mqtt
def test_sim_speed_0_without_a_subscriber_waits_for_pubacks(plain_broker):
    """23,400 messages as fast as the simulator makes them, nobody subscribed: it completes,
    never more than the bound unacknowledged, every message acknowledged."""
    r = subprocess.run(
        [*DCTWIN, *sim_args(plain_broker.address, 1800)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **plain_broker.client_env(), "DCTWIN_MQTT_MAX_INFLIGHT": "50"},
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    total = sum(stats["messages"].values())
    assert total == 1800 * 13
    assert stats["published_mqtt"] == stats["acknowledged"] == total
    assert stats["unacknowledged"] == 0 and stats["max_inflight"] == 50
    assert 0 < stats["max_unacked"] <= 50


@pytest.mark.slow
@pytest.mark.mqtt
def test_serve_stores_every_message_of_a_speed_0_sim(broker, tmp_path):
    db = tmp_path / "bp.duckdb"
    log = tmp_path / "serve.log"
    env = {**os.environ, **broker.client_env(), "DCTWIN_MQTT_MAX_INFLIGHT": "100"}
    serve = subprocess.Popen(
        [
            *DCTWIN,
            *("serve", "--broker", broker.address, "--db", str(db), "--site", str(SMALL_SITE)),
            *("--api-port", "0", "--calibrate-every", "0", "--detect-every", "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        env=env,
    )
    try:
        assert wait_until(lambda: b"serving:" in log.read_bytes() or serve.poll() is not None, 60)
        assert serve.poll() is None, log.read_text()
        r = subprocess.run(
            [*DCTWIN, *sim_args(broker.address, 1200)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        stats = json.loads(r.stdout.strip().splitlines()[-1])
        assert stats["acknowledged"] == stats["published_mqtt"] == sum(stats["messages"].values())
        assert stats["max_unacked"] <= 100
        time.sleep(2.0)  # the service's last batch
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
    assert serve.returncode == 0, log.read_text()
    st = subprocess.run(
        [*DCTWIN, "status", "--db", str(db), "--json"], capture_output=True, text=True
    )
    status = json.loads(st.stdout)
    assert status["samples"] == {k: stats["samples"].get(k, 0) for k in status["samples"]}
    assert sum(status["samples"].values()) == sum(stats["samples"].values())
    assert status["dead_letters"] == {}


@pytest.mark.mqtt
@pytest.mark.slow  # 3 s or more: out of the fast tier
def test_sim_says_in_one_line_when_the_broker_goes_away(tmp_path):
    b = start_broker(TEST_BROKER, log_path=tmp_path / "broker.log")  # type: ignore[arg-type]
    log = tmp_path / "sim.log"
    try:
        p = subprocess.Popen(
            [
                *DCTWIN,
                *("sim", "--site", str(SMALL_SITE), "--broker", b.address),
                *("--speed", "20", "--duration", "100000"),
            ],
            stdout=subprocess.PIPE,
            stderr=log.open("wb"),
            env={**os.environ, **b.client_env()},
        )
        assert wait_until(lambda: b"connected to" in log.read_bytes() or p.poll() is not None, 30)
        time.sleep(1.0)
    finally:
        b.stop()
    try:
        p.wait(45)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"sim kept running without its broker: {log.read_text()}")
    text = log.read_text()
    assert p.returncode == 2, text
    assert "Traceback" not in text
    assert f"error: lost the MQTT broker at mqtt://{b.address}" in text.replace("\n", " ")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_sim_says_in_one_line_when_the_disk_is_full():
    r = subprocess.run(
        [
            *DCTWIN,
            *("sim", "--site", str(SMALL_SITE), "--no-mqtt", "--jsonl", "/dev/full"),
            *("--duration", "600", "--speed", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "--jsonl /dev/full: cannot write: No space left on device" in r.stderr
