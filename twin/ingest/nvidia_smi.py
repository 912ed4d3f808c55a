"""Read ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`` logs into contract
messages, so that the history a site already has goes through the same validation and store as
live telemetry.

- Fields in any order; the header (``power.draw [W]``) names them, or ``query_gpu`` does for a
  ``noheader`` log. Units in the header, in the values (``245.12 W``) or nowhere (``nounits``);
  a unit that is not the field's is refused.
- ``[N/A]``, ``[Not Supported]`` and every other bracketed value are missing, not zero.
- Timestamps as ``nvidia-smi -l``/``-lms`` print them (``2024/01/15 10:23:45.123``), in the
  local time of the machine that ran it: ``tz`` names that zone (default UTC). A timestamp
  that carries its own ISO-8601 offset (``2024-01-15T10:23:45.123+08:00``, ``...Z``) is read
  at that offset, whatever ``tz`` says, and normalised to UTC.
- The GPU: ``index`` gives sample id ``<node>:<index>`` (:func:`collectors.contract.gpu_id`);
  else ``uuid`` is the sample id; else ``pci.bus_id``, ranked (nvidia-smi numbers GPUs in PCI
  bus order); with none of them the log is taken as one GPU, index 0. A GPU number in another
  column (:data:`GPU_NUMBER_FIELDS`, e.g. ``gpu``) is used when ``index`` is absent or the same
  on every row while that column varies; rows that would still share a timestamp and a GPU id
  refuse the log, naming its columns (never a silent merge).
- A row that cannot be read is refused with a reason (:data:`ROW_REASONS`) and the others go
  on; the contract's own checks (negative, out of range, future) are the ingest's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from collectors.base import MessageBuilder
from collectors.contract import gpu_id

#: nvidia-smi's query names that its header prints under another name (``nvidia-smi
#: --help-query-gpu``: "clocks.sm" is printed "clocks.current.sm", "gpu_uuid" as "uuid").
ALIASES: dict[str, str] = {
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.memory": "clocks.current.memory",
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
}

#: Contract quantity <- nvidia-smi fields, the first present wins (names from
#: ``nvidia-smi --help-query-gpu``; quantities as the NVML collector publishes them).
QUANTITY_FIELDS: dict[str, tuple[str, ...]] = {
    "power_w": ("power.draw", "power.draw.average", "power.draw.instant"),
    "temp_c": ("temperature.gpu",),
    "mem_temp_c": ("temperature.memory",),
    "util_pct": ("utilization.gpu",),
    "mem_util_pct": ("utilization.memory",),
    "clock_sm_mhz": ("clocks.current.sm",),
    "clock_mem_mhz": ("clocks.current.memory",),
    "power_limit_w": ("enforced.power.limit", "power.limit"),
    "fb_used_mib": ("memory.used",),
}

#: The units nvidia-smi prints per quantity ("" where it prints none: temperatures).
UNITS: dict[str, frozenset[str]] = {
    "power_w": frozenset({"W"}),
    "temp_c": frozenset({"", "C", "°C"}),
    "mem_temp_c": frozenset({"", "C", "°C"}),
    "util_pct": frozenset({"%"}),
    "mem_util_pct": frozenset({"%"}),
    "clock_sm_mhz": frozenset({"MHz"}),
    "clock_mem_mhz": frozenset({"MHz"}),
    "power_limit_w": frozenset({"W"}),
    "fb_used_mib": frozenset({"MiB"}),
}

#: Columns some exporters and scripts put the GPU number in instead of nvidia-smi's ``index``.
GPU_NUMBER_FIELDS = ("gpu", "gpu_index", "gpu_id", "gpu.index", "device", "device_index")
IDENTITY_FIELDS = ("index", "uuid", "pci.bus_id", *GPU_NUMBER_FIELDS)

#: Why a row of a log is refused.
ROW_REASONS: dict[str, str] = {
    "wrong_field_count": "the row has another number of fields than the header",
    "bad_timestamp": "the timestamp is not YYYY/MM/DD HH:MM:SS[.fff][+HH:MM] (or is not in --tz)",
    "bad_gpu": "the GPU index or UUID is missing or not a number",
    "wrong_unit": "a value carries a unit that is not its field's",
    "bad_number": "a value is neither a number nor [N/A]",
    "no_values": "no quantity of the row has a value",
}

_TS_FORMATS = ("%Y/%m/%d %H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f")
#: An ISO-8601 offset at the end of a timestamp: ``+08:00``, ``-0530``, ``Z``.
_OFFSET = r"(?:[+-]\d{2}:?\d{2}|Z)$"
_HEADER_TOKEN = re.compile(r"^([a-z_][a-z0-9_.]*)(?: \[([^\]]*)\])?$")
_MISSING = r"^(\[.*\]|N/A|)$"
_VALUE = r"^([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*(\S*)$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class NvidiaSmiError(ValueError):
    """A log that cannot be read as a whole (no timestamp field, no fields, a wrong unit in the
    header); the message names the file and what is wrong."""


@dataclass
class Parsed:
    """A log read: the rows kept as a table (``ts_us``, ``id``, one column per quantity) and
    what was refused, per reason, with the first line of each."""

    path: Path
    rows: int
    table: pl.DataFrame
    refused: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    quantities: dict[str, str] = field(default_factory=dict)  # quantity -> field
    ignored: list[str] = field(default_factory=list)
    gpu_from: str = ""
    header_lines: int = 0

    def summary(self) -> dict[str, object]:
        ts = self.table["ts_us"]
        span = None
        if len(ts):
            span = [_iso(int(ts.min())), _iso(int(ts.max()))]  # type: ignore[arg-type]
        return {
            "rows": self.rows,
            "rows_kept": self.table.height,
            "rows_refused": dict(self.refused),
            "refused_examples": self.examples,
            "quantities": self.quantities,
            "ignored_fields": self.ignored,
            "gpu_ids_from": self.gpu_from,
            "gpus": sorted(self.table["id"].unique().to_list()),
            "time_range": span,
        }


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat().replace("+00:00", "Z")


def _canonical(name: str) -> str:
    return ALIASES.get(name, name)


def _header(line: str) -> list[tuple[str, str | None]] | None:
    """``[(field, unit or None)]`` when ``line`` is an nvidia-smi CSV header, else None."""
    out: list[tuple[str, str | None]] = []
    for token in line.split(","):
        m = _HEADER_TOKEN.match(token.strip())
        if m is None:
            return None
        out.append((_canonical(m.group(1)), m.group(2)))
    known = {f for fs in QUANTITY_FIELDS.values() for f in fs} | {"timestamp", *IDENTITY_FIELDS}
    return out if any(f in known for f, _ in out) else None


def _fields(
    path: Path, first: str, query_gpu: str | None
) -> tuple[list[tuple[str, str | None]], bool]:
    """The log's fields (with the header's units) and whether its first line is the header."""
    header = _header(first)
    query = None
    if query_gpu is not None:
        query = [_canonical(q.strip()) for q in query_gpu.split(",") if q.strip()]
    if header is None and query is None:
        raise NvidiaSmiError(
            f"{path}: the first line is not an nvidia-smi CSV header; for a noheader log give"
            " the fields it was written with (--query-gpu timestamp,index,power.draw,...)"
        )
    if header is not None and query is not None and [f for f, _ in header] != query:
        raise NvidiaSmiError(
            f"{path}: the header's fields {[f for f, _ in header]} differ from --query-gpu {query}"
        )
    fields = header if header is not None else [(q, None) for q in query or []]
    names = [f for f, _ in fields]
    dup = sorted({f for f in names if names.count(f) > 1})
    if dup:
        raise NvidiaSmiError(f"{path}: the fields {dup} appear more than once")
    if "timestamp" not in names:
        raise NvidiaSmiError(
            f"{path}: no timestamp field; a log for import needs one"
            " (nvidia-smi --query-gpu=timestamp,...)"
        )
    return fields, header is not None


def _choose(
    path: Path, fields: list[tuple[str, str | None]]
) -> tuple[dict[str, int], dict[str, str], list[str]]:
    """Column position per quantity, the field each comes from, and the fields ignored."""
    pos = {f: i for i, (f, _) in enumerate(fields)}
    cols: dict[str, int] = {}
    used: dict[str, str] = {}
    for quantity, candidates in QUANTITY_FIELDS.items():
        for name in candidates:
            if name in pos:
                unit = fields[pos[name]][1]
                if unit is not None and unit not in UNITS[quantity]:
                    raise NvidiaSmiError(
                        f"{path}: the header gives {name} in {unit}, expected"
                        f" {' or '.join(sorted(u for u in UNITS[quantity] if u))}"
                    )
                cols[quantity], used[quantity] = pos[name], name
                break
    if not cols:
        raise NvidiaSmiError(
            f"{path}: none of the fields {list(pos)} is a quantity the twin knows"
            f" (known: {', '.join(f for fs in QUANTITY_FIELDS.values() for f in fs)})"
        )
    taken = set(used.values()) | {"timestamp", *IDENTITY_FIELDS}
    return cols, used, [f for f in pos if f not in taken]


def _timestamps(raw: pl.Expr, tz: str) -> pl.Expr:
    """Epoch microseconds (UTC) of nvidia-smi's local timestamps in zone ``tz``; null where
    a timestamp does not parse or does not exist in ``tz`` (a DST gap)."""
    naive = raw.str.replace(_OFFSET, "")
    parsed = pl.coalesce(
        [naive.str.strptime(pl.Datetime("us"), f, strict=False) for f in _TS_FORMATS]
    )
    local = parsed.dt.replace_time_zone(tz, ambiguous="earliest", non_existent="null")
    local_us = local.dt.convert_time_zone("UTC").dt.epoch("us")
    # a timestamp with its own offset: the wall time read as UTC, less the offset
    off = raw.str.extract(r"([+-])(\d{2}):?(\d{2})$", 0)
    sign = pl.when(raw.str.extract(r"([+-])\d{2}:?\d{2}$", 1) == "-").then(-1).otherwise(1)
    off_us = (
        sign
        * (
            raw.str.extract(r"[+-](\d{2}):?\d{2}$", 1).cast(pl.Int64, strict=False) * 60
            + raw.str.extract(r"[+-]\d{2}:?(\d{2})$", 1).cast(pl.Int64, strict=False)
        )
        * 60_000_000
    )
    as_utc = parsed.dt.replace_time_zone("UTC").dt.epoch("us")
    has_off = off.is_not_null()
    is_z = raw.str.ends_with("Z")
    return pl.when(has_off).then(as_utc - off_us).when(is_z).then(as_utc).otherwise(local_us)


def read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8-sig", errors="replace")
    except OSError as e:
        raise NvidiaSmiError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from e
    return text.splitlines()


def parse(path: Path, node: str, *, query_gpu: str | None = None, tz: str = "UTC") -> Parsed:
    """Read an nvidia-smi CSV log of GPUs on ``node``; :class:`NvidiaSmiError` when the log
    cannot be read as a whole, refused rows counted per reason otherwise."""
    lines = pl.DataFrame({"line": read_lines(path)}, schema={"line": pl.String}).with_row_index(
        "lineno", offset=1
    )
    lines = lines.with_columns(pl.col("line").str.strip_chars()).filter(pl.col("line") != "")
    if lines.height == 0:
        raise NvidiaSmiError(f"{path}: the file is empty")
    first = lines["line"][0]
    fields, has_header = _fields(path, first, query_gpu)
    cols, used, ignored = _choose(path, fields)
    names = [f for f, _ in fields]
    header_lines = 0
    if has_header:  # a log appended to by several runs repeats its header
        is_header = pl.col("line") == first
        header_lines = int(lines.select(is_header.sum()).item())
        lines = lines.filter(~is_header)
    parts = pl.col("line").str.split(",")
    df = lines.select(
        "lineno",
        "line",
        (parts.list.len() == len(names)).alias("count_ok"),
        *[
            parts.list.get(i, null_on_oob=True).str.strip_chars().alias(f"f{i}")
            for i in range(len(names))
        ],
    )
    ts = _timestamps(pl.col(f"f{names.index('timestamp')}"), tz).alias("ts_us")
    reasons: list[tuple[str, pl.Expr]] = []
    value_cols: list[pl.Expr] = []
    for quantity, i in cols.items():
        raw = pl.col(f"f{i}")
        missing = raw.is_null() | raw.str.contains(_MISSING)
        number = raw.str.extract(_VALUE, 1).cast(pl.Float64, strict=False)
        unit = raw.str.extract(_VALUE, 2)
        ok_unit = unit.is_in([*UNITS[quantity], ""]) | unit.is_null()  # "": nounits
        reasons.append(("wrong_unit", ~missing & number.is_not_null() & ~ok_unit))
        reasons.append(("bad_number", ~missing & number.is_null()))
        value_cols.append(pl.when(missing).then(None).otherwise(number).alias(quantity))
    sid, gpu_from, gpu_ok = _gpu_ids(df, names, node)
    df = df.with_columns(ts, *value_cols, sid.alias("id"))
    any_value = pl.any_horizontal([pl.col(q).is_not_null() for q in cols])
    checks = [
        ("wrong_field_count", ~pl.col("count_ok")),
        ("bad_timestamp", pl.col("ts_us").is_null()),
        ("bad_gpu", ~gpu_ok),
        *reasons,
        ("no_values", ~any_value),
    ]
    reason = pl.lit(None, pl.String)
    for name, cond in reversed(checks):
        reason = pl.when(cond).then(pl.lit(name)).otherwise(reason)
    df = df.with_columns(reason.alias("reason"))
    bad = df.filter(pl.col("reason").is_not_null())
    refused: Counter[str] = Counter(dict(bad["reason"].value_counts().iter_rows()))
    examples = {
        r: f"line {n}: {line[:200]}"
        for r, n, line in bad.group_by("reason", maintain_order=True)
        .agg(pl.col("lineno").first(), pl.col("line").first())
        .iter_rows()
    }
    table = df.filter(pl.col("reason").is_null()).select("ts_us", "id", *cols)
    if gpu_from.startswith("none") and table["ts_us"].is_duplicated().any():
        raise NvidiaSmiError(
            f"{path}: several rows share a timestamp and no field tells the GPUs apart;"
            " log with index (or uuid) among the --query-gpu fields"
        )
    dup = table.select(pl.struct("ts_us", "id").is_duplicated().sum()).item()
    if dup:
        raise NvidiaSmiError(
            f"{path}: {dup} rows share a timestamp and a GPU id with another row (GPU ids from"
            f" {gpu_from}); the columns are {names}: which one numbers the GPUs? Log with index"
            " (or uuid) telling them apart"
        )
    return Parsed(
        path=path,
        rows=lines.height,
        table=table,
        refused=refused,
        examples=examples,
        quantities=used,
        ignored=ignored,
        gpu_from=gpu_from,
        header_lines=header_lines,
    )


def _gpu_ids(df: pl.DataFrame, names: list[str], node: str) -> tuple[pl.Expr, str, pl.Expr]:
    """The sample id expression, where it comes from, and which rows have a usable one."""
    other = next((f for f in GPU_NUMBER_FIELDS if f in names), None)
    use = "index" if "index" in names else other
    if other is not None and "index" in names:
        # nvidia-smi's index the same on every row while another column numbers the GPUs: a
        # log written per GPU (CUDA_VISIBLE_DEVICES) with the number added by its script
        n_idx = df.select(pl.col(f"f{names.index('index')}").n_unique()).item()
        n_other = df.select(pl.col(f"f{names.index(other)}").n_unique()).item()
        if n_idx == 1 and n_other > 1:
            use = other
    if use is not None:
        idx = pl.col(f"f{names.index(use)}").cast(pl.Int64, strict=False)
        sid = pl.lit(gpu_id(node, "")) + idx.cast(pl.String)
        how = use if use == "index" else f"{use} (the GPU number column)"
        return sid, how, idx.is_not_null() & (idx >= 0)
    if "uuid" in names:
        uuid = pl.col(f"f{names.index('uuid')}")
        ok = uuid.is_not_null() & ~uuid.str.contains(_MISSING)
        return uuid, "uuid", ok
    if "pci.bus_id" in names:
        bus = pl.col(f"f{names.index('pci.bus_id')}").str.to_lowercase()
        rank = bus.rank("dense").cast(pl.Int64) - 1  # nvidia-smi numbers GPUs in PCI bus order
        ok = bus.is_not_null() & ~bus.str.contains(_MISSING)
        return pl.lit(gpu_id(node, "")) + rank.cast(pl.String), "pci.bus_id (PCI order)", ok
    return pl.lit(gpu_id(node, 0)), "none in the log: one GPU, index 0", pl.lit(True)


def messages(parsed: Parsed, site: str, node: str) -> Iterator[tuple[str, bytes]]:
    """One contract message per kept row (source ``node``, collector ``nvidia-smi``), numbered
    from 0 in file order, so importing the same log again repeats (source, seq, ts) and stores
    nothing twice."""
    builder = MessageBuilder(site, "nvidia-smi", seq_start=0)
    quantities = [c for c in parsed.table.columns if c not in ("ts_us", "id")]
    for row in parsed.table.iter_rows(named=True):
        sample = {"id": row["id"], **{q: row[q] for q in quantities}}
        ts = _EPOCH + timedelta(microseconds=row["ts_us"])
        yield builder.message("gpu", node, [sample], ts)
