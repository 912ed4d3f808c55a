"""NVML collector against a function-level fake of pynvml (real units: mW, mJ, °C, MHz, bytes),
and against a real GPU where one is present (``-m gpu``)."""

# ruff: noqa: N802 - the fake's methods carry pynvml's names

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import orjson
import pynvml
import pytest
from typer.testing import CliRunner

from collectors.base import CollectorError
from collectors.contract import decode
from collectors.nvml import NvmlCollector


@dataclass
class FakeGpu:
    """What the driver would report for one GPU, in NVML's own units."""

    index: int
    uuid: str
    name: str
    serial: str | None
    power_mw: int
    energy_mj: int
    temp_c: int
    mem_temp_c: int | None  # None: the field value comes back NOT_SUPPORTED
    util_gpu: int
    util_mem: int
    sm_mhz: int
    mem_mhz: int
    limit_mw: int
    events: int
    ecc: tuple[int, int] | None  # (corrected, uncorrected); None: ECC not supported
    fb_used_b: int
    calls: dict[str, int] = field(default_factory=dict)


H100 = FakeGpu(
    index=0,
    uuid="GPU-5f0c4a3e-1111-2222-3333-444455556666",
    name="NVIDIA H100 80GB HBM3",
    serial="1654922001234",
    power_mw=612_345,
    energy_mj=9_876_543_210,
    temp_c=61,
    mem_temp_c=70,
    util_gpu=97,
    util_mem=41,
    sm_mhz=1980,
    mem_mhz=2619,
    limit_mw=700_000,
    events=0x4,  # SW power cap
    ecc=(3, 0),
    fb_used_b=52_345 * 1024 * 1024,
)
RTX = FakeGpu(
    index=1,
    uuid="GPU-0a1b2c3d-aaaa-bbbb-cccc-ddddeeeeffff",
    name="NVIDIA GeForce RTX 4090",
    serial=None,
    power_mw=33_210,
    energy_mj=1_000_500,
    temp_c=38,
    mem_temp_c=None,
    util_gpu=0,
    util_mem=2,
    sm_mhz=210,
    mem_mhz=405,
    limit_mw=450_000,
    events=0x1,  # GPU idle
    ecc=None,
    fb_used_b=512 * 1024 * 1024,
)


