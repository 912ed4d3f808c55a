"""The ingest's batch decoder: whole batches of contract messages checked column-wise.

:class:`BatchDecoder` takes a list of (topic, payload) items, as the MQTT service or a file
import hands them to :class:`twin.ingest.Ingester`, and returns the accepted messages' samples
as Arrow columns per kind, the quantities the contract does not name, the refused messages with
their reason and the duplicates. It accepts exactly what :func:`collectors.contract.decode`
accepts: every rule it checks is the contract's (the value rules through
:func:`collectors.contract.value_breaks`, the counts and lengths through the contract's
constants), and a message that fails any check is handed to ``decode``, which names the reason
(tests/test_batch_arrow.py and tests/test_value_rules.py hold the paths to it).

This is the twin's side of the wire contract; a collector never needs it (it builds messages
with :mod:`collectors.contract` and :class:`collectors.base.MessageBuilder`).
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from collectors.contract import (
    CONTRACT_VERSION,
    DEAD_LETTER_REASONS,
    INT64_MAX,
    MAX_COLLECTOR_CHARS,
    MAX_DEPTH,
    MAX_EXTRA_VALUES,
    MAX_ID_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_SAMPLE_KEYS,
    MAX_SAMPLES,
    MAX_SOURCE_CHARS,
    QUANTITIES,
    SAMPLE_KEYS,
    TS_MAX_S,
    TS_MIN_S,
    ContractError,
    TimestampError,
    decode,
    extra_refusal,
    nesting_depth,
    parse_timestamp,
    parse_topic,
    value_breaks,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _deep_lines(all_payloads: list[bytes]) -> list[bool] | None:
    """Per payload: whether it nests deeper than :data:`MAX_DEPTH` (None when none does).
    Only payloads with more brackets than that are scanned, together, in a few numpy passes
    over them joined (:func:`nesting_depth` per payload, each line counted from its own start,
    so a malformed line does not shift the next)."""
    many = [
        j
        for j, p in enumerate(all_payloads)
        if p.count(b"[") + p.count(b"{") > MAX_DEPTH  # at most that deep otherwise
    ]
    if not many:
        return None
    payloads = [all_payloads[j] for j in many]
    m = len(payloads)
    texts = [p.replace(b"\\\\", b"").replace(b'\\"', b"") for p in payloads]
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=m) + 1
    raw = np.frombuffer(b"\n".join(texts) + b"\n", dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    is_q = raw == ord('"')
    q = np.cumsum(is_q, dtype=np.int32)
    odd_before = ((q[starts] - is_q[starts]) & 1).astype(np.int8)  # quotes before each line
    inside = ((q & 1).astype(np.int8) ^ np.repeat(odd_before, lens)).astype(bool)
    step = ((raw == ord("[")) | (raw == ord("{"))).astype(np.int32)
    step -= (raw == ord("]")) | (raw == ord("}"))
    step[inside] = 0
    depth = np.cumsum(step, dtype=np.int32)
    # the deepest point of each line, from the depth where it starts
    deep = np.maximum.reduceat(depth, starts) - (depth[starts] - step[starts]) > MAX_DEPTH
    if not deep.any():
        return None
    out = [False] * len(all_payloads)
    for j in np.flatnonzero(deep).tolist():
        out[many[j]] = True
    return out


_HEADER_KEYS = frozenset(("v", "collector", "source", "seq", "ts", "samples"))
_NONE = type(None)
_FLOAT_TYPES = frozenset((float, int, _NONE))
_INT_TYPES = frozenset((int, _NONE))


@dataclass(slots=True)
class BatchMessage:
    """One accepted message of a batch: its header; its samples are in the batch's columns."""

    index: int  # position in the items given to decode_batch
    kind: str
    source: str
    collector: str
    seq: int
    ts_us: int  # microseconds since the Unix epoch, UTC
    n_samples: int


@dataclass
class DecodedBatch:
    """What :meth:`BatchDecoder.decode_batch` made of a list of (topic, payload) items."""

    messages: list[BatchMessage]
    #: kind -> column -> Arrow array (``ts``, ``source``, ``id``, then the kind's quantities)
    columns: dict[str, dict[str, Any]]
    #: quantities the contract does not name: ts (us), kind, source, id, quantity, value
    extras: dict[str, list[Any]]
    #: (item index, why) for each refused message
    refused: list[tuple[int, ContractError]]
    #: item indices of duplicates (of a message already stored, or earlier in this batch)
    duplicates: list[int]


def _us(ts: datetime) -> int:
    return (ts - _EPOCH) // _ONE_US


_ONE_US = timedelta(microseconds=1)


