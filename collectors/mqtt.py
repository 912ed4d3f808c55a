"""MQTT connection settings and a paho-mqtt 2.x client factory shared by every dctwin client.

Credentials and TLS come from arguments or the environment (``DCTWIN_MQTT_USERNAME``,
``DCTWIN_MQTT_PASSWORD``, ``DCTWIN_MQTT_TLS``, ``DCTWIN_MQTT_CA_FILE``, ...). The password is a
``SecretStr``: it never appears in a repr or a log line.

Clients speak MQTT v5 where the broker does and fall back to 3.1.1 (the embedded Python broker
speaks only 3.1.1); nothing here depends on v5-only features for correctness.
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from typing import Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger(__name__)

#: Session expiry asked of a v5 broker for persistent sessions: one week [s].
SESSION_EXPIRY_S = 7 * 24 * 3600


class BrokerError(RuntimeError):
    """The broker could not be reached or refused the connection."""


class BrokerConfig(BaseSettings):
    """Where the broker is and how to authenticate; env vars ``DCTWIN_MQTT_*`` fill the gaps."""

    model_config = SettingsConfigDict(env_prefix="DCTWIN_MQTT_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=1883, ge=1, le=65535)
    username: str | None = None
    password: SecretStr | None = None
    tls: bool = False
    ca_file: str | None = None
    tls_insecure: bool = Field(default=False, description="skip certificate verification")
    protocol: Literal["auto", "5", "3.1.1"] = "auto"
    keepalive_s: int = Field(default=30, ge=5)
    max_inflight: int = Field(
        default=1000,
        ge=1,
        le=60000,
        description="QoS 1 messages a publisher leaves unacknowledged at most (backpressure);"
        " MQTT packet ids are 16 bits, so this stays well under 65,535",
    )

    @classmethod
    def parse(cls, hostport: str | None, **overrides: object) -> BrokerConfig:
        """Build from ``HOST:PORT`` (or ``HOST``, or None for the defaults and environment)."""
        values: dict[str, object] = {k: v for k, v in overrides.items() if v is not None}
        if hostport:
            host, sep, port = hostport.rpartition(":")
            if not sep:
                host, port = hostport, ""
            if port:
                if not port.isdigit():
                    raise ValueError(f"--broker {hostport!r}: port {port!r} is not a number")
                values["port"] = int(port)
            if host:
                values["host"] = host.strip("[]")
        return cls(**values)  # type: ignore[arg-type]

    def describe(self) -> str:
        """Human-readable target without secrets."""
        user = f"{self.username}@" if self.username else ""
        return f"mqtt{'s' if self.tls else ''}://{user}{self.host}:{self.port}"


#: Reconnect back-off after a lost connection: from about RECONNECT_MIN_S, doubling, capped at
#: about RECONNECT_MAX_S, reset once connected; each client draws its own bounds in
#: [0.5, 1] x these (jitter: a fleet of collectors does not retry in step). The cap is what
#: keeps a client back within 5 s of the broker's return, whatever the outage (paho's default
#: cap, 120 s, left one 29 s behind after a 34 s outage).
RECONNECT_MIN_S = 1.0
RECONNECT_MAX_S = 4.0


def jittered(delay_s: float) -> float:
    """``delay_s`` times a random factor in [0.5, 1] (full jitter would also allow 0)."""
    return delay_s * random.uniform(0.5, 1.0)


def _new_client(
    cfg: BrokerConfig, client_id: str, protocol: int, manual_ack: bool, persistent: bool
) -> mqtt.Client:
    client = mqtt.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=protocol,
        clean_session=None if protocol == mqtt.MQTTv5 else not persistent,
        manual_ack=manual_ack,
    )
    if cfg.username:
        client.username_pw_set(
            cfg.username, cfg.password.get_secret_value() if cfg.password else None
        )
    if cfg.tls:
        client.tls_set(ca_certs=cfg.ca_file, cert_reqs=ssl.CERT_REQUIRED)
        if cfg.tls_insecure:
            client.tls_insecure_set(True)
    client.max_inflight_messages_set(cfg.max_inflight)
    client.max_queued_messages_set(0)
    client.reconnect_delay_set(
        min_delay=jittered(RECONNECT_MIN_S),  # type: ignore[arg-type]  # paho takes floats
        max_delay=jittered(RECONNECT_MAX_S),  # type: ignore[arg-type]
    )
    return client


def connect(
    cfg: BrokerConfig,
    client_id: str,
    *,
    persistent: bool = False,
    manual_ack: bool = False,
    on_message: Callable[[mqtt.Client, object, mqtt.MQTTMessage], None] | None = None,
    subscriptions: list[str] | None = None,
    timeout_s: float = 10.0,
    receive_maximum: int | None = None,
) -> mqtt.Client:
    """Connect, start the network loop, subscribe at QoS 1, and return the client.

    ``persistent`` asks for a session that outlives the connection (v5: clean start off and a
    session expiry; 3.1.1: clean session off), so that QoS 1 messages the broker held while this
    client was away arrive when it returns. Subscriptions are (re)made on every connect.
    """
    protocols = {"5": [mqtt.MQTTv5], "3.1.1": [mqtt.MQTTv311]}.get(
        cfg.protocol, [mqtt.MQTTv5, mqtt.MQTTv311]
    )
    last_error = "no attempt"
    for proto in protocols:
        client = _new_client(cfg, client_id, proto, manual_ack, persistent)
        connected = threading.Event()
        result: dict[str, object] = {}

        def on_connect(c, userdata, flags, reason_code, properties, _r=result, _e=connected):
            _r["rc"] = reason_code
            if not reason_code.is_failure and subscriptions:
                c.subscribe([(t, 1) for t in subscriptions])
            _e.set()

        def on_disconnect(c, userdata, flags, reason_code, properties, _r=result, _e=connected):
            if not _e.is_set():  # closed before CONNACK: e.g. a 3.1.1-only broker and MQTT v5
                _r["rc"] = reason_code
                _r["closed"] = True
                _e.set()

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect
        if on_message is not None:
            client.on_message = on_message
        kwargs: dict[str, object] = {}
        if proto == mqtt.MQTTv5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY_S if persistent else 0
            if receive_maximum:
                props.ReceiveMaximum = min(int(receive_maximum), 65535)
            kwargs = {"clean_start": not persistent, "properties": props}
        try:
            client.connect(cfg.host, cfg.port, keepalive=cfg.keepalive_s, **kwargs)
        except OSError as e:
            raise BrokerError(f"cannot reach MQTT broker at {cfg.describe()}: {e}") from e
        client.loop_start()
        # A 3.1.1-only broker may ignore a v5 CONNECT; don't wait long before falling back.
        wait_s = min(timeout_s, 3.0) if proto == mqtt.MQTTv5 and len(protocols) > 1 else timeout_s
        if not connected.wait(wait_s):
            client.loop_stop()
            client.disconnect()
            last_error = f"no CONNACK within {wait_s:.0f} s"
            continue
        rc = result["rc"]
        if result.get("closed") or rc.is_failure:  # type: ignore[attr-defined]
            client.disconnect()
            client.loop_stop()
            last_error = str(rc)
            log.info("broker %s refused MQTT %s (%s)", cfg.describe(), _pname(proto), rc)
            continue
        client.on_disconnect = None
        log.info("connected to %s with MQTT %s as %s", cfg.describe(), _pname(proto), client_id)
        return client
    raise BrokerError(f"MQTT broker at {cfg.describe()} refused the connection: {last_error}")


def _pname(proto: int) -> str:
    return "5" if proto == mqtt.MQTTv5 else "3.1.1"


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    """Poll ``predicate`` until true or the timeout; returns the last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def prepare_session(cfg: BrokerConfig, client_id: str, topic: str, timeout_s: float = 10.0) -> None:
    """Create a persistent session subscribed to ``topic`` and leave it, so that the broker
    queues QoS 1 messages for ``client_id`` from now on, even before that client first connects.
    """
    subscribed = threading.Event()
    client = connect(cfg, client_id, persistent=True)
    client.on_subscribe = lambda *args: subscribed.set()
    client.subscribe(topic, qos=1)
    try:
        if not subscribed.wait(timeout_s):
            raise BrokerError(f"no SUBACK from {cfg.describe()} within {timeout_s:.0f} s")
    finally:
        client.disconnect()
        client.loop_stop()


