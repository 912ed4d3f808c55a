"""The contract's sample rules, column-wise over an Arrow table of samples (replay's path).

:class:`collectors.contract.BatchDecoder` checks JSON messages; a recording that is already
columns (a bundle's Parquet) is checked here against the same rules, read from the contract
itself (:data:`~collectors.contract.QUANTITIES` and ``LONG_QUANTITIES`` with their bounds,
:data:`EXTRA_BOUND`, :data:`MAX_EXTRA_NAME`, :data:`TS_MIN`/:data:`TS_MAX`, the sample models'
id length), without building a message. :func:`suspect_rows` only *flags* rows: the ingest
sends the messages that hold a flagged row through the message path
(:meth:`twin.ingest.Ingester.ingest`), which names the reason and dead-letters them exactly as
it would live data. A flag is never a verdict, so a conservative flag (a message that may be too
large) costs time, never a wrong row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.contract import (
    EXTRA_BOUND,
    INT64_MAX,
    MAX_EXTRA_NAME,
    MAX_EXTRA_VALUES,
    MAX_PAYLOAD_BYTES,
    MAX_SAMPLE_KEYS,
    MAX_SAMPLES,
    MAX_SOURCE_CHARS,
    QUANTITIES,
    SAMPLE_MODELS,
    TS_MAX,
    TS_MIN,
    named_quantity,
)

_EPOCH_US = {"min": int(TS_MIN.timestamp()) * 1_000_000, "max": int(TS_MAX.timestamp()) * 1_000_000}
#: Columns of a sample table that are not quantities.
KEY_COLUMNS = ("ts", "source", "id")


def _id_max_length() -> int:
    """The longest sample id the contract's sample models accept."""
    for meta in SAMPLE_MODELS["gpu"].model_fields["id"].metadata:
        if getattr(meta, "max_length", None) is not None:
            return int(meta.max_length)
    raise RuntimeError("the contract's sample model has no id length bound")  # pragma: no cover


ID_MAX_LENGTH = _id_max_length()
#: A message whose estimated JSON size passes this share of MAX_PAYLOAD_BYTES is left to the
#: message path, which measures it exactly (``oversized`` when it is).
_SIZE_MARGIN = 0.5


def _flag_float(arr: pa.Array, lower: float, upper: float) -> np.ndarray:
    vals = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    with np.errstate(invalid="ignore"):  # NaN is a null: JSON has no NaN
        return np.isinf(vals) | (vals < lower) | (vals > upper)


def _flag_column(kind: str, name: str, arr: pa.Array) -> np.ndarray:
    """Rows of one column whose value the contract would refuse (nulls never are)."""
    q = named_quantity(kind, name)  # typed, or long (kept in extra_readings, checked alike)
    t = arr.type
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t)
    present = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if q is None:  # a quantity the contract does not name: a finite number within EXTRA_BOUND
        if len(name) > MAX_EXTRA_NAME or not numeric:
            return present
        return present & _flag_float(arr, -EXTRA_BOUND, EXTRA_BOUND) | (
            present & np.isnan(arr.to_numpy(zero_copy_only=False).astype(np.float64))
        )
    if q.integer:
        if not pa.types.is_integer(t):  # a float for an integer quantity: wrong_type
            return present
        lower = 0 if q.nonnegative else -INT64_MAX - 1
        if pa.types.is_unsigned_integer(t):
            return present & (arr.to_numpy(zero_copy_only=False) > INT64_MAX)
        vals = arr.to_numpy(zero_copy_only=False)
        return present & (vals < lower)
    if not numeric:
        return present
    return present & _flag_float(arr, q.lower, q.bound)


def suspect_rows(kind: str, table: pa.Table, starts: np.ndarray) -> np.ndarray:
    """Which rows of ``table`` (columns ts, source, id and quantities in contract units; one
    message per run beginning at each index of ``starts``) may break the contract."""
    n = table.num_rows
    flags = np.zeros(n, dtype=bool)
    ids = table.column("id")
    id_len = pc.utf8_length(ids).to_numpy(zero_copy_only=False).astype(np.float64)
    flags |= ~(id_len >= 1) | (id_len > ID_MAX_LENGTH)  # a null id has no length: flagged
    ts = table.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64)
    flags |= ~((ts >= _EPOCH_US["min"]) & (ts < _EPOCH_US["max"]))
    src_len = pc.utf8_length(table.column("source")).to_numpy(zero_copy_only=False)
    flags |= ~(src_len.astype(np.float64) <= MAX_SOURCE_CHARS)
    size = np.nan_to_num(id_len, nan=0.0) + 16.0
    keys = np.full(n, 2, dtype=np.int64)  # id and ts
    extras = np.zeros(n, dtype=np.int64)
    for name in table.column_names:
        if name in KEY_COLUMNS:
            continue
        arr = table.column(name).combine_chunks()
        flags |= _flag_column(kind, name, arr)
        present = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)
        keys += present
        if name not in QUANTITIES[kind]:
            extras += present
        # '"name":value,' with a value of at most 24 characters (a float's repr)
        size += present * (len(name) + 28)
    flags |= keys > MAX_SAMPLE_KEYS
    if n:
        counts = np.diff(np.append(starts, n))
        msg_size = np.add.reduceat(size, starts) + 200.0  # the header
        big = msg_size > _SIZE_MARGIN * MAX_PAYLOAD_BYTES
        big |= counts > MAX_SAMPLES
        big |= np.add.reduceat(extras, starts) > MAX_EXTRA_VALUES
        if big.any():
            flags |= np.repeat(big, counts)
    return flags


__all__ = ["ID_MAX_LENGTH", "KEY_COLUMNS", "suspect_rows"]
