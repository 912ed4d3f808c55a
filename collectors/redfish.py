"""Redfish collector: rack PDUs (``PowerEquipment``) and CDUs (``ThermalEquipment``) over HTTPS.

One :class:`RedfishCollector` reads one Redfish service (a PDU's or CDU's own controller, or a
DCIM gateway) and returns, per poll, one contract message per piece of equipment it found:

- ``pdu`` (``/redfish/v1/PowerEquipment/RackPDUs/<id>``, schema ``PowerDistribution``)
- ``cdu`` (``/redfish/v1/ThermalEquipment/CDUs/<id>``, schema ``CoolingUnit``)

Sample ids follow the simulator's convention (twin/simulator/README.md), with ``<src>``
the message source:

=====================================  ========================================================
Redfish resource                       sample id and quantities
=====================================  ========================================================
``Metrics`` (PowerDistributionMetrics)  ``<src>``: ``power_w``, ``apparent_power_va``,
                                       ``power_factor``, ``energy_kwh``, ``inlet_temp_c``,
                                       ``humidity_pct`` (+ extra ``reactive_power_var``)
``Mains/<m>`` (one mains circuit)      ``<src>/L1``..``L3`` from ``PolyPhaseCurrentAmps``,
                                       ``PolyPhaseVoltage`` (``LineNToNeutral``; line-to-line
                                       when the wiring has no neutral) and
                                       ``PolyPhasePowerWatts``; the circuit itself (totals,
                                       neutral current, line-to-line readings) on
                                       ``<src>/<m>``; ``frequency_hz`` also on ``<src>``.
                                       With several mains: ``<src>/<m>/L1``..
``Branches/<b>``                       ``<src>/<b>`` (the site file names the breaker ``<b>``)
``Outlets/<o>``                        ``<src>/outlet<o>``
``OutletGroups/<g>``                   ``<src>/group-<g>``
``SecondaryCoolantConnectors/<first>``  ``<cdu>``: ``supply_temp_c``, ``return_temp_c``,
                                       ``flow_lpm``, ``dp_kpa``, ``heat_kw``
``PrimaryCoolantConnectors/<first>``   ``<cdu>``: ``fw_supply_temp_c``, ``fw_return_temp_c``,
                                       ``fw_flow_lpm`` (+ ``fw_dp_kpa``, ``fw_heat_kw``)
``Pumps/<p>``                          ``<cdu>/pump<p>``: ``pump_speed_pct`` (``pump_power_w``
                                       when reported; their sum on ``<cdu>``)
``EnvironmentMetrics``                 ``<cdu>``: extras ``ambient_temp_c``, ``humidity_pct``
Chassis ``Sensors`` not quoted above   environment sensors fill ``<src>``'s inlet (PDU) or
                                       ambient (CDU) temperature and humidity when still
                                       empty; every other sensor lands on
                                       ``<src>/sensors/<sensor id>`` (``power_w``, ``temp_c``,
                                       ``flow_lpm``, ``pressure_kpa``, ...)
=====================================  ========================================================

Further connectors go to ``<cdu>/secondary<id>`` / ``<cdu>/primary<id>``. Other readings of a
resource become extra quantities named after the property (``voltage_l1l2_v``,
``supply_pressure_kpa``, ``delta_temp_k``, ...). A reading that the service quotes in a
resource *and* exposes as a Sensor (same ``DataSourceUri``) is taken once, from the resource.

Units. The excerpt properties carry their unit in the schema (``CurrentAmps``,
``EnergykWh``, ``HeatRemovedkW``, ...). A Sensor resource states it in ``ReadingUnits`` (UCUM);
:data:`UCUM` converts the ones we know to the contract's units. A reading in any other unit is
refused with a logged reason and never stored under a wrong unit.

Source names. The source defaults to the equipment's ``Id``, or a slug of its ``Name`` when
the Id is a bare number (the DMTF mockup's ``RackPDUs/1`` "RackPDU1" -> ``rackpdu1``). The site
file names PDUs and CDUs (``pdu-r01-a``); pass that name as ``source`` (CLI ``--source
pdu-r01-a``) so that the twin resolves the readings, and ``equipment`` to pick one of several
devices behind one service.

Auth: HTTP basic by default; ``session=True`` logs in at ``/redfish/v1/SessionService/Sessions``
and sends ``X-Auth-Token`` (logged out on :meth:`RedfishCollector.close`). TLS verification is
on by default; ``verify=False`` turns it off, a string names a CA bundle.
"""

