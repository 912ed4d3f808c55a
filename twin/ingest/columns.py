"""The contract's sample rules, column-wise over an Arrow table of samples (replay's path).

:class:`twin.ingest.batch_decode.BatchDecoder` checks JSON messages; a recording that is
already columns (a bundle's Parquet) is checked here against the same rules, read from the
contract itself (each value by its rule: :func:`collectors.contract.value_breaks` over
:func:`~collectors.contract.value_rule`; names by :data:`~collectors.contract.MAX_EXTRA_NAME`,
timestamps by ``TS_MIN_S``/``TS_MAX_S``, ids by ``MAX_ID_CHARS``, and the counts), without
building a message. :func:`suspect_rows` only *flags* rows: the ingest
sends the messages that hold a flagged row through the message path
(:meth:`twin.ingest.Ingester.ingest`), which names the reason and dead-letters them exactly as
it would live data. A flag is never a verdict, so a conservative flag (a message that may be too
large) costs time, never a wrong row. A NaN in a float column is a null (JSON has no NaN): a row
that holds one is flagged too, so that the store gets the message path's null, never a NaN.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.contract import (
    MAX_EXTRA_NAME,
    MAX_EXTRA_VALUES,
    MAX_ID_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_SAMPLE_KEYS,
    MAX_SAMPLES,
    MAX_SOURCE_CHARS,
    QUANTITIES,
    TS_MAX_S,
    TS_MIN_S,
    UNNAMED,
    value_breaks,
    value_rule,
)

_EPOCH_US = {"min": int(TS_MIN_S) * 1_000_000, "max": int(TS_MAX_S) * 1_000_000}
#: Columns of a sample table that are not quantities.
KEY_COLUMNS = ("ts", "source", "id")
#: A message whose estimated JSON size passes this share of MAX_PAYLOAD_BYTES is left to the
#: message path, which measures it exactly (``oversized`` when it is).
_SIZE_MARGIN = 0.5


def _flag_column(kind: str, name: str, arr: pa.Array) -> np.ndarray:
    """Rows of one column whose value the contract would refuse, or that hold a NaN (a null
    the message path stores as one); nulls are never flagged."""
    q = value_rule(kind, name)  # typed, long (kept in extra_readings, checked alike), unnamed
    t = arr.type
    present = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if q is UNNAMED and len(name) > MAX_EXTRA_NAME:
        return present
    if pa.types.is_integer(t):
        # int64 or narrower, or unsigned (past int64 only there): the rule on the values
        vals = arr.fill_null(0).to_numpy(zero_copy_only=False)
        return present & value_breaks(q, vals)[2]
    if q.integer or not pa.types.is_floating(t):  # a float for an integer: wrong_type
        return present
    vals = arr.to_numpy(zero_copy_only=False).astype(np.float64)  # a null reads as NaN
    non_finite, _, beyond = value_breaks(q, vals)
    return present & (non_finite | beyond)


def suspect_rows(kind: str, table: pa.Table, starts: np.ndarray) -> np.ndarray:
    """Which rows of ``table`` (columns ts, source, id and quantities in contract units; one
    message per run beginning at each index of ``starts``) may break the contract."""
    n = table.num_rows
    flags = np.zeros(n, dtype=bool)
    ids = table.column("id")
    id_len = pc.utf8_length(ids).to_numpy(zero_copy_only=False).astype(np.float64)
    flags |= ~(id_len >= 1) | (id_len > MAX_ID_CHARS)  # a null id has no length: flagged
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


__all__ = ["KEY_COLUMNS", "suspect_rows"]
