"""Read Prometheus HTTP API answers (``/api/v1/query_range``, ``/api/v1/query``) holding
dcgm-exporter series into contract messages, so that GPU history a site already keeps in
Prometheus goes through the same validation and store as live telemetry.

- The file is one answer (``{"status": "success", "data": {"resultType": "matrix", ...}}``),
  a JSON array of answers, or one answer per line (JSON lines), since users concatenate
  queries; a JSON array of series (an answer's ``data.result`` alone) is read as one matrix.
  ``resultType`` ``matrix`` (``values``) and ``vector`` (one ``value``) are read.
  An answer with ``"status": "error"`` is refused with its ``errorType`` and ``error``.
- Series map to quantities through the DCGM collector's table
  (:data:`collectors.dcgm.DCGM_FIELDS`, units converted by its ``scale``: energy mJ -> J;
  MiB, MHz, W, °C, % and the 0..1 PROF_* ratios are the contract's units already). A metric
  the table does not name is counted per name and otherwise ignored.
- The node (message source) is ``--node``, else the ``Hostname`` (or ``hostname``) label, else
  the host of the ``instance`` label; the sample id is ``<node>:<gpu>`` from the ``gpu`` label
  (``<node>:<gpu>/mig<GPU_I_ID>`` for per-instance fields under MIG, as the collector does),
  else the ``UUID`` label.
- Left out of the samples, and counted: ``NaN`` and infinite values (an exporter's NaN, or a
  query's arithmetic), DCGM's blank sentinels (:func:`collectors.dcgm.is_blank`), an exact 0 of
  a temperature field the collector's table marks ``zero_unmeasured`` (no sensor, not 0 °C), a
  point that overlapping answers (or MIG instances) repeat, and a field where a preferred one
  of the same quantity already gives a value.
- Points of one node at one timestamp make one message (one sample per GPU), numbered per node
  from 0 in time order, so importing the same file again repeats (source, seq, ts) and stores
  nothing twice. Prometheus timestamps carry milliseconds, as the contract's do.

A staleness marker never reaches an API answer: a series that went stale simply has no points
past that time (a gap), which is what the importer stores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import polars as pl

from collectors.base import MessageBuilder
from collectors.contract import QUANTITIES, TS_MAX_S, TS_MIN_S, gpu_id, sub_id, topic_for

#: Why an answer of the file is refused as a whole.
RESPONSE_REASONS: dict[str, str] = {
    "error_response": 'the answer is "status": "error" (its errorType and error are shown)',
    "bad_response": "the answer is not a Prometheus API answer (no data.result list)",
    "unsupported_result_type": "resultType is scalar or string, not matrix or vector",
}

#: Why a series (with all its points) is refused.
SERIES_REASONS: dict[str, str] = {
    "no_gpu": "the series has neither a gpu (index) nor a UUID label",
    "bad_gpu": "the gpu label is not a GPU index (0, 1, ...)",
    "no_node": "no --node, Hostname, hostname or instance label names the node",
    "bad_node": "the node name cannot be a topic level (it holds '/', '+' or '#')",
    "bad_series": "the series is not an object with metric labels and values",
}

#: Why a point is refused, or left out of the samples.
POINT_REASONS: dict[str, str] = {
    "bad_point": 'the point is not [unix seconds, "number"]',
    "non_finite": "the value is NaN or infinite (left out)",
    "dcgm_blank": "the value is one of DCGM's blank sentinels (left out)",
    "unmeasured_zero": "a temperature of exactly 0: no sensor, not 0 °C (left out)",
    "duplicate": "the same GPU, field and timestamp again: overlapping answers, or a MIG"
    " instance repeating its GPU's device-wide field (left out)",
    "superseded": "a preferred DCGM field gives the same quantity at that time (left out)",
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INTEGER = frozenset(q for q, spec in QUANTITIES["gpu"].items() if spec.integer)
_SIDE_SCHEMA = {
    "node": pl.String,
    "id": pl.String,
    "gpu_order": pl.Int64,
    "quantity": pl.String,
    "field": pl.String,
    "scale": pl.Float64,
    "fp64": pl.Boolean,
    "priority": pl.Int64,
    "zu": pl.Boolean,
    "skey": pl.Int64,  # the (node, id) of the series, as a number
    "qkey": pl.Int64,  # its quantity, as a number
    "fkey": pl.Int64,  # its DCGM field, as a number
}


class PrometheusError(ValueError):
    """A file that cannot be read as a whole (not JSON, no answer in it, --node over several
    hosts); the message names the file and what is wrong."""


@dataclass
class Parsed:
    """A file read: the points kept as a table (``node``, ``id``, ``ts_us``, one column per
    quantity) and what was refused or left out, per reason, with the first example of each."""

    path: Path
    responses: int = 0
    series: int = 0
    points: int = 0
    table: pl.DataFrame = field(default_factory=pl.DataFrame)
    responses_refused: Counter[str] = field(default_factory=Counter)
    series_refused: Counter[str] = field(default_factory=Counter)
    points_refused: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    unknown_metrics: Counter[str] = field(default_factory=Counter)  # name -> series
    quantities: dict[str, list[str]] = field(default_factory=dict)  # quantity -> DCGM fields
    uuids: dict[str, list[str]] = field(default_factory=dict)  # sample id -> UUID labels
    unmeasured: list[str] = field(default_factory=list)  # "<id> <field>"
    errors: list[str] = field(default_factory=list)  # "answer N: errorType: error"

    def refused(self) -> dict[str, dict[str, int]]:
        """What of the file did not become samples: counts per reason, per unit."""
        unknown = sum(self.unknown_metrics.values())
        series = dict(self.series_refused) | ({"unknown_metric": unknown} if unknown else {})
        return {
            "responses": dict(self.responses_refused),
            "series": series,
            "points": dict(self.points_refused),
        }

    def summary(self) -> dict[str, object]:
        t = self.table
        span = None
        if t.height:
            span = [_iso(int(t["ts_us"].min())), _iso(int(t["ts_us"].max()))]  # type: ignore[arg-type]
        nodes = sorted(t["node"].unique().to_list()) if t.height else []
        gpus = sorted(t["id"].unique().to_list()) if t.height else []
        return {
            "responses": self.responses,
            "responses_refused": dict(self.responses_refused),
            "series": self.series,
            "series_refused": dict(self.series_refused),
            "unknown_metrics": dict(sorted(self.unknown_metrics.items())),
            "points": self.points,
            "points_kept": self.points - sum(self.points_refused.values()),
            "points_refused": dict(self.points_refused),
            "refused_examples": self.examples,
            "quantities": self.quantities,
            "unmeasured_zero_fields": self.unmeasured,
            "nodes": nodes,
            "gpus": gpus,
            "gpu_uuids": self.uuids,
            "samples": t.height,
            "messages": t.select("node", "ts_us").n_unique() if t.height else 0,
            "time_range": span,
        }


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat().replace("+00:00", "Z")


def read_answers(path: Path) -> list[Any]:
    """The answers a file holds: one JSON value, a JSON array of answers, or JSON lines."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise PrometheusError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from e
    if not raw.strip():
        raise PrometheusError(f"{path}: the file is empty")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as whole:
        lines = [(n, li) for n, li in enumerate(raw.splitlines(), 1) if li.strip()]
        answers = []
        for n, line in lines:  # JSON lines: every non-empty line is one answer
            try:
                answers.append(orjson.loads(line))
            except orjson.JSONDecodeError as e:
                where = f"line {n}: {e}" if len(lines) > 1 and n > 1 else str(whole)
                raise PrometheusError(
                    f"{path}: not JSON ({where}); expected a Prometheus API answer"
                    " (query_range or query), a JSON array of them, or one per line"
                ) from None
        return answers
    if isinstance(doc, list) and doc and all(isinstance(d, dict) and "metric" in d for d in doc):
        return [{"status": "success", "data": {"resultType": "matrix", "result": doc}}]
    if doc == []:
        raise PrometheusError(f"{path}: the file is an empty JSON array: no answer in it")
    return doc if isinstance(doc, list) else [doc]