from __future__ import annotations

import logging
import math
import re
import ssl
from collections.abc import Iterable
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import httpx

from collectors.base import CollectorError, Message, MessageBuilder
from collectors.contract import phase_id, sub_id, value_error

__all__ = ["UCUM", "RedfishCollector"]

log = logging.getLogger(__name__)

COLLECTOR = "redfish"
ROOT = "/redfish/v1/"

#: Default collections walked per kind, under PowerEquipment / ThermalEquipment.
COLLECTIONS: dict[str, tuple[str, ...]] = {"pdu": ("RackPDUs",), "cdu": ("CDUs",)}
_SERVICE_OF_KIND = {"pdu": "PowerEquipment", "cdu": "ThermalEquipment"}

#: UCUM ``ReadingUnits`` -> (contract unit, factor, offset): value_contract = raw*factor+offset.
UCUM: dict[str, tuple[str, float, float]] = {
    "Cel": ("°C", 1.0, 0.0),
    "[degF]": ("°C", 5.0 / 9.0, -32.0 * 5.0 / 9.0),
    "K": ("°C", 1.0, -273.15),
    "A": ("A", 1.0, 0.0),
    "mA": ("A", 1e-3, 0.0),
    "V": ("V", 1.0, 0.0),
    "mV": ("V", 1e-3, 0.0),
    "W": ("W", 1.0, 0.0),
    "kW": ("W", 1e3, 0.0),
    "V.A": ("VA", 1.0, 0.0),
    "kV.A": ("VA", 1e3, 0.0),
    "kW.h": ("kWh", 1.0, 0.0),
    "W.h": ("kWh", 1e-3, 0.0),
    "J": ("kWh", 1.0 / 3.6e6, 0.0),
    "Hz": ("Hz", 1.0, 0.0),
    "%": ("%", 1.0, 0.0),
    "L/min": ("L/min", 1.0, 0.0),
    "L/s": ("L/min", 60.0, 0.0),
    "m3/h": ("L/min", 1000.0 / 60.0, 0.0),
    "[gal_us]/min": ("L/min", 3.785411784, 0.0),
    "kPa": ("kPa", 1.0, 0.0),
    "Pa": ("kPa", 1e-3, 0.0),
    "bar": ("kPa", 100.0, 0.0),
    "[psi]": ("kPa", 6.894757293168361, 0.0),
    "{rev}/min": ("rpm", 1.0, 0.0),
    "RPM": ("rpm", 1.0, 0.0),
}
#: Spellings seen in the field for a temperature sensor (the DMTF PDU mockup writes "C").
_TEMPERATURE_ALIASES = {"C": "Cel", "°C": "Cel", "degC": "Cel"}

#: Sensor.ReadingType -> (quantity suffix stem, contract unit it must convert to).
_READING_TYPES: dict[str, tuple[str, str]] = {
    "Temperature": ("temp_c", "°C"),
    "Humidity": ("humidity_pct", "%"),
    "Power": ("power_w", "W"),
    "EnergykWh": ("energy_kwh", "kWh"),
    "EnergyJoules": ("energy_kwh", "kWh"),
    "EnergyWh": ("energy_kwh", "kWh"),
    "Current": ("current_a", "A"),
    "Voltage": ("voltage_v", "V"),
    "Frequency": ("frequency_hz", "Hz"),
    "LiquidFlowLPM": ("flow_lpm", "L/min"),
    "LiquidFlow": ("flow_lpm", "L/min"),
    "PressurekPa": ("pressure_kpa", "kPa"),
    "PressurePa": ("pressure_kpa", "kPa"),
    "Pressure": ("pressure_kpa", "kPa"),
    "DifferentialPressurekPa": ("dp_kpa", "kPa"),
    "Heat": ("heat_kw", "W"),  # converted to kW below
    "Percent": ("pct", "%"),
    "Rotational": ("speed_rpm", "rpm"),
}

