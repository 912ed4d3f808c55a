"""SNMP v2c collector for rack PDUs: Raritan PDU2-MIB, APC PowerNet-MIB rPDU2, ServerTech Sentry4.

:class:`SnmpPduCollector` walks the tables of one vendor *profile* with GETBULK and returns one
``pdu`` contract message per poll. A profile (:class:`Profile`, pydantic) is a list of tables;
each column names its MIB object, OID, contract quantity, sample-id pattern and scaling, so the
scaling of every value is explicit and reviewable in :data:`PROFILES`:

    value = raw / 10**decimals * scale, in ``unit``, then converted to the contract's unit

``decimals`` is read from the agent where the MIB says so (Raritan ``...SensorDecimalDigits``),
and where the agent states the unit (Raritan ``...SensorUnits``, Sentry4
``st4TempSensorScale``) that unit is checked: a reading in a unit the profile does not list is
refused with a logged reason, never stored under a wrong unit. Config columns (decimal digits,
units, APC module/number) are read on the first poll and cached.

Sample ids follow the simulator (twin/simulator/README.md): ``<pdu>`` for the unit (input
cord / inlet), ``<pdu>/L1..L3`` for lines (poles), ``<pdu>/cb<n>`` for branch breakers
(over-current protectors, APC banks, Sentry4 branches; name the breakers ``cb1``.. in the site
file), ``<pdu>/outlet<n>``. The first temperature/humidity probe fills ``<pdu>``'s
``inlet_temp_c`` / ``humidity_pct``, further ones ``<pdu>/sensor<n>``. A second inlet, input
cord or daisy-chained unit gets a prefix: ``<pdu>/inlet2/L1``, ``<pdu>/unit2/cord1/L1``,
``<pdu>/module2/L1``.

Where the OIDs come from (MIB text = the vendor MIB as shipped in LibreNMS ``mibs/``):

- Sentry4-MIB: every object used here was read in the MIB text (st4Objects =
  1.3.6.1.4.1.1718.4.1; input cords .3, lines .4, phases .5, branches .7, outlets .8,
  temperature .9, humidity .10; UNITS clauses give the scales).
- PDU2-MIB: the measurement columns (``measurementsInletSensorValue`` 6.5.2.3.1.4,
  ``measurementsInletPoleSensorValue`` 6.5.2.4.1.4, outlet 6.5.4.3.1.4, over-current protector
  6.5.3.3.1.4, external 6.5.5.3.1.4) and the ``inletPoleSensorConfigurationTable ::=
  { inlets 6 }`` were read in the MIB text and Raritan's SNMP MIB user guide; the decimal-digits
  and units columns (column 7 and 6 of each ``...SensorConfigurationEntry``;
  ``inletSensorDecimalDigits`` 6.3.3.4.1.7 is quoted in the user guide) and the external sensor
  columns (``externalSensorType`` 6.3.6.3.1.2, ``...Units`` .16, ``...DecimalDigits`` .17) come
  from several independent open-source pollers, not from the MIB text itself. The
  SensorTypeEnumeration (rmsCurrent 1, rmsVoltage 4, activePower 5, apparentPower 6,
  powerFactor 7, activeEnergy 8, temperature 10, humidity 11, frequency 23) and the
  SensorUnitsEnumeration values used (volt 1, amp 2, watt 3, voltamp 4, wattHour 5, degreeC 7,
  hertz 8, percent 9, none -1) come from the user guide's tables and the same pollers.
- PowerNet-MIB (rPDU2): the OIDs and scales were NOT read in the MIB text (the MIB file was too
  large to search here); they come from open-source pollers (Observium's APC discovery,
  check_pdu_health): ``rPDU2DeviceStatusPower`` 26.4.3.1.5 (hundredths of kW),
  ``...Energy`` .9 (tenths of kWh), ``...ApparentPower`` .16 (hundredths of kVA),
  ``...PowerFactor`` .17 (hundredths), ``rPDU2PhaseStatusCurrent`` 26.6.3.1.5 (tenths of A),
  ``...Voltage`` .6 (V), ``...Power`` .7 (hundredths of kW), ``...PowerFactor`` .9 (hundredths),
  ``rPDU2BankStatusCurrent`` 26.8.3.1.5 (tenths of A), ``rPDU2SensorTempHumidityStatusTempC``
  26.10.2.2.1.8 (tenths of °C) and ``...RelativeHumidity`` .10 (%). The Module and Number
  columns (.2 and .3 of the phase and bank tables) follow the column order those pollers print;
  ``rPDU2DeviceStatusModule`` (.2) is assumed by analogy. Check them against the MIB of your
  firmware before relying on chained APC units.

pysnmp is asyncio: each collector runs a private event loop inside :meth:`poll`, so the API is
synchronous (call it from a plain thread, not from inside a running event loop).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pysnmp.error import PySnmpError
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    bulk_cmd,
)
from pysnmp.proto.rfc1905 import EndOfMibView, NoSuchInstance, NoSuchObject

from collectors.base import CollectorError, Message, MessageBuilder
from collectors.contract import QUANTITIES, unit_of

__all__ = ["PROFILES", "Column", "Profile", "SnmpPduCollector", "Table"]

log = logging.getLogger(__name__)

COLLECTOR = "snmp"

#: Unit after scaling -> (contract unit, factor, offset).
UNITS: dict[str, tuple[str, float, float]] = {
    "A": ("A", 1.0, 0.0),
    "V": ("V", 1.0, 0.0),
    "W": ("W", 1.0, 0.0),
    "kW": ("W", 1e3, 0.0),
    "VA": ("VA", 1.0, 0.0),
    "kVA": ("VA", 1e3, 0.0),
    "kWh": ("kWh", 1.0, 0.0),
    "Wh": ("kWh", 1e-3, 0.0),
    "Hz": ("Hz", 1.0, 0.0),
    "1": ("1", 1.0, 0.0),
    "Cel": ("°C", 1.0, 0.0),
    "degF": ("°C", 5.0 / 9.0, -32.0 * 5.0 / 9.0),
    "%": ("%", 1.0, 0.0),
}


def contract_unit(quantity: str) -> str:
    """The unit a quantity is stored in: the contract's, or the one its name ends with."""
    if quantity.startswith("power_factor"):
        return "1"
    unit = unit_of(quantity, "pdu")
    if unit is None:
        raise ValueError(f"quantity {quantity!r} names no unit")
    return unit