def _node_of(labels: dict[str, Any], node: str | None) -> str | None:
    if node:
        return node
    for name in ("Hostname", "hostname"):
        v = labels.get(name)
        if isinstance(v, str) and v:
            return v
    instance = labels.get("instance")
    if isinstance(instance, str) and instance:
        try:  # "10.0.0.5:9400", "[fe80::1]:9400", "node01:9400" -> the host
            return urlsplit(f"//{instance}").hostname or instance
        except ValueError:
            return instance
    return None


@dataclass(frozen=True)
class DcgmTable:
    """The DCGM collector's field table and blank sentinels (``collectors/dcgm.py``), handed in
    by the caller: the twin outside its CLI imports only the wire contract of ``collectors/``,
    and one table maps DCGM fields for the collector and the import alike."""

    fields: Mapping[str, Any]  # DCGM field name -> collectors.dcgm.DcgmField
    fp64_blank: float  # DCGM_FP64_BLANK
    int64_blank: float  # DCGM_INT64_BLANK
    int32_blank: int  # DCGM_INT32_BLANK


@dataclass
class _Collect:
    """Series of the answers, as columns: one row per series in ``side``, one per point in
    ``point_series`` / ``point_ts`` / ``point_value``."""

    parsed: Parsed
    table: DcgmTable
    node: str | None
    site: str
    side: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in _SIDE_SCHEMA})
    point_series: list[int] = field(default_factory=list)
    point_ts: list[Any] = field(default_factory=list)
    point_value: list[Any] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)
    keys: dict[Any, int] = field(default_factory=dict)  # (node, id), quantity, field -> number

    def refuse(self, counter: Counter[str], reason: str, n: int, example: str) -> None:
        counter[reason] += n
        self.parsed.examples.setdefault(reason, example[:300])

    def answer(self, i: int, doc: Any) -> None:
        p = self.parsed
        where = f"answer {i + 1}"
        if isinstance(doc, dict) and doc.get("status") == "error":
            text = f"{where}: {doc.get('errorType', '?')}: {doc.get('error', '?')}"[:300]
            p.errors.append(text)
            self.refuse(p.responses_refused, "error_response", 1, text)
            return
        data = doc.get("data") if isinstance(doc, dict) else None
        result = data.get("result") if isinstance(data, dict) else None
        rtype = data.get("resultType") if isinstance(data, dict) else None
        if rtype in ("scalar", "string"):
            self.refuse(p.responses_refused, "unsupported_result_type", 1, f"{where}: {rtype}")
            return
        if not isinstance(result, list) or rtype not in ("matrix", "vector"):
            text = orjson.dumps(doc)[:200].decode(errors="replace")
            self.refuse(p.responses_refused, "bad_response", 1, f"{where}: {text}")
            return
        for j, series in enumerate(result):
            self.series(f"{where}, series {j + 1}", series, rtype)

    def series(self, where: str, s: Any, rtype: str) -> None:
        p = self.parsed
        p.series += 1
        labels = s.get("metric") if isinstance(s, dict) else None
        values = s.get("values") if rtype == "matrix" else [s.get("value")]
        if not isinstance(labels, dict) or not isinstance(values, list):
            self.refuse(p.series_refused, "bad_series", 1, f"{where}: {str(s)[:200]}")
            return
        name = str(labels.get("__name__", ""))
        fields = self.table.fields
        key = name if name in fields else name.removesuffix("_total")
        dcgm = fields.get(key)
        if dcgm is None:
            p.unknown_metrics[name or "(no __name__)"] += 1
            return
        sid, reason = self._sample_id(labels, dcgm)
        if reason is not None:
            self.refuse(p.series_refused, reason, 1, f"{where}: {orjson.dumps(labels).decode()}")
            return
        p.points += len(values)
        uuid = labels.get("UUID")
        if isinstance(uuid, str) and uuid and uuid != sid:
            known = p.uuids.setdefault(sid, [])
            if uuid not in known:
                known.append(uuid)
        p.quantities.setdefault(dcgm.quantity, [])
        if key not in p.quantities[dcgm.quantity]:
            p.quantities[dcgm.quantity].append(key)
        self._add_series(sid, labels, key, dcgm)
        index = len(self.side["id"]) - 1
        if values and all(type(pt) is list and len(pt) == 2 for pt in values):
            ts, vs = zip(*values, strict=True)  # every point [ts, "value"]: in one go
            self.point_series.extend([index] * len(values))
            self.point_ts.extend(ts)
            self.point_value.extend(vs)
            return
        for point in values:
            if isinstance(point, list) and len(point) == 2:
                self.point_series.append(index)
                self.point_ts.append(point[0])
                self.point_value.append(point[1])
            else:
                self.refuse(p.points_refused, "bad_point", 1, f"{where}: {str(point)[:100]}")

    def _sample_id(self, labels: dict[str, Any], dcgm: Any) -> tuple[str, str | None]:
        node = _node_of(labels, self.node)
        host = labels.get("Hostname") or labels.get("hostname") or labels.get("instance")
        if isinstance(host, str) and host:
            self.hosts.add(host)
        if node is None:
            return "", "no_node"
        try:
            topic_for(self.site, "gpu", node)
        except ValueError:
            return "", "bad_node"
        gpu = labels.get("gpu")
        if gpu in (None, ""):
            uuid = labels.get("UUID")
            return (uuid, None) if isinstance(uuid, str) and uuid else ("", "no_gpu")
        if not (isinstance(gpu, str) and gpu.isdigit()):
            return "", "bad_gpu"
        sid = gpu_id(node, int(gpu))
        instance = labels.get("GPU_I_ID")
        if instance not in (None, "") and not dcgm.device_wide:
            sid = sub_id(sid, f"mig{instance}")
        return sid, None

    def _add_series(self, sid: str, labels: dict[str, Any], key: str, dcgm: Any) -> None:
        gpu = labels.get("gpu")
        row = {
            "node": _node_of(labels, self.node),
            "id": sid,
            "gpu_order": int(gpu) if isinstance(gpu, str) and gpu.isdigit() else -1,
            "quantity": dcgm.quantity,
            "field": key,
            "scale": dcgm.scale,
            "fp64": dcgm.fp64,
            "priority": dcgm.priority,
            "zu": dcgm.zero_unmeasured,
        }
        for col, k in (("skey", (row["node"], sid)), ("qkey", ("q", dcgm.quantity)), ("fkey", key)):
            row[col] = self.keys.setdefault(k, len(self.keys))
        for col, v in row.items():
            self.side[col].append(v)