class BatchDecoder:
    """Validates many messages at once, column by column, by the rules of :func:`decode`.

    Plain payloads (one ASCII line without escapes: what dctwin's collectors send) of one kind
    are parsed together by pyarrow.json against the kind's schema and checked as columns
    (:class:`_ArrowPart`: no Python object per value); the others have only their header
    checked in Python, and the samples of all of them of one kind are checked together (value
    types with one pass of ``map(type, ...)``, bounds with numpy). A message that fails any
    check is handed to :func:`decode`, which names the reason, so the paths share one set of
    rules (tests/test_batch_arrow.py holds them to it). ``window_us``: (earliest, latest)
    timestamp accepted [us since the epoch], for the ingest's max-past/max-future limits
    (``ts_past``/``ts_future``).
    """

    def __init__(self, site: str | None = None):
        self.site = site
        self._topics: dict[str, tuple[str, str, str] | ContractError] = {}
        self._str_ts: dict[str, int] = {}  # RFC 3339 text -> us, for timestamps seen before

    def _topic(self, topic: str) -> tuple[str, str, str]:
        """The topic's (site, kind, source), remembered; ContractError (also remembered)."""
        t = self._topics.get(topic)
        if t is None:
            try:
                t = parse_topic(topic, self.site)
            except ContractError as e:
                t = e
            if len(self._topics) >= 100_000:
                self._topics.clear()
            self._topics[topic] = t
        if isinstance(t, ContractError):
            raise ContractError(t.reason, t.detail)
        return t

    def _known_topic(self, topic: str) -> tuple[str, str, str] | bool:
        """The topic's (site, kind, source), or False when the contract refuses it (the
        per-message path names why)."""
        try:
            return self._topic(topic)
        except ContractError:
            return False

    def _ts_us(self, value: Any) -> int:
        if type(value) is not str:  # numbers are not cached: 1 == 1.0 == True as dict keys
            return _us(parse_timestamp(value))  # TimestampError: the caller refuses it
        cache = self._str_ts
        us = cache.get(value)
        if us is None:
            us = _us(parse_timestamp(value))
            if len(cache) >= 8192:
                cache.clear()
            cache[value] = us
        return us

    def decode_batch(
        self,
        items: list[tuple[str, bytes]],
        *,
        is_new: Any = None,
        window_us: tuple[int, int] | None = None,
        dedup: Any = None,
    ) -> DecodedBatch:
        """Validate ``items``; ``is_new(kind, source, seq, ts_us)`` says whether a valid message
        is not a duplicate (it must also remember the keys of this batch); it is asked in the
        order of ``items`` within a kind, so the first of two copies is the one kept. ``dedup``
        instead answers for a whole kind at once: ``dedup(kind, keys)`` with keys (item index,
        source, seq, ts_us) in item order returns the item indices that are duplicates."""
        refused: list[tuple[int, ContractError]] = []
        duplicates: list[int] = []
        per_kind: dict[str, list[tuple[int, str, str, int, int, list]]] = {}
        lo, hi = window_us if window_us is not None else (None, None)
        lo_ = -(1 << 62) if lo is None else lo
        hi_ = 1 << 62 if hi is None else hi
        topics = self._topics
        ts_cache = self._str_ts
        loads, dumps = orjson.loads, orjson.dumps
        version = CONTRACT_VERSION
        # Plain payloads (see _plain) of a known topic are parsed and checked a whole kind at
        # a time in Arrow (_ArrowPart); what that cannot take goes through the loop below.
        fast_parts, slow = self._arrow_parts(items, lo_, hi_)
        for i in slow:
            topic, payload = items[i]
            # the common case, inline: a topic of a known shape, canonical JSON, a valid
            # header; anything else goes to decode(), which names the reason (or accepts it)
            t = topics.get(topic) or self._known_topic(topic)
            if (
                type(t) is tuple
                and type(payload) is bytes
                and len(payload) <= MAX_PAYLOAD_BYTES
                and len(t[2]) <= MAX_SOURCE_CHARS
                and (
                    payload.count(b"[") + payload.count(b"{") <= MAX_DEPTH
                    or nesting_depth(payload) <= MAX_DEPTH
                )
            ):
                try:
                    obj = loads(payload)
                except orjson.JSONDecodeError:
                    obj = None
                if type(obj) is dict and obj.keys() == _HEADER_KEYS:
                    v, collector, seq = obj["v"], obj["collector"], obj["seq"]
                    samples = obj["samples"]
                    tsv = obj["ts"]
                    ts_type = type(tsv)
                    ts_us = None
                    if ts_type is str:
                        ts_us = ts_cache.get(tsv)
                        if ts_us is None:
                            with contextlib.suppress(TimestampError):
                                ts_us = self._ts_us(tsv)  # parses and remembers it
                    elif (ts_type is float or ts_type is int) and TS_MIN_S <= tsv < TS_MAX_S:
                        ts_us = timedelta(seconds=tsv) // _ONE_US  # as parse_timestamp rounds
                    if (
                        ts_us is not None
                        and type(v) is int
                        and v == version
                        and type(collector) is str
                        and 0 < len(collector) <= MAX_COLLECTOR_CHARS
                        and obj["source"] == t[2]
                        and type(seq) is int
                        and 0 <= seq <= INT64_MAX
                        and type(samples) is list
                        and 0 < len(samples) <= MAX_SAMPLES
                        and lo_ <= ts_us <= hi_
                        and dumps(obj) == payload
                    ):
                        kind = t[1]
                        per_kind.setdefault(kind, []).append(
                            (i, kind, t[2], collector, seq, ts_us, samples)
                        )
                        continue
            try:
                d = decode(topic, payload, self.site)  # names the reason, or accepts it
                kind, source, collector, seq = d.kind, d.source, d.collector, d.seq
                ts_us, samples = _us(d.ts), d.samples
                self._check_window(ts_us, lo, hi)
            except ContractError as e:
                refused.append((i, e))
                continue
            per_kind.setdefault(kind, []).append((i, kind, source, collector, seq, ts_us, samples))
        messages: list[BatchMessage] = []
        columns: dict[str, dict[str, Any]] = {}
        extras: dict[str, list[Any]] = {
            n: [] for n in ("ts", "kind", "source", "id", "quantity", "value")
        }
        for kind in {**per_kind, **fast_parts}:
            msgs = per_kind.get(kind, [])
            checked = None
            while msgs:
                result = self._kind_columns(kind, msgs, lo, hi)
                if isinstance(result, tuple):
                    checked = result
                    break
                # some messages failed a column check: refuse them, check the rest again
                for m in msgs:
                    if m[0] in result:
                        refused.append((m[0], self._why(items[m[0]], result[m[0]])))
                msgs = [m for m in msgs if m[0] not in result]
            parts = fast_parts.get(kind, [])
            dups: set[int] = set()
            if is_new is not None or dedup is not None:
                keys: Any = [(m[0], m[2], m[4], m[5]) for m in msgs]
                for part in parts:
                    keys = keys + part.keys() if keys else part.keys()
                if len(parts) + bool(msgs) > 1:
                    keys.sort()
                if dedup is not None:
                    dups = set(dedup(kind, keys))
                else:
                    dups = {k[0] for k in keys if not is_new(kind, k[1], k[2], k[3])}
            if dups:  # valid, but stored before (or earlier in this batch)
                duplicates.extend(sorted(dups))
            kind_cols = []
            if checked is not None:
                cols, ext, row_msg, ext_msg = checked
                if dups:
                    msgs = [m for m in msgs if m[0] not in dups]
                    cols, ext = _drop_rows(cols, ext, row_msg, ext_msg, dups)
                    row_msg = [r for r in row_msg if r not in dups]
                if msgs:
                    kind_cols.append((cols, row_msg))
                    for k, vals in ext.items():
                        extras[k].extend(vals)
                messages.extend(
                    BatchMessage(m[0], kind, m[2], m[3], m[4], m[5], len(m[6])) for m in msgs
                )
            for part in parts:
                if dups:
                    part = part.without(dups)
                if part.index:
                    kind_cols.append((part.cols, part.row_msg))
                    messages.extend(part.messages(kind))
            if kind_cols:
                columns[kind] = _concat_columns(kind_cols)
        messages.sort(key=lambda m: m.index)
        return DecodedBatch(messages, columns, extras, refused, duplicates)

    def _arrow_parts(
        self, items: list[tuple[str, bytes]], lo_: int, hi_: int
    ) -> tuple[dict[str, list[_ArrowPart]], list[int]]:
        """The Arrow-checked parts of ``items`` per kind, and the indices (sorted) of the
        messages left to the per-message path (unknown topic shapes, oversized or non-bytes
        payloads, and whatever the Arrow parts could not vouch for)."""
        topics = self._topics
        fast: dict[str, tuple[list[int], list[str]]] = {}
        slow: list[int] = []
        for i, (topic, payload) in enumerate(items):
            t = topics.get(topic) or self._known_topic(topic)
            if (
                type(t) is tuple
                and type(payload) is bytes
                and len(payload) <= MAX_PAYLOAD_BYTES
                and len(t[2]) <= MAX_SOURCE_CHARS
            ):
                idx_src = fast.get(t[1])
                if idx_src is None:
                    idx_src = fast[t[1]] = ([], [])
                idx_src[0].append(i)
                idx_src[1].append(t[2])
            else:
                slow.append(i)
        fast_parts: dict[str, list[_ArrowPart]] = {}
        for kind, (idx, srcs) in fast.items():
            parts, rest = _ArrowPart.split(self, kind, items, idx, srcs, lo_, hi_)
            if parts:
                fast_parts[kind] = parts
            slow.extend(rest)
        slow.sort()
        return fast_parts, slow

    @staticmethod
    def _check_window(ts_us: int, lo: int | None, hi: int | None, where: str = "ts") -> None:
        if hi is not None and ts_us > hi:
            raise ContractError(
                "ts_future", f"{where} {_iso_us(ts_us)} is after the latest accepted {_iso_us(hi)}"
            )
        if lo is not None and ts_us < lo:
            raise ContractError(
                "ts_past", f"{where} {_iso_us(ts_us)} is before the earliest accepted {_iso_us(lo)}"
            )

    def _why(self, item: tuple[str, bytes], fast_detail: str) -> ContractError:
        """The reason for a message the column checks refused: decode()'s, else the checks'."""
        try:
            decode(item[0], item[1], self.site)
        except ContractError as e:
            return e
        # decode() accepts what the column checks refused: a sample timestamp outside the
        # ingest's window (decode() has no window), or a disagreement between the two paths.
        reason, _, detail = fast_detail.partition(": ")
        return ContractError(reason if reason in DEAD_LETTER_REASONS else "wrong_type", detail)

    def _kind_columns(
        self,
        kind: str,
        msgs: list[tuple[int, str, str, str, int, int, list]],
        lo: int | None,
        hi: int | None,
    ) -> Any:
        """Columns of one kind's samples; or {message index: detail} of the messages to refuse
        (then the caller drops them and calls again)."""
        quantities = QUANTITIES[kind]
        rows: list[Any] = []
        row_msg: list[int] = []
        for m in msgs:
            rows.extend(m[6])
            row_msg.extend([m[0]] * len(m[6]))
        n = len(rows)
        bad: dict[int, str] = {}

        def refuse(row_indices: Any, detail: str) -> None:
            for r in row_indices:
                bad.setdefault(row_msg[r], detail)

        if set(map(type, rows)) != {dict}:
            refuse([r for r, s in enumerate(rows) if type(s) is not dict], "wrong_type: sample")
            return bad
        allowed = SAMPLE_KEYS[kind]
        n_keys = np.fromiter(map(len, rows), dtype=np.int64, count=n)
        refuse(np.flatnonzero(n_keys > MAX_SAMPLE_KEYS), "too_many_quantities: sample keys")
        keys: set[str] = set().union(*rows)
        ids = list(map(dict.get, rows, itertools.repeat("id")))
        if set(map(type, ids)) != {str}:
            refuse([r for r, v in enumerate(ids) if type(v) is not str], "wrong_type: sample id")
        else:
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=n)
            refuse(
                np.flatnonzero((lengths < 1) | (lengths > MAX_ID_CHARS)),
                "wrong_type: sample id length",
            )
        # timestamps: the message's, or the sample's own
        counts = np.fromiter(map(len, (m[6] for m in msgs)), dtype=np.int64, count=len(msgs))
        ts = np.repeat(np.fromiter((m[5] for m in msgs), dtype=np.int64, count=len(msgs)), counts)
        if "ts" in keys:
            for r, s in enumerate(rows):
                v = s.get("ts")
                if v is None:
                    continue
                try:
                    us = self._ts_us(v)
                    self._check_window(us, lo, hi, "sample ts")
                except (TimestampError, TypeError):
                    refuse([r], "bad_timestamp: sample ts")
                    continue
                except ContractError as e:
                    refuse([r], f"{e.reason}: {e.detail}")
                    continue
                ts[r] = us
        cols: dict[str, Any] = {}
        if not bad and "ts" not in keys and keys <= allowed:
            fast = _uniform_columns(kind, rows, keys, n)
            if fast is not None:
                cols = fast
        for name, q in quantities.items():
            if name in cols:
                continue
            if name not in keys:
                cols[name] = pa.nulls(n, pa.int64() if q.integer else pa.float64())
                continue
            col = [s.get(name) for s in rows]
            types = set(map(type, col))
            if q.integer:
                if not types <= _INT_TYPES:
                    refuse(
                        [r for r, v in enumerate(col) if type(v) not in _INT_TYPES],
                        f"wrong_type: {name}",
                    )
                    continue
                try:
                    arr = pa.array(col, type=pa.int64())
                except (OverflowError, pa.ArrowInvalid):
                    refuse(
                        [r for r, v in enumerate(col) if v is not None and not _int64(v)],
                        f"out_of_range: {name}",
                    )
                    continue
                if arr.null_count < n:  # int64 already: the rule's sign (a null reads as 0)
                    _, negative, beyond = value_breaks(q, arr.fill_null(0).to_numpy())
                    refuse(np.flatnonzero(negative), f"negative_value: {name}")
                    refuse(np.flatnonzero(beyond), f"out_of_range: {name}")
                cols[name] = arr
            else:
                if not types <= _FLOAT_TYPES:
                    refuse(
                        [r for r, v in enumerate(col) if type(v) not in _FLOAT_TYPES],
                        f"wrong_type: {name}",
                    )
                    continue
                try:
                    vals = np.array(col, dtype=np.float64)
                except OverflowError:
                    refuse(
                        [r for r, v in enumerate(col) if type(v) is int and abs(v) > 1e300],
                        f"out_of_range: {name}",
                    )
                    continue
                missing = np.isnan(vals)  # JSON has no NaN (orjson refuses it): a null
                non_finite, negative, beyond = value_breaks(q, vals)
                refuse(np.flatnonzero(non_finite & ~missing), f"non_finite: {name}")
                refuse(np.flatnonzero(negative), f"negative_value: {name}")
                refuse(np.flatnonzero(beyond), f"out_of_range: {name}")
                cols[name] = pa.array(vals, mask=missing if missing.any() else None)
        ext: dict[str, list[Any]] = {}
        ext_msg: list[int] = []
        if not keys <= allowed:  # some sample has quantities the contract does not name
            ext, ext_msg = _extra_rows(kind, msgs, rows, row_msg, ts, ids, refuse, bad)
        else:
            ext = {k: [] for k in ("ts", "kind", "source", "id", "quantity", "value")}
        if bad:
            return bad
        srcs = [m[2] for m in msgs]
        counts = [len(m[6]) for m in msgs]
        out = {
            "ts": pa.array(ts, type=pa.timestamp("us", tz="UTC")),
            "source": pa.array(srcs, type=pa.string()).take(
                pa.array(np.repeat(np.arange(len(msgs)), counts))
            ),
            "id": pa.array(ids, type=pa.string()),
            **cols,
        }
        return out, ext, row_msg, ext_msg