class AckedPublisher:
    """QoS 1 publishing with backpressure, over a client from :func:`connect`.

    :meth:`publish` blocks while ``max_inflight`` messages are unacknowledged and returns once
    the broker's PUBACKs make room, so a fast producer never outruns paho's 16-bit packet ids
    (``ERR_QUEUE_SIZE``) nor fills memory. A broker that goes away, or acknowledges nothing
    for ``ack_timeout_s``, is a :class:`BrokerError` naming it.
    """

    def __init__(
        self,
        client: mqtt.Client,
        cfg: BrokerConfig,
        *,
        max_inflight: int | None = None,
        ack_timeout_s: float = 30.0,
    ):
        self.client = client
        self.cfg = cfg
        self.max_inflight = max_inflight or cfg.max_inflight
        self.ack_timeout_s = ack_timeout_s
        self.sent = 0
        self.acked = 0
        self.rejected = 0
        self.max_unacked = 0
        self._lost: str | None = None
        self._closing = False
        self._cv = threading.Condition()
        client.on_publish = self._on_publish
        client.on_disconnect = self._on_disconnect

    @property
    def unacked(self) -> int:
        with self._cv:
            return self.sent - self.acked

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._cv:
            self.acked += 1
            if getattr(reason_code, "is_failure", False):
                self.rejected += 1
            self._cv.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._cv:
            if not self._closing and self._lost is None:
                self._lost = (
                    f"lost the MQTT broker at {self.cfg.describe()} ({reason_code}) with"
                    f" {self.sent - self.acked} message(s) unacknowledged"
                )
            self._cv.notify_all()

    def _wait(self, done: Callable[[], bool], timeout_s: float | None) -> bool:
        """Wait (holding the lock) until ``done()``; no progress for ``ack_timeout_s`` or a lost
        connection raises; ``timeout_s`` overall returns False."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        progress_t, progress_n = time.monotonic(), self.acked
        while not done():
            if self._lost is not None:
                raise BrokerError(self._lost)
            now = time.monotonic()
            if self.acked != progress_n:
                progress_t, progress_n = now, self.acked
            if now - progress_t > self.ack_timeout_s:
                raise BrokerError(
                    f"MQTT broker at {self.cfg.describe()} acknowledged nothing for"
                    f" {self.ack_timeout_s:g} s ({self.sent - self.acked} message(s) waiting)"
                )
            if end is not None and now >= end:
                return False
            self._cv.wait(0.2 if end is None else max(0.0, min(0.2, end - now)))
        return True

    def publish(self, topic: str, payload: bytes) -> None:
        """Publish at QoS 1, first waiting until fewer than ``max_inflight`` are unacked."""
        with self._cv:
            self._wait(lambda: self.sent - self.acked < self.max_inflight, None)
        info = self.client.publish(topic, payload, qos=1)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            with self._cv:
                lost = self._lost
            raise BrokerError(
                lost
                or f"cannot publish to the MQTT broker at {self.cfg.describe()}:"
                f" {mqtt.error_string(info.rc)}"
            )
        with self._cv:
            self.sent += 1
            self.max_unacked = max(self.max_unacked, self.sent - self.acked)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every PUBACK; returns how many are still missing."""
        with self._cv:
            self._wait(lambda: self.acked >= self.sent, timeout_s)
            return max(0, self.sent - self.acked)

    def close(self) -> None:
        """Disconnect (what is unacknowledged now stays so) and stop the network loop."""
        with self._cv:
            self._closing = True
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()

    def stats(self) -> dict[str, int]:
        with self._cv:
            return {
                "published_mqtt": self.sent,
                "acknowledged": self.acked,
                "rejected": self.rejected,
                "max_unacked": self.max_unacked,
            }