def not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class FakeNvml:
    """Patches the pynvml functions the collector calls; handles are the FakeGpu objects."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], init_error=None):
        self.gpus = gpus
        self.init_error = init_error
        self.shutdowns = 0
        self.temperature_v = True
        m = monkeypatch
        for name in dir(self):
            if name.startswith("nvml"):
                m.setattr(pynvml, name, getattr(self, name))

    def _count(self, gpu: FakeGpu, name: str) -> None:
        gpu.calls[name] = gpu.calls.get(name, 0) + 1

    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetIndex(self, h):
        return h.index

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetName(self, h):
        return h.name

    def nvmlDeviceGetSerial(self, h):
        if h.serial is None:
            raise not_supported()
        return h.serial

    def nvmlDeviceGetPowerUsage(self, h):
        return h.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return h.energy_mj

    def nvmlDeviceGetTemperatureV(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        if not self.temperature_v:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._count(h, "temperature_v")
        return h.temp_c

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        self._count(h, "temperature")
        return h.temp_c

    def nvmlDeviceGetFieldValues(self, h, field_ids):
        assert list(field_ids) == [pynvml.NVML_FI_DEV_MEMORY_TEMP]
        values = (pynvml.c_nvmlFieldValue_t * 1)()
        values[0].fieldId = pynvml.NVML_FI_DEV_MEMORY_TEMP
        if h.mem_temp_c is None:
            values[0].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        else:
            values[0].nvmlReturn = pynvml.NVML_SUCCESS
            values[0].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            values[0].value.uiVal = h.mem_temp_c
        return values

    def nvmlDeviceGetUtilizationRates(self, h):
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = h.util_gpu, h.util_mem
        return u

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {pynvml.NVML_CLOCK_SM: h.sm_mhz, pynvml.NVML_CLOCK_MEM: h.mem_mhz}[clock]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return h.limit_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return h.events

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        self._count(h, "ecc")
        if h.ecc is None:
            raise not_supported()
        return h.ecc[0 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1]

    def nvmlDeviceGetMemoryInfo(self, h):
        mem = pynvml.c_nvmlMemory_t()
        mem.total = 80 * 1024**3
        mem.used = h.fb_used_b
        mem.free = mem.total - mem.used
        return mem


def gpus() -> list[FakeGpu]:
    return [FakeGpu(**{**H100.__dict__, "calls": {}}), FakeGpu(**{**RTX.__dict__, "calls": {}})]


def test_poll_gives_exact_contract_values(monkeypatch):
    FakeNvml(monkeypatch, gpus())
    c = NvmlCollector(site="demo", node="gpu-node-017")
    [(topic, payload)] = c.poll()
    m = decode(topic, payload)
    assert (m.site, m.kind, m.source, m.collector) == ("demo", "gpu", "gpu-node-017", "nvml")
    by_id = {s["id"]: s for s in m.samples}
    assert set(by_id) == {"gpu-node-017:0", "gpu-node-017:1"}
    h = by_id["gpu-node-017:0"]
    assert h["power_w"] == 612.345  # mW -> W
    assert h["energy_j"] == 9_876_543.21  # mJ -> J
    assert h["temp_c"] == 61.0
    assert h["mem_temp_c"] == 70.0
    assert (h["util_pct"], h["mem_util_pct"]) == (97.0, 41.0)
    assert (h["clock_sm_mhz"], h["clock_mem_mhz"]) == (1980.0, 2619.0)
    assert h["power_limit_w"] == 700.0
    assert h["throttle_reasons"] == 4
    assert (h["ecc_sbe_total"], h["ecc_dbe_total"]) == (3, 0)
    assert h["fb_used_mib"] == 52_345.0
    assert h["sm_active"] is None  # NVML has no SM activity; never faked
    # The raw payload carries only what was read, no nulls.
    raw = orjson.loads(payload)["samples"]
    assert all(v is not None for s in raw for v in s.values())
    c.close()


def test_unsupported_quantities_are_absent_and_logged_once(monkeypatch, caplog):
    fake = FakeNvml(monkeypatch, gpus())
    caplog.set_level(logging.INFO, logger="collectors.nvml")
    c = NvmlCollector(site="demo", node="n1")
    for _ in range(3):
        [(_, payload)] = c.poll()
    rtx = next(s for s in orjson.loads(payload)["samples"] if s["id"] == "n1:1")
    assert "mem_temp_c" not in rtx  # field value nvmlReturn NOT_SUPPORTED
    assert "ecc_sbe_total" not in rtx and "ecc_dbe_total" not in rtx  # NVMLError_NotSupported
    assert rtx["power_w"] == 33.21 and rtx["temp_c"] == 38.0
    h100 = next(s for s in orjson.loads(payload)["samples"] if s["id"] == "n1:0")
    assert "mem_temp_c" in h100 and "ecc_sbe_total" in h100
    unsupported = [r.getMessage() for r in caplog.records if "does not support" in r.getMessage()]
    assert sorted(unsupported) == sorted(
        f"GPU n1:1 (NVIDIA GeForce RTX 4090) does not support {q}; left out of its samples"
        for q in ("mem_temp_c", "ecc_sbe_total", "ecc_dbe_total")
    )
    assert fake.gpus[1].calls["ecc"] == 2  # asked once per counter, never again
    assert fake.gpus[0].calls["ecc"] == 6
    # Identity is logged at start, not published.
    text = caplog.text
    assert "GPU-0a1b2c3d-aaaa-bbbb-cccc-ddddeeeeffff" in text and "serial n/a" in text
    assert "1654922001234" in text
    assert b"GPU-" not in payload
    assert [g.uuid for g in c.gpus] == [H100.uuid, RTX.uuid]
    c.close()


def test_old_driver_falls_back_to_get_temperature(monkeypatch):
    fake = FakeNvml(monkeypatch, gpus())
    fake.temperature_v = False  # binding has it, the driver lacks the symbol
    c = NvmlCollector(site="demo", node="n1")
    for _ in range(2):
        [(topic, payload)] = c.poll()
    assert [s["temp_c"] for s in decode(topic, payload).samples] == [61.0, 38.0]
    assert fake.gpus[0].calls["temperature"] == 2
    c.close()


def test_uuid_ids(monkeypatch):
    FakeNvml(monkeypatch, gpus())
    c = NvmlCollector(site="demo", node="n1", gpu_id="uuid")
    [(topic, payload)] = c.poll()
    assert [s["id"] for s in decode(topic, payload).samples] == [H100.uuid, RTX.uuid]


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "(libnvidia-ml.so.1) was not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
    ],
)
def test_no_driver_is_one_clear_error(monkeypatch, code, words):
    FakeNvml(monkeypatch, gpus(), init_error=code)
    with pytest.raises(CollectorError, match="no NVIDIA driver") as e:
        NvmlCollector(site="demo")
    assert words in str(e.value)


def test_a_lost_gpu_is_left_out_and_the_others_are_read(monkeypatch, caplog):
    FakeNvml(monkeypatch, gpus())
    real = pynvml.nvmlDeviceGetHandleByIndex

    def handle(i):
        if i == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return real(i)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", handle)
    c = NvmlCollector(site="demo", node="n1")
    [(topic, payload)] = c.poll()
    assert [s["id"] for s in decode(topic, payload).samples] == ["n1:1"]
    assert "GPU 0 cannot be read" in caplog.text
    c.close()


def test_no_gpu_is_a_clear_error(monkeypatch):
    fake = FakeNvml(monkeypatch, [])
    with pytest.raises(CollectorError, match="no NVIDIA GPU"):
        NvmlCollector(site="demo")
    assert fake.shutdowns == 1


def test_cli_once_stdout_prints_contract_messages(monkeypatch):
    from twin.cli import app

    FakeNvml(monkeypatch, gpus())
    result = CliRunner().invoke(
        app, ["collect", "nvml", "--once", "--stdout", "--node", "gpu-node-017", "--site", "demo"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    msg = orjson.loads(lines[0])
    m = decode(msg["topic"], orjson.dumps(msg["payload"]))
    assert (m.site, m.source) == ("demo", "gpu-node-017")
    assert msg["topic"] == "dctwin/v1/demo/gpu/gpu-node-017"
    assert [s["power_w"] for s in m.samples] == [612.345, 33.21]


def test_cli_no_driver_exits_2_without_traceback(monkeypatch):
    from twin.cli import app

    FakeNvml(monkeypatch, gpus(), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    result = CliRunner().invoke(app, ["collect", "nvml", "--once", "--stdout"])
    assert result.exit_code == 2
    assert "no NVIDIA driver" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.gpu
def test_real_gpu_poll_decodes():
    """Runs where a real NVIDIA GPU and driver are present; skipped elsewhere."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"no usable NVIDIA driver/GPU here: {e}")
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            pytest.skip("NVML sees no GPU")
    finally:
        pynvml.nvmlShutdown()
    c = NvmlCollector(site="gpu-test")
    try:
        messages = c.poll()
    finally:
        c.close()
    assert len(messages) == 1
    m = decode(*messages[0])
    assert len(m.samples) == len(c.gpus) >= 1
    for s in m.samples:
        assert s["power_w"] is not None and 0 < s["power_w"] < 2000
        assert s["temp_c"] is not None and 0 < s["temp_c"] < 120
        print(s)


