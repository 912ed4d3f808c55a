"""``dctwin collect snmp`` against a real SNMP v2c agent: snmpsim serving tests/fixtures/snmp/.

Each ``<name>.snmprec`` (``OID|type|value`` lines, written from the MIB definitions with values
that hold together: V x I ~ VA, VA x pf ~ W) holds the raw integers a PDU of that vendor would
answer; snmpsim serves it under the community ``<name>`` (``sentry4-delta``: a Sentry4 on a
delta feed). Every profile is polled through the CLI as a user runs it (``--once --stdout`` in
a subprocess); the expected values are the raw numbers scaled by hand from the MIB's UNITS /
DecimalDigits.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("snmpsim", reason="snmpsim (dev extra) serves the test SNMP agent")

from collectors.base import Collector, CollectorError
from collectors.contract import decode
from collectors.snmp import SnmpPduCollector
from collectors.snmp_profiles import (
    PROFILE_DIR,
    ProfileError,
    load_profile,
    profile_names,
    profiles,
    resolve,
)
from tests.snmp_agent import ASYNCIO_LEAK, RESPONDER, _free_udp_port, _serve
from twin.site import load_site

# pysnmp 7 calls deprecated pysmi names of its own when pysmi (an snmpsim dependency) is present
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FIXTURES = Path(__file__).parent / "fixtures" / "snmp"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """snmpsim on 127.0.0.1:<free port>; yields the port once it answers."""
    if not RESPONDER.exists():
        pytest.skip(f"{RESPONDER} not installed")
    tmp = tmp_path_factory.mktemp("snmpsim")
    data = tmp / "data"
    shutil.copytree(FIXTURES, data)
    yield from _serve(data, tmp, "apc-rpdu2", "apc-rpdu2")


P = "pdu-r01-a"


def cli(port: int, profile: str, community: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``dctwin collect snmp ... --once --stdout`` in a subprocess, as a user runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "twin.cli",
            "collect",
            "snmp",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--profile",
            profile,
            "--source",
            P,
            "--site",
            "lab",
            "--timeout",
            "2",
            "--once",
            "--stdout",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "DCTWIN_SNMP_COMMUNITY": community},
    )


def samples_of(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    """The samples of the one message printed, by id, checked against the contract."""
    assert proc.returncode == 0, proc.stderr
    assert ASYNCIO_LEAK not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    msg = json.loads(lines[0])
    topic = msg["topic"]
    assert topic == f"dctwin/v1/lab/pdu/{P}"
    d = decode(topic, json.dumps(msg["payload"]).encode())
    assert d.kind == "pdu" and d.collector == "snmp"
    return {s["id"]: {k: v for k, v in s.items() if v is not None} for s in d.samples}


def poll(port: int, profile: str, community: str | None = None) -> dict[str, dict[str, Any]]:
    return samples_of(cli(port, profile, community or profile))


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


def consistent(sample: dict[str, Any], current: str = "current_a") -> None:
    """V x I ~ VA and VA x pf ~ W on one id (one circuit), within 1 %."""
    va = sample["voltage_v"] * sample[current]
    assert math.isclose(va, sample["apparent_power_va"], rel_tol=0.01), (va, sample)
    if "power_factor" in sample:
        w = sample["apparent_power_va"] * sample["power_factor"]
        assert math.isclose(w, sample["power_w"], rel_tol=0.01), (w, sample)


@pytest.mark.slow
def test_apc_rpdu2_scales_tenths_and_hundredths(agent: int) -> None:
    s = poll(agent, "apc", "apc-rpdu2")  # the alias of apc-rpdu2
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


@pytest.mark.slow
def test_apc_old_rpdu_load_table(agent: int) -> None:
    s = poll(agent, "apc-rpdu")
    # rPDUIdentDevicePowerWatts W, ...PowerVA VA; rPDULoadStatusLoad tenths of A, bank 0 = phase
    assert s == {
        P: {"id": P, "power_w": 2758.0, "apparent_power_va": 2829.0},
        f"{P}/L1": {"id": f"{P}/L1", "current_a": 12.3},
        f"{P}/cb1": {"id": f"{P}/cb1", "current_a": 6.4},
        f"{P}/cb2": {"id": f"{P}/cb2", "current_a": 5.9},
    }
    assert math.isclose(230 * s[f"{P}/L1"]["current_a"], s[P]["apparent_power_va"], rel_tol=0.01)


@pytest.mark.slow
def test_sentry4_wye_scales_and_fahrenheit_probe(agent: int) -> None:
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
            # wye: st4PhaseLabel "L1-N" -> the phase is the line; line current beside it
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
    assert not [i for i in s if "-L" in i]  # a wye unit has no legs


@pytest.mark.slow
def test_sentry4_delta_legs_are_apart_from_lines(agent: int) -> None:
    """The field bug: <pdu>/L1 put line L1's current beside leg L1-L2's voltage and power."""
    s = poll(agent, "servertech", "sentry4-delta")
    for line in ("L1", "L2", "L3"):
        # st4LineCurrent 281 hundredth A: line current only, no voltage or power on a line id
        assert s[f"{P}/{line}"] == {"id": f"{P}/{line}", "current_a": 2.81}
    for leg in ("L1-L2", "L2-L3", "L3-L1"):
        check(
            s,
            {
                f"{P}/{leg}": {
                    "voltage_v": 415.0,  # st4PhaseVoltage 4150 tenth V
                    "phase_current_a": 1.62,  # st4PhaseCurrent 162 hundredth A
                    "power_w": 645.0,
                    "apparent_power_va": 672.0,
                    "power_factor": 0.96,
                    "energy_kwh": 144.0,  # st4PhaseEnergy 1440 tenth kWh
                }
            },
        )
        consistent(s[f"{P}/{leg}"], "phase_current_a")
        assert "current_a" not in s[f"{P}/{leg}"]
    # line current = sqrt(3) x leg current on a balanced delta
    assert math.isclose(s[f"{P}/L1"]["current_a"], math.sqrt(3) * 1.62, rel_tol=0.01)
    assert "neutral_current_a" not in s[P]  # st4LineCurrent N = -1 on delta
    check(s, {P: {"power_w": 1935.0, "apparent_power_va": 2016.0, "energy_kwh": 4321.0}})


@pytest.mark.slow
def test_sentry3_delta_infeeds_and_sensor_states(agent: int) -> None:
    proc = cli(agent, "sentry3", "sentry3")
    s = samples_of(proc)
    check(
        s,
        {
            # towerTable: W, VA, hundredths, kWh, Hz; probe 716 tenth degF -> 22.0 degC
            P: {
                "power_w": 2370.0,
                "apparent_power_va": 2496.0,
                "power_factor": 0.95,
                "energy_kwh": 5432.0,
                "frequency_hz": 60.0,
                "inlet_temp_c": 22.0,
                "humidity_pct": 38.0,
            },
            # infeedLoadValue 693 hundredth A on the line (infeedLineID)
            f"{P}/L1": {"current_a": 6.93},
            f"{P}/L2": {"current_a": 6.93},
            # infeedPhaseID "L1-L2": phase voltage/current/power on the leg
            f"{P}/L1-L2": {
                "voltage_v": 208.0,
                "phase_current_a": 4.0,
                "power_w": 790.0,
                "apparent_power_va": 832.0,
                "power_factor": 0.95,
                "energy_kwh": 1234.5,
            },
            f"{P}/L3-L1": {"voltage_v": 208.0, "power_w": 790.0},
            # branchLoadValue hundredth A; outlet AA1
            f"{P}/cb1-1": {"current_a": 3.21},
            f"{P}/cb1-2": {"current_a": 3.72},
            f"{P}/outlet1-1": {
                "current_a": 1.2,
                "voltage_v": 208.0,
                "power_w": 237.0,
                "apparent_power_va": 250.0,
                "power_factor": 0.95,
                "energy_kwh": 98.765,
            },
        },
    )
    consistent(s[f"{P}/L1-L2"], "phase_current_a")
    consistent(s[f"{P}/outlet1-1"])
    # infeed AC: infeedLoadStatus readError(6): its line current is left out, said once
    assert f"{P}/L3" not in s
    assert "infeedLoadValue.1.3 skipped: sensor state 6" in proc.stderr
    # probe A2: tempHumidSensorTempStatus notFound(1)
    assert f"{P}/sensor2" not in s
    assert "tempHumidSensorTempValue.1.2 skipped: sensor state 1" in proc.stderr


@pytest.mark.slow
def test_raritan_pdu2_decimal_digits_state_and_units(agent: int) -> None:
    proc = cli(agent, "raritan", "raritan-pdu2")
    s = samples_of(proc)
    check(
        s,
        {
            # inlet: rmsCurrent 12345 with 3 digits, activeEnergy 1234567 Wh, frequency 500 / 10
            P: {
                "current_a": 12.345,
                "voltage_v": 230.0,
                "power_w": 2782.0,
                "apparent_power_va": 2839.0,
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
            # outlet 1: 1500 (3 digits) A, 2300 (1 digit) V, 338 W, 345 VA, 98 (2) pf, 500 (1) Hz
            f"{P}/outlet1": {
                "current_a": 1.5,
                "voltage_v": 230.0,
                "power_w": 338.0,
                "apparent_power_va": 345.0,
                "power_factor": 0.98,
                "frequency_hz": 50.0,
            },
            f"{P}/outlet2": {"current_a": 0.0, "power_w": 0.0, "frequency_hz": 50.0},
        },
    )
    consistent(s[P])
    consistent(s[f"{P}/outlet1"])
    # outlet 2's powerFactor sensor state is unavailable(-1): left out, not published as 0.0
    assert "power_factor" not in s[f"{P}/outlet2"]
    assert "measurementsOutletSensorValue (powerFactor).1.2.7 skipped: sensor state -1" in (
        proc.stderr
    )
    # external sensor 3 reports units code 14, which the profile does not accept
    assert f"{P}/sensor3" not in s
    assert "unit code 14" in proc.stderr and "measurementsExternalSensorValue" in proc.stderr


@pytest.mark.slow
def test_eaton_epdu_millis_meastypes_and_probe_state(agent: int) -> None:
    proc = cli(agent, "eaton", "eaton-epdu")
    s = samples_of(proc)
    # strapping unit 0 adds no prefix; inputTotalPower VA, W, Wh, thousandths; 0.1 Hz
    check(
        s,
        {
            P: {
                "frequency_hz": 50.0,
                "apparent_power_va": 6900.0,
                "power_w": 6555.0,
                "energy_kwh": 7654.321,
                "power_factor": 0.95,
                "neutral_current_a": 0.5,  # inputCurrentMeasType neutral(2), 500 mA
                "inlet_temp_c": 24.5,  # 245 tenths, temperatureScale celsius
            },
        },
    )
    for line in ("L1", "L2", "L3"):
        # phaseNtoN 230000 mV, phaseN 10000 mA, inputPowerMeasType phaseN
        check(s, {f"{P}/{line}": {"voltage_v": 230.0, "current_a": 10.0, "power_w": 2185.0}})
        consistent(s[f"{P}/{line}"])
    # inputVoltageMeasType phase1to2(5): a line-to-line voltage goes to the leg, not to L1
    assert s[f"{P}/L1-L2"] == {"id": f"{P}/L1-L2", "voltage_v": 398.4}
    # groupType breaker1pole: 5200 / 4800 mA; group 3 is an outlet section, not a breaker
    check(s, {f"{P}/cb1": {"current_a": 5.2}, f"{P}/cb2": {"current_a": 4.8}})
    assert f"{P}/cb3" not in s
    # probe 2 temperatureProbeStatus disconnected(0): left out, said once
    assert f"{P}/sensor2" not in s
    assert "temperatureValue.0.2 skipped: sensor state 0" in proc.stderr


@pytest.mark.slow
def test_geist_v5_wye_scales_probes_and_states(agent: int) -> None:
    proc = cli(agent, "geist", "geist-v5")  # the alias of geist-v5
    s = samples_of(proc)
    check(
        s,
        {
            # pduMainTable: watts, volt-amps, % -> 0.96, watt-hours -> kWh; THD probe 1 fills
            # <pdu>: 752 decidegrees in temperatureUnits fahrenheit(0) -> 24.0 degC, 41 %
            P: {
                "power_w": 4049.0,
                "apparent_power_va": 4218.0,
                "power_factor": 0.96,
                "energy_kwh": 9876.543,
                "inlet_temp_c": 24.0,
                "humidity_pct": 41.0,
            },
            # pduPhaseName "L1" on a wye unit: 2301 decivolts, 625 centiamps; pduLineCurrent
            f"{P}/L1": {
                "voltage_v": 230.1,
                "phase_current_a": 6.25,
                "current_a": 6.25,
                "power_w": 1380.0,
                "apparent_power_va": 1438.0,
                "power_factor": 0.96,
                "energy_kwh": 3292.0,
            },
            f"{P}/L2": {"voltage_v": 229.8, "phase_current_a": 6.1, "current_a": 6.1},
            f"{P}/L3": {"voltage_v": 230.5, "current_a": 5.98, "energy_kwh": 3294.543},
            # pduBreakerTable: centiamps; breaker 1 also meters voltage, power and energy
            f"{P}/cb1": {
                "current_a": 3.12,
                "voltage_v": 230.1,
                "power_w": 690.0,
                "apparent_power_va": 718.0,
                "power_factor": 0.96,
                "energy_kwh": 1646.0,
            },
            f"{P}/cb2": {"current_a": 3.13},
            f"{P}/cb6": {"current_a": 2.98},
            # pduOutletMeterTable: decivolts, centiamps, W, VA, %, Wh
            f"{P}/outlet1": {
                "voltage_v": 230.1,
                "current_a": 1.5,
                "power_w": 331.0,
                "apparent_power_va": 345.0,
                "power_factor": 0.96,
                "energy_kwh": 123.456,
            },
            f"{P}/outlet2": {"current_a": 0.42, "power_w": 92.0, "power_factor": 0.95},
            # RT probe 1 (770 = 77.0 degF): <pdu> already has the THD probe's temperature
            f"{P}/temp1": {"inlet_temp_c": 25.0},
        },
    )
    consistent(s[f"{P}/L1"], "phase_current_a")
    consistent(s[f"{P}/cb1"])
    consistent(s[f"{P}/outlet1"])
    assert "humidity_pct" not in s[f"{P}/temp1"]
    assert f"{P}/thd1" not in s  # the first THD probe is the unit's own reading
    assert not [i for i in s if "-L" in i]  # a wye unit has no legs
    # RT probe 2 tempSensorAvail 0 (unavailable): left out, said once
    assert f"{P}/temp2" not in s
    assert "tempSensorTemp.2 skipped: sensor state 0" in proc.stderr
    # THD probe 2 thdSensorAvail 2 (partially unavailable): which reading is missing is not
    # said, so both are left out
    assert f"{P}/thd2" not in s
    assert "thdSensorTemp.2 skipped: sensor state 2" in proc.stderr
    assert "thdSensorHumidity.2 skipped: sensor state 2" in proc.stderr


@pytest.mark.slow
def test_geist_v5_delta_legs_are_apart_from_lines(agent: int) -> None:
    s = poll(agent, "vertiv", "geist-v5-delta")  # alias vertiv; pduMeterType delta(1)
    for line in ("L1", "L2", "L3"):
        # pduLineCurrent 693 centiamps: line current only
        assert s[f"{P}/{line}"] == {"id": f"{P}/{line}", "current_a": 6.93}
    for leg in ("L1-L2", "L2-L3", "L3-L1"):
        check(
            s,
            {
                f"{P}/{leg}": {
                    "voltage_v": 208.0,  # pduPhaseVoltage 2080 decivolts
                    "phase_current_a": 4.0,  # pduPhaseCurrent 400 centiamps
                    "power_w": 790.0,
                    "apparent_power_va": 832.0,
                    "power_factor": 0.95,
                    "energy_kwh": 1234.5,
                }
            },
        )
        consistent(s[f"{P}/{leg}"], "phase_current_a")
        assert "current_a" not in s[f"{P}/{leg}"]
    assert math.isclose(s[f"{P}/L1"]["current_a"], math.sqrt(3) * 4.0, rel_tol=0.01)
    # temperatureUnits celsius(1): 221 decidegrees -> 22.1 degC on the unit (no THD probe)
    check(s, {P: {"power_w": 2370.0, "apparent_power_va": 2496.0, "inlet_temp_c": 22.1}})


@pytest.mark.slow
def test_phase_name_must_agree_with_the_meter_type(
    agent: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A phase named as a leg on a unit whose wiring calls for a line is refused, not stored
    on a leg (or line) id: the profile's rule read the other way round against the delta unit."""
    text = (PROFILE_DIR / "geist-v5.yaml").read_text()
    rule = "line_when: {meter: [0]}, leg_when: {meter: [1]}"
    assert rule in text
    path = tmp_path / "geist-v5.yaml"
    path.write_text(text.replace(rule, "line_when: {meter: [1]}, leg_when: {meter: [0]}"))
    c = SnmpPduCollector(
        "127.0.0.1",
        site="lab",
        profile=load_profile(path),
        community="geist-v5-delta",
        port=agent,
        source=P,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="collectors.snmp"):
            d = decode(*c.poll()[0])
    finally:
        c.close()
    ids = {x["id"] for x in d.samples}
    assert not [i for i in ids if "-L" in i], ids
    assert {f"{P}/L1", f"{P}/L2", f"{P}/L3"} <= ids  # the line table still answers
    l1 = next(x for x in d.samples if x["id"] == f"{P}/L1")
    assert l1.get("voltage_v") is None  # a leg's voltage never lands on the line
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "pduPhaseTable row 1 skipped" in said  # one row, one reason: said once
    assert "names a leg (L1-L2) where meter = 1 calls for a line" in said


