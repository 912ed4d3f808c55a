"""Start a local MQTT broker for the demo, tests and benchmarks.

``mosquitto`` when it is on PATH (with queue limits raised: the default
``max_queued_messages 1000`` silently drops QoS 1 messages when a subscriber falls behind),
else an embedded Python broker (amqtt, MQTT 3.1.1 only) in a child process.

The embedded broker keeps sessions (and the QoS 1 messages queued for a disconnected client)
only for clients that log in with a username, so dctwin's clients always send one there
(:data:`EMBEDDED_USERNAME`); it does not check passwords and must not face a network.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from collectors.mqtt import BrokerConfig

BrokerKind = Literal["auto", "mosquitto", "embedded"]
EMBEDDED_USERNAME = "dctwin"

MOSQUITTO_CONF = """\
# Written by dctwin for a local broker; see deploy/mosquitto.conf for a site broker.
listener {port} {host}
allow_anonymous true
persistence {persistence}
{persistence_location}
{limits}"""

RAISED_LIMITS = """\
# Raise the queue limits: the defaults drop QoS 1 messages when a subscriber falls behind.
max_queued_messages 0
max_queued_bytes 0
max_inflight_messages 20000
max_packet_size 2000000
"""

AMQTT_CONF = """\
listeners:
  default:
    type: tcp
    bind: {host}:{port}
    max_connections: 1000
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: false
"""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def resolve_kind(kind: BrokerKind) -> Literal["mosquitto", "embedded"]:
    if kind == "auto":
        return "mosquitto" if shutil.which("mosquitto") else "embedded"
    if kind == "mosquitto" and not shutil.which("mosquitto"):
        raise RuntimeError("broker kind 'mosquitto' asked for, but mosquitto is not on PATH")
    return kind


@dataclass
class LocalBroker:
    """A broker process this program started; ``stop()`` (or the context manager) ends it."""

    kind: Literal["mosquitto", "embedded"]
    host: str
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def username(self) -> str | None:
        """The username dctwin's clients must send to this broker (None: any or none)."""
        return EMBEDDED_USERNAME if self.kind == "embedded" else None

    @property
    def protocol(self) -> str:
        """The MQTT version to speak to it: the embedded broker knows only 3.1.1."""
        return "3.1.1" if self.kind == "embedded" else "auto"

    def client_config(self) -> BrokerConfig:
        """Settings for a dctwin client of this broker."""
        return BrokerConfig(
            host=self.host, port=self.port, username=self.username, protocol=self.protocol
        )

    def client_env(self) -> dict[str, str]:
        """Environment for dctwin clients of this broker (DCTWIN_MQTT_*)."""
        env = {"DCTWIN_MQTT_PROTOCOL": self.protocol}
        if self.username:
            env["DCTWIN_MQTT_USERNAME"] = self.username
        return env

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM if self.kind == "mosquitto" else signal.SIGINT)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_broker(
    kind: BrokerKind = "auto",
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    persistence_dir: str | Path | None = None,
    log_path: str | Path | None = None,
    timeout_s: float = 15.0,
    raise_limits: bool = True,
) -> LocalBroker:
    """Start a broker on ``host:port`` (a free port when None) and wait until it accepts.

    ``raise_limits=False`` runs mosquitto with its stock queue and in-flight limits, as a
    plain site broker would be."""
    real = resolve_kind(kind)
    port = port or free_port(host)
    if port_open(host, port):
        raise RuntimeError(f"port {host}:{port} is already in use")
    tmp = tempfile.TemporaryDirectory(prefix="dctwin-broker-")
    workdir = Path(tmp.name)
    log = open(log_path or workdir / "broker.log", "ab")  # noqa: SIM115 - lives with the process
    if real == "mosquitto":
        conf = workdir / "mosquitto.conf"
        conf.write_text(
            MOSQUITTO_CONF.format(
                port=port,
                host=host,
                persistence="true" if persistence_dir else "false",
                persistence_location=f"persistence_location {Path(persistence_dir).resolve()}/"
                if persistence_dir
                else "",
                limits=RAISED_LIMITS if raise_limits else "",
            )
        )
        cmd = [shutil.which("mosquitto") or "mosquitto", "-c", str(conf)]
    else:
        conf = workdir / "amqtt.yaml"
        conf.write_text(AMQTT_CONF.format(port=port, host=host))
        cmd = [sys.executable, "-m", "amqtt.scripts.broker_script", "-c", str(conf)]
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log.close()
    broker = LocalBroker(real, host, port, proc, workdir, tmp)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = (workdir / "broker.log").read_text(errors="replace") if not log_path else ""
            broker.stop()
            raise RuntimeError(
                f"{real} broker exited with {proc.returncode} on start: {text[-800:]}"
            )
        if port_open(host, port):
            return broker
        time.sleep(0.05)
    broker.stop()
    raise RuntimeError(f"{real} broker did not listen on {host}:{port} within {timeout_s:.0f} s")
