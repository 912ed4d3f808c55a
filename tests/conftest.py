"""Shared fixtures: a real MQTT broker on a free port, stores, and the sample sites."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.mqtt import BrokerConfig
from twin.broker import LocalBroker, start_broker

REPO = Path(__file__).resolve().parents[1]
SMALL_SITE = REPO / "sample_telemetry" / "small_site.yaml"
DEMO_SITE = REPO / "sample_telemetry" / "demo_site.yaml"

#: DCTWIN_TEST_BROKER=embedded runs the broker tests against the embedded Python broker even
#: where mosquitto is installed; the default takes mosquitto when on PATH.
TEST_BROKER = os.environ.get("DCTWIN_TEST_BROKER", "auto")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A fresh broker for one test: mosquitto when on PATH, else the embedded Python broker."""
    b = start_broker(TEST_BROKER, log_path=tmp_path / "broker.log")  # type: ignore[arg-type]
    yield b
    b.stop()


@pytest.fixture
def embedded_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """The embedded Python broker (MQTT 3.1.1 only), whatever else is installed."""
    b = start_broker("embedded", log_path=tmp_path / "broker.log")
    yield b
    b.stop()


def broker_config(b: LocalBroker) -> BrokerConfig:
    return b.client_config()


def wye_pdu(name: str, feed: str, breaker_prefix: str = "cb") -> dict:
    """A 415 V, 32 A three-phase wye PDU with one breaker per phase, for sites built in tests."""
    return {
        "name": name,
        "feed": feed,
        "voltage_v": 415,
        "rated_current_a": 32,
        "breakers": [
            {"name": f"{breaker_prefix}{i}", "phase": f"L{i}", "rated_current_a": 32}
            for i in (1, 2, 3)
        ],
    }


def has_mosquitto_pub() -> bool:
    return shutil.which("mosquitto_pub") is not None


@pytest.fixture(autouse=True)
def _keep_main_module() -> Iterator[None]:
    """Streamlit's AppTest runs page scripts as ``__main__``; a receiver child started later
    with multiprocessing's spawn would re-run that script. Put the real ``__main__`` back."""
    import sys

    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main
