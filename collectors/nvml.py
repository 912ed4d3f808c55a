"""NVML collector: reads every GPU of this host through the NVIDIA driver (``nvidia-ml-py``).

One poll gives one ``gpu`` message from ``source`` = the node name, one sample per GPU, with the
sample ``id`` ``<node>:<index>`` (the site model's GPU id, ``Node.gpu_ids()``) or, with
``gpu_id="uuid"``, the NVML UUID (which a site may list in a node's ``gpu_uuids``).

=====================  =====================================================  ==============
quantity               NVML call                                              unit at NVML
=====================  =====================================================  ==============
``power_w``            ``nvmlDeviceGetPowerUsage``                            mW -> W
``energy_j``           ``nvmlDeviceGetTotalEnergyConsumption``                mJ -> J
``temp_c``             ``nvmlDeviceGetTemperatureV`` (driver >= R535; else    °C
                       ``nvmlDeviceGetTemperature``), sensor GPU
``mem_temp_c``         ``nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)``  °C
``util_pct``           ``nvmlDeviceGetUtilizationRates().gpu``                %
``mem_util_pct``       ``nvmlDeviceGetUtilizationRates().memory``             %
``clock_sm_mhz``       ``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)``              MHz
``clock_mem_mhz``      ``nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)``             MHz
``power_limit_w``      ``nvmlDeviceGetEnforcedPowerLimit``                    mW -> W
``throttle_reasons``   ``nvmlDeviceGetCurrentClocksEventReasons`` (older      bitmask
                       drivers: ``...ClocksThrottleReasons``)
``ecc_sbe_total``      ``nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)``   count
``ecc_dbe_total``      ``nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)`` count
``fb_used_mib``        ``nvmlDeviceGetMemoryInfo().used``                     B -> MiB
=====================  =====================================================  ==============

A quantity a GPU does not support (``NVMLError_NotSupported``, or ``NVML_ERROR_NOT_SUPPORTED``
in a field value's ``nvmlReturn``) is left out of its samples, never faked, logged once per
(GPU, quantity), and not asked again. Other NVML errors leave the quantity out of that poll and
are logged once until the call succeeds again.

A temperature of exactly 0 °C (``temp_c``, ``mem_temp_c``) is "not measured", not a reading:
``NVML_FI_DEV_MEMORY_TEMP`` answers ``NVML_SUCCESS`` with 0 on some boards that expose no memory
temperature (GeForce RTX 3090, no-fee-ethereum-mining/nsfminer#150; L4, NVIDIA/DCGM#311), and a
powered GPU is never at 0 °C (datacenter inlet air is 18-27 °C in ASHRAE TC 9.9's recommended
range and a die runs above it). Such a 0 is left out of that poll's sample (logged once per
GPU and quantity) and asked again next poll, so a sensor that starts reading is published then.
Other quantities keep their zeros (0 % utilization, 0 ECC errors are readings).

Identity (UUID, product name, serial number, index) is not a contract quantity (only numbers
may travel as quantities), so it is logged once at start and kept in :attr:`NvmlCollector.gpus`;
``dctwin collect nvml --once --stdout`` prints it on stderr.

``sm_active`` (fraction of SMs busy) is a DCGM profiling metric that NVML does not expose: run
``dctwin collect dcgm`` against a dcgm-exporter where it is needed.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from collectors.base import CollectorError, Message, MessageBuilder
from collectors.contract import gpu_id

log = logging.getLogger(__name__)

__all__ = ["GpuIdentity", "NvmlCollector"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Who a GPU is: NVML index, UUID, product name, serial (None where NVML has none)."""

    index: int
    uuid: str
    name: str
    serial: str | None
    sample_id: str


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _field_number(fv: Any, nvml: Any) -> float | int | None:
    """The number held in an ``nvmlFieldValue_t``, read by its ``valueType``."""
    member = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(int(fv.valueType))
    return None if member is None else getattr(fv.value, member)


class _NotSupportedError(Exception):
    """The GPU does not support this quantity (never retried)."""