def test_a_memory_temperature_of_zero_is_left_out(monkeypatch, caplog):
    """NVML_FI_DEV_MEMORY_TEMP answering NVML_SUCCESS with 0 (boards without a readable memory
    sensor) is not measured: left out, logged once, asked again next poll."""
    from twin.cli import app

    fake = FakeNvml(monkeypatch, gpus())
    fake.gpus[0].mem_temp_c = 0
    result = CliRunner().invoke(
        app, ["collect", "nvml", "--once", "--stdout", "--node", "gpu-node-017", "--site", "demo"]
    )
    assert result.exit_code == 0, result.output
    [line] = [x for x in result.stdout.splitlines() if x.strip()]
    h100 = orjson.loads(line)["payload"]["samples"][0]
    assert h100["id"] == "gpu-node-017:0"
    assert "mem_temp_c" not in h100 and h100["temp_c"] == 61.0

    caplog.set_level(logging.INFO, logger="collectors.nvml")
    c = NvmlCollector(site="demo", node="n1")
    for _ in range(2):
        [(_, payload)] = c.poll()
    notes = [r.getMessage() for r in caplog.records if "not measured" in r.getMessage()]
    assert notes == [
        "GPU n1:0 (NVIDIA H100 80GB HBM3): mem_temp_c reads 0 °C (not measured);"
        " left out of its samples"
    ]
    fake.gpus[0].mem_temp_c = 42  # a sensor that starts reading is published
    fake.gpus[0].temp_c = 0  # and a core temperature of 0 is left out too
    [(_, payload)] = c.poll()
    h100 = orjson.loads(payload)["samples"][0]
    assert h100["mem_temp_c"] == 42.0 and "temp_c" not in h100
    c.close()