@pytest.mark.slow
def test_geist_wrong_profile_is_named(agent: int) -> None:
    for profile, community in (("geist-v5", "apc-rpdu2"), ("sentry4", "geist-v5")):
        proc = cli(agent, profile, community)
        assert proc.returncode == 2 and "wrong profile" in proc.stderr, proc.stderr
        assert ASYNCIO_LEAK not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_apc_cpdu_wye_scales_cascade_and_sensor_states(agent: int) -> None:
    proc = cli(agent, "cpdu", "apc-cpdu")  # the alias of apc-cpdu
    s = samples_of(proc)
    check(
        s,
        {
            # pduUnitStatus: Watts, Volt-Amps, 123456 tenths of kWh; the first temperature
            # probe (243 tenths of degreeC) and the first humidity probe (41 percent) fill <pdu>
            P: {
                "power_w": 6063.0,
                "apparent_power_va": 6332.0,
                "energy_kwh": 12345.6,
                "inlet_temp_c": 24.3,
                "humidity_pct": 41.0,
            },
            # pduInputPhaseStatus: 1250 hundredths of A, Volts, Watts, Volt-Amps; wye: line Ln
            f"{P}/L1": {
                "current_a": 12.5,
                "voltage_v": 230.0,
                "power_w": 2760.0,
                "apparent_power_va": 2875.0,
            },
            f"{P}/L2": {"current_a": 11.0, "voltage_v": 231.0, "power_w": 2414.0},
            f"{P}/L3": {"current_a": 4.0, "voltage_v": 229.0, "apparent_power_va": 916.0},
            # pduCircuitBreakerStatusCurrent: hundredths of A; cb6 is off (load state 6): 0 A
            f"{P}/cb1": {"current_a": 6.4},
            f"{P}/cb2": {"current_a": 6.1},
            f"{P}/cb5": {"current_a": 4.0},
            f"{P}/cb6": {"current_a": 0.0},
            # pduOutletMeteredStatus: hundredths of A, Watts, resettable tenths of kWh
            f"{P}/outlet1": {"current_a": 1.5, "power_w": 331.0, "energy_kwh": 123.4},
            f"{P}/outlet2": {"current_a": 0.42, "power_w": 92.0, "energy_kwh": 20.5},
            f"{P}/outlet3": {"current_a": 0.0, "power_w": 0.0},
            # a second temperature probe: 770 tenths of degreeF -> 25.0 degC
            f"{P}/sensor3": {"inlet_temp_c": 25.0},
            # the cascaded unit 2 gets its own prefix
            f"{P}/unit2": {"power_w": 941.0, "apparent_power_va": 990.0, "energy_kwh": 2048.0},
            f"{P}/unit2/L1": {"current_a": 2.0, "voltage_v": 230.0, "power_w": 437.0},
        },
    )
    for line, cbs in (("L1", ("cb1", "cb2")), ("L2", ("cb3", "cb4")), ("L3", ("cb5", "cb6"))):
        sample = s[f"{P}/{line}"]
        consistent(sample)  # V x I ~ VA
        assert 0.9 < sample["power_w"] / sample["apparent_power_va"] <= 1.0
        breakers = sum(s[f"{P}/{cb}"]["current_a"] for cb in cbs)
        assert math.isclose(breakers, sample["current_a"], rel_tol=1e-9)
    lines = [s[f"{P}/L{n}"] for n in (1, 2, 3)]
    assert math.isclose(sum(x["power_w"] for x in lines), s[P]["power_w"], rel_tol=1e-9)
    va = sum(x["apparent_power_va"] for x in lines)
    assert math.isclose(va, s[P]["apparent_power_va"], rel_tol=1e-9)
    # outlet n is on phase n: its power is below that phase's V x I
    for n in (1, 2):
        outlet = s[f"{P}/outlet{n}"]
        assert outlet["power_w"] <= s[f"{P}/L{n}"]["voltage_v"] * outlet["current_a"]
    # the MIB's power factor is "the ratio of active to apparent power" with no scale
    assert not [i for i, x in s.items() if "power_factor" in x]
    assert "humidity_pct" not in s[f"{P}/sensor3"]
    assert f"{P}/sensor1" not in s and f"{P}/sensor2" not in s  # those are <pdu>'s own
    assert not [i for i in s if "-L" in i]  # a wye unit has no legs
    # probe 4: pduExternalSensorStatusCommStatus commsLost(3), its 0 is no reading
    assert f"{P}/sensor4" not in s
    assert "pduExternalSensorStatusHighPrecisionValue.1.4 skipped: sensor state 3" in proc.stderr