class NvmlCollector:
    """Polls every GPU NVML sees on this host; implements :class:`collectors.base.Collector`.

    Parameters
    ----------
    site
        Site name for the topic.
    node
        Node name: the message ``source`` and the prefix of sample ids (default: hostname).
    gpu_id
        ``"index"``: sample id ``<node>:<index>``; ``"uuid"``: the NVML UUID.

    Raises
    ------
    CollectorError
        No NVIDIA driver (libnvidia-ml.so.1 missing, or the kernel driver not loaded), NVML
        failing to start, or no GPU on this host.
    """

    def __init__(
        self,
        *,
        site: str,
        node: str | None = None,
        gpu_id: Literal["index", "uuid"] = "index",
    ):
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - a dependency of dctwin
            raise CollectorError(f"nvidia-ml-py is not installed: {e}") from None
        self._nvml = pynvml
        self.node = node or socket.gethostname().split(".")[0]
        self.name = f"nvml {self.node}"
        self._builder = MessageBuilder(site, "nvml")
        self._gpu_id = gpu_id
        self._unsupported: set[tuple[int, str]] = set()
        self._failing: dict[tuple[int, str], int] = {}  # (gpu, quantity) -> last error code
        self._zero_logged: set[tuple[int, str]] = set()  # (gpu, quantity) read 0 °C, logged
        self._initialized = False
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise CollectorError(self._init_message(e)) from None
        self._initialized = True
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            self.close()
            raise CollectorError(f"NVML could not count the GPUs: {e}") from None
        self._handles: list[Any] = []
        self.gpus: list[GpuIdentity] = []
        for i in range(count):
            try:  # a lost or broken GPU is left out; the others are still read
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpu = self._identity(i, handle)
            except pynvml.NVMLError as e:
                log.error("NVML: GPU %d cannot be read (%s); it is left out", i, e)
                continue
            self._handles.append(handle)
            self.gpus.append(gpu)
        if not self.gpus:
            self.close()
            raise CollectorError(
                "NVML found no NVIDIA GPU on this host"
                if count == 0
                else f"NVML lists {count} GPU(s) but none can be read"
            )
        self.driver_version = self._optional(pynvml.nvmlSystemGetDriverVersion)
        log.info(
            "NVML: %d GPU(s) on %s, driver %s",
            len(self.gpus),
            self.node,
            _text(self.driver_version) if self.driver_version is not None else "unknown",
        )
        for g in self.gpus:
            log.info(
                "GPU %d -> id %s: %s, uuid %s, serial %s",
                g.index,
                g.sample_id,
                g.name,
                g.uuid,
                g.serial or "n/a",
            )
        self._temp_v = hasattr(pynvml, "nvmlDeviceGetTemperatureV")
        self._events_fn = getattr(
            pynvml,
            "nvmlDeviceGetCurrentClocksEventReasons",
            getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
        )

    @staticmethod
    def _init_message(e: Exception) -> str:
        import pynvml

        if isinstance(e, pynvml.NVMLError_LibraryNotFound):
            return (
                "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) was not found. Install "
                "the NVIDIA driver; in a container, run it with the NVIDIA runtime "
                "(--gpus all / runtimeClassName: nvidia)"
            )
        if isinstance(e, pynvml.NVMLError_DriverNotLoaded):
            return "no NVIDIA driver: the NVIDIA kernel driver is not loaded (try nvidia-smi)"
        if isinstance(e, pynvml.NVMLError_NoPermission):
            return "NVML refused access to the GPUs (insufficient permissions)"
        return f"NVML failed to start: {e}"

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _identity(self, position: int, handle: Any) -> GpuIdentity:
        nvml = self._nvml
        index = self._optional(nvml.nvmlDeviceGetIndex, handle)
        index = position if index is None else int(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(self._optional(nvml.nvmlDeviceGetName, handle) or "unknown")
        serial = self._optional(nvml.nvmlDeviceGetSerial, handle)
        sample_id = uuid if self._gpu_id == "uuid" else gpu_id(self.node, index)
        return GpuIdentity(index, uuid, name, _text(serial) if serial else None, sample_id)

    # -- one quantity -------------------------------------------------------------------------

    def _read(self, gpu: GpuIdentity, quantity: str, fn: Callable[[], Any]) -> Any:
        """Call ``fn``; None (and a log line, once) when unsupported or failing."""
        key = (gpu.index, quantity)
        if key in self._unsupported:
            return None
        nvml = self._nvml
        try:
            value = fn()
        except (nvml.NVMLError_NotSupported, _NotSupportedError):
            self._unsupported.add(key)
            log.info(
                "GPU %s (%s) does not support %s; left out of its samples",
                gpu.sample_id,
                gpu.name,
                quantity,
            )
            return None
        except nvml.NVMLError as e:
            code = getattr(e, "value", -1)
            if self._failing.get(key) != code:
                self._failing[key] = code
                log.warning("GPU %s: reading %s failed: %s", gpu.sample_id, quantity, e)
            return None
        if key in self._failing:
            del self._failing[key]
            log.info("GPU %s: %s reads again", gpu.sample_id, quantity)
        return value

    def _temperature(self, handle: Any) -> int:
        nvml = self._nvml
        if self._temp_v:
            try:
                return int(nvml.nvmlDeviceGetTemperatureV(handle, nvml.NVML_TEMPERATURE_GPU))
            except nvml.NVMLError_FunctionNotFound:
                self._temp_v = False  # driver older than the binding
        return int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))

    def _clock_events(self, handle: Any) -> int:
        nvml = self._nvml
        if self._events_fn is None:
            raise _NotSupportedError
        try:
            return int(self._events_fn(handle))
        except nvml.NVMLError_FunctionNotFound:
            old = getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            if old is None or self._events_fn is old:
                raise _NotSupportedError from None
            self._events_fn = old
            return int(old(handle))

    def _memory_temp(self, handle: Any) -> float | int:
        nvml = self._nvml
        (fv,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_MEMORY_TEMP])
        ret = int(fv.nvmlReturn)
        if ret == nvml.NVML_ERROR_NOT_SUPPORTED:
            raise _NotSupportedError
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        value = _field_number(fv, nvml)
        if value is None:
            raise _NotSupportedError
        return value

    def _measured_temp(self, gpu: GpuIdentity, quantity: str, value: Any) -> float | None:
        """``value`` in °C, or None when it is missing or an unmeasured 0 (module docstring)."""
        if value is None:
            return None
        if value == 0:
            key = (gpu.index, quantity)
            if key not in self._zero_logged:
                self._zero_logged.add(key)
                log.info(
                    "GPU %s (%s): %s reads 0 °C (not measured); left out of its samples",
                    gpu.sample_id,
                    gpu.name,
                    quantity,
                )
            return None
        return float(value)

    # -- a poll -------------------------------------------------------------------------------

    def sample(self, gpu: GpuIdentity, handle: Any) -> dict[str, Any]:
        """One GPU's sample: ``id`` plus every quantity it supports, in contract units."""
        nvml = self._nvml
        s: dict[str, Any] = {"id": gpu.sample_id}
        mw = self._read(gpu, "power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        s["power_w"] = None if mw is None else mw / 1000.0
        mj = self._read(gpu, "energy_j", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        s["energy_j"] = None if mj is None else mj / 1000.0
        t = self._read(gpu, "temp_c", lambda: self._temperature(handle))
        s["temp_c"] = self._measured_temp(gpu, "temp_c", t)
        mt = self._read(gpu, "mem_temp_c", lambda: self._memory_temp(handle))
        s["mem_temp_c"] = self._measured_temp(gpu, "mem_temp_c", mt)
        util = self._read(gpu, "util_pct", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            s["util_pct"] = float(util.gpu)
            s["mem_util_pct"] = float(util.memory)
        sm = self._read(
            gpu, "clock_sm_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        )
        s["clock_sm_mhz"] = None if sm is None else float(sm)
        mem = self._read(
            gpu, "clock_mem_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)
        )
        s["clock_mem_mhz"] = None if mem is None else float(mem)
        lim = self._read(gpu, "power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        s["power_limit_w"] = None if lim is None else lim / 1000.0
        s["throttle_reasons"] = self._read(
            gpu, "throttle_reasons", lambda: self._clock_events(handle)
        )
        for quantity, error_type in (
            ("ecc_sbe_total", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_dbe_total", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            n = self._read(
                gpu,
                quantity,
                lambda et=error_type: nvml.nvmlDeviceGetTotalEccErrors(
                    handle, et, nvml.NVML_VOLATILE_ECC
                ),
            )
            s[quantity] = None if n is None else int(n)
        meminfo = self._read(gpu, "fb_used_mib", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        s["fb_used_mib"] = None if meminfo is None else meminfo.used / _MIB
        return s

    def poll(self) -> list[Message]:
        """Read every GPU once; one ``gpu`` message (none if no GPU gave a reading)."""
        ts = datetime.now(UTC)
        samples = []
        for gpu, handle in zip(self.gpus, self._handles, strict=True):
            s = self.sample(gpu, handle)
            if any(v is not None for k, v in s.items() if k != "id"):
                samples.append(s)
        if not samples:
            log.warning("NVML: no GPU on %s gave a reading this poll", self.node)
            return []
        return [self._builder.message("gpu", self.node, samples, ts)]

    def close(self) -> None:
        """Release NVML (idempotent)."""
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:  # pragma: no cover - driver going away
                log.debug("nvmlShutdown: %s", e)