# Circuit (Mains, Branch, Outlet, OutletGroup) excerpt -> quantity. Units by schema.
_CIRCUIT_SCALARS: dict[str, str] = {
    "CurrentAmps": "current_a",
    "Voltage": "voltage_v",
    "PowerWatts": "power_w",
    "EnergykWh": "energy_kwh",
    "FrequencyHz": "frequency_hz",
}
# Extra fields of a SensorPowerExcerpt, next to Reading (W).
_POWER_FIELDS: dict[str, str] = {
    "ApparentVA": "apparent_power_va",
    "ReactiveVAR": "reactive_power_var",
    "PowerFactor": "power_factor",
}
_LINES = ("Line1", "Line2", "Line3")
_LN = {f"Line{n}ToNeutral": n for n in (1, 2, 3)}
_LL = {"Line1ToLine2": 1, "Line2ToLine3": 2, "Line3ToLine1": 3}

# CoolantConnector excerpt -> quantity (secondary / TCS names; "fw_" prefix for primary).
_CONNECTOR: dict[str, str] = {
    "SupplyTemperatureCelsius": "supply_temp_c",
    "ReturnTemperatureCelsius": "return_temp_c",
    "FlowLitersPerMinute": "flow_lpm",
    "DeltaPressurekPa": "dp_kpa",
    "HeatRemovedkW": "heat_kw",
    "SupplyPressurekPa": "supply_pressure_kpa",
    "ReturnPressurekPa": "return_pressure_kpa",
    "DeltaTemperatureCelsius": "delta_temp_k",
}
_ENVIRONMENT: dict[str, str] = {
    "TemperatureCelsius": "ambient_temp_c",
    "HumidityPercent": "humidity_pct",
    "PowerWatts": "power_w",
    "EnergykWh": "energy_kwh",
}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "equipment"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _line_key(key: str) -> str:
    """'Line1ToNeutral' -> 'l1n', 'Line1ToLine2' -> 'l1l2', 'Line1' -> 'l1', 'Neutral' -> 'n'."""
    return key.replace("Line", "l").replace("Neutral", "n").replace("To", "").lower()


class _Samples:
    """Samples of one message, keyed by id, keeping the first value set for each quantity."""

    def __init__(self, kind: str):
        self.kind = kind
        self.by_id: dict[str, dict[str, Any]] = {}
        self.quoted: set[str] = set()  # DataSourceUri of every excerpt read

    def put(self, sid: str, quantity: str, value: Any, what: str) -> None:
        v = _number(value)
        if v is None:
            if value is not None:
                log.debug("redfish: %s is not a finite number (%r); skipped", what, value)
            return
        err = value_error(self.kind, quantity, v)  # the contract's value rule, at the edge
        if err is not None:
            log.warning("redfish: %s skipped: %s: %s", what, err.reason, err.detail)
            return
        sample = self.by_id.setdefault(sid, {"id": sid})
        sample.setdefault(quantity, v)

    def has(self, sid: str, quantity: str) -> bool:
        return quantity in self.by_id.get(sid, {})

    def list(self) -> list[dict[str, Any]]:
        return [s for s in self.by_id.values() if len(s) > 1]


