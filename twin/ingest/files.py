"""Load telemetry without a broker: JSONL files of MQTT messages, or exported Parquet bundles.

A JSONL line is ``{"topic": "...", "payload": {...}}``; ``payload`` may also be a string holding
the raw message text. A line that is not such an object is dead-lettered with the file and line
in place of the topic, and loading goes on.

A bundle is a directory written by ``dctwin export`` (``kind=<kind>/day=<day>/*.parquet``); its
rows are regrouped into contract messages (one per source and timestamp) and sent through the
same ingest path as live data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from collectors.contract import KINDS, QUANTITIES, encode, topic_for
from twin.ingest.ingester import Ingester
from twin.store.reads import bundle_rows

CHUNK = 20_000
Progress = Callable[[int], None]


def iter_jsonl(path: Path) -> Iterator[tuple[str, bytes]]:
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            where = f"file:{path}:{lineno}"
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                yield where, line  # dead-lettered as bad_topic, raw line kept
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("topic"), str):
                yield where, line
                continue
            payload = obj.get("payload")
            if isinstance(payload, str):
                yield obj["topic"], payload.encode()
                continue
            try:
                raw = orjson.dumps(payload)
            except TypeError:  # nested past what orjson writes: the line, dead-lettered by reason
                raw = line
            yield obj["topic"], raw


def iter_bundle(path: Path, site_name: str) -> Iterator[tuple[str, bytes]]:
    for kind in KINDS:
        files = sorted((path / f"kind={kind}").glob("**/*.parquet"))
        if not files:
            continue
        cols = list(QUANTITIES[kind])
        seqs: dict[str, int] = {}
        current: tuple[str, int] | None = None
        samples: list[dict] = []
        for rows in bundle_rows(files, cols):
            for ts_us, source, sid, *values in rows:
                key = (source, ts_us)
                if key != current and samples and current is not None:
                    yield _bundle_message(site_name, kind, current, samples, seqs)
                    samples = []
                current = key
                sample = {"id": sid}
                sample.update({c: v for c, v in zip(cols, values, strict=True) if v is not None})
                samples.append(sample)
        if samples and current is not None:
            yield _bundle_message(site_name, kind, current, samples, seqs)


def _bundle_message(
    site: str, kind: str, key: tuple[str, int], samples: list[dict], seqs: dict[str, int]
) -> tuple[str, bytes]:
    source, ts_us = key
    seq = seqs.get(source, 0)
    seqs[source] = seq + 1
    payload = encode(collector="bundle", source=source, seq=seq, ts=ts_us / 1e6, samples=samples)
    return topic_for(site, kind, source), payload


def ingest_path(
    ingester: Ingester, path: Path, site_name: str, progress: Progress | None = None
) -> int:
    """Ingest a JSONL file or a bundle directory; returns the number of messages read."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    source = iter_bundle(path, site_name) if path.is_dir() else iter_jsonl(path)
    chunk: list[tuple[str, bytes]] = []
    total = 0
    for item in source:
        chunk.append(item)
        if len(chunk) >= CHUNK:
            ingester.ingest_or_isolate(chunk)
            total += len(chunk)
            if progress:
                progress(len(chunk))
            chunk = []
    if chunk:
        ingester.ingest_or_isolate(chunk)
        total += len(chunk)
        if progress:
            progress(len(chunk))
    return total
