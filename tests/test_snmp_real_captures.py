"""``dctwin collect snmp`` on real PDU captures, compared with the readings a peer extracts.

``../shared/reference/snmp_peer`` (read in place, GPL-3.0: never copied into the project) holds
seven ``.snmprec`` walks of real rack PDUs from the test suites of LibreNMS and NAV, each with
the readings that project extracts (its README says which file is which unit). snmpsim serves
the folder as it is (the community is the file name); each capture is polled through the CLI
with the one profile a user would pick, and every peer reading is looked up by the id and
quantity the contract gives it (the test's own reading of the peer's names: "Phase A" is line
L1, "Bank 2" breaker cb2, "TowerA_Neutral" the unit's neutral). Counted are the peer's
measurements; left out, each checked against the capture itself:

- a sensor the device reports unavailable (Raritan sensor state -1), which must not be
  published either;
- a row the issue's own rule refuses: a labelled table's row without a label (Vertiv's
  pduLineTable has no pduLineName), which must be refused and logged, never published under its
  row number;
- a setting that is no measurement (Sentry3 systemPowerFactor, which the peer itself groups as
  "Configured Power Factor").

The strict share (nothing left out but unavailable sensors) is printed beside the counted one.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("snmpsim", reason="snmpsim (dev extra) serves the test SNMP agent")

from collectors.contract import decode
from tests.snmp_agent import ASYNCIO_LEAK, RESPONDER, _serve

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO = Path(__file__).resolve().parents[1]
PEER = REPO.parent / "shared" / "reference" / "snmp_peer"
CAPTURES = PEER / "captures"
P = "pdu"

#: the peer's sensor class -> the contract's quantity
CLASSES = {
    "current": "current_a",
    "voltage": "voltage_v",
    "power": "power_w",
    "power_consumed": "energy_kwh",
    "power_factor": "power_factor",
    "frequency": "frequency_hz",
    "temperature": "inlet_temp_c",
    "humidity": "humidity_pct",
}
#: Raritan measurement types (PDU2-MIB SensorTypeEnumeration) -> quantity
RARITAN_TYPES = {
    1: "current_a",
    4: "voltage_v",
    5: "power_w",
    6: "apparent_power_va",
    7: "power_factor",
    8: "energy_kwh",
    23: "frequency_hz",
}
_LETTER = {"A": 1, "B": 2, "C": 3}


@dataclass(frozen=True)
class Reading:
    """One reading the peer extracts: where the contract puts it, and its value."""

    oid: str
    name: str
    sid: str | None  # None: left out (why says so)
    quantity: str
    value: float
    why: str = ""  # why it is left out: unavailable / unlabelled row / setting


def snmprec(capture: str) -> dict[str, str]:
    """OID -> value of a capture (``OID|type|value`` lines)."""
    out: dict[str, str] = {}
    for line in (CAPTURES / f"{capture}.snmprec").read_text(errors="replace").splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            out[parts[0].lstrip(".")] = parts[2]
    return out


def _index(oid: str, column: str) -> tuple[int, ...]:
    return tuple(int(x) for x in oid[len(column) + 1 :].split("."))


def _librenms_id(capture: str, oid: str, descr: str, cls: str) -> tuple[str, str, str]:
    """(id, quantity, why-left-out) of one LibreNMS sensor of ``capture``."""
    q = CLASSES[cls]
    if oid.startswith("1.3.6.1.4.1.13742.6.5."):  # Raritan PDU2-MIB measurements
        table = oid.split(".")[9]  # 2 inlet, 4 outlet, 5 external
        col = {"2": "6.5.2.3.1.4", "4": "6.5.4.3.1.4", "5": "6.5.5.3.1.4"}[table]
        ix = _index(oid, f"1.3.6.1.4.1.13742.{col}")
        if table == "2":
            return (P if ix[1] == 1 else f"{P}/inlet{ix[1]}"), RARITAN_TYPES[ix[2]], ""
        if table == "4":
            state = snmprec(capture).get(f"1.3.6.1.4.1.13742.6.5.4.3.1.3.{ix[0]}.{ix[1]}.{ix[2]}")
            why = "the device reports it unavailable (state -1)" if state == "-1" else ""
            return f"{P}/outlet{ix[1]}", RARITAN_TYPES[ix[2]], why
        return (P if ix[1] == 1 else f"{P}/sensor{ix[1]}"), q, ""
    if oid.startswith("1.3.6.1.4.1.318."):  # APC
        if oid.startswith("1.3.6.1.4.1.318.1.1.12.2.3.1.1.2."):  # rPDULoadStatusLoad
            m = re.fullmatch(r"(Phase|Bank) (\d+)", descr)
            assert m, descr
            return (f"{P}/L{m[2]}" if m[1] == "Phase" else f"{P}/cb{m[2]}"), q, ""
        if oid.startswith("1.3.6.1.4.1.318.1.1.26.6.3.1."):  # rPDU2PhaseStatus, phase 1
            return f"{P}/L1", q, ""
        return P, q, ""  # rPDU2DeviceStatus
    if oid.startswith("1.3.6.1.4.1.534.6.6.7."):  # Eaton
        if ".6.6.7.6." in oid:  # outlet tables: <unit 0>.<outlet>
            return f"{P}/outlet{oid.rsplit('.', 1)[1]}", q, ""
        return f"{P}/L1", q, ""  # input rows of this 1-phase unit: "Input Feed L1", "Input"
    if oid.startswith("1.3.6.1.4.1.21239.5.2.3."):  # Geist / Vertiv
        table, row = oid.split(".")[10], int(oid.rsplit(".", 1)[1])
        if table == "1":
            return P, q, ""
        if table == "3":
            return f"{P}/cb{row}", q, ""
        if table == "4":
            name = snmprec(capture).get(f"1.3.6.1.4.1.21239.5.2.3.4.1.2.{row}")
            assert name is None, name  # the capture really has no pduLineName
            return "", q, "a line row without pduLineName: refused (no row number as an id)"
        m = re.fullmatch(r"Phase ([ABC])", descr)
        assert m, descr
        return f"{P}/L{_LETTER[m[1]]}", q, ""
    if oid.startswith("1.3.6.1.4.1.1718.3."):  # Sentry3
        if oid == "1.3.6.1.4.1.1718.3.1.10.0":
            return "", q, "systemPowerFactor: a setting used in calculations, not a reading"
        if oid.startswith("1.3.6.1.4.1.1718.3.1."):
            return P, q, ""  # systemTotalPower
        m = re.fullmatch(r"Tower[A-Z]_(?:Infeed([ABC])|(Neutral))", descr)
        assert m, descr
        if m[2]:
            return P, "neutral_current_a", ""
        return f"{P}/L{_LETTER[m[1]]}", q, ""
    raise AssertionError(f"no rule for {oid} ({descr})")


def librenms(capture: str) -> list[Reading]:
    data = json.loads((PEER / "expected" / f"{capture}.json").read_text())
    out = []
    for s in data["sensors"]["discovery"]["sensors"]:
        if s["sensor_class"] not in CLASSES:
            continue  # states (outlet switch, door) are not readings
        oid = s["sensor_oid"].lstrip(".")
        sid, q, why = _librenms_id(capture, oid, s["sensor_descr"], s["sensor_class"])
        value = float(s["sensor_current"])
        if q == "power_factor" and value > 1:  # LibreNMS shows some in hundredths
            value /= 100
        out.append(Reading(oid, s["sensor_descr"], sid or None, q, value, why))
    return out


def nav(capture: str) -> list[Reading]:
    """NAV's six inlet sensors: value = the capture's raw value / 10^precision."""
    data = json.loads((PEER / "expected" / "nav_raritan_pxe1847_inlet.json").read_text())
    raw = snmprec(capture)
    out = []
    for s in data["sensors"]:
        oid = s["oid"].lstrip(".")
        kind = int(oid.rsplit(".", 1)[1])
        value = float(raw[oid]) / 10 ** s["precision"]
        if kind == 8:  # watthours
            value /= 1000
        out.append(Reading(oid, s["name"], P, RARITAN_TYPES[kind], value))
    return out


CASES: dict[str, tuple[str, Callable[[str], list[Reading]]]] = {
    "librenms_raritan-pdu_px3": ("raritan-pdu2", librenms),
    "nav_raritan_pxe1847": ("raritan-pdu2", nav),
    "librenms_apc_ap8959eu3": ("apc-rpdu2", librenms),
    "librenms_apc_ap8853": ("apc-rpdu2", librenms),
    "librenms_eatonpdu_2": ("eaton-epdu", librenms),
    "librenms_vertiv-pdu_mg02e4w1": ("geist-v5", librenms),
    "librenms_sentry3_3phase": ("sentry3", librenms),
}


@pytest.fixture(scope="module")
def peer_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """snmpsim serving the shared captures folder in place."""
    if not CAPTURES.is_dir():
        pytest.skip(f"{CAPTURES} is absent (the shared reference captures are not checked out)")
    if not RESPONDER.exists():
        pytest.skip(f"{RESPONDER} not installed")
    yield from _serve(
        CAPTURES, tmp_path_factory.mktemp("snmpsim-peer"), "raritan-pdu2", "nav_raritan_pxe1847"
    )


def collect(port: int, profile: str, community: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "twin.cli", "collect", "snmp", "--host", "127.0.0.1"),
            *("--port", str(port), "--profile", profile, "--source", P, "--site", "lab"),
            *("--timeout", "2", "--once", "--stdout"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "DCTWIN_SNMP_COMMUNITY": community},
    )


def published(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert proc.returncode == 0, proc.stderr
    assert ASYNCIO_LEAK not in proc.stderr, proc.stderr
    msg = json.loads(proc.stdout)
    d = decode(msg["topic"], json.dumps(msg["payload"]).encode())
    return {s["id"]: {k: v for k, v in s.items() if v is not None} for s in d.samples}


def compare(readings: list[Reading], s: dict[str, dict[str, Any]]) -> tuple[int, int, int, list]:
    """(found, counted, strict total, misses) of the peer's readings in the CLI's samples."""
    found, counted, strict, misses = 0, 0, 0, []
    for r in readings:
        unavailable = r.why.startswith("the device reports")
        if not unavailable:
            strict += 1
        if r.sid is None:
            continue
        got = s.get(r.sid, {}).get(r.quantity)
        if unavailable:
            assert got is None, f"{r.oid} ({r.name}) is unavailable but published: {got}"
            continue
        counted += 1
        if got is not None and math.isclose(got, r.value, rel_tol=1e-9, abs_tol=1e-9):
            found += 1
        else:
            misses.append((r.oid, r.name, r.sid, r.quantity, r.value, got))
    return found, counted, strict, misses


@pytest.mark.slow
@pytest.mark.parametrize("capture", list(CASES))
def test_real_capture_matches_the_peer(peer_agent: int, capture: str) -> None:
    profile, expected = CASES[capture]
    proc = collect(peer_agent, profile, capture)
    s = published(proc)
    readings = expected(capture)
    found, counted, strict, misses = compare(readings, s)
    print(
        f"\n{capture} ({profile}): {found}/{counted} = {100 * found / counted:.1f} % published "
        f"(strict: {found}/{strict} = {100 * found / strict:.1f} %)"
    )
    assert found >= 0.95 * counted, misses
    # never a row number as an id, never a neutral as a line
    for sid in s:
        element = sid.split("/")[-1]
        assert not element.isdigit(), f"row number as an id: {sid}"
        assert not re.fullmatch(r"L[4-9]", element), f"a fourth line: {sid}"
        assert "neutral_current_a" not in s[sid] or "/L" not in sid, sid
    # what the rule refuses is refused and said, not published
    for r in readings:
        if r.why.startswith("a line row"):
            row = r.oid.rsplit(".", 1)[1]
            assert f"pduLineTable row {row} skipped" in proc.stderr, proc.stderr
            assert "no label at" in proc.stderr
        if r.why.startswith("systemPowerFactor"):
            assert "power_factor" not in s[P]


@pytest.mark.slow
def test_the_peers_neutral_and_signed_power_factor(peer_agent: int) -> None:
    """The two id/quantity bugs the issue names, on the units that showed them."""
    s = published(collect(peer_agent, "sentry3", "librenms_sentry3_3phase"))
    assert s[P]["neutral_current_a"] == 2.12  # "TowerA_Neutral": the unit's neutral
    assert sorted(i for i in s if i.startswith(f"{P}/L")) == [f"{P}/L1", f"{P}/L2", f"{P}/L3"]
    assert s[P]["power_w"] == 279.0  # systemTotalPower: the tower has no power column
    e = published(collect(peer_agent, "eaton-epdu", "librenms_eatonpdu_2"))
    # inputPowerFactor -946 beside inputTotalPowerFactor 946: the magnitude, in 0..1
    assert e[f"{P}/L1"]["power_factor"] == 0.946 == e[P]["power_factor"]
    assert e[f"{P}/outlet1"]["power_factor"] == 0.842  # outletPowerFactor -842
    assert e[f"{P}/outlet1"]["energy_kwh"] == 785.621  # outletWh 785621
    assert all(0 <= v["power_factor"] <= 1 for v in e.values() if "power_factor" in v)