class RedfishCollector:
    """Polls one Redfish service for its rack PDUs or CDUs (see the module docstring).

    ``url`` is the service's base (``https://pdu-r01-a``; a trailing ``/redfish/v1`` is
    accepted). ``kind`` picks PDUs or CDUs; by default whichever the service root offers.
    ``equipment`` picks one device by Redfish ``Id`` when the service has several;
    ``collections`` overrides the collections walked (default ``RackPDUs`` / ``CDUs``).
    """

    def __init__(
        self,
        url: str,
        *,
        site: str,
        source: str | None = None,
        kind: Literal["pdu", "cdu"] | None = None,
        username: str | None = None,
        password: str | None = None,
        verify: bool | str = True,
        timeout_s: float = 5.0,
        session: bool = False,
        equipment: str | None = None,
        collections: Iterable[str] | None = None,
    ):
        parts = urlsplit(url if "://" in url else f"https://{url}")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"redfish url {url!r} must be http(s)://host[:port]")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.name = f"redfish {self.url}"
        self.site = site
        self.source = source
        self.kind = kind
        self.equipment = equipment
        self.collections = tuple(collections) if collections is not None else None
        self._username = username
        self._password = password
        self._use_session = session
        self._token: str | None = None
        self._session_uri: str | None = None
        self._expand = False
        self._builder = MessageBuilder(site, COLLECTOR)
        self._warned: set[tuple[str, str]] = set()
        self._devices: list[tuple[str, str, str]] | None = None  # (kind, uri, source)
        if isinstance(verify, str):
            verify_arg: bool | ssl.SSLContext = ssl.create_default_context(cafile=verify)
        else:
            verify_arg = verify
        auth = None
        if username is not None and not session:
            auth = httpx.BasicAuth(username, password or "")
        self._http = httpx.Client(
            base_url=self.url,
            auth=auth,
            verify=verify_arg,
            timeout=timeout_s,
            headers={"Accept": "application/json", "OData-Version": "4.0"},
            follow_redirects=True,
        )

    # ---- HTTP --------------------------------------------------------------------------------

    def _fail(self, path: str, reason: str) -> CollectorError:
        return CollectorError(f"{self.name}: {urljoin(self.url, path)}: {reason}")

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {})
        if self._token:
            headers["X-Auth-Token"] = self._token
        try:
            return self._http.request(method, path, headers=headers, **kw)
        except httpx.TimeoutException as e:
            raise self._fail(path, f"unreachable: timed out ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise self._fail(path, f"unreachable: {type(e).__name__}: {e}") from e

    def _login(self) -> None:
        if self._username is None:
            raise CollectorError(f"{self.name}: session=True needs a username and password")
        path = f"{ROOT}SessionService/Sessions"
        self._token = None
        r = self._request(
            "POST", path, json={"UserName": self._username, "Password": self._password or ""}
        )
        if r.status_code in (401, 403):
            raise self._fail(path, f"HTTP {r.status_code}: login refused (check the credentials)")
        if r.status_code >= 400 or not r.headers.get("X-Auth-Token"):
            raise self._fail(path, f"HTTP {r.status_code}: no session token returned")
        self._token = r.headers["X-Auth-Token"]
        loc = r.headers.get("Location")
        if not loc:
            try:
                loc = r.json().get("@odata.id")
            except ValueError:
                loc = None
        self._session_uri = loc

    def _get(self, path: str, *, optional: bool = False, retried: bool = False) -> Any:
        r = self._request("GET", path)
        if r.status_code == 401 and self._use_session and not retried:
            self._login()
            return self._get(path, optional=optional, retried=True)
        if r.status_code in (401, 403):
            raise self._fail(
                path, f"HTTP {r.status_code} {r.reason_phrase}: check the username and password"
            )
        if r.status_code == 404 and optional:
            return None
        if r.status_code >= 400:
            raise self._fail(path, f"HTTP {r.status_code} {r.reason_phrase}")
        try:
            body = r.json()
        except ValueError:
            raise self._fail(path, "not a Redfish service: the response is not JSON") from None
        if not isinstance(body, dict):
            raise self._fail(path, "not a Redfish service: the response is not a JSON object")
        return body

    def _members(self, collection_uri: str) -> list[dict[str, Any]]:
        """The member resources of a collection ($expand'ed in one request when supported)."""
        body = None
        if self._expand:
            r = self._request("GET", collection_uri, params={"$expand": ".($levels=1)"})
            if r.status_code < 400:
                try:
                    body = r.json()
                except ValueError:
                    body = None
            if body is None:
                self._expand = False
                log.info(
                    "%s: $expand refused at %s; reading members one by one",
                    self.name,
                    collection_uri,
                )
        if body is None:
            body = self._get(collection_uri, optional=True) or {}
        out = []
        for m in body.get("Members", []):
            if not isinstance(m, dict) or "@odata.id" not in m:
                continue
            if len(m) > 1 and "Id" in m:
                out.append(m)
            else:
                member = self._get(m["@odata.id"], optional=True)
                if member is not None:
                    out.append(member)
        return out

    def _link(self, resource: dict[str, Any], prop: str) -> str | None:
        v = resource.get(prop)
        return v.get("@odata.id") if isinstance(v, dict) else None

    # ---- discovery ---------------------------------------------------------------------------

    def _discover(self) -> list[tuple[str, str, str]]:
        root = self._get(ROOT, optional=True)
        if root is None:
            raise self._fail(ROOT, "not a Redfish service: HTTP 404 for the service root")
        if "RedfishVersion" not in root and not str(root.get("@odata.type", "")).startswith(
            "#ServiceRoot"
        ):
            raise self._fail(ROOT, "not a Redfish service: no RedfishVersion in the service root")
        if self._use_session and self._token is None:
            self._login()
        expand = (root.get("ProtocolFeaturesSupported") or {}).get("ExpandQuery") or {}
        self._expand = bool(expand.get("Levels") or expand.get("ExpandAll"))
        kinds = [self.kind] if self.kind else [k for k, s in _SERVICE_OF_KIND.items() if s in root]
        if not kinds:
            raise self._fail(
                ROOT, "the service has neither PowerEquipment nor ThermalEquipment (no PDU or CDU)"
            )
        devices: list[tuple[str, str, str, dict[str, Any]]] = []
        for kind in kinds:
            service_uri = self._link(root, _SERVICE_OF_KIND[kind])
            if service_uri is None:
                raise self._fail(ROOT, f"the service has no {_SERVICE_OF_KIND[kind]}")
            service = self._get(service_uri)
            for coll in self.collections or COLLECTIONS[kind]:
                coll_uri = self._link(service, coll)
                if coll_uri is None:
                    continue
                for member in self._members(coll_uri):
                    eid = str(member.get("Id", ""))
                    if self.equipment is not None and eid != self.equipment:
                        continue
                    devices.append((kind, member["@odata.id"], eid, member))
        if not devices:
            what = f"equipment {self.equipment!r}" if self.equipment else "no PDU or CDU"
            raise self._fail(ROOT, f"found {what} under {', '.join(kinds)} collections")
        if self.source is not None and len(devices) > 1:
            ids = ", ".join(d[2] for d in devices)
            raise self._fail(
                ROOT,
                f"{len(devices)} devices ({ids}) but one source {self.source!r}: pass "
                "equipment=<Id> (--equipment) to pick one, or no source to publish each under "
                "its own name",
            )
        out = []
        for kind, uri, eid, member in devices:
            if self.source is not None:
                src = self.source
            elif eid and not eid.isdigit():
                src = eid
            else:
                src = _slug(str(member.get("Name") or f"{kind}-{eid}"))
            src = src.replace("/", "-").replace("+", "-").replace("#", "-")
            out.append((kind, uri, src))
        return out

    # ---- poll --------------------------------------------------------------------------------

    def poll(self) -> list[Message]:
        """One message per PDU/CDU of the service, with every reading it exposes."""
        if self._devices is None:
            self._devices = self._discover()
        try:
            return self._poll_devices(self._devices)
        except CollectorError:
            self._devices = None  # look the equipment up again on the next poll
            raise

    def _poll_devices(self, devices: list[tuple[str, str, str]]) -> list[Message]:
        out: list[Message] = []
        for kind, uri, src in devices:
            resource = self._get(uri)
            samples = _Samples(kind)
            if kind == "pdu":
                self._walk_pdu(resource, src, samples)
            else:
                self._walk_cdu(resource, src, samples)
            self._walk_sensors(resource, kind, src, samples)
            rows = samples.list()
            if rows:
                out.append(self._builder.message(kind, src, rows))
            else:
                log.warning("%s: %s reported no readings this poll", self.name, uri)
        return out

    def close(self) -> None:
        """Log out of the Redfish session (if any) and close the HTTP client."""
        if self._token and self._session_uri:
            try:
                self._request("DELETE", self._session_uri)
            except CollectorError as e:
                log.debug("%s: logout failed: %s", self.name, e)
        self._token = None
        self._http.close()

    # ---- PDU ---------------------------------------------------------------------------------

    @staticmethod
    def _excerpt(
        samples: _Samples, local: set[str], sid: str, quantity: str, ex: Any, what: str
    ) -> bool:
        """Put one SensorExcerpt's Reading. A sensor quoted twice by one resource counts once."""
        if not isinstance(ex, dict):
            return False
        uri = ex.get("DataSourceUri")
        if isinstance(uri, str):
            if uri in local:
                return False
            local.add(uri)
            samples.quoted.add(uri)
        samples.put(sid, quantity, ex.get("Reading"), what)
        return True

    def _power(
        self, samples: _Samples, local: set[str], sid: str, ex: Any, what: str, suffix: str = ""
    ) -> None:
        """A SensorPowerExcerpt: Reading [W] plus ApparentVA, ReactiveVAR, PowerFactor."""
        if self._excerpt(samples, local, sid, _with(suffix, "power_w"), ex, what):
            for field, q in _POWER_FIELDS.items():
                samples.put(sid, _with(suffix, q), ex.get(field), f"{what}.{field}")

    def _circuit(
        self,
        c: dict[str, Any],
        sid: str,
        samples: _Samples,
        local: set[str],
        what: str,
        *,
        poly: bool = True,
    ) -> None:
        """A Circuit, Outlet or OutletGroup: scalar excerpts, then poly-phase ones as extras.

        A circuit without a scalar ``CurrentAmps``/``Voltage``/``PowerWatts`` takes it from its
        only poly-phase entry (or its first line-to-neutral one), as a one-line branch does.
        """
        if poly:
            for prop, scalar in (
                ("PolyPhaseCurrentAmps", "CurrentAmps"),
                ("PolyPhaseVoltage", "Voltage"),
                ("PolyPhasePowerWatts", "PowerWatts"),
            ):
                entries = c.get(prop) or {}
                if scalar in c or not isinstance(entries, dict) or not entries:
                    continue
                ln = [k for k in entries if k in _LN]
                if len(entries) == 1 or ln:
                    key = ln[0] if ln else next(iter(entries))
                    c = {**c, scalar: entries[key]}
        for prop, q in _CIRCUIT_SCALARS.items():
            if prop == "PowerWatts":
                self._power(samples, local, sid, c.get(prop), f"{what}.{prop}")
            else:
                self._excerpt(samples, local, sid, q, c.get(prop), f"{what}.{prop}")
        if not poly:
            return
        for prop, stem, unit in (
            ("PolyPhaseCurrentAmps", "current", "a"),
            ("PolyPhaseVoltage", "voltage", "v"),
        ):
            for key, ex in (c.get(prop) or {}).items():
                q = f"{stem}_{_line_key(key)}_{unit}"
                self._excerpt(samples, local, sid, q, ex, f"{what}.{prop}.{key}")
        for key, ex in (c.get("PolyPhasePowerWatts") or {}).items():
            self._power(
                samples, local, sid, ex, f"{what}.PolyPhasePowerWatts.{key}", suffix=_line_key(key)
            )

    def _mains(
        self,
        c: dict[str, Any],
        prefix: str,
        circuit_sid: str,
        samples: _Samples,
        local: set[str],
        what: str,
    ) -> None:
        """A mains circuit: its lines onto ``<prefix>/L1..L3``, the rest onto ``circuit_sid``."""
        currents = c.get("PolyPhaseCurrentAmps") or {}
        volts = c.get("PolyPhaseVoltage") or {}
        powers = c.get("PolyPhasePowerWatts") or {}
        has_ln_v = any(k in _LN for k in volts)
        has_ln_p = any(k in _LN for k in powers)
        for n, key in enumerate(_LINES, start=1):
            self._excerpt(
                samples,
                local,
                phase_id(prefix, n),
                "current_a",
                currents.get(key),
                f"{what}.PolyPhaseCurrentAmps.{key}",
            )
        self._excerpt(
            samples,
            local,
            circuit_sid,
            "neutral_current_a",
            currents.get("Neutral"),
            f"{what}.PolyPhaseCurrentAmps.Neutral",
        )
        for key, ex in volts.items():
            n = _LN.get(key) or _LL.get(key)
            if n is None:
                continue
            q = "voltage_v" if key in _LN or not has_ln_v else f"voltage_{_line_key(key)}_v"
            where = f"{what}.PolyPhaseVoltage.{key}"
            self._excerpt(samples, local, phase_id(prefix, n), q, ex, where)
        for key, ex in powers.items():
            n = _LN.get(key) or _LL.get(key)
            if n is None:
                continue
            suffix = "" if key in _LN or not has_ln_p else _line_key(key)
            self._power(
                samples,
                local,
                phase_id(prefix, n),
                ex,
                f"{what}.PolyPhasePowerWatts.{key}",
                suffix=suffix,
            )
        self._circuit(c, circuit_sid, samples, local, what, poly=False)

    def _walk_pdu(self, pdu: dict[str, Any], src: str, samples: _Samples) -> None:
        metrics_uri = self._link(pdu, "Metrics")
        if metrics_uri:
            m = self._get(metrics_uri, optional=True) or {}
            local: set[str] = set()
            self._power(samples, local, src, m.get("PowerWatts"), "Metrics.PowerWatts")
            for prop, q in (
                ("EnergykWh", "energy_kwh"),
                ("TemperatureCelsius", "inlet_temp_c"),
                ("HumidityPercent", "humidity_pct"),
            ):
                self._excerpt(samples, local, src, q, m.get(prop), f"Metrics.{prop}")
        mains_uri = self._link(pdu, "Mains")
        mains = self._members(mains_uri) if mains_uri else []
        for c in mains:
            cid = str(c.get("Id", "mains"))
            circuit_sid = sub_id(src, cid)
            prefix = src if len(mains) == 1 else circuit_sid
            self._mains(c, prefix, circuit_sid, samples, set(), f"Mains/{cid}")
            if len(mains) == 1 and samples.has(circuit_sid, "frequency_hz"):
                samples.put(
                    src,
                    "frequency_hz",
                    samples.by_id[circuit_sid]["frequency_hz"],
                    f"Mains/{cid}.FrequencyHz",
                )
        for prop, element in (("Branches", ""), ("Outlets", "outlet"), ("OutletGroups", "group-")):
            uri = self._link(pdu, prop)
            for c in self._members(uri) if uri else []:
                cid = str(c.get("Id", ""))
                sid = sub_id(src, f"{element}{cid}")
                self._circuit(c, sid, samples, set(), f"{prop}/{cid}")

    # ---- CDU ---------------------------------------------------------------------------------

    def _walk_cdu(self, cdu: dict[str, Any], src: str, samples: _Samples) -> None:
        for prop, prefix, sub in (
            ("SecondaryCoolantConnectors", "", "secondary"),
            ("PrimaryCoolantConnectors", "fw_", "primary"),
        ):
            uri = self._link(cdu, prop)
            for i, c in enumerate(self._members(uri) if uri else []):
                cid = str(c.get("Id", i))
                sid = src if i == 0 else sub_id(src, f"{sub}{cid}")
                local: set[str] = set()
                for field, q in _CONNECTOR.items():
                    self._excerpt(
                        samples, local, sid, prefix + q, c.get(field), f"{prop}/{cid}.{field}"
                    )
        uri = self._link(cdu, "Pumps")
        pump_power: list[float] = []
        for p in self._members(uri) if uri else []:
            pid = str(p.get("Id", ""))
            sid = sub_id(src, pid if pid.lower().startswith("pump") else f"pump{pid}")
            local = set()
            speed = p.get("PumpSpeedPercent")
            self._excerpt(
                samples, local, sid, "pump_speed_pct", speed, f"Pumps/{pid}.PumpSpeedPercent"
            )
            if isinstance(speed, dict):
                samples.put(sid, "pump_speed_rpm", speed.get("SpeedRPM"), f"Pumps/{pid}.SpeedRPM")
            self._excerpt(
                samples, local, sid, "pump_power_w", p.get("PowerWatts"), f"Pumps/{pid}.PowerWatts"
            )
            if samples.has(sid, "pump_power_w"):
                pump_power.append(samples.by_id[sid]["pump_power_w"])
        if pump_power:
            samples.put(src, "pump_power_w", sum(pump_power), "sum of Pumps/*.PowerWatts")
        env_uri = self._link(cdu, "EnvironmentMetrics")
        if env_uri:
            env = self._get(env_uri, optional=True) or {}
            local = set()
            for field, q in _ENVIRONMENT.items():
                self._excerpt(samples, local, src, q, env.get(field), f"EnvironmentMetrics.{field}")

    # ---- Sensors -----------------------------------------------------------------------------

    def _expanded(self, collection_uri: str) -> dict[str, dict[str, Any]]:
        """Members of a collection fetched in one $expand request, or {} when not possible."""
        if not self._expand:
            return {}
        r = self._request("GET", collection_uri, params={"$expand": ".($levels=1)"})
        try:
            body = r.json() if r.status_code < 400 else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return {}
        return {
            m["@odata.id"]: m
            for m in body.get("Members", [])
            if isinstance(m, dict) and "@odata.id" in m and len(m) > 1
        }

    def _walk_sensors(
        self, resource: dict[str, Any], kind: str, src: str, samples: _Samples
    ) -> None:
        """Sensors of the linked chassis that no resource above quoted."""
        chassis = (resource.get("Links") or {}).get("Chassis") or []
        if isinstance(chassis, dict):
            chassis = [chassis]
        for ch in chassis:
            ch_uri = ch.get("@odata.id") if isinstance(ch, dict) else None
            if not ch_uri:
                continue
            ch_res = self._get(ch_uri, optional=True) or {}
            sensors_uri = self._link(ch_res, "Sensors")
            if not sensors_uri:
                continue
            listing = self._get(sensors_uri, optional=True) or {}
            refs = [m.get("@odata.id") for m in listing.get("Members", []) if isinstance(m, dict)]
            todo = [u for u in refs if isinstance(u, str) and u not in samples.quoted]
            if not todo:
                continue
            members = self._expanded(sensors_uri) if len(todo) > 1 else {}
            for uri in todo:
                sensor = members.get(uri) or self._get(uri, optional=True)
                if sensor is not None:
                    self._sensor(sensor, kind, src, samples, uri)

    def _refuse(self, uri: str, reason: str) -> None:
        key = (uri, reason)
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, "%s: sensor %s skipped: %s", self.name, uri, reason)

    def _sensor(self, s: dict[str, Any], kind: str, src: str, samples: _Samples, uri: str) -> None:
        """One Sensor resource: ReadingUnits converted to the contract unit, or refused."""
        rtype = s.get("ReadingType")
        units = s.get("ReadingUnits")
        reading = s.get("Reading")
        if reading is None:
            return
        if rtype not in _READING_TYPES:
            self._refuse(uri, f"ReadingType {rtype!r} is not mapped to a contract quantity")
            return
        stem, want = _READING_TYPES[rtype]
        if rtype == "Temperature" and units in _TEMPERATURE_ALIASES:
            units = _TEMPERATURE_ALIASES[units]
        conv = UCUM.get(units) if isinstance(units, str) else None
        if conv is None or conv[0] != want:
            self._refuse(uri, f"unknown or mismatched ReadingUnits {units!r} for {rtype}")
            return
        v = _number(reading)
        if v is None:
            self._refuse(uri, f"Reading {reading!r} is not a finite number")
            return
        value = v * conv[1] + conv[2]
        if rtype == "Heat":
            value /= 1000.0  # W -> kW
        sid = f"{src}/sensors/{s.get('Id') or uri.rstrip('/').rsplit('/', 1)[-1]}"
        quantity = stem
        if rtype in ("Temperature", "Humidity"):
            liquid = str(s.get("PhysicalContext", "")).startswith("Liquid")
            env_q = (
                "humidity_pct"
                if rtype == "Humidity"
                else ("inlet_temp_c" if kind == "pdu" else "ambient_temp_c")
            )
            if not liquid and not samples.has(src, env_q):
                sid, quantity = src, env_q
        samples.put(sid, quantity, value, f"sensor {uri}")


def _with(suffix: str, quantity: str) -> str:
    """'power_w' + 'l1l2' -> 'power_l1l2_w'; '' leaves the quantity as it is."""
    if not suffix:
        return quantity
    stem, _, unit = quantity.rpartition("_")
    if quantity == "power_factor":
        return f"power_factor_{suffix}"
    return f"{stem}_{suffix}_{unit}"
