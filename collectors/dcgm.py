"""DCGM collector: scrapes a dcgm-exporter ``/metrics`` endpoint (Prometheus text format).

One scrape gives one ``gpu`` message per host (``source`` = the ``Hostname`` label, or
``hostname`` on older exporters, or ``node`` when given, or the endpoint's host name), with one
sample per GPU, ``id`` = ``<node>:<gpu>`` (the ``gpu`` label is the GPU index, as in the site
model's ``Node.gpu_ids()``).

Fields (units as in dcgm-exporter's ``default-counters.csv``):

=========================================  ===================  =================  =========
DCGM field                                 quantity             unit at DCGM       DCGM type
=========================================  ===================  =================  =========
``DCGM_FI_DEV_POWER_USAGE``                ``power_w``          W                  fp64
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``   ``energy_j``         mJ -> J            int64
``DCGM_FI_DEV_GPU_TEMP``                   ``temp_c``           °C                 int64
``DCGM_FI_DEV_MEMORY_TEMP``                ``mem_temp_c``       °C                 int64
``DCGM_FI_DEV_GPU_UTIL``                   ``util_pct``         %                  int64
``DCGM_FI_DEV_MEM_COPY_UTIL``              ``mem_util_pct``     %                  int64
``DCGM_FI_PROF_SM_ACTIVE``                 ``sm_active``        ratio 0..1         fp64
``DCGM_FI_DEV_SM_CLOCK``                   ``clock_sm_mhz``     MHz                int64
``DCGM_FI_DEV_MEM_CLOCK``                  ``clock_mem_mhz``    MHz                int64
``DCGM_FI_DEV_FB_USED``                    ``fb_used_mib``      MiB                int64
``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``       ``power_limit_w``    W                  fp64
``DCGM_FI_DEV_POWER_MGMT_LIMIT``           ``power_limit_w``    W (if no enforced) fp64
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``       ``throttle_reasons`` bitmask            int64
``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``     ``throttle_reasons`` bitmask (older)    int64
``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL``          ``ecc_sbe_total``    count              int64
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``          ``ecc_dbe_total``    count              int64
``DCGM_FI_DEV_FB_FREE``                    ``fb_free_mib`` *    MiB                int64
``DCGM_FI_DEV_XID_ERRORS``                 ``xid_last`` *       last XID code      int64
``DCGM_FI_PROF_GR_ENGINE_ACTIVE``          ``gr_engine_active`` * ratio 0..1       fp64
``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``        ``tensor_active`` *  ratio 0..1         fp64
``DCGM_FI_PROF_DRAM_ACTIVE``               ``dram_active`` *    ratio 0..1         fp64
=========================================  ===================  =================  =========

(*) names the contract does not know: the twin keeps them in its long table. Other fields of
the scrape are ignored.

Blank values
    DCGM marks a value it could not read with a sentinel (``dcgm_structs.h``):
    ``DCGM_INT32_BLANK`` = 0x7ffffff0, ``DCGM_INT64_BLANK`` = 0x7ffffffffffffff0,
    ``DCGM_FP64_BLANK`` = 2**47 = 140737488355328.0, each followed by NOT_FOUND (+1),
    NOT_SUPPORTED (+2) and NOT_PERMISSIONED (+3); ``DCGM_*_IS_BLANK(v)`` is ``v >= BLANK``.
    Current exporters skip them, older ones print them. Here an fp64 field is blank when
    ``v >= 2**47``; an int64 field when ``v >= 0x7ffffffffffffff0`` or when it is one of the
    sixteen int32 sentinels 0x7ffffff0..0x7fffffff exactly (DCGM stores the int32 blanks in
    int64 fields too). A blank is left out of the sample, never published as a number.

Unmeasured zeros
    Some temperature fields read exactly 0 where the device has no sensor, instead of a blank:
    ``DCGM_FI_DEV_MEMORY_TEMP`` is 0 on cards whose memory temperature is not read (GeForce RTX
    3090 / 4070 Ti Super on dcgm-exporter 3.3.5, NVIDIA/dcgm-exporter#460; L4, where DCGM reads
    the NVML field value without checking its per-field return, NVIDIA/DCGM#311). 0 °C is not
    a temperature a powered GPU has (datacenter inlet air is 18-27 °C in ASHRAE TC 9.9's
    recommended range and a die runs above its inlet), so for ``DCGM_FI_DEV_MEMORY_TEMP`` and
    ``DCGM_FI_DEV_GPU_TEMP`` an exact 0 is "not measured": it is left out of the sample like a
    blank (logged once per GPU and field), never published as ``mem_temp_c: 0.0`` nor fitted.
    Every other field keeps its zeros: 0 % utilization or activity, 0 ECC errors, XID 0 (no
    error) and 0 MiB used are real readings, and DCGM marks an unsupported power or clock as a
    blank, not as 0.

MIG
    A series with ``GPU_I_ID`` belongs to a GPU instance: per-instance quantities
    (``util_pct``, ``mem_util_pct``, ``sm_active``, ``fb_used_mib`` and the starred extras) go
    to the sample ``<node>:<gpu>/mig<GPU_I_ID>``; device-wide quantities (power, energy,
    temperatures, clocks, power limit, clock events, ECC) go to the parent ``<node>:<gpu>``,
    so that a MIG-partitioned GPU's power is counted once. The site model lists no MIG
    instances, so the twin keeps their samples as readings of unknown devices.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from collectors.base import CollectorError, Message, MessageBuilder
from collectors.contract import QUANTITIES, gpu_id, split_gpu_id, split_sub_id, sub_id

log = logging.getLogger(__name__)

__all__ = [
    "DCGM_FIELDS",
    "DCGM_FP64_BLANK",
    "DCGM_INT32_BLANK",
    "DCGM_INT64_BLANK",
    "DcgmCollector",
    "DcgmField",
    "is_blank",
    "parse_scrape",
]

#: Sentinels of dcgm_structs.h (each followed by +1 NOT_FOUND, +2 NOT_SUPPORTED,
#: +3 NOT_PERMISSIONED; ``DCGM_*_IS_BLANK(v)`` is ``v >= BLANK``).
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0  # 2**47


@dataclass(frozen=True, slots=True)
class DcgmField:
    """How one DCGM field maps to a quantity."""

    quantity: str
    scale: float = 1.0  # multiply DCGM's value by this to get the quantity's unit
    fp64: bool = False  # DCGM type: fp64 (True) or int64 (False)
    device_wide: bool = True  # under MIG, belongs to the parent GPU
    priority: int = 0  # when two fields give one quantity, the lower number wins
    zero_unmeasured: bool = False  # an exact 0 means "no sensor" (see "Unmeasured zeros")


#: DCGM field -> quantity; see the module docstring for units.
DCGM_FIELDS: dict[str, DcgmField] = {
    "DCGM_FI_DEV_POWER_USAGE": DcgmField("power_w", fp64=True),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": DcgmField("energy_j", scale=1e-3),
    "DCGM_FI_DEV_GPU_TEMP": DcgmField("temp_c", zero_unmeasured=True),
    "DCGM_FI_DEV_MEMORY_TEMP": DcgmField("mem_temp_c", zero_unmeasured=True),
    "DCGM_FI_DEV_GPU_UTIL": DcgmField("util_pct", device_wide=False),
    "DCGM_FI_DEV_MEM_COPY_UTIL": DcgmField("mem_util_pct", device_wide=False),
    "DCGM_FI_PROF_SM_ACTIVE": DcgmField("sm_active", fp64=True, device_wide=False),
    "DCGM_FI_DEV_SM_CLOCK": DcgmField("clock_sm_mhz"),
    "DCGM_FI_DEV_MEM_CLOCK": DcgmField("clock_mem_mhz"),
    "DCGM_FI_DEV_FB_USED": DcgmField("fb_used_mib", device_wide=False),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": DcgmField("power_limit_w", fp64=True),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": DcgmField("power_limit_w", fp64=True, priority=1),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": DcgmField("throttle_reasons"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": DcgmField("throttle_reasons", priority=1),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": DcgmField("ecc_sbe_total"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": DcgmField("ecc_dbe_total"),
    "DCGM_FI_DEV_FB_FREE": DcgmField("fb_free_mib", device_wide=False),
    "DCGM_FI_DEV_XID_ERRORS": DcgmField("xid_last"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": DcgmField("gr_engine_active", fp64=True, device_wide=False),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": DcgmField("tensor_active", fp64=True, device_wide=False),
    "DCGM_FI_PROF_DRAM_ACTIVE": DcgmField("dram_active", fp64=True, device_wide=False),
}

_INTEGER = {name for name, q in QUANTITIES["gpu"].items() if q.integer} | {"xid_last"}


def is_blank(value: float, fp64: bool) -> bool:
    """True when ``value`` is one of DCGM's blank sentinels for a field of that type."""
    if not math.isfinite(value):
        return True
    if fp64:
        return value >= DCGM_FP64_BLANK
    if value >= float(DCGM_INT64_BLANK):
        return True
    return value.is_integer() and DCGM_INT32_BLANK <= value <= DCGM_INT32_BLANK + 15