def _extra_rows(
    kind: str,
    msgs: list[tuple[int, str, str, str, int, int, list]],
    rows: list[dict],
    row_msg: list[int],
    ts: Any,
    ids: list[Any],
    refuse: Any,
    bad: dict[int, str],
) -> tuple[dict[str, list[Any]], list[int]]:
    """The rows of ``extra_readings`` (quantities the contract does not name) of one kind's
    samples, and each row's message; a bad value or name is refused per row (``refuse``), a
    message past :data:`MAX_EXTRA_VALUES` marked in ``bad``."""
    allowed = SAMPLE_KEYS[kind]
    ext: dict[str, list[Any]] = {k: [] for k in ("ts", "kind", "source", "id", "quantity", "value")}
    ext_msg: list[int] = []
    sources = None
    for r, s in enumerate(rows):
        if s.keys() <= allowed:
            continue
        if sources is None:
            sources = {m[0]: m[2] for m in msgs}
        for name, v in s.items():
            if name in allowed:
                continue
            why = extra_refusal(kind, name, v)
            if why is not None:
                refuse([r], why)
                continue
            ext["ts"].append(int(ts[r]))
            ext["kind"].append(kind)
            ext["source"].append(sources[row_msg[r]])
            ext["id"].append(ids[r])
            ext["quantity"].append(name)
            ext["value"].append(float(v))
            ext_msg.append(row_msg[r])
    for m, count in Counter(ext_msg).items():
        if count > MAX_EXTRA_VALUES:
            bad.setdefault(m, f"too_many_extras: {count} values")
    return ext, ext_msg