def blank_expr(value: pl.Expr, fp64: pl.Expr, t: DcgmTable) -> pl.Expr:
    """:func:`collectors.dcgm.is_blank` over columns (finite values; NaN/Inf are handled
    before): fp64 at or above 2**47; int64 at or above the int64 blank, or exactly one of the
    sixteen int32 sentinels."""
    lo, hi = t.int32_blank, t.int32_blank + 15
    int32 = (value >= lo) & (value <= hi) & (value.floor() == value)
    return pl.when(fp64).then(value >= t.fp64_blank).otherwise((value >= t.int64_blank) | int32)


def parse(path: Path, table: DcgmTable, *, node: str | None = None, site: str = "site") -> Parsed:
    """Read a file of Prometheus API answers, mapping series through ``table``;
    :class:`PrometheusError` when it cannot be read as a whole, refusals counted per reason
    otherwise."""
    answers = read_answers(path)
    c = _Collect(Parsed(path=path, responses=len(answers)), table, node, site)
    for i, doc in enumerate(answers):
        c.answer(i, doc)
    if node and len(c.hosts) > 1:
        raise PrometheusError(
            f"{path}: --node {node!r} given, but the series come from {len(c.hosts)} hosts"
            f" ({', '.join(sorted(c.hosts)[:5])}); their GPUs would mix: leave --node out"
        )
    c.parsed.table = _table(c)
    return c.parsed