@pytest.mark.slow
def test_apc_cpdu_delta_keeps_line_current_and_refuses_leg_readings(agent: int) -> None:
    """pduNamePlateType delta(2): the MIB says the phase current is the line's on delta, but not
    which leg a phase row's voltage and power are: they are refused with the reason."""
    proc = cli(agent, "apc-cpdu", "apc-cpdu-delta")
    s = samples_of(proc)
    for line in ("L1", "L2", "L3"):
        # 693 hundredths of A: line current only, no voltage or power on a line id
        assert s[f"{P}/{line}"] == {"id": f"{P}/{line}", "current_a": 6.93}
    assert not [i for i in s if "-L" in i]
    check(s, {P: {"power_w": 4560.0, "apparent_power_va": 4800.0, "energy_kwh": 5432.1}})
    assert "pduInputPhaseStatusTable row 1.1 skipped" in proc.stderr
    assert "pduInputPhaseStatusTable row 1.3 skipped" in proc.stderr
    assert "names a line (L1) where wiring = 2 calls for a leg" in proc.stderr


@pytest.mark.slow
def test_apc_cpdu_wrong_profile_is_named(agent: int) -> None:
    for profile, community in (
        ("apc-cpdu", "apc-rpdu2"),
        ("apc-rpdu2", "apc-cpdu"),
        ("apc-rpdu", "apc-cpdu"),
    ):
        proc = cli(agent, profile, community)
        assert proc.returncode == 2 and "wrong profile" in proc.stderr, (profile, proc.stderr)
        assert ASYNCIO_LEAK not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_unavailable_sensor_is_logged_once(agent: int, caplog: pytest.LogCaptureFixture) -> None:
    c = SnmpPduCollector(
        "127.0.0.1", site="lab", profile="raritan-pdu2", community="raritan-pdu2", port=agent
    )
    assert isinstance(c, Collector)  # what the runner drives
    try:
        with caplog.at_level(logging.DEBUG, logger="collectors.snmp"):
            for _ in range(3):
                d = decode(*c.poll()[0])
                outlet2 = next(x for x in d.samples if x["id"].endswith("/outlet2"))
                assert outlet2.get("power_factor") is None
    finally:
        c.close()
    said = [r for r in caplog.records if "(powerFactor).1.2.7 skipped" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


@pytest.mark.slow
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
    assert any(o.endswith(".5.4.3.1.3") for o in walked)  # states are read every poll
    assert first.samples == second.samples
    assert second.seq == first.seq + 1
    assert first.source == "127-0-0-1"  # default source: the host


@pytest.mark.slow
def test_wrong_community_is_a_clear_error(agent: int) -> None:
    proc = cli(agent, "apc-rpdu2", "not-the-community", "--timeout", "0.5", "--retries", "0")
    assert proc.returncode == 2, proc.stderr
    assert "no usable answer" in proc.stderr and "community" in proc.stderr
    assert ASYNCIO_LEAK not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
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
    c.close()  # idempotent


@pytest.mark.slow
def test_wrong_profile_is_named(agent: int) -> None:
    proc = cli(agent, "sentry4", "apc-rpdu2")
    assert proc.returncode == 2 and "wrong profile" in proc.stderr, proc.stderr
    assert ASYNCIO_LEAK not in proc.stderr


@pytest.mark.slow
def test_unknown_profile_and_help_list_the_registry() -> None:
    proc = cli(9, "raritan-px9", "public")
    assert proc.returncode == 2
    assert "unknown SNMP profile 'raritan-px9'" in proc.stderr
    for name in profile_names():
        assert name in proc.stderr
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    helptext = subprocess.run(
        [sys.executable, "-m", "twin.cli", "collect", "snmp", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    ).stdout
    for name in (
        "raritan-pdu2",
        "apc-rpdu2",
        "apc-rpdu",
        "sentry4",
        "sentry3",
        "eaton-epdu",
        "geist-v5",
        "apc-cpdu",
    ):
        assert name in helptext
    for alias in (a for p in profiles().values() for a in p.aliases):
        assert alias in helptext, alias  # the help's alias list is kept with the files


def test_profiles_are_data_files_with_sources() -> None:
    known = profiles()
    assert set(known) == set(profile_names())
    assert {
        "raritan-pdu2",
        "apc-rpdu2",
        "apc-rpdu",
        "sentry4",
        "sentry3",
        "eaton-epdu",
        "geist-v5",
        "apc-cpdu",
    } <= set(known)
    assert resolve("raritan").name == "raritan-pdu2"
    assert resolve("apc").name == "apc-rpdu2"
    assert resolve("servertech").name == "sentry4"
    assert resolve("eaton").name == "eaton-epdu"
    assert resolve("geist").name == "geist-v5" and resolve("vertiv").name == "geist-v5"
    assert resolve("cpdu").name == "apc-cpdu"
    for p in known.values():
        assert (PROFILE_DIR / f"{p.name}.yaml").is_file()
        assert p.source.mib and p.source.published and p.source.verified
        for t in p.tables:
            for col in t.columns:
                assert col.mib and col.oid.startswith("1.3.6.1.4.1.")
    # every fixture is served under a community the tests poll
    assert {f.stem for f in FIXTURES.glob("*.snmprec")} == set(known) | {
        "sentry4-delta",
        "geist-v5-delta",
        "apc-cpdu-delta",
        # label grammars, neutrals and tables written otherwise (the tests at the end)
        "geist-v5-letters",
        "geist-v5-pairs",
        "sentry4-prefixed",
        "sentry3-names",
        "eaton-epdu-outlets",
        "apc-rpdu2-legacy",
        "raritan-pdu2-neutral",
    }
    with pytest.raises(ValueError, match="unknown SNMP profile"):
        SnmpPduCollector("127.0.0.1", site="lab", profile="nope", community="public")


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = (PROFILE_DIR / "apc-rpdu.yaml").read_text()
    assert old in text
    path = tmp_path / "apc-rpdu.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_a_wrong_profile_file_names_file_and_field(tmp_path: Path) -> None:
    bad_unit = _broken(tmp_path, "quantity: power_w, unit: W}", "quantity: power_w, unit: kA}")
    with pytest.raises(ProfileError) as e:
        load_profile(bad_unit)
    msg = str(e.value)
    assert str(bad_unit) in msg
    assert "tables[0] (rPDUIdent).columns[0] (rPDUIdentDevicePowerWatts)" in msg
    assert "'kA' is not one of" in msg

    bad_oid = _broken(tmp_path, "oid: 1.3.6.1.4.1.318.1.1.12.1.16,", "oid: rPDUIdent.16,")
    with pytest.raises(ProfileError, match=r"columns\[0\] \(rPDUIdentDevicePowerWatts\)\.oid"):
        load_profile(bad_oid)

    bad_pattern = _broken(tmp_path, 'sample: "{src}/L{phase}"', 'sample: "{src}/L{line}"')
    with pytest.raises(ProfileError, match=r"tables\[1\].*names \{line\}"):
        load_profile(bad_pattern)

    not_yaml = tmp_path / "x.yaml"
    not_yaml.write_text("name: x\ntables: [\n")
    with pytest.raises(ProfileError, match=r"x\.yaml: line \d+ not valid YAML"):
        load_profile(not_yaml)


def test_delta_leg_ids_resolve_and_are_not_phases() -> None:
    from collectors.contract import leg_id, line_element, split_leg_id, split_phase_id
    from twin.chain.limits import phase_table

    assert line_element("L1-N") == "L1" and line_element(" l2 ") == "L2"
    assert line_element("L1-L2") == "L1-L2" and line_element("L3 - L1") == "L3-L1"
    assert line_element("AA") is None and line_element("L1-L1") is None
    assert split_phase_id(f"{P}/L1-L2") is None  # never mistaken for a phase
    assert split_leg_id(leg_id(P, 3, 1)) == (P, 3, 1)
    assert split_leg_id(f"{P}/L1") is None
    site = load_site(REPO / "sample_telemetry" / "small_site.yaml")
    for leg in ("L1-L2", "L2-L3", "L3-L1"):
        assert site.is_known("pdu", f"{P}/{leg}")
    assert not site.is_known("pdu", f"{P}/L1-L4")  # a three-phase unit has no line 4
    assert not site.is_known("pdu", "pdu-nowhere/L1-L2")
    table = phase_table(site)
    assert not [i for i in table.ids if "-L" in i]
    assert f"{P}/L1" in table.ids


# ---- label grammars, neutrals and tables on units written otherwise (our own fixtures) --------


@pytest.mark.slow
def test_geist_lower_case_phase_letters_and_a_line_table_without_names(agent: int) -> None:
    """pduPhaseName "phase a".."phase c" on a wye unit; no pduLineName: rows refused, said."""
    proc = cli(agent, "geist-v5", "geist-v5-letters")
    s = samples_of(proc)
    for line, volts, amps in (("L1", 230.1, 6.25), ("L2", 229.8, 6.1), ("L3", 230.5, 5.98)):
        # a wye phase's current is its line's: current_a too, from the phase table
        check(s, {f"{P}/{line}": {"voltage_v": volts, "phase_current_a": amps, "current_a": amps}})
    assert not [i for i in s if i.rsplit("/", 1)[-1].isdigit()], sorted(s)  # no row numbers
    for row in (1, 2, 3):
        assert f"pduLineTable row {row} skipped" in proc.stderr
    assert proc.stderr.count("pduLineTable row 1 skipped") == 1  # once per row, not per column
    assert "no label at 1.3.6.1.4.1.21239.5.2.3.4.1.2 for this row" in proc.stderr


@pytest.mark.slow
def test_geist_phase_letter_pairs_are_delta_legs(agent: int) -> None:
    """ "Phase AB".."Phase CA" on a delta unit are its legs; "Line 1".. its lines."""
    s = poll(agent, "geist-v5", "geist-v5-pairs")
    for leg in ("L1-L2", "L2-L3", "L3-L1"):
        check(s, {f"{P}/{leg}": {"voltage_v": 208.0, "phase_current_a": 4.0, "power_w": 790.0}})
    for line in ("L1", "L2", "L3"):
        assert s[f"{P}/{line}"] == {"id": f"{P}/{line}", "current_a": 6.93}


@pytest.mark.slow
def test_sentry4_phase_labels_after_a_unit_and_cord_prefix(agent: int) -> None:
    """st4PhaseLabel "BA:L1-L2", "ba:l2-l3", "BA : L3 - L1" and st4LineLabel "AA:L1",
    "aa:l2", "AA : L3", "AA:N": the prefix is read over."""
    s = poll(agent, "sentry4", "sentry4-prefixed")
    for line in ("L1", "L2", "L3"):
        assert s[f"{P}/{line}"] == {"id": f"{P}/{line}", "current_a": 2.81}
    assert "neutral_current_a" not in s[P]  # st4LineCurrent of "AA:N" is -1 (no reading)
    for leg in ("L1-L2", "L2-L3", "L3-L1"):
        check(s, {f"{P}/{leg}": {"voltage_v": 415.0, "phase_current_a": 1.62, "power_w": 645.0}})
    assert {i for i in s if i.startswith(f"{P}/L")} == {
        *(f"{P}/{x}" for x in ("L1", "L2", "L3", "L1-L2", "L2-L3", "L3-L1"))
    }


@pytest.mark.slow
def test_sentry3_infeeds_by_name_neutral_and_system_total(agent: int) -> None:
    """No PIPS line ids, a tower renamed "Master": infeeds read by name in either case, the
    neutral's current on the unit, a renamed infeed refused with its name quoted, and the
    system total as the unit's power (the tower has no power column)."""
    proc = cli(agent, "sentry3", "sentry3-names")
    s = samples_of(proc)
    check(
        s,
        {
            P: {"power_w": 3456.0, "neutral_current_a": 3.45},  # systemTotalPower; 345 cA
            f"{P}/L1": {"current_a": 6.93, "voltage_v": 208.0},  # "Master_InfeedA"
            f"{P}/L2": {"current_a": 6.93},  # "master_infeedb"
            f"{P}/L3": {"voltage_v": 208.0},  # "Master_InfeedC" (its load state is readError)
        },
    )
    assert "power_factor" not in s[P]  # systemPowerFactor is a setting: not read
    assert not [i for i in s if re.search(r"/L[4-9]$|/\d+$", i)], sorted(s)  # no L4, no rows
    assert "infeedTable row 1.5 skipped" in proc.stderr
    assert "label 'spare feed' at 1.3.6.1.4.1.1718.3.2.2.1.3 names no line or leg" in proc.stderr


@pytest.mark.slow
def test_eaton_outlets_chained_unit_and_power_factor_magnitude(agent: int) -> None:
    """outletCurrent / outletVA / outletWatts / outletWh / outletPowerFactor of units 0 and 1;
    a signed power factor's magnitude; one beyond 1 refused with its raw value."""
    proc = cli(agent, "eaton-epdu", "eaton-epdu-outlets")
    s = samples_of(proc)
    check(
        s,
        {
            # 1500 mA, 345 VA, 331 W, 123456 Wh, -960 thousandths
            f"{P}/outlet1": {
                "current_a": 1.5,
                "apparent_power_va": 345.0,
                "power_w": 331.0,
                "energy_kwh": 123.456,
                "power_factor": 0.96,
            },
            f"{P}/outlet2": {"current_a": 0.42, "power_factor": 0.95},
            f"{P}/unit1/outlet1": {"current_a": 1.501, "power_w": 331.0},
            f"{P}/outlet3": {"current_a": 0.0},
        },
    )
    assert "power_factor" not in s[f"{P}/outlet3"]
    assert "outletPowerFactor.0.3 skipped: power factor 1.2 (raw -1200) is outside 0..1" in (
        proc.stderr
    )


@pytest.mark.slow
def test_apc_rpdu2_reads_the_legacy_bank_table_when_present(agent: int) -> None:
    """An rPDU2 unit without rPDU2BankStatus rows: its banks from rPDULoadStatus."""
    s = poll(agent, "apc-rpdu2", "apc-rpdu2-legacy")
    # rPDULoadStatusLoad tenths of A: bank 1 61, bank 2 62; phase 1 (bank 0) as rPDU2's
    check(s, {f"{P}/cb1": {"current_a": 6.1}, f"{P}/cb2": {"current_a": 6.2}})
    check(s, {f"{P}/L1": {"current_a": 12.3, "voltage_v": 230.0}})


@pytest.mark.slow
def test_raritan_neutral_pole_is_the_inlets_neutral(agent: int) -> None:
    """inletPoleLine lineL1(1), lineNeutral(4) (a single-phase inlet, as a real PXE-1847
    reads): pole 2's current is the unit's neutral_current_a, never line L2; a voltage on the
    neutral pole is refused with the reason."""
    proc = cli(agent, "raritan-pdu2", "raritan-pdu2-neutral")
    s = samples_of(proc)
    check(s, {P: {"neutral_current_a": 4.2}, f"{P}/L1": {"current_a": 4.1, "voltage_v": 230.0}})
    assert not [i for i in s if re.search(r"/L[2-9]$", i)], sorted(s)
    assert "names the neutral: it has no voltage_v" in proc.stderr


@pytest.mark.slow
def test_an_unlabelled_row_is_said_once_for_the_row(
    agent: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A Geist line row without pduLineName: one WARNING for the row (not one per column), then
    DEBUG on later polls; never an id made of its row number."""
    c = SnmpPduCollector(
        "127.0.0.1", site="lab", profile="geist-v5", community="geist-v5-letters", port=agent
    )
    try:
        with caplog.at_level(logging.DEBUG, logger="collectors.snmp"):
            for _ in range(2):
                ids = {x["id"] for x in decode(*c.poll()[0]).samples}
                assert not [i for i in ids if i.rsplit("/", 1)[-1].isdigit()], ids
    finally:
        c.close()
    said = [r for r in caplog.records if "pduLineTable row 2 skipped" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]