class Column(BaseModel):
    """One MIB column (or one sensor type of a Raritan measurements column)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mib: str = Field(description="MIB object, e.g. 'PowerNet-MIB::rPDU2PhaseStatusCurrent'")
    oid: str = Field(description="column OID; a row is <oid>.<index>")
    quantity: str
    scale: float = 1.0
    unit: str = Field(description="unit of raw * scale / 10**decimals; a key of UNITS")
    decimals: str | None = Field(None, description="OID of a decimal-digits column, same index")
    units: str | None = Field(
        None, description="OID of a units column (same index) or scalar (ends in .0)"
    )
    units_map: dict[int, str] = Field(
        default_factory=dict, description="agent's units enum -> a key of UNITS; others refused"
    )
    when: dict[str, tuple[int, ...]] = Field(
        default_factory=dict, description="index part or key -> values the row must have"
    )
    sample: str | None = Field(None, description="sample-id pattern overriding the table's")
    invalid: tuple[int, ...] = Field((-1,), description="raw values meaning 'no reading'")


class Table(BaseModel):
    """One conceptual table: how its index reads and where its rows land."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    index: tuple[str, ...] = Field(description="names of the index parts, in order")
    keys: dict[str, str] = Field(
        default_factory=dict, description="name -> OID of a column of the same row (cached)"
    )
    sample: str = Field(description="pattern: {src}, {chain}, index parts and keys")
    chain: tuple[str, ...] = Field(
        (), description="parts that prefix the id as /<name><value> when not 1"
    )
    first: str | None = Field(None, description="pattern for the first row of each quantity")
    columns: tuple[Column, ...]