def _table(c: _Collect) -> pl.DataFrame:
    """The kept points as one row per (node, id, timestamp); what is left out counted. Sorts
    and duplicate checks run on numbers (``skey``, ``qkey``, ``fkey``), names are joined back
    at the end."""
    p = c.parsed
    side = pl.DataFrame(c.side, schema=_SIDE_SCHEMA).with_row_index("series")
    points = pl.DataFrame(
        {
            "series": pl.Series(c.point_series, dtype=pl.UInt32),
            "ts_s": pl.Series(c.point_ts, dtype=pl.Float64, strict=False),
            "raw": pl.Series([v if isinstance(v, str) else None for v in c.point_value]),
        },
        schema_overrides={"raw": pl.String},
    ).with_row_index("order")
    points = points.with_columns(pl.col("raw").cast(pl.Float64, strict=False).alias("v"))
    numeric = ["series", "skey", "qkey", "fkey", "scale", "fp64", "priority", "zu"]
    df = points.join(side.select(numeric), on="series", how="left")
    ts_ok = pl.col("ts_s").is_finite() & (pl.col("ts_s") >= TS_MIN_S) & (pl.col("ts_s") < TS_MAX_S)
    v = pl.col("v")
    checks = [
        ("bad_point", pl.col("ts_s").is_null() | ~ts_ok | v.is_null()),
        ("non_finite", ~v.is_finite()),
        ("dcgm_blank", blank_expr(v, pl.col("fp64"), c.table)),
        ("unmeasured_zero", pl.col("zu") & (v == 0.0)),
    ]
    reason = pl.lit(None, pl.String)
    for name, cond in reversed(checks):
        reason = pl.when(cond).then(pl.lit(name)).otherwise(reason)
    ts_us = (pl.col("ts_s") * 1000).round().cast(pl.Int64, strict=False) * 1000  # ms, as sent
    df = df.with_columns(
        reason.alias("reason"), pl.when(ts_ok).then(ts_us).otherwise(None).alias("ts_s")
    ).rename({"ts_s": "ts_us"})
    bad = df.filter(pl.col("reason").is_not_null())
    ok = df.filter(pl.col("reason").is_null()).with_columns(v * pl.col("scale"))
    key = ["skey", "qkey", "ts_us"]
    ok = ok.sort([*key, "priority", "order"])
    first_of_field = ok.select(pl.struct([*key, "fkey"]).is_first_distinct()).to_series()
    dropped = [ok.filter(~first_of_field).with_columns(pl.lit("duplicate").alias("reason"))]
    ok = ok.filter(first_of_field)
    first_of_key = ok.select(pl.struct(key).is_first_distinct()).to_series()
    dropped.append(ok.filter(~first_of_key).with_columns(pl.lit("superseded").alias("reason")))
    kept = ok.filter(first_of_key)
    names = side.select("series", "id", "field")
    left_out = pl.concat([bad, *dropped]).join(names, on="series", how="left")
    _count(p, left_out)
    zero = left_out.filter(pl.col("reason") == "unmeasured_zero")
    p.unmeasured = sorted({f"{i} {f}" for i, f in zero.select("id", "field").iter_rows()})
    if kept.height == 0:
        return pl.DataFrame(schema={"node": pl.String, "id": pl.String, "ts_us": pl.Int64})
    return _wide(kept, side)


