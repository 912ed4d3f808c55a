"""Poison benchmark (issue 28): hostile messages of every documented shape in a live stream.

A 1,000-GPU site polled at 1 Hz (``--nodes`` sources of ``--gpus`` GPUs each, one message per
source a second, 6 quantities a GPU) is published at QoS 1 through a real Mosquitto into
``dctwin serve`` (a subprocess, as operators run it), with ``--hostile-share`` (1 %) of the
messages hostile: one of each dead-letter reason a message can earn (``SHAPES``: every reason
of :data:`collectors.contract.DEAD_LETTER_REASONS` but ``store_rejected`` and
``ingest_error``, which no message should reach), in turn, each one unique (a dead letter
repeated byte for byte is kept once by design). For ``--duration`` seconds it samples the
service's ``dctwin_ingest_lag_seconds`` (``/metrics``) and the RSS of the service and its
receiver child; afterwards it reads the store: every good message stored once (ingest log and
gpu rows), every hostile one dead-lettered with its reason (by SHA-256 of its payload).

Then the nesting figure (``--nesting-rounds``): 6,000 good messages alone, and the same with 60
payloads nested 300 deep interleaved 1:100, each through (a) ``Ingester.ingest`` into a fresh
store (one process, no MQTT: thread CPU time, best of the rounds) and (b) the running service
(published as fast as the broker takes them, timed from the first publish until ``/metrics``
counts them all stored; median of the rounds, alternating). Target: nesting adds at most 5 %.

Targets: lag < 2 s and RSS < 1 GB throughout; every good message stored once; every hostile one
dead-lettered with its documented reason. Exit 1 when a target is missed.

    PYTHONPATH=. .venv/bin/python bench/bench_poison.py --duration 300 --json /tmp/poison.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collectors.contract import (  # noqa: E402
    DEAD_LETTER_REASONS,
    MAX_EXTRA_VALUES,
    MAX_PAYLOAD_BYTES,
    MAX_SAMPLE_KEYS,
    MAX_SAMPLES,
    encode,
    topic_for,
)
from collectors.mqtt import connect  # noqa: E402
from twin.broker import start_broker  # noqa: E402

SITE_FILE = REPO / "sample_telemetry" / "small_site.yaml"
SITE = "small"
QUANTITIES = {"power_w": 612.5, "temp_c": 61.0, "mem_temp_c": 70.0, "util_pct": 97.0}
QUANTITIES |= {"sm_active": 0.8, "energy_j": 1.5e9}


def now_s() -> float:
    return datetime.now(UTC).timestamp()


def good(node: int, seq: int, gpus: int, ts: float | None = None) -> tuple[str, bytes]:
    """One poll of a source, as the collectors write it (an RFC 3339 timestamp)."""
    src = f"bench-n{node:04d}"
    samples = [{"id": f"{src}:{g}", **QUANTITIES} for g in range(gpus)]
    when = datetime.fromtimestamp(now_s() if ts is None else ts, UTC)
    return topic_for(SITE, "gpu", src), encode(
        collector="bench", source=src, seq=seq, ts=when, samples=samples
    )


def _body(n: int, **over: object) -> dict:
    b: dict = {
        "v": 1,
        "collector": "hostile",
        "source": "evil-1",
        "seq": n,
        "ts": round(now_s(), 3),
        "samples": [{"id": "evil-1:0", "power_w": 1.0}],
    }
    b.update(over)
    return b


T = topic_for(SITE, "gpu", "evil-1")


def _dumps(b: dict) -> bytes:
    return orjson.dumps(b)


def _deep(n: int, depth: int = 300) -> bytes:
    head = _dumps(_body(n, samples=[]))[:-3]
    return head + b'[{"id":"evil-1:0","power_w":' + b"[" * depth + b"]" * depth + b"}]}"


#: reason -> a function of a unique number giving (topic, payload) that earns that reason
SHAPES = {
    "oversized": lambda n: (T, b'{"n":%d,"x":"' % n + b"x" * (MAX_PAYLOAD_BYTES + 16) + b'"}'),
    "bad_topic": lambda n: (f"dctwin/v1/{SITE}/gpu", _dumps(_body(n))),
    "unknown_kind": lambda n: (f"dctwin/v1/{SITE}/fan/evil-1", _dumps(_body(n))),
    "wrong_site": lambda n: ("dctwin/v1/elsewhere/gpu/evil-1", _dumps(_body(n))),
    "malformed_json": lambda n: (T, b'{"v":1,"seq":%d,' % n),
    "duplicate_key": lambda n: (T, _dumps(_body(n)).replace(b'"v":1,', b'"v":1,"v":1,')),
    "non_finite": lambda n: (T, _dumps(_body(n)).replace(b'"power_w":1.0', b'"power_w":NaN')),
    "bad_version": lambda n: (T, _dumps(_body(n, v=2))),
    "missing_field": lambda n: (T, _dumps({k: v for k, v in _body(n).items() if k != "ts"})),
    "wrong_type": lambda n: (T, _dumps(_body(n, samples=[[1, 2, 3]]))),
    "negative_value": lambda n: (T, _dumps(_body(n, samples=[{"id": "e:0", "power_w": -5.0}]))),
    "out_of_range": lambda n: (
        T,
        _dumps(_body(n)).replace(b'"seq":%d' % n, b'"seq":' + b"9" * 4401 + b"%d" % n),
    ),
    "bad_timestamp": lambda n: (T, _dumps(_body(n, ts="2026-W48-2T10:00:00Z"))),
    "ts_future": lambda n: (T, _dumps(_body(n, ts=now_s() + 86400))),
    "ts_past": lambda n: (T, _dumps(_body(n, ts=now_s() - 90 * 86400))),
    "source_mismatch": lambda n: (T, _dumps(_body(n, source="someone-else"))),
    "too_deep": lambda n: (T, _deep(n)),
    "too_many_samples": lambda n: (
        T,
        _dumps(_body(n, samples=[{"id": "e:0"}] * (MAX_SAMPLES + 1))),
    ),
    "too_many_quantities": lambda n: (
        T,
        _dumps(
            _body(n, samples=[{"id": "e:0", **{f"x{i}_w": 1.0 for i in range(MAX_SAMPLE_KEYS)}}])
        ),
    ),
    "too_many_extras": lambda n: (
        T,
        _dumps(
            _body(
                n,
                samples=[
                    {"id": f"e:{j}", **{f"x{i}_w": 1.0 for i in range(50)}}
                    for j in range(MAX_EXTRA_VALUES // 50 + 1)
                ],
            )
        ),
    ),
}
UNREACHABLE = {"store_rejected", "ingest_error"}  # no message should get these
assert set(SHAPES) | UNREACHABLE == set(DEAD_LETTER_REASONS), "a documented shape is missing"


class Serve:
    """`dctwin serve` on ``broker`` with its API; RSS of it and its children."""

    def __init__(self, broker: object, db: Path, log: Path):
        env = {**os.environ, **broker.client_env(), "PYTHONPATH": str(REPO)}  # type: ignore[attr-defined]
        self.log = log
        self.p = subprocess.Popen(
            [
                *(sys.executable, "-m", "twin.cli", "serve", "--broker", broker.address),  # type: ignore[attr-defined]
                *("--db", str(db), "--site", str(SITE_FILE), "--api-port", "0"),
                *("--calibrate-every", "0", "--detect-every", "0"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
            env=env,
            cwd=REPO,
        )
        deadline = time.monotonic() + 90
        while b"serving:" not in log.read_bytes():
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"dctwin serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        m = re.search(r"api: (http://127\.0\.0\.1:\d+)", log.read_text())
        assert m is not None
        self.api = httpx.Client(base_url=m.group(1), timeout=30)

    def metric(self, name: str) -> float:
        m = re.search(rf"^{name} (\S+)$", self.api.get("/metrics").text, re.M)
        return float(m.group(1)) if m else 0.0

    def rss(self) -> int:
        try:
            p = psutil.Process(self.p.pid)
            return p.memory_info().rss + sum(
                c.memory_info().rss for c in p.children(recursive=True)
            )
        except psutil.Error:
            return 0

    def stop(self) -> None:
        self.api.close()
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(120)


def publish_all(client: object, items: list[tuple[str, bytes]]) -> None:
    infos = [client.publish(t, p, qos=1) for t, p in items]  # type: ignore[attr-defined]
    for info in infos:
        info.wait_for_publish(120)


def stream(
    serve: Serve, client: object, args: argparse.Namespace
) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes, str]], dict]:
    """The live phase: ``args.duration`` s of polls with hostile messages mixed in."""
    goods: list[tuple[str, bytes]] = []
    bad: list[tuple[str, bytes, str]] = []
    lag: list[float] = []
    rss: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                lag.append(serve.metric("dctwin_ingest_lag_seconds"))
            rss.append(serve.rss())
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    reasons = list(SHAPES)
    n_bad = 0
    owed = 0.0
    t0 = time.monotonic()
    tick = 0
    while time.monotonic() - t0 < args.duration:
        ts = now_s()
        items = [good(i, tick, args.gpus, ts) for i in range(args.nodes)]
        goods.extend(items)
        owed += args.nodes * args.hostile_share
        while owed >= 1:  # hostile messages spread over the second's polls
            owed -= 1
            reason = reasons[n_bad % len(reasons)]
            topic, payload = SHAPES[reason](1_000_000 + n_bad)
            bad.append((topic, payload, reason))
            items.insert((n_bad * 37) % len(items), (topic, payload))
            n_bad += 1
        publish_all(client, items)
        tick += 1
        sleep = t0 + tick - time.monotonic()
        if sleep > 0:
            time.sleep(sleep)
    # drain: everything stored or dead-lettered
    want = len(goods)
    deadline = time.monotonic() + 120
    while serve.metric("dctwin_ingest_messages_stored_total") < want:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(2.0)
    stop.set()
    sampler.join(5)
    return goods, bad, {"lag_s": lag, "rss": rss, "ticks": tick, "elapsed_s": time.monotonic() - t0}


def check_store(db: Path, goods: list, bad: list) -> dict:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        n_log, n_keys = con.execute(
            "SELECT count(*), count(DISTINCT (source, seq, ts)) FROM ingest_log"
            " WHERE source LIKE 'bench-%'"
        ).fetchall()[0]
        gpu_rows = con.execute("SELECT count(*) FROM gpu WHERE source LIKE 'bench-%'").fetchall()[
            0
        ][0]
        dead = dict(con.execute("SELECT sha256, reason FROM dead_letters").fetchall())
        e2e = con.execute(
            "SELECT quantile_cont(epoch(received_at) - epoch(ts), [0.5, 0.99, 1.0])"
            " FROM ingest_log WHERE source LIKE 'bench-%'"
        ).fetchall()[0][0]
    finally:
        con.close()
    wrong: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    for _, payload, reason in bad:
        got = dead.get(hashlib.sha256(payload).hexdigest())
        if got is None:
            missing[reason] += 1
        elif got != reason:
            wrong[f"{reason}->{got}"] += 1
    return {
        "good_published": len(goods),
        "ingest_log_rows": n_log,
        "distinct_keys": n_keys,
        "gpu_rows": gpu_rows,
        "hostile_published": len(bad),
        "hostile_by_reason": dict(Counter(r for _, _, r in bad)),
        "hostile_missing": dict(missing),
        "hostile_wrong_reason": dict(wrong),
        "e2e_latency_s_p50_p99_max": e2e,
    }


def nesting_sets(seq0: int, gpus: int) -> tuple[list, list]:
    """6,000 good messages, and the same with 60 nested 300 deep interleaved 1:100."""
    ts = now_s()
    plain = [good(i % 125, seq0 + i // 125, gpus, ts + i // 125 * 1e-3) for i in range(6000)]
    mixed: list = []
    for i, item in enumerate(plain):
        mixed.append(item)
        if i % 100 == 99:
            mixed.append((T, _deep(seq0 + i)))
    return plain, mixed


def nesting_offline(rounds: int, gpus: int) -> dict:
    from twin.ingest import Ingester
    from twin.store import Store

    best: dict[str, float] = {}
    for r in range(rounds):
        plain, mixed = nesting_sets(10_000_000 + r * 100, gpus)
        for name, items in (("plain", plain), ("nested", mixed)):
            with tempfile.TemporaryDirectory() as d, Store(Path(d) / "n.duckdb") as store:
                ing = Ingester(store, None)
                t0 = time.thread_time()
                ing.ingest(items)
                cpu = time.thread_time() - t0
                assert ing.counters.stored_messages == 6000, ing.counters.as_dict()
                if name == "nested":
                    assert ing.counters.dead_letters == {"too_deep": 60}
            best[name] = min(best.get(name, cpu), cpu)
    return {"plain_cpu_s": best["plain"], "nested_cpu_s": best["nested"]}


def nesting_live(serve: Serve, client: object, rounds: int, gpus: int) -> dict:
    times: dict[str, list[float]] = {"plain": [], "nested": []}
    for r in range(rounds):
        plain, mixed = nesting_sets(20_000_000 + r * 100, gpus)
        # different sources per round and set: nothing is a duplicate
        order = (
            (("plain", plain), ("nested", mixed))
            if r % 2 == 0
            else (
                ("nested", mixed),
                ("plain", plain),
            )
        )
        for name, items in order:
            items = [
                (
                    t.replace("bench-n", f"nest{r}{name[0]}-n"),
                    p.replace(b"bench-n", f"nest{r}{name[0]}-n".encode()),
                )
                for t, p in items
            ]
            before = serve.metric("dctwin_ingest_messages_stored_total")
            t0 = time.monotonic()
            publish_all(client, items)
            while serve.metric("dctwin_ingest_messages_stored_total") < before + 6000:
                time.sleep(0.02)
            times[name].append(time.monotonic() - t0)
            time.sleep(1.0)
    return {
        "plain_s": times["plain"],
        "nested_s": times["nested"],
        "plain_median_s": statistics.median(times["plain"]),
        "nested_median_s": statistics.median(times["nested"]),
    }


def lookup_cost(rows: int) -> dict:
    """What the exactly-once check costs when it must look messages up: an ingest log of
    ``rows`` messages (125 sources at 1 Hz, received as they were sent), then keys behind
    every stream's marks and outside the memory of recent keys, looked up in one query
    (:meth:`twin.store.Store.stored_messages`, what :class:`twin.ingest.Ingester` runs once per
    batch that has such keys): 125 keys (a retained redelivery of one poll) and 20,000 (a
    chunk of a second import). Best wall time of 3; and a whole ingest of the 20,000 as
    duplicates (decode included) for scale."""
    import pyarrow as pa

    from twin.ingest import Ingester, IngestLimits
    from twin.store import Store

    out: dict = {"ingest_log_rows": rows}
    n_src = 125
    with tempfile.TemporaryDirectory() as d, Store(Path(d) / "l.duckdb") as store:
        t0 = float(int(now_s() - rows / n_src))  # whole seconds: as the JSON carries them
        store.con.execute(
            "INSERT INTO ingest_log SELECT 'bench-n' || lpad(CAST(i % 125 AS VARCHAR), 4, '0'),"
            " 'gpu', i // 125, to_timestamp(? + (i // 125)), to_timestamp(? + (i // 125)),"
            " 'bench', 8 FROM range(?) t(i)",
            [t0, t0, rows],
        )
        first = (rows // n_src) // 3  # a stretch in the middle of the history
        for n_keys in (125, 20_000):
            i = list(range(n_keys))
            keys = pa.table(
                {
                    "i": pa.array(i, pa.int64()),
                    "source": pa.array([f"bench-n{k % n_src:04d}" for k in i], pa.string()),
                    "seq": pa.array([first + k // n_src for k in i], pa.int64()),
                    "ts": pa.array(
                        [int((t0 + first + k // n_src) * 1e6) for k in i],
                        pa.timestamp("us", tz="UTC"),
                    ),
                }
            )
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                found = store.stored_messages("gpu", keys)
                best = min(best, time.perf_counter() - start)
            assert len(found) == n_keys, (len(found), n_keys)
            out[f"lookup_{n_keys}_keys_s"] = best
        ing = Ingester(store, None, IngestLimits(max_past_s=0, max_future_s=0))
        items = [
            good(k % n_src, first + k // n_src, 8, t0 + first + k // n_src) for k in range(20_000)
        ]
        start = time.perf_counter()
        ing.ingest(items)
        out["ingest_20000_duplicates_s"] = time.perf_counter() - start
        assert ing.counters.duplicates == 20_000 and ing.counters.dedup_lookups == 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=300.0, help="live phase [s] (default 300)")
    ap.add_argument("--nodes", type=int, default=125, help="sources, one message a second each")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per source (125 x 8 = 1,000)")
    ap.add_argument("--hostile-share", type=float, default=0.01, help="share of hostile messages")
    ap.add_argument("--nesting-rounds", type=int, default=3, help="rounds of the nesting figure")
    ap.add_argument(
        "--lookup-rows",
        type=int,
        default=0,
        help="also time the dedup's ingest-log lookup over a log of this many messages",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-poison-"))
    broker = start_broker("mosquitto", log_path=work / "broker.log")
    serve = Serve(broker, work / "p.duckdb", work / "serve.log")
    client = connect(broker.client_config(), f"bench-poison-{os.getpid()}")
    out: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.1f} GiB",
        "load_avg_start": os.getloadavg(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    try:
        print(f"live phase: {args.duration:.0f} s, {args.nodes} sources x {args.gpus} GPUs at 1 Hz")
        goods, bad, live = stream(serve, client, args)
        out["live"] = {
            "lag_max_s": max(live["lag_s"], default=None),
            "rss_max_mib": max(live["rss"], default=0) / 2**20,
            "ticks": live["ticks"],
            "elapsed_s": live["elapsed_s"],
        }
        if args.nesting_rounds:
            print(f"nesting: {args.nesting_rounds} rounds through the service ...")
            out["nesting_live"] = nesting_live(serve, client, args.nesting_rounds, args.gpus)
    finally:
        client.disconnect()
        client.loop_stop()
        serve.stop()
        broker.stop()
    out["load_avg_end"] = os.getloadavg()
    out["store"] = check_store(work / "p.duckdb", goods, bad)
    if args.nesting_rounds:
        print("nesting: offline ...")
        out["nesting_offline"] = nesting_offline(max(args.nesting_rounds, 3), args.gpus)
    if args.lookup_rows:
        print(f"dedup lookups over {args.lookup_rows:,} ingest-log rows ...")
        out["lookup_cost"] = lookup_cost(args.lookup_rows)
    s, lv = out["store"], out["live"]
    problems = []
    if lv["lag_max_s"] is None or lv["lag_max_s"] >= 2.0:
        problems.append(f"lag {lv['lag_max_s']} s >= 2 s")
    if lv["rss_max_mib"] >= 1024:
        problems.append(f"RSS {lv['rss_max_mib']:.0f} MiB >= 1 GiB")
    if not (s["ingest_log_rows"] == s["distinct_keys"] == s["good_published"]):
        problems.append("good messages not stored exactly once")
    if s["gpu_rows"] != s["good_published"] * args.gpus:
        problems.append("gpu rows != good messages x GPUs")
    if s["hostile_missing"] or s["hostile_wrong_reason"]:
        problems.append("hostile messages not dead-lettered with their reason")
    if args.nesting_rounds:
        off, liv = out["nesting_offline"], out["nesting_live"]
        out["nesting_added_offline_pct"] = 100 * (off["nested_cpu_s"] / off["plain_cpu_s"] - 1)
        out["nesting_added_live_pct"] = 100 * (liv["nested_median_s"] / liv["plain_median_s"] - 1)
    out["problems"] = problems
    print(json.dumps(out, indent=1, default=str))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