class Profile(BaseModel):
    """A vendor MIB: the tables to walk."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    tables: tuple[Table, ...]


# ---- profiles -----------------------------------------------------------------------------------

_RARITAN = "1.3.6.1.4.1.13742.6"
# SensorTypeEnumeration -> (quantity, unit after decimals, SensorUnitsEnumeration accepted)
_RARITAN_TYPES: dict[int, tuple[str, str, dict[int, str]]] = {
    1: ("current_a", "A", {2: "A"}),  # rmsCurrent, amp
    4: ("voltage_v", "V", {1: "V"}),  # rmsVoltage, volt
    5: ("power_w", "W", {3: "W"}),  # activePower, watt
    6: ("apparent_power_va", "VA", {4: "VA"}),  # apparentPower, voltamp
    7: ("power_factor", "1", {-1: "1", 0: "1"}),  # powerFactor, none
    8: ("energy_kwh", "Wh", {5: "Wh"}),  # activeEnergy, wattHour
    23: ("frequency_hz", "Hz", {8: "Hz"}),  # frequency, hertz
}


def _raritan_columns(
    mib: str, value_oid: str, config_entry: str, types: tuple[int, ...]
) -> tuple[Column, ...]:
    return tuple(
        Column(
            mib=f"PDU2-MIB::{mib} (sensorType {t})",
            oid=value_oid,
            quantity=_RARITAN_TYPES[t][0],
            unit=_RARITAN_TYPES[t][1],
            decimals=f"{config_entry}.7",  # ...SensorDecimalDigits
            units=f"{config_entry}.6",  # ...SensorUnits
            units_map=_RARITAN_TYPES[t][2],
            when={"type": (t,)},
            invalid=(),
        )
        for t in types
    )


RARITAN_PDU2 = Profile(
    name="raritan-pdu2",
    description="Raritan PX2/PX3/PX4 (PDU2-MIB); values scaled by each sensor's DecimalDigits",
    tables=(
        Table(
            name="inletSensorMeasurementsTable",  # INDEX { pduId, inletId, sensorType }
            index=("pdu", "inlet", "type"),
            sample="{src}{chain}",
            chain=("pdu", "inlet"),
            # measurementsInletSensorValue; inletSensorConfigurationEntry (6.3.3.4.1)
            columns=_raritan_columns(
                "measurementsInletSensorValue",
                f"{_RARITAN}.5.2.3.1.4",
                f"{_RARITAN}.3.3.4.1",
                (1, 4, 5, 6, 7, 8, 23),
            ),
        ),
        Table(
            name="inletPoleSensorMeasurementsTable",  # { pduId, inletId, inletPoleIndex, type }
            index=("pdu", "inlet", "pole", "type"),
            sample="{src}{chain}/L{pole}",
            chain=("pdu", "inlet"),
            # measurementsInletPoleSensorValue; inletPoleSensorConfigurationEntry (6.3.3.6.1)
            columns=_raritan_columns(
                "measurementsInletPoleSensorValue",
                f"{_RARITAN}.5.2.4.1.4",
                f"{_RARITAN}.3.3.6.1",
                (1, 4, 5, 6, 7, 8),
            ),
        ),
        Table(
            name="overCurrentProtectorSensorMeasurementsTable",  # { pduId, ocpIndex, type }
            index=("pdu", "ocp", "type"),
            sample="{src}{chain}/cb{ocp}",
            chain=("pdu",),
            # measurementsOverCurrentProtectorSensorValue; ...SensorConfigurationEntry 6.3.4.4.1
            columns=_raritan_columns(
                "measurementsOverCurrentProtectorSensorValue",
                f"{_RARITAN}.5.3.3.1.4",
                f"{_RARITAN}.3.4.4.1",
                (1,),
            ),
        ),
        Table(
            name="outletSensorMeasurementsTable",  # INDEX { pduId, outletId, sensorType }
            index=("pdu", "outlet", "type"),
            sample="{src}{chain}/outlet{outlet}",
            chain=("pdu",),
            # measurementsOutletSensorValue; outletSensorConfigurationEntry (6.3.5.4.1)
            columns=_raritan_columns(
                "measurementsOutletSensorValue",
                f"{_RARITAN}.5.4.3.1.4",
                f"{_RARITAN}.3.5.4.1",
                (1, 4, 5, 6, 7, 8),
            ),
        ),
        Table(
            name="externalSensorMeasurementsTable",  # INDEX { pduId, sensorID }
            index=("pdu", "sensor"),
            keys={"type": f"{_RARITAN}.3.6.3.1.2"},  # externalSensorType
            sample="{src}{chain}/sensor{sensor}",
            first="{src}{chain}",
            chain=("pdu",),
            columns=(
                Column(
                    mib="PDU2-MIB::measurementsExternalSensorValue (temperature)",
                    oid=f"{_RARITAN}.5.5.3.1.4",
                    quantity="inlet_temp_c",
                    unit="Cel",
                    decimals=f"{_RARITAN}.3.6.3.1.17",  # externalSensorDecimalDigits
                    units=f"{_RARITAN}.3.6.3.1.16",  # externalSensorUnits
                    units_map={7: "Cel"},  # degreeC; degreeF is refused (enum not verified)
                    when={"type": (10,)},
                    invalid=(),
                ),
                Column(
                    mib="PDU2-MIB::measurementsExternalSensorValue (humidity)",
                    oid=f"{_RARITAN}.5.5.3.1.4",
                    quantity="humidity_pct",
                    unit="%",
                    decimals=f"{_RARITAN}.3.6.3.1.17",
                    units=f"{_RARITAN}.3.6.3.1.16",
                    units_map={9: "%"},  # percent
                    when={"type": (11,)},
                    invalid=(),
                ),
            ),
        ),
    ),
)

_APC = "1.3.6.1.4.1.318.1.1.26"
APC_RPDU2 = Profile(
    name="apc-rpdu2",
    description="APC/Schneider Rack PDU 2G (PowerNet-MIB rPDU2 tables)",
    tables=(
        Table(
            name="rPDU2DeviceStatusTable",  # INDEX { rPDU2DeviceStatusIndex }
            index=("row",),
            keys={"module": f"{_APC}.4.3.1.2"},  # rPDU2DeviceStatusModule (assumed column 2)
            sample="{src}{chain}",
            chain=("module",),
            columns=(
                # rPDU2DeviceStatusPower: hundredths of kW
                Column(
                    mib="PowerNet-MIB::rPDU2DeviceStatusPower",
                    oid=f"{_APC}.4.3.1.5",
                    quantity="power_w",
                    scale=0.01,
                    unit="kW",
                ),
                # rPDU2DeviceStatusEnergy: tenths of kWh
                Column(
                    mib="PowerNet-MIB::rPDU2DeviceStatusEnergy",
                    oid=f"{_APC}.4.3.1.9",
                    quantity="energy_kwh",
                    scale=0.1,
                    unit="kWh",
                ),
                # rPDU2DeviceStatusApparentPower: hundredths of kVA
                Column(
                    mib="PowerNet-MIB::rPDU2DeviceStatusApparentPower",
                    oid=f"{_APC}.4.3.1.16",
                    quantity="apparent_power_va",
                    scale=0.01,
                    unit="kVA",
                ),
                # rPDU2DeviceStatusPowerFactor: hundredths
                Column(
                    mib="PowerNet-MIB::rPDU2DeviceStatusPowerFactor",
                    oid=f"{_APC}.4.3.1.17",
                    quantity="power_factor",
                    scale=0.01,
                    unit="1",
                ),
            ),
        ),
        Table(
            name="rPDU2PhaseStatusTable",  # INDEX { rPDU2PhaseStatusIndex }
            index=("row",),
            keys={
                "module": f"{_APC}.6.3.1.2",  # rPDU2PhaseStatusModule
                "number": f"{_APC}.6.3.1.3",  # rPDU2PhaseStatusNumber
            },
            sample="{src}{chain}/L{number}",
            chain=("module",),
            columns=(
                # rPDU2PhaseStatusCurrent: tenths of A
                Column(
                    mib="PowerNet-MIB::rPDU2PhaseStatusCurrent",
                    oid=f"{_APC}.6.3.1.5",
                    quantity="current_a",
                    scale=0.1,
                    unit="A",
                ),
                # rPDU2PhaseStatusVoltage: V
                Column(
                    mib="PowerNet-MIB::rPDU2PhaseStatusVoltage",
                    oid=f"{_APC}.6.3.1.6",
                    quantity="voltage_v",
                    unit="V",
                ),
                # rPDU2PhaseStatusPower: hundredths of kW
                Column(
                    mib="PowerNet-MIB::rPDU2PhaseStatusPower",
                    oid=f"{_APC}.6.3.1.7",
                    quantity="power_w",
                    scale=0.01,
                    unit="kW",
                ),
                # rPDU2PhaseStatusPowerFactor: hundredths
                Column(
                    mib="PowerNet-MIB::rPDU2PhaseStatusPowerFactor",
                    oid=f"{_APC}.6.3.1.9",
                    quantity="power_factor",
                    scale=0.01,
                    unit="1",
                ),
            ),
        ),
        Table(
            name="rPDU2BankStatusTable",  # INDEX { rPDU2BankStatusIndex }
            index=("row",),
            keys={
                "module": f"{_APC}.8.3.1.2",  # rPDU2BankStatusModule
                "number": f"{_APC}.8.3.1.3",  # rPDU2BankStatusNumber
            },
            sample="{src}{chain}/cb{number}",
            chain=("module",),
            columns=(
                # rPDU2BankStatusCurrent: tenths of A
                Column(
                    mib="PowerNet-MIB::rPDU2BankStatusCurrent",
                    oid=f"{_APC}.8.3.1.5",
                    quantity="current_a",
                    scale=0.1,
                    unit="A",
                ),
            ),
        ),
        Table(
            name="rPDU2SensorTempHumidityStatusTable",
            index=("row",),
            sample="{src}/sensor{row}",
            first="{src}",
            columns=(
                # rPDU2SensorTempHumidityStatusTempC: tenths of degrees Celsius
                Column(
                    mib="PowerNet-MIB::rPDU2SensorTempHumidityStatusTempC",
                    oid=f"{_APC}.10.2.2.1.8",
                    quantity="inlet_temp_c",
                    scale=0.1,
                    unit="Cel",
                ),
                # rPDU2SensorTempHumidityStatusRelativeHumidity: percent (-1 without a sensor)
                Column(
                    mib="PowerNet-MIB::rPDU2SensorTempHumidityStatusRelativeHumidity",
                    oid=f"{_APC}.10.2.2.1.10",
                    quantity="humidity_pct",
                    unit="%",
                ),
            ),
        ),
    ),
)

_ST4 = "1.3.6.1.4.1.1718.4.1"
_UCL = ("unit", "cord")
SENTRY4 = Profile(
    name="sentry4",
    description="Server Technology PRO1/PRO2 (Sentry4-MIB)",
    tables=(
        Table(
            name="st4InputCordMonitorTable",  # INDEX { st4UnitIndex, st4InputCordIndex }
            index=_UCL,
            sample="{src}{chain}",
            chain=_UCL,
            columns=(
                # st4InputCordActivePower: Watts
                Column(
                    mib="Sentry4-MIB::st4InputCordActivePower",
                    oid=f"{_ST4}.3.3.1.3",
                    quantity="power_w",
                    unit="W",
                ),
                # st4InputCordApparentPower: Volt-Amps
                Column(
                    mib="Sentry4-MIB::st4InputCordApparentPower",
                    oid=f"{_ST4}.3.3.1.5",
                    quantity="apparent_power_va",
                    unit="VA",
                ),
                # st4InputCordPowerFactor: hundredths
                Column(
                    mib="Sentry4-MIB::st4InputCordPowerFactor",
                    oid=f"{_ST4}.3.3.1.8",
                    quantity="power_factor",
                    scale=0.01,
                    unit="1",
                ),
                # st4InputCordEnergy: tenth Kilowatt-Hours
                Column(
                    mib="Sentry4-MIB::st4InputCordEnergy",
                    oid=f"{_ST4}.3.3.1.10",
                    quantity="energy_kwh",
                    scale=0.1,
                    unit="kWh",
                ),
                # st4InputCordFrequency: tenth Hertz
                Column(
                    mib="Sentry4-MIB::st4InputCordFrequency",
                    oid=f"{_ST4}.3.3.1.11",
                    quantity="frequency_hz",
                    scale=0.1,
                    unit="Hz",
                ),
            ),
        ),
        Table(
            name="st4LineMonitorTable",  # INDEX { unit, cord, st4LineIndex } L1=1 .. N=4
            index=(*_UCL, "line"),
            sample="{src}{chain}/L{line}",
            chain=_UCL,
            columns=(
                # st4LineCurrent: hundredth Amps
                Column(
                    mib="Sentry4-MIB::st4LineCurrent",
                    oid=f"{_ST4}.4.3.1.3",
                    quantity="current_a",
                    scale=0.01,
                    unit="A",
                    when={"line": (1, 2, 3)},
                ),
                Column(
                    mib="Sentry4-MIB::st4LineCurrent (N)",
                    oid=f"{_ST4}.4.3.1.3",
                    quantity="neutral_current_a",
                    scale=0.01,
                    unit="A",
                    when={"line": (4,)},
                    sample="{src}{chain}",
                ),
            ),
        ),
        Table(
            # INDEX { unit, cord, st4PhaseIndex }: wye L1-N=1..L3-N=3, delta L1-L2=1..L3-L1=3,
            # wye & delta: L1-N..L3-N = 1..3, L1-L2..L3-L1 = 4..6 (-> <pdu>/phase4..6)
            name="st4PhaseMonitorTable",
            index=(*_UCL, "phase"),
            sample="{src}{chain}/L{phase}",
            chain=_UCL,
            columns=tuple(
                Column(
                    mib=f"Sentry4-MIB::{mib}",
                    oid=f"{_ST4}.5.3.1.{col}",
                    quantity=q,
                    scale=scale,
                    unit=unit,
                    when={"phase": phases},
                    sample=None if phases == (1, 2, 3) else "{src}{chain}/phase{phase}",
                )
                for phases in ((1, 2, 3), (4, 5, 6))
                for mib, col, q, scale, unit in (
                    ("st4PhaseVoltage", 3, "voltage_v", 0.1, "V"),  # tenth Volts
                    ("st4PhaseCurrent", 6, "phase_current_a", 0.01, "A"),  # hundredth Amps
                    ("st4PhaseActivePower", 8, "power_w", 1.0, "W"),  # Watts
                    ("st4PhaseApparentPower", 9, "apparent_power_va", 1.0, "VA"),  # Volt-Amps
                    ("st4PhasePowerFactor", 10, "power_factor", 0.01, "1"),  # hundredths
                    ("st4PhaseEnergy", 13, "energy_kwh", 0.1, "kWh"),  # tenth kWh
                )
            ),
        ),
        Table(
            name="st4BranchMonitorTable",  # INDEX { unit, cord, st4BranchIndex }
            index=(*_UCL, "branch"),
            sample="{src}{chain}/cb{branch}",
            chain=_UCL,
            columns=(
                # st4BranchCurrent: hundredth Amps
                Column(
                    mib="Sentry4-MIB::st4BranchCurrent",
                    oid=f"{_ST4}.7.3.1.3",
                    quantity="current_a",
                    scale=0.01,
                    unit="A",
                ),
            ),
        ),
        Table(
            name="st4OutletMonitorTable",  # INDEX { unit, cord, st4OutletIndex }
            index=(*_UCL, "outlet"),
            sample="{src}{chain}/outlet{outlet}",
            chain=_UCL,
            columns=(
                Column(
                    mib="Sentry4-MIB::st4OutletCurrent",
                    oid=f"{_ST4}.8.3.1.3",
                    quantity="current_a",
                    scale=0.01,
                    unit="A",
                ),  # hundredth Amps
                Column(
                    mib="Sentry4-MIB::st4OutletVoltage",
                    oid=f"{_ST4}.8.3.1.6",
                    quantity="voltage_v",
                    scale=0.1,
                    unit="V",
                ),  # tenth Volts
                Column(
                    mib="Sentry4-MIB::st4OutletActivePower",
                    oid=f"{_ST4}.8.3.1.7",
                    quantity="power_w",
                    unit="W",
                ),  # Watts
                Column(
                    mib="Sentry4-MIB::st4OutletApparentPower",
                    oid=f"{_ST4}.8.3.1.9",
                    quantity="apparent_power_va",
                    unit="VA",
                ),  # Volt-Amps
                Column(
                    mib="Sentry4-MIB::st4OutletPowerFactor",
                    oid=f"{_ST4}.8.3.1.10",
                    quantity="power_factor",
                    scale=0.01,
                    unit="1",
                ),  # hundredths
                Column(
                    mib="Sentry4-MIB::st4OutletEnergy",
                    oid=f"{_ST4}.8.3.1.14",
                    quantity="energy_kwh",
                    unit="Wh",
                ),  # Watt-Hours
            ),
        ),
        Table(
            name="st4TempSensorMonitorTable",  # INDEX { st4UnitIndex, st4TempSensorIndex }
            index=("unit", "sensor"),
            sample="{src}{chain}/sensor{sensor}",
            first="{src}{chain}",
            chain=("unit",),
            columns=(
                # st4TempSensorValue: tenth degrees in st4TempSensorScale; -410 = invalid
                Column(
                    mib="Sentry4-MIB::st4TempSensorValue",
                    oid=f"{_ST4}.9.3.1.1",
                    quantity="inlet_temp_c",
                    scale=0.1,
                    unit="Cel",
                    units=f"{_ST4}.9.1.10.0",  # st4TempSensorScale: celsius(0) fahrenheit(1)
                    units_map={0: "Cel", 1: "degF"},
                    invalid=(-410,),
                ),
            ),
        ),
        Table(
            name="st4HumidSensorMonitorTable",  # INDEX { st4UnitIndex, st4HumidSensorIndex }
            index=("unit", "sensor"),
            sample="{src}{chain}/sensor{sensor}",
            first="{src}{chain}",
            chain=("unit",),
            columns=(
                # st4HumidSensorValue: percentage relative humidity; -1 = none
                Column(
                    mib="Sentry4-MIB::st4HumidSensorValue",
                    oid=f"{_ST4}.10.3.1.1",
                    quantity="humidity_pct",
                    unit="%",
                ),
            ),
        ),
    ),
)

#: Profiles by name (the CLI's ``--profile``).
PROFILES: dict[str, Profile] = {p.name: p for p in (RARITAN_PDU2, APC_RPDU2, SENTRY4)}

_OID = tuple[int, ...]


def _oid(text: str) -> _OID:
    return tuple(int(x) for x in text.strip(".").split("."))


class _Reject(Exception):
    """A reading that cannot be stored; the message says why."""


class SnmpPduCollector:
    """Polls one PDU's SNMP v2c agent with a vendor profile (see the module docstring).

    ``profile`` is a key of :data:`PROFILES` or a :class:`Profile`. ``source`` defaults to the
    host with ``.``/``:`` turned into ``-``; pass the site file's PDU name (CLI ``--source
    pdu-r01-a``) so the twin resolves the readings.
    """

    def __init__(
        self,
        host: str,
        *,
        site: str,
        profile: str | Profile,
        community: str,
        port: int = 161,
        source: str | None = None,
        timeout_s: float = 2.0,
        retries: int = 1,
        max_repetitions: int = 25,
    ):
        if isinstance(profile, Profile):
            self.profile = profile
        elif profile in PROFILES:
            self.profile = PROFILES[profile]
        else:
            raise ValueError(f"unknown SNMP profile {profile!r}; known: {', '.join(PROFILES)}")
        for table in self.profile.tables:  # fail at start, not at the first poll
            for col in table.columns:
                if col.unit not in UNITS or any(u not in UNITS for u in col.units_map.values()):
                    raise ValueError(f"{col.mib}: unit {col.unit!r} is not one of {list(UNITS)}")
                contract_unit(col.quantity)
        self.host = host
        self.port = port
        self.site = site
        self.source = source or host.replace(".", "-").replace(":", "-")
        self.name = f"snmp {self.profile.name} {host}:{port}"
        self._community = community
        self._timeout_s = timeout_s
        self._retries = retries
        self._max_rep = max_repetitions
        self._builder = MessageBuilder(site, COLLECTOR)
        self._loop = asyncio.new_event_loop()
        self._engine: SnmpEngine | None = None
        self._target: UdpTransportTarget | None = None
        self._cache: dict[str, dict[_OID, Any]] = {}  # config column -> rows
        self._cache_for: dict[str, set[_OID]] = {}  # config column -> value rows when read
        self._warned: set[tuple[str, str]] = set()

    # ---- SNMP --------------------------------------------------------------------------------

    async def _walk(self, oid: str) -> dict[_OID, Any]:
        """Every row under a column OID (GETBULK until the subtree ends), keyed by index."""
        assert self._engine is not None and self._target is not None
        base = _oid(oid)
        out: dict[_OID, Any] = {}
        cursor = base
        while True:
            err, status, index, vbs = await bulk_cmd(
                self._engine,
                CommunityData(self._community, mpModel=1),
                self._target,
                ContextData(),
                0,
                self._max_rep,
                ObjectType(ObjectIdentity(".".join(map(str, cursor)))),
                lookupMib=False,
            )
            if err:
                raise CollectorError(
                    f"{self.name}: no usable answer to GETBULK {oid} ({err}) within "
                    f"{self._timeout_s} s x {self._retries + 1} tries: agent down or "
                    "unreachable, or wrong community (a v2c agent ignores a wrong community)"
                )
            if status:
                raise CollectorError(
                    f"{self.name}: agent error {status} at index {index} for GETBULK {oid}"
                )
            if not vbs:
                return out
            for name, value in vbs:
                t = tuple(name)
                if (
                    t[: len(base)] != base
                    or t <= cursor
                    or isinstance(value, EndOfMibView | NoSuchObject | NoSuchInstance)
                ):
                    return out
                out[t[len(base) :]] = value
                cursor = t

    async def _poll(self) -> dict[str, dict[_OID, Any]]:
        if self._engine is None:
            self._engine = SnmpEngine()
            self._target = await UdpTransportTarget.create(
                (self.host, self.port), timeout=self._timeout_s, retries=self._retries
            )
        values: dict[str, dict[_OID, Any]] = {}
        for table in self.profile.tables:
            for col in table.columns:
                if col.oid not in values:
                    values[col.oid] = await self._walk(col.oid)
        # config columns: read for the rows seen, once; again when a row is new to them
        for table in self.profile.tables:
            rows = {i for c in table.columns for i in values[c.oid]}
            config = list(table.keys.values())
            for col in table.columns:
                config += [o for o in (col.decimals, col.units) if o]
            for oid in config:
                scalar = oid.endswith(".0")
                key = oid.removesuffix(".0")
                if key not in self._cache or (not scalar and rows - self._cache_for[key]):
                    self._cache[key] = await self._walk(key)
                    self._cache_for[key] = self._cache_for.get(key, set()) | rows
        return values

    def poll(self) -> list[Message]:
        """One ``pdu`` message with every reading of the profile the agent answered."""
        try:
            values = self._loop.run_until_complete(self._poll())
        except (PySnmpError, OSError) as e:  # e.g. a host name that does not resolve
            raise CollectorError(f"{self.name}: {type(e).__name__}: {e}") from e
        if not any(values.values()):
            raise CollectorError(
                f"{self.name}: the agent answered but has none of the {self.profile.name} "
                "objects: wrong profile for this PDU?"
            )
        samples: dict[str, dict[str, Any]] = {}
        for table in self.profile.tables:
            self._table(table, values, samples)
        rows = [s for s in samples.values() if len(s) > 1]
        if not rows:
            raise CollectorError(f"{self.name}: no reading could be stored (see the log)")
        return [self._builder.message("pdu", self.source, rows)]

    def close(self) -> None:
        """Release the SNMP engine's socket and the private event loop."""
        if self._engine is not None:
            self._engine.close_dispatcher()
            self._engine = None
        if not self._loop.is_closed():
            self._loop.close()

    # ---- mapping -----------------------------------------------------------------------------

    def _refuse(self, what: str, reason: str) -> None:
        key = (what, reason)
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, "%s: %s skipped: %s", self.name, what, reason)

    def _table(
        self, table: Table, values: dict[str, dict[_OID, Any]], samples: dict[str, dict[str, Any]]
    ) -> None:
        firsts: set[str] = set()
        rows = sorted({i for c in table.columns for i in values[c.oid]})
        for index in rows:
            if len(index) != len(table.index):
                log.debug(
                    "%s: %s row %s does not match index %s",
                    self.name,
                    table.name,
                    index,
                    table.index,
                )
                continue
            fields: dict[str, Any] = dict(zip(table.index, index, strict=True))
            for name, oid in table.keys.items():
                raw = self._cache.get(oid, {}).get(index)
                if raw is not None:
                    fields[name] = _int(raw, raw)
            chain = "".join(f"/{p}{fields[p]}" for p in table.chain if fields.get(p, 1) != 1)
            for col in table.columns:
                raw = values[col.oid].get(index)
                if raw is None or any(fields.get(k) not in v for k, v in col.when.items()):
                    continue
                what = f"{col.mib}.{'.'.join(map(str, index))}"
                try:
                    value = self._convert(col, index, raw)
                except _Reject as e:
                    self._refuse(what, str(e))
                    continue
                if value is None:
                    continue
                pattern = col.sample or table.sample
                if table.first and col.quantity not in firsts:
                    pattern = table.first
                    firsts.add(col.quantity)
                try:
                    sid = pattern.format(src=self.source, chain=chain, **fields)
                except KeyError as e:
                    self._refuse(what, f"sample pattern {pattern!r} needs {e}")
                    continue
                q = QUANTITIES["pdu"].get(col.quantity)
                if q is not None and q.nonnegative and value < 0:
                    self._refuse(what, f"{col.quantity} cannot be negative ({value})")
                    continue
                samples.setdefault(sid, {"id": sid}).setdefault(col.quantity, value)

    def _convert(self, col: Column, index: _OID, raw: Any) -> float | None:
        """raw -> contract units, or None for a 'no reading' value; _Reject when unsure."""
        n = _int(raw, None)
        if n is None:
            raise _Reject(f"value {raw!r} is not an integer")
        if n in col.invalid:
            return None
        value = float(n) * col.scale
        if col.decimals:
            d = _int(self._cache.get(col.decimals, {}).get(index), None)
            if d is None or not 0 <= d <= 9:
                raise _Reject(f"no decimal digits at {col.decimals} for this row")
            value /= 10**d
        unit = col.unit
        if col.units:
            scalar = col.units.endswith(".0")
            rows = self._cache.get(col.units.removesuffix(".0"), {})
            u = _int(rows.get((0,) if scalar else index), None)
            if u is None:
                log.debug(
                    "%s: %s has no unit at %s; taking the MIB's %s",
                    self.name,
                    col.mib,
                    col.units,
                    unit,
                )
            elif u not in col.units_map:
                raise _Reject(f"unit code {u} at {col.units} is not one of {col.units_map}")
            else:
                unit = col.units_map[u]
        target, factor, offset = UNITS[unit]
        if target != contract_unit(col.quantity):
            raise _Reject(f"unit {unit} does not convert to {contract_unit(col.quantity)}")
        value = value * factor + offset
        return value if math.isfinite(value) else None


def _int(value: Any, default: Any) -> Any:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