def _label(labels: dict[str, str], *names: str) -> str | None:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return None


def parse_scrape(
    text: str,
    *,
    node: str | None = None,
    default_node: str = "unknown",
    unmeasured: set[tuple[str, str]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Samples per host from one dcgm-exporter scrape.

    ``node`` overrides the ``Hostname`` / ``hostname`` label; ``default_node`` stands in where
    neither is there. Returns ``{host: [sample, ...]}`` with samples in contract units. Blanks
    and unmeasured zeros are left out; ``(sample id, DCGM field)`` of each unmeasured zero is
    added to ``unmeasured`` when given.
    """
    # (host, sample id) -> quantity -> (priority, value)
    found: dict[tuple[str, str], dict[str, tuple[int, float]]] = {}
    blanks = 0
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise CollectorError(f"not a Prometheus text exposition: {e}") from None
    for family in families:
        for s in family.samples:
            # The parser names a counter's samples <family>_total (energy, ECC counters).
            field = DCGM_FIELDS.get(s.name) or DCGM_FIELDS.get(s.name.removesuffix("_total"))
            if field is None:
                continue
            gpu = _label(s.labels, "gpu")
            if gpu is None:
                continue
            host = node or _label(s.labels, "Hostname", "hostname") or default_node
            instance = _label(s.labels, "GPU_I_ID")
            sid = gpu_id(host, gpu)
            if instance is not None and not field.device_wide:
                sid = sub_id(sid, f"mig{instance}")
            value = float(s.value)
            if is_blank(value, field.fp64):
                blanks += 1
                continue
            if field.zero_unmeasured and value == 0.0:
                if unmeasured is not None:
                    unmeasured.add((sid, s.name))
                continue
            quantities = found.setdefault((host, sid), {})
            prev = quantities.get(field.quantity)
            if prev is None or field.priority < prev[0]:
                quantities[field.quantity] = (field.priority, value * field.scale)
    if blanks:
        log.debug("DCGM scrape: %d blank value(s) left out", blanks)
    by_host: dict[str, list[dict[str, Any]]] = {}
    for (host, sid), quantities in sorted(found.items(), key=lambda kv: _sort_key(kv[0][1])):
        sample: dict[str, Any] = {"id": sid}
        for q, (_, v) in quantities.items():
            sample[q] = int(v) if q in _INTEGER else float(v)
        by_host.setdefault(host, []).append(sample)
    return by_host


def _sort_key(sample_id: str) -> tuple[Any, ...]:
    gpu, mig = split_sub_id(sample_id)
    node_index = split_gpu_id(gpu)
    return (*(node_index or (gpu, -1)), mig or "")


class DcgmCollector:
    """Scrapes one dcgm-exporter; implements :class:`collectors.base.Collector`.

    Raises :class:`CollectorError` (from ``__init__`` for a bad URL, from ``poll`` when the
    endpoint cannot be reached, answers with an HTTP error or with something that is not a
    Prometheus exposition).
    """

    def __init__(
        self,
        url: str,
        *,
        site: str,
        node: str | None = None,
        timeout_s: float = 5.0,
        verify: bool | str = True,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CollectorError(
                f"bad dcgm-exporter URL {url!r}: expected http(s)://HOST[:PORT]/metrics"
            )
        if parts.path in ("", "/"):
            url = url.rstrip("/") + "/metrics"
        self.url = url
        self.node = node
        self._default_node = parts.hostname
        self.name = f"dcgm {url}"
        self._builder = MessageBuilder(site, "dcgm")
        self._client = httpx.Client(timeout=timeout_s, verify=verify)
        self._unmeasured_logged: set[tuple[str, str]] = set()

    def scrape(self) -> str:
        """The endpoint's text; CollectorError naming the URL and the reason otherwise."""
        try:
            r = self._client.get(self.url)
        except httpx.HTTPError as e:
            raise CollectorError(
                f"cannot scrape dcgm-exporter at {self.url}: {type(e).__name__}: {e}"
            ) from None
        if r.status_code != 200:
            raise CollectorError(f"dcgm-exporter at {self.url} answered HTTP {r.status_code}")
        return r.text

    def poll(self) -> list[Message]:
        """One scrape: one ``gpu`` message per host."""
        ts = datetime.now(UTC)
        unmeasured: set[tuple[str, str]] = set()
        by_host = parse_scrape(
            self.scrape(), node=self.node, default_node=self._default_node, unmeasured=unmeasured
        )
        for sid, field in sorted(unmeasured - self._unmeasured_logged):
            log.info("GPU %s: %s reads 0 (not measured); left out of its samples", sid, field)
        self._unmeasured_logged |= unmeasured
        if not by_host:
            log.warning("dcgm-exporter at %s listed no GPU field dctwin maps", self.url)
        try:
            return [
                self._builder.message("gpu", host, samples, ts) for host, samples in by_host.items()
            ]
        except ValueError as e:  # a host name that cannot be a topic level
            raise CollectorError(f"dcgm-exporter at {self.url}: {e}") from None

    def close(self) -> None:
        self._client.close()
