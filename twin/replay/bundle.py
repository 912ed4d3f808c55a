"""Recordings: a time range of the store as a self-contained bundle, and reading one back.

A bundle is a directory::

    manifest.json      format, version, site, range, resolution, per-kind rows, resolutions
    site.yaml          the site file the telemetry belongs to
    calibration.json.gz  the newest calibration run's parameters and quality (if any)
    <kind>.parquet     one file per kind: ts, source, id and the quantities

At ``resolution_s`` > 0 the samples are averaged into buckets of that length (integers:
counters take the maximum, the throttle bitmask the bitwise OR). Each quantity is stored as an
integer multiple of its recording resolution (:data:`RESOLUTION`, in the contract's units;
``manifest.json`` lists them), which is what makes a day of a 880-GPU site fit in about 20 MB
with ZSTD: the resolution is that of the sensors (NVML reports whole degrees and watts) or finer
than anything the twin models. ``energy_j`` (GPU) is not recorded: it is the integral of
``power_w``. Everything else of the contract is kept.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from collectors.contract import KINDS, QUANTITIES
from twin.site import Site, load_site
from twin.store import Store
from twin.store.reads import read_rows

FORMAT = "dctwin-bundle"
VERSION = 1

#: Recording resolution per quantity, in the contract's unit; None: stored as is (integers).
RESOLUTION: dict[str, dict[str, float | None]] = {
    "gpu": {
        "power_w": 5.0,  # nvidia-smi: power.draw "is accurate to within +/- 5 watts"
        "temp_c": 1.0,  # NVML reports whole degrees
        "mem_temp_c": 1.0,
        "util_pct": 1.0,  # NVML reports whole percent
        "mem_util_pct": 1.0,
        "sm_active": 0.01,
        "power_limit_w": 1.0,
        "clock_sm_mhz": 1.0,
        "clock_mem_mhz": 1.0,
        "throttle_reasons": None,
        "fb_used_mib": 1.0,
        "ecc_sbe_total": None,
        "ecc_dbe_total": None,
    },
    "node": {
        "power_w": 1.0,
        "cpu_util_pct": 1.0,
        "inlet_temp_c": 0.1,
        "outlet_temp_c": 0.1,
        "fan_speed_pct": 0.1,
    },
    "pdu": {  # the resolution rack PDUs report (APC rPDU2: 0.1 A, 1 V, 0.01 kW, 0.1 kWh)
        "current_a": 0.1,
        "voltage_v": 1.0,
        "power_w": 10.0,
        "apparent_power_va": 10.0,
        "energy_kwh": 0.1,
        "power_factor": 0.01,
        "frequency_hz": 0.1,
        "inlet_temp_c": 0.1,
        "humidity_pct": 1.0,
    },
    "cdu": {
        "supply_temp_c": 0.01,
        "return_temp_c": 0.01,
        "flow_lpm": 0.1,
        "pump_speed_pct": 0.1,
        "pump_power_w": 1.0,
        "dp_kpa": 0.1,
        "fw_supply_temp_c": 0.01,
        "fw_return_temp_c": 0.01,
        "fw_flow_lpm": 0.1,
        "heat_kw": 0.01,
    },
    "link": {"tx_bps": 1e8, "rx_bps": 1e8, "errors": None},  # 0.1 Gb/s
}
#: Not recorded (derivable): GPU energy is the integral of its power.
NOT_RECORDED = {"gpu": ("energy_j",)}


class BundleError(ValueError):
    """A bundle that cannot be written or read; the message names the file and the problem."""


class Manifest(BaseModel):
    format: str = FORMAT
    version: int = VERSION
    site: str
    start: datetime
    end: datetime
    resolution_s: float = Field(ge=0, description="0: raw samples")
    rows: dict[str, int]
    resolutions: dict[str, dict[str, float | None]]
    calibration_run: int | None
    created_at: datetime
    notes: str = ""


def _columns(kind: str) -> list[str]:
    return [q for q in QUANTITIES[kind] if q not in NOT_RECORDED.get(kind, ())]


def record(
    store: Store,
    site_path: str | Path,
    out_dir: str | Path,
    start: datetime,
    end: datetime,
    *,
    resolution_s: float = 10.0,
    notes: str = "",
    overwrite: bool = False,
) -> Manifest:
    """Write the store's telemetry in [start, end) as a bundle in ``out_dir``."""
    if end <= start:
        raise BundleError(f"end {end.isoformat()} is not after start {start.isoformat()}")
    if resolution_s < 0:
        raise BundleError(f"resolution {resolution_s} s must be >= 0")
    site = load_site(site_path)
    out = Path(out_dir)
    if out.exists():
        if not overwrite and any(out.iterdir()):
            raise BundleError(f"{out}: exists and is not empty (overwrite to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rows: dict[str, int] = {}
    for kind in KINDS:
        table = _read_kind(store, kind, start, end, resolution_s)
        if table.num_rows == 0:
            continue
        write_parquet(_quantize(kind, table), out / f"{kind}.parquet")
        rows[kind] = table.num_rows
    if not rows:
        raise BundleError(f"no telemetry between {start.isoformat()} and {end.isoformat()}")
    shutil.copyfile(site_path, out / "site.yaml")
    run = _calibration(store)
    if run is not None:
        with gzip.open(out / "calibration.json.gz", "wt", encoding="utf-8") as f:
            json.dump(run, f, default=str, separators=(",", ":"))
    manifest = Manifest(
        site=site.name,
        start=start.astimezone(UTC),
        end=end.astimezone(UTC),
        resolution_s=resolution_s,
        rows=rows,
        resolutions={k: {q: RESOLUTION[k][q] for q in _columns(k)} for k in rows},
        calibration_run=None if run is None else run["run_id"],
        created_at=datetime.now(UTC),
        notes=notes,
    )
    (out / "manifest.json").write_text(manifest.model_dump_json(indent=1))
    return manifest


def _read_kind(store: Store, kind: str, start: datetime, end: datetime, res_s: float) -> pa.Table:
    cols = _columns(kind)
    # a bucket keeps the union of throttle bits, the largest integer reading, the mean of others
    agg = {
        q: "bit_or" if q == "throttle_reasons" else "max" if QUANTITIES[kind][q].integer else "avg"
        for q in cols
    }
    return read_rows(store, kind, cols, start, end, res_s, agg)


def _dict(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return col if pa.types.is_dictionary(col.type) else col.dictionary_encode()


def _quantize(kind: str, table: pa.Table) -> pa.Table:
    """Each quantity as an integer multiple of its resolution (nulls kept)."""
    out: dict[str, pa.Array] = {
        "ts": table.column("ts").cast(pa.timestamp("us", tz="UTC")),
        "source": _dict(table.column("source")),
        "id": _dict(table.column("id")),
    }
    for q in _columns(kind):
        col = table.column(q)
        res = RESOLUTION[kind][q]
        if res is None:
            out[q] = col.cast(pa.int64())
            continue
        vals = col.to_numpy(zero_copy_only=False).astype(float)
        mask = np.isnan(vals)
        ints = np.round(np.where(mask, 0.0, vals) / res)
        big = np.abs(ints).max(initial=0) >= 2**31
        out[q] = pa.array(ints.astype(np.int64 if big else np.int32), mask=mask)
    return pa.table(out)


#: Monotonic per device: delta-encoded. Everything else numeric: byte-stream split, which
#: ZSTD compresses best for noisy integers (measured on the demo day: GPU power 6.2 MB
#: against 7.7 MB delta-encoded and 8.2 MB dictionary-encoded).
_DELTA = {"ts", "energy_kwh", "energy_j", "ecc_sbe_total", "ecc_dbe_total", "errors"}


def write_parquet(table: pa.Table, path: Path) -> None:
    """ZSTD level 19, sorted by (id, ts), each column in the encoding that suits it."""
    enc = {}
    for f in table.schema:
        if f.name in ("source", "id"):
            continue
        enc[f.name] = "DELTA_BINARY_PACKED" if f.name in _DELTA else "BYTE_STREAM_SPLIT"
    pq.write_table(
        table,
        path,
        compression="zstd",
        compression_level=19,
        use_dictionary=["source", "id"],
        column_encoding=enc,
    )


def _calibration(store: Store) -> dict[str, Any] | None:
    """The newest calibration run with every parameter and quality row, for the bundle."""
    runs = store.calibration_runs()
    if not runs:
        return None
    run = runs[0]
    return {
        **{
            k: run[k]
            for k in (
                *("run_id", "fitted_at", "window_start", "window_end", "holdout_start"),
                *("gpus", "seconds", "source"),
            )
        },
        "params": store.calibration_param_rows(run["run_id"]),
        "quality": store.calibration_quality(run["run_id"]),
    }


def _time_order(head: pa.Table) -> tuple[np.ndarray, np.ndarray, pa.Array, int]:
    """Of a (ts, source) table: the rows' ts [us] and source ranks, both in the order by (ts,
    source) (stable: within a (ts, source), the file's order), that order, and the number of
    sources."""
    us = head.column("ts").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
    src = _dict(head.unify_dictionaries().column("source")).combine_chunks()
    del head
    names = src.dictionary.to_numpy(zero_copy_only=False)
    rank = np.empty(len(names), dtype=np.int32)
    rank[np.argsort(names, kind="stable")] = np.arange(len(names), dtype=np.int32)
    codes = rank[src.indices.to_numpy(zero_copy_only=False)]
    del src
    order = np.lexsort((codes, us))
    us, codes = us[order], codes[order]
    index_type = np.int32 if len(order) < 2**31 else np.int64
    return us, codes, pa.array(order.astype(index_type)), len(names)


def _read_ordered(pf: pq.ParquetFile, name: str, take: pa.Array) -> pa.Array:
    """One column of a Parquet file, in the order ``take``."""
    col = pf.read(columns=[name]).unify_dictionaries().column(0)
    return col.combine_chunks().take(take)


@dataclass
class TimeOrdered:
    """One kind of a bundle as stored, with its rows' order by (ts, source): a time range at a
    time in contract units (:meth:`rows`), for replay."""

    bundle: Bundle
    kind: str
    table: pa.Table  # as stored (integer multiples of the resolutions), ordered by (ts, source)
    ts_us: np.ndarray  # ts of the rows [us since the epoch]
    source_code: np.ndarray  # of the ordered rows: the source's rank among the kind's sources
    sources: int

    def span(self, lo_us: int, hi_us: int) -> tuple[int, int]:
        """Positions [a, b) of the ordered rows with lo_us <= ts < hi_us."""
        a, b = np.searchsorted(self.ts_us, [lo_us, hi_us])
        return int(a), int(b)

    def rows(self, a: int, b: int) -> pa.Table:
        """Ordered rows [a, b) in contract units (as :meth:`Bundle.table` gives them)."""
        return self.bundle._units(self.kind, self.table.slice(a, b - a))


@dataclass
class Bundle:
    """A bundle read back: its manifest, site, calibration and tables in contract units."""

    path: Path
    manifest: Manifest
    site: Site
    calibration: dict[str, Any] | None

    @classmethod
    def load(cls, path: str | Path) -> Bundle:
        p = Path(path)
        mf = p / "manifest.json"
        if not mf.is_file():
            raise BundleError(f"{p}: not a dctwin bundle (no manifest.json)")
        try:
            manifest = Manifest.model_validate_json(mf.read_text())
        except ValueError as e:
            raise BundleError(f"{mf}: {e}") from None
        if manifest.format != FORMAT or manifest.version != VERSION:
            raise BundleError(
                f"{mf}: format {manifest.format!r} v{manifest.version}; this dctwin reads "
                f"{FORMAT!r} v{VERSION}"
            )
        site = load_site(p / "site.yaml")
        cal_path = p / "calibration.json.gz"
        calibration = None
        if cal_path.is_file():
            with gzip.open(cal_path, "rt", encoding="utf-8") as f:
                calibration = json.load(f)
        return cls(p, manifest, site, calibration)

    def table(self, kind: str, columns: list[str] | None = None) -> pa.Table:
        """The samples of ``kind`` with every quantity back in its contract unit (float)."""
        f = self.path / f"{kind}.parquet"
        if kind not in self.manifest.rows or not f.is_file():
            raise BundleError(f"{self.path}: no {kind} telemetry in this bundle")
        names = None if columns is None else ["ts", "source", "id", *columns]
        return self._units(kind, pq.read_table(f, columns=names))

    def _units(self, kind: str, t: pa.Table) -> pa.Table:
        """A table as stored (integer multiples of the resolutions) in contract units."""
        res = self.manifest.resolutions[kind]
        out: dict[str, pa.Array] = {
            "ts": t.column("ts"),
            "source": t.column("source").cast(pa.string()),
            "id": t.column("id").cast(pa.string()),
        }
        for q in t.column_names[3:]:
            r = res.get(q)
            col = t.column(q)
            out[q] = col if r is None else pa.compute.multiply(col.cast(pa.float64()), r)
        return pa.table(out)

    def time_ordered(self, kind: str) -> TimeOrdered:
        """The samples of ``kind`` in time order, to read a time range at a time."""
        f = self.path / f"{kind}.parquet"
        if kind not in self.manifest.rows or not f.is_file():
            raise BundleError(f"{self.path}: no {kind} telemetry in this bundle")
        try:  # column by column: the peak is the ordered table and one column more
            pf = pq.ParquetFile(f)
            names_in_file = pf.schema_arrow.names
            for name in ("ts", "source", "id"):
                if name not in names_in_file:
                    raise BundleError(f"{f}: no {name!r} column")
            us, codes, take, sources = _time_order(pf.read(columns=["ts", "source"]))
            cols = {name: _read_ordered(pf, name, take) for name in names_in_file}
        except (OSError, pa.ArrowException) as e:
            raise BundleError(f"{f}: {e}") from None
        t = pa.table(cols)
        return TimeOrdered(self, kind, t, us, codes, sources)

    def params(self) -> dict[tuple[str, str, str], float]:
        """(kind, id, param) -> value of the bundle's usable calibrated parameters."""
        if not self.calibration:
            return {}
        return {
            (p["kind"], p["id"], p["param"]): p["value"]
            for p in self.calibration["params"]
            if p["usable"] and p["value"] is not None
        }