def _drop_rows(
    cols: dict[str, Any],
    ext: dict[str, list[Any]],
    row_msg: list[int],
    ext_msg: list[int],
    drop: set[int],
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The columns and extras without the rows of the messages in ``drop``."""
    keep = pa.array(~np.isin(np.asarray(row_msg), np.fromiter(drop, dtype=np.int64)))
    cols = {name: arr.filter(keep) for name, arr in cols.items()}
    if ext_msg:
        idx = [j for j, m in enumerate(ext_msg) if m not in drop]
        ext = {k: [vals[j] for j in idx] for k, vals in ext.items()}
    return cols, ext


def _plain(payload: bytes) -> bool:
    """Whether the Arrow path may parse ``payload``: one JSON object on one line, ASCII (Arrow's
    parser does not check UTF-8), no backslash and no NUL. Without a backslash every quote
    delimits a string, so the payload holds two quotes per key and per string value, which
    _ArrowPart compares with the keys and strings that Arrow parsed (a repeated key, or a key
    whose value is null, sends the message to the other path)."""
    return (
        payload[:1] == b"{"
        and payload[-1:] == b"}"
        and payload.isascii()
        and b"\n" not in payload
        and b"\\" not in payload
        and b"\r" not in payload
        and b"\0" not in payload
    )


def _plain_joined(buf: bytes, payloads: list[bytes]) -> bool:
    """``all(map(_plain, payloads))`` for ``buf``, the payloads joined by newlines (a few
    single-byte scans of the whole buffer, and the first and last byte of each payload)."""
    if not (
        buf.isascii()
        and b"\\" not in buf
        and b"\r" not in buf
        and b"\0" not in buf
        and buf.count(b"\n") == len(payloads) - 1
    ):
        return False
    lens = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    if not (lens > 0).all():
        return False
    ends = np.cumsum(lens + 1) - 1  # where each payload's newline is (or would be)
    raw = np.frombuffer(buf, dtype=np.uint8)
    return bool((raw[ends - lens] == ord("{")).all() and (raw[ends - 1] == ord("}")).all())


_ARROW_SCHEMAS: dict[str, Any] = {}


def _arrow_parse_options(kind: str) -> Any:
    """pyarrow.json options that take exactly the contract's fields of ``kind`` and fail on any
    other field, on a value of another JSON type, or on an integer field written as a float."""
    opts = _ARROW_SCHEMAS.get(kind)
    if opts is None:
        fields = [pa.field("id", pa.string())] + [
            pa.field(name, pa.int64() if q.integer else pa.float64())
            for name, q in QUANTITIES[kind].items()
        ]
        schema = pa.schema(
            [
                ("v", pa.int64()),
                ("collector", pa.string()),
                ("source", pa.string()),
                ("seq", pa.int64()),
                ("ts", pa.string()),
                ("samples", pa.list_(pa.struct(fields))),
            ]
        )
        opts = _ARROW_SCHEMAS[kind] = pj.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="error"
        )
    return opts


class _ArrowPart:
    """The messages of one kind that pyarrow.json parsed and the contract's checks accepted,
    as columns: no Python object per value. :meth:`build` sends every message it cannot vouch
    for (a parse error anywhere in the kind: all of them) to the per-message path, which names
    the reason or accepts it; so this path only ever accepts what that path accepts."""

    __slots__ = ("collector", "cols", "index", "n", "row_msg", "seq", "source", "ts_us")

    def __init__(self, **kw: Any):
        for k, v in kw.items():
            setattr(self, k, v)

    #: A run of messages that Arrow cannot parse is split in halves down to this size (one
    #: bad message costs about two parses of the rest), then left to the per-message path.
    SPLIT_MIN = 64

    @classmethod
    def split(
        cls,
        decoder: BatchDecoder,
        kind: str,
        items: list[tuple[str, bytes]],
        idx: list[int],
        srcs: list[str],
        lo: int,
        hi: int,
        deep_checked: bool = False,
    ) -> tuple[list[_ArrowPart], list[int]]:
        """The accepted parts of the messages ``idx`` (topic sources ``srcs``), in item order,
        and the item indices left to the per-message path. When Arrow cannot parse them, the
        payloads nested deeper than MAX_DEPTH (found in one numpy pass) are left out first:
        those alone then cost one more parse, not a split down to SPLIT_MIN around each."""
        part, rest, parsed = cls.build(decoder, kind, items, idx, srcs, lo, hi)
        if parsed or len(idx) < 2 * cls.SPLIT_MIN:
            return ([part] if part is not None else []), rest
        if not deep_checked:
            deep = _deep_lines([items[i][1] for i in idx])
            if deep is not None:
                keep = [j for j, d in enumerate(deep) if not d]
                parts, rest = cls.split(
                    decoder,
                    kind,
                    items,
                    [idx[j] for j in keep],
                    [srcs[j] for j in keep],
                    lo,
                    hi,
                    deep_checked=True,
                )
                return parts, rest + [i for i, d in zip(idx, deep, strict=True) if d]
        h = len(idx) // 2
        a, rest_a = cls.split(decoder, kind, items, idx[:h], srcs[:h], lo, hi, True)
        b, rest_b = cls.split(decoder, kind, items, idx[h:], srcs[h:], lo, hi, True)
        return a + b, rest_a + rest_b

    @classmethod
    def build(
        cls,
        decoder: BatchDecoder,
        kind: str,
        items: list[tuple[str, bytes]],
        idx: list[int],
        srcs: list[str],
        lo: int,
        hi: int,
    ) -> tuple[_ArrowPart | None, list[int], bool]:
        """(the accepted part or None, the item indices left to the per-message path, whether
        Arrow parsed the messages at all)."""
        payloads = [items[i][1] for i in idx]
        buf = b"\n".join(payloads)
        rest: list[int] = []
        if not _plain_joined(buf, payloads):  # some are not: take the others
            plain = [_plain(p) for p in payloads]
            rest = list(itertools.compress(idx, (not x for x in plain)))
            idx = list(itertools.compress(idx, plain))
            srcs = list(itertools.compress(srcs, plain))
            payloads = list(itertools.compress(payloads, plain))
            if not idx:
                return None, rest, True
            buf = b"\n".join(payloads)
        try:
            table = pj.read_json(
                pa.BufferReader(buf),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(buf) + 1),
                parse_options=_arrow_parse_options(kind),
            )
        except (pa.ArrowException, ValueError, OverflowError):
            return None, rest + idx, False
        m = len(idx)
        if table.num_rows != m:  # cannot be (one object per line), but if it were
            return None, rest + idx, False

        def col(name: str) -> Any:
            return table.column(name).combine_chunks()

        def true(arr: Any) -> Any:
            return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)

        ok = true(pc.equal(col("v"), CONTRACT_VERSION))
        n_coll = pc.utf8_length(col("collector")).fill_null(0).to_numpy(zero_copy_only=False)
        ok &= (n_coll >= 1) & (n_coll <= MAX_COLLECTOR_CHARS)
        want_src = pa.array(srcs, pa.string())
        source = col("source")
        ok &= true(pc.equal(source, want_src))
        seq = col("seq")
        ok &= true(pc.greater_equal(seq, 0))
        # message timestamps: each distinct text parsed once (and remembered by the decoder)
        ts_text = col("ts").dictionary_encode()
        words = ts_text.dictionary.to_pylist()
        us = np.zeros(len(words) + 1, dtype=np.int64)
        good = np.zeros(len(words) + 1, dtype=bool)
        for j, w in enumerate(words):
            with contextlib.suppress(TimestampError):
                us[j] = decoder._ts_us(w)
                good[j] = lo <= us[j] <= hi
        codes = ts_text.indices.fill_null(len(words)).to_numpy(zero_copy_only=False)
        ts_us = us[codes]
        ok &= good[codes]
        samples = col("samples")
        lengths = pc.list_value_length(samples).fill_null(0).to_numpy(zero_copy_only=False)
        ok &= (lengths >= 1) & (lengths <= MAX_SAMPLES)
        rows = samples.flatten()
        n = len(rows)
        if n != int(lengths.sum()):
            return None, rest + idx, True
        row_pos = np.repeat(np.arange(m), lengths)
        row_bad = ~np.asarray(rows.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        ids = rows.field("id")
        n_id = pc.utf8_length(ids).fill_null(0).to_numpy(zero_copy_only=False)
        row_bad |= (n_id < 1) | (n_id > MAX_ID_CHARS)
        keys = np.zeros(n, dtype=np.int64)  # keys with a value in each sample
        cols: dict[str, Any] = {}
        for name, q in QUANTITIES[kind].items():
            arr = rows.field(name)
            if arr.null_count == n:
                cols[name] = arr
                continue
            valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            keys += valid
            # a null reads as NaN (non-finite, masked by valid); a valid NaN is a NaN token
            non_finite, _, beyond = value_breaks(q, arr.to_numpy(zero_copy_only=False))
            row_bad |= valid & (non_finite | beyond)
            cols[name] = arr
        keys += 2 * (n_id > 0)  # the id: a key and a string
        # strings (keys and string values) that Arrow parsed with a value, per message
        per_msg = np.bincount(row_pos, weights=keys, minlength=m).astype(np.int64)
        for name in _HEADER_KEYS:
            valid = np.asarray(col(name).is_valid().to_numpy(zero_copy_only=False), bool)
            per_msg += valid * (2 if name in ("collector", "source", "ts") else 1)
        # each payload has at least 2 * per_msg quotes (see _plain): equal sums, equal counts
        if buf.count(b'"') != 2 * int(per_msg.sum()):
            found = np.fromiter((p.count(b'"') for p in payloads), dtype=np.int64, count=m)
            ok &= 2 * per_msg == found
        if row_bad.any():
            ok &= np.bincount(row_pos, weights=row_bad, minlength=m) == 0
        idx_arr = np.asarray(idx, dtype=np.int64)
        rest += idx_arr[~ok].tolist()
        if not ok.any():
            return None, rest, True
        row_msg = idx_arr[row_pos]
        if not ok.all():
            keep_rows = ok[row_pos]
            mask = pa.array(keep_rows)
            cols = {k: v.filter(mask) for k, v in cols.items()}
            ids = ids.filter(mask)
            row_msg = row_msg[keep_rows]
            row_pos = row_pos[keep_rows]
        sources = want_src if ok.all() else want_src.filter(pa.array(ok))
        keep = np.flatnonzero(ok)
        part = cls(
            index=idx_arr[keep].tolist(),
            source=sources.to_pylist(),
            collector=col("collector").take(pa.array(keep)).to_pylist(),
            seq=seq.take(pa.array(keep)).to_pylist(),
            ts_us=ts_us[keep].tolist(),
            n=lengths[keep].tolist(),
            row_msg=row_msg,
            cols={
                "ts": pa.array(ts_us[row_pos], type=pa.timestamp("us", tz="UTC")),
                "source": want_src.take(pa.array(row_pos)),
                "id": ids,
                **cols,
            },
        )
        return part, rest, True

    def keys(self) -> list[tuple[int, str, int, int]]:
        """(item index, source, seq, ts [us]) of each message, for the dedup."""
        return list(zip(self.index, self.source, self.seq, self.ts_us, strict=True))

    def messages(self, kind: str) -> list[BatchMessage]:
        return list(
            map(
                BatchMessage,
                self.index,
                itertools.repeat(kind),
                self.source,
                self.collector,
                self.seq,
                self.ts_us,
                self.n,
            )
        )

    def without(self, drop: set[int]) -> _ArrowPart:
        """This part less the messages of the item indices ``drop``."""
        keep = [j for j, i in enumerate(self.index) if i not in drop]
        keep_rows = ~np.isin(self.row_msg, np.fromiter(drop, dtype=np.int64))
        mask = pa.array(keep_rows)
        return _ArrowPart(
            index=[self.index[j] for j in keep],
            source=[self.source[j] for j in keep],
            collector=[self.collector[j] for j in keep],
            seq=[self.seq[j] for j in keep],
            ts_us=[self.ts_us[j] for j in keep],
            n=[self.n[j] for j in keep],
            row_msg=self.row_msg[keep_rows],
            cols={k: v.filter(mask) for k, v in self.cols.items()},
        )


def _concat_columns(parts: list[tuple[dict[str, Any], Any]]) -> dict[str, Any]:
    """The columns of one kind from both paths, rows in the order of their messages' items."""
    if len(parts) == 1:
        return parts[0][0]
    names = list(parts[0][0])
    cols = {k: pa.concat_arrays([p[0][k].cast(parts[0][0][k].type) for p in parts]) for k in names}
    order = np.argsort(
        np.concatenate([np.asarray(p[1], dtype=np.int64) for p in parts]), kind="stable"
    )
    take = pa.array(order)
    return {k: v.take(take) for k, v in cols.items()}


def _uniform_columns(kind: str, rows: list[dict], keys: set[str], n: int) -> dict[str, Any] | None:
    """The quantity columns of samples that all carry the same keys, in a few C-level passes
    (one to take the values, one to check their types, one numpy conversion); None when any
    value needs the per-column checks, which then name the offender."""
    if set(map(len, rows)) != {len(keys)}:  # some sample lacks a key: per column
        return None
    quantities = QUANTITIES[kind]
    floats = [q for q in quantities if q in keys and not quantities[q].integer]
    ints = [q for q in quantities if q in keys and quantities[q].integer]
    out: dict[str, Any] = {}
    if floats:
        if len(floats) > 1:
            values: list[Any] = list(map(operator.itemgetter(*floats), rows))
            types = set(map(type, itertools.chain.from_iterable(values)))
        else:
            values = [s[floats[0]] for s in rows]
            types = set(map(type, values))
        if not types <= _FLOAT_TYPES:
            return None
        try:
            block = np.array(values, dtype=np.float64).reshape(n, len(floats)).T
        except (OverflowError, TypeError, ValueError):
            return None
        for j, q in enumerate(floats):
            if value_breaks(quantities[q], block[j])[2].any():  # NaN (a null) breaks no range
                return None
        missing = np.isnan(block)
        any_missing = missing.any(axis=1)
        for j, q in enumerate(floats):
            col = np.ascontiguousarray(block[j])
            out[q] = pa.array(col, mask=missing[j] if any_missing[j] else None)
    for q in ints:
        col = [s[q] for s in rows]
        if not set(map(type, col)) <= _INT_TYPES:
            return None
        try:
            arr = pa.array(col, type=pa.int64())
        except (OverflowError, pa.ArrowInvalid):
            return None
        if arr.null_count < n and value_breaks(quantities[q], _pc_min(arr))[2]:
            return None  # int64 already: only its least value can break the rule
        out[q] = arr
    return out


def _pc_min(arr: Any) -> Any:
    return pc.min(arr).as_py()


def _int64(v: int) -> bool:
    return type(v) is int and -INT64_MAX - 1 <= v <= INT64_MAX


def _iso_us(us: int) -> str:
    try:
        return (_EPOCH + timedelta(microseconds=us)).isoformat().replace("+00:00", "Z")
    except OverflowError:
        return f"{us} us"


__all__ = ["BatchDecoder", "BatchMessage", "DecodedBatch"]
