"""SnmpPduCollector against a real SNMP v2c agent: snmpsim serving tests/fixtures/snmp/*.snmprec.

Each ``<profile>.snmprec`` (``OID|type|value`` lines) holds the raw integers a PDU of that
vendor would answer; snmpsim serves it under the community ``<profile>``. The expected values
below are those raw numbers scaled by hand from the MIB's UNITS / DecimalDigits.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("snmpsim", reason="snmpsim (dev extra) serves the test SNMP agent")

from collectors.base import Collector, CollectorError
from collectors.contract import decode
from collectors.snmp import PROFILES, SnmpPduCollector

# pysnmp 7 calls deprecated pysmi names of its own when pysmi (an snmpsim dependency) is present
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FIXTURES = Path(__file__).parent / "fixtures" / "snmp"
RESPONDER = Path(sys.executable).with_name("snmpsim-command-responder")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """snmpsim on 127.0.0.1:<free port>; yields the port once it answers."""
    if not RESPONDER.exists():
        pytest.skip(f"{RESPONDER} not installed")
    tmp = tmp_path_factory.mktemp("snmpsim")
    data = tmp / "data"
    shutil.copytree(FIXTURES, data)
    port = _free_udp_port()
    log = (tmp / "snmpsim.log").open("w")
    proc = subprocess.Popen(
        [
            str(RESPONDER),
            f"--data-dir={data}",
            f"--cache-dir={tmp / 'cache'}",
            f"--agent-udpv4-endpoint=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SNMPSIM_ALLOW_ROOT": "true"},  # it refuses root otherwise
    )
    try:
        probe = SnmpPduCollector(
            "127.0.0.1",
            site="lab",
            profile="apc-rpdu2",
            community="apc-rpdu2",
            port=port,
            timeout_s=0.5,
            retries=0,
        )
        deadline = time.monotonic() + 60
        while True:  # wait until the agent has indexed its data and answers
            try:
                probe.poll()
                break
            except CollectorError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"snmpsim did not come up: {(tmp / 'snmpsim.log').read_text()}")
        probe.close()
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def poll(port: int, profile: str, **kw: Any) -> dict[str, dict[str, Any]]:
    c = SnmpPduCollector(
        "127.0.0.1",
        site="lab",
        profile=profile,
        community=profile,
        port=port,
        source="pdu-r01-a",
        **kw,
    )
    assert isinstance(c, Collector)
    try:
        msgs = c.poll()
    finally:
        c.close()
    assert len(msgs) == 1
    topic, payload = msgs[0]
    assert topic == "dctwin/v1/lab/pdu/pdu-r01-a"
    d = decode(topic, payload)
    assert d.kind == "pdu" and d.collector == "snmp"
    return {s["id"]: {k: v for k, v in s.items() if v is not None} for s in d.samples}


def check(samples: dict[str, dict[str, Any]], expected: dict[str, dict[str, float]]) -> None:
    for sid, quantities in expected.items():
        assert sid in samples, f"{sid} missing; got {sorted(samples)}"
        for q, v in quantities.items():
            assert q in samples[sid], f"{sid}.{q} missing; got {samples[sid]}"
            assert math.isclose(samples[sid][q], v, rel_tol=1e-9, abs_tol=1e-9), (
                sid,
                q,
                samples[sid][q],
                v,
            )


P = "pdu-r01-a"


def test_apc_rpdu2_scales_tenths_and_hundredths(agent: int) -> None:
    s = poll(agent, "apc-rpdu2")
    check(
        s,
        {
            # rPDU2DeviceStatus: 345 hundredths kW, 123456 tenths kWh, 362 hundredths kVA, 95 %
            P: {
                "power_w": 3450.0,
                "energy_kwh": 12345.6,
                "apparent_power_va": 3620.0,
                "power_factor": 0.95,
                "inlet_temp_c": 23.5,
                "humidity_pct": 41.0,
            },
            # rPDU2PhaseStatus: current 123 tenths A -> 12.3 A; power 276 hundredths kW -> 2760 W
            f"{P}/L1": {
                "current_a": 12.3,
                "voltage_v": 230.0,
                "power_w": 2760.0,
                "power_factor": 0.97,
            },
            f"{P}/L2": {
                "current_a": 8.7,
                "voltage_v": 231.0,
                "power_w": 1950.0,
                "power_factor": 0.96,
            },
            f"{P}/L3": {"current_a": 0.0, "voltage_v": 229.0, "power_w": 0.0},
            # rPDU2BankStatusCurrent: tenths of A
            f"{P}/cb1": {"current_a": 6.4},
            f"{P}/cb2": {"current_a": 5.9},
            # second probe: temperature only (humidity -1 = no sensor)
            f"{P}/sensor2": {"inlet_temp_c": 27.1},
        },
    )
    assert "power_factor" not in s[f"{P}/L3"]  # -1: not available
    assert "humidity_pct" not in s[f"{P}/sensor2"]


def test_sentry4_scales_and_fahrenheit_probe(agent: int) -> None:
    s = poll(agent, "sentry4")
    check(
        s,
        {
            # st4InputCord: W, VA, hundredths, tenth kWh, tenth Hz; st4LineCurrent N (line 4)
            P: {
                "power_w": 4120.0,
                "apparent_power_va": 4300.0,
                "power_factor": 0.96,
                "energy_kwh": 9876.5,
                "frequency_hz": 60.0,
                "neutral_current_a": 2.1,
                # st4TempSensorValue 770 tenth degrees, st4TempSensorScale fahrenheit -> 25 °C
                "inlet_temp_c": 25.0,
                "humidity_pct": 40.0,
            },
            # st4LineCurrent hundredth A; st4PhaseVoltage tenth V; st4PhaseActivePower W
            f"{P}/L1": {
                "current_a": 12.34,
                "voltage_v": 230.1,
                "power_w": 1400.0,
                "apparent_power_va": 1450.0,
                "power_factor": 0.97,
                "energy_kwh": 300.0,
                "phase_current_a": 12.34,
            },
            f"{P}/L2": {"current_a": 11.5, "voltage_v": 229.8, "power_w": 1350.0},
            f"{P}/L3": {"current_a": 10.1, "voltage_v": 230.5, "power_w": 1370.0},
            # st4BranchCurrent hundredth A
            f"{P}/cb1": {"current_a": 6.12},
            f"{P}/cb2": {"current_a": 6.22},
            f"{P}/cb3": {"current_a": 0.0},
            f"{P}/cb4": {"current_a": 5.75},
            f"{P}/cb5": {"current_a": 4.1},
            # st4Outlet: hundredth A, tenth V, W, VA, hundredths, Watt-Hours -> kWh
            f"{P}/outlet1": {
                "current_a": 1.5,
                "voltage_v": 230.0,
                "power_w": 330.0,
                "apparent_power_va": 345.0,
                "power_factor": 0.96,
                "energy_kwh": 123.456,
            },
        },
    )
    assert f"{P}/cb6" not in s  # -1: no reading
    assert f"{P}/L4" not in s  # the neutral is not a phase
    assert f"{P}/sensor2" not in s  # -410: invalid temperature reading


def test_raritan_pdu2_uses_decimal_digits_and_refuses_unknown_units(
    agent: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="collectors.snmp"):
        s = poll(agent, "raritan-pdu2")
    check(
        s,
        {
            # inlet: rmsCurrent 12345 with 3 digits, activeEnergy 1234567 Wh, frequency 500 / 10
            P: {
                "current_a": 12.345,
                "voltage_v": 230.0,
                "power_w": 2840.0,
                "apparent_power_va": 2900.0,
                "power_factor": 0.98,
                "energy_kwh": 1234.567,
                "frequency_hz": 50.0,
                "inlet_temp_c": 23.5,
                "humidity_pct": 45.0,
            },
            f"{P}/L1": {"current_a": 4.1, "voltage_v": 230.0},
            f"{P}/L2": {"current_a": 4.2, "voltage_v": 231.0},
            f"{P}/L3": {"current_a": 4.045, "voltage_v": 229.0},
            # over-current protectors (breakers)
            f"{P}/cb1": {"current_a": 6.1},
            f"{P}/cb2": {"current_a": 6.245},
            f"{P}/outlet1": {"current_a": 1.5, "power_w": 345.0},
            f"{P}/outlet2": {"current_a": 0.0, "power_w": 0.0},
        },
    )
    # external sensor 3 reports units code 14, which the profile does not accept
    assert f"{P}/sensor3" not in s
    assert all(v != 77.0 for smp in s.values() for v in smp.values() if isinstance(v, float))
    refused = [r.getMessage() for r in caplog.records if "unit code 14" in r.getMessage()]
    assert refused and "measurementsExternalSensorValue" in refused[0]


def test_config_columns_are_read_once(agent: int) -> None:
    c = SnmpPduCollector(
        "127.0.0.1", site="lab", profile="raritan-pdu2", community="raritan-pdu2", port=agent
    )
    walked: list[str] = []
    real_walk = c._walk

    async def counting_walk(oid: str) -> Any:
        walked.append(oid)
        return await real_walk(oid)

    c._walk = counting_walk  # type: ignore[method-assign]
    first = decode(*c.poll()[0])
    assert any(o.endswith(".3.3.4.1.7") for o in walked)  # inletSensorDecimalDigits
    walked.clear()
    second = decode(*c.poll()[0])
    c.close()
    assert not any(o.endswith((".7", ".6")) and ".6.3." in o for o in walked), walked
    assert first.samples == second.samples
    assert second.seq == first.seq + 1
    assert first.source == "127-0-0-1"  # default source: the host


def test_wrong_community_is_a_clear_error(agent: int) -> None:
    c = SnmpPduCollector(
        "127.0.0.1",
        site="lab",
        profile="apc-rpdu2",
        community="not-the-community",
        port=agent,
        timeout_s=0.5,
        retries=0,
    )
    with pytest.raises(CollectorError, match=r"127\.0\.0\.1:\d+.*no usable answer.*community"):
        c.poll()
    c.close()


def test_no_agent_is_a_clear_error() -> None:
    port = _free_udp_port()
    c = SnmpPduCollector(
        "127.0.0.1",
        site="lab",
        profile="sentry4",
        community="public",
        port=port,
        timeout_s=0.3,
        retries=1,
    )
    with pytest.raises(
        CollectorError, match=rf"snmp sentry4 127\.0\.0\.1:{port}.*no usable answer"
    ):
        c.poll()
    c.close()


def test_wrong_profile_is_named(agent: int) -> None:
    c = SnmpPduCollector(
        "127.0.0.1", site="lab", profile="sentry4", community="apc-rpdu2", port=agent
    )
    with pytest.raises(CollectorError, match="wrong profile"):
        c.poll()
    c.close()


def test_profiles_are_explicit() -> None:
    assert set(PROFILES) == {"raritan-pdu2", "apc-rpdu2", "sentry4"}
    for p in PROFILES.values():
        for t in p.tables:
            for col in t.columns:
                assert col.mib and col.oid.startswith("1.3.6.1.4.1.")
    with pytest.raises(ValueError, match="unknown SNMP profile"):
        SnmpPduCollector("127.0.0.1", site="lab", profile="nope", community="public")