def _wide(kept: pl.DataFrame, side: pl.DataFrame) -> pl.DataFrame:
    """One column per quantity, rows in (node, timestamp, GPU) order."""
    wide = kept.pivot(on="qkey", index=["skey", "ts_us"], values="v")
    quantity = dict(side.select(pl.col("qkey").cast(pl.String), "quantity").unique().iter_rows())
    wide = wide.rename(quantity, strict=False)  # quantities with no point kept have no column
    samples = (
        side.select("skey", "node", "id", "gpu_order")
        .unique("skey")
        .sort("node", "gpu_order", "id")
        .with_columns(
            pl.col("node").rank("dense").alias("nrank"), pl.int_range(pl.len()).alias("srank")
        )
    )
    wide = wide.join(samples, on="skey", how="left").sort("nrank", "ts_us", "srank")
    quantities = [q for q in QUANTITIES["gpu"] if q in wide.columns]
    extras = sorted(q for q in set(quantity.values()) - set(quantities) if q in wide.columns)
    return wide.select("node", "id", "ts_us", *quantities, *extras)


def _count(p: Parsed, left_out: pl.DataFrame) -> None:
    """Count the points left out per reason (in :data:`POINT_REASONS` order), with the first
    of each as its example."""
    counts = dict(left_out["reason"].value_counts().iter_rows())
    for reason in POINT_REASONS:
        if counts.get(reason):
            p.points_refused[reason] += counts[reason]
    firsts = left_out.sort("order").group_by("reason", maintain_order=True)
    for r, sid, fld, ts_us, raw in firsts.agg(
        pl.col("id", "field", "ts_us", "raw").first()
    ).iter_rows():
        at = _iso(ts_us) if ts_us is not None else "a timestamp that is not Unix seconds"
        p.examples.setdefault(r, f"{sid} {fld} at {at}: {raw!r}")


def messages(parsed: Parsed, site: str) -> Iterator[tuple[str, bytes]]:
    """One contract message per node and timestamp (collector ``prometheus``), one sample per
    GPU, numbered per node from 0 in time order."""
    builder = MessageBuilder(site, "prometheus", seq_start=0)
    t = parsed.table
    quantities = [c for c in t.columns if c not in ("node", "id", "ts_us")]
    current: tuple[str, int] | None = None
    samples: list[dict[str, Any]] = []
    for row in t.iter_rows(named=True):
        at = (row["node"], row["ts_us"])
        if current is not None and at != current:
            yield _message(builder, current, samples)
            samples = []
        current = at
        sample: dict[str, Any] = {"id": row["id"]}
        for q in quantities:
            v = row[q]
            if v is not None:
                sample[q] = int(v) if q in _INTEGER and float(v).is_integer() else v
        samples.append(sample)
    if current is not None:
        yield _message(builder, current, samples)


def _message(
    builder: MessageBuilder, at: tuple[str, int], samples: list[dict[str, Any]]
) -> tuple[str, bytes]:
    node, ts_us = at
    return builder.message("gpu", node, samples, _EPOCH + timedelta(microseconds=ts_us))
