#!/usr/bin/env python
"""Scale benchmark (issue 17 item 5) on sites made by ``dctwin site generate``.

Three modes, each writing one JSON file under bench/results/ and a summary on stdout:

``ingest`` (a): one shard-sized site (``--gpus``, default 25,000) at ``--rate`` (1 Hz). The
    simulator (``twin.simulator.SiteSimulator`` on the generated site, in ``--publishers``
    processes that each publish the topics of their hash share, so a source always comes from
    one process) publishes in real time at QoS 1 through a local mosquitto (free port, raised
    queue limits). Phase ``bare``: bench_ingest's bare paho subscriber counts the messages.
    Phase ``dctwin``: ``dctwin serve --site`` (ingest, detection, calibration, API) stores them;
    its ``/metrics`` is read every second. Reported: readings/s offered, received by the bare
    subscriber and stored by dctwin over the same window, their ratio, the ingest lag (wall
    time minus the newest stored GPU sample's time, every second), the service's peak RSS, and
    the exactly-once check on the store afterwards. ``--client raw`` (default) publishes through
    bench_ingest's raw MQTT client (a few us a message); ``paho`` as the simulator's own
    publisher does (about 150 us a message here: one process then cannot send a 25,000-GPU
    site at 1 Hz, see bench/README.md).

``passes`` (b): a store of ``--minutes`` of the generated site sampled every ``--step`` s,
    written by the simulator through the real Ingester (no MQTT); then, each in a fresh process
    (its peak RSS is the pass's): one detection pass (``twin.analysis.detect.detect``, as ``serve``
    runs it; a cold and a warm pass) and one calibration (``CalibrationScheduler.run_once``
    on the whole span, held-out share as ``serve``'s defaults).

``shards`` (c): ``--gpus 100000 --halls 4 --shards 4`` at ``--step 10`` s for ``--minutes``
    (30): one ``dctwin serve --site FILE --shard NAME`` per shard (each on its own DuckDB file
    and the port of its ``api_url``), the simulator publishing the whole site, and
    ``dctwin site-view --site FILE`` when that command exists. Every ``--step`` seconds: per
    shard the ingest lag and RSS; the site view's ``/api/v1/overview`` latency and the shards
    it showed stale. Each tick's lag is measured from its nominal time (``lag_s``, the target)
    and from when the simulator had published it (``lag_after_publish_s``: the twin's own,
    apart from a simulator that falls behind its schedule on a loaded machine). After the run,
    per shard: a detection pass and a calibration on its store over the shard's sub-site
    (``shard_view(site, name).site``, what ``serve --shard`` models; fresh processes, as in
    ``passes``), and the peak RSS of its service. Needs ``serve --shard`` (it checks
    ``dctwin serve --help``) and exits 2 with a message when it is missing.

``metrics`` (issue 30 item 7): a store built as in ``passes`` (``--minutes``, default 3 here:
    /metrics reads only the newest headroom report, not the history), one headroom report
    computed and stored as the service's detection pass stores it, then ``dctwin serve`` on it
    (detection and calibration off, so nothing else runs beside the scrapes) and
    ``--scrapes`` (7) reads of its ``/metrics``, then of ``/metrics?name[]=dctwin_headroom_celsius``
    and of ``match[]={__name__=~"dctwin_headroom_.*"}``, each timed from request to last byte.
    Target: <= 0.5 s a full scrape at 25,000 GPUs.

Targets (issue 17): ingest lag < 5 s in every shard throughout; detection per 25,000-GPU shard
<= 15 s; site overview <= 1 s; <= 4 GB per shard. Linux only (/proc for RSS).

Usage::

    python bench/bench_scale.py ingest --gpus 25000 --seconds 60
    python bench/bench_scale.py passes --gpus 25000 --minutes 30 --step 10
    python bench/bench_scale.py shards --gpus 100000 --halls 4 --shards 4 --minutes 30
    python bench/bench_scale.py metrics --gpus 25000 --minutes 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import bench_ingest  # noqa: E402  (the bare subscriber, the raw and paho publishers)

from twin.broker import free_port, start_broker  # noqa: E402
from twin.site import Site, load_site  # noqa: E402
from twin.site.generate import GenerateOptions, generate_site  # noqa: E402

DCTWIN = [sys.executable, "-m", "twin.cli"]
RESULTS = REPO / "bench" / "results"
TARGET_LAG_S = 5.0
TARGET_DETECT_S = 15.0
TARGET_OVERVIEW_S = 1.0
TARGET_RSS_MIB = 4096.0
TARGET_METRICS_S = 0.5


# ---- small helpers -----------------------------------------------------------------------------
def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
    }


def _rss_mib(pid: int, field: str = "VmHWM") -> float:
    """A process's peak (VmHWM) or current (VmRSS) resident set [MiB], from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def _peak_self_mib() -> float:
    """This process's peak RSS [MiB]: VmHWM, which starts afresh at exec (ru_maxrss on Linux
    keeps the forking parent's peak across fork and exec)."""
    return _rss_mib(os.getpid())


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """Prometheus text of ``url``/metrics as {name{labels}: value}."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer /healthz within {timeout_s:.0f} s")


def make_site(tmp: Path, gpus: int, halls: int, shards: int, seed: int) -> tuple[Path, Site]:
    gen = generate_site(GenerateOptions(gpus=gpus, halls=halls, shards=shards, seed=seed))
    path = tmp / f"site-{gpus}-{halls}h-{shards}s.yaml"
    path.write_text(gen.text)
    print(f"site: {path} {json.dumps(gen.summary)}", flush=True)
    return path, gen.site


def tick_profile(site: Site, rate_hz: float) -> dict[str, Any]:
    """Messages, samples and readings (quantities) of one simulator tick, per kind."""
    import orjson

    from twin.simulator import SiteSimulator

    sim = SiteSimulator(site, seed=0, start=datetime.now(UTC), rate_hz=rate_hz)
    sim.step()
    msgs: dict[str, int] = {}
    samples: dict[str, int] = {}
    readings: dict[str, int] = {}
    for topic, payload in sim.step():
        kind = topic.split("/")[3]
        body = orjson.loads(payload)
        msgs[kind] = msgs.get(kind, 0) + 1
        samples[kind] = samples.get(kind, 0) + len(body["samples"])
        readings[kind] = readings.get(kind, 0) + sum(
            sum(1 for k in s if k != "id") for s in body["samples"]
        )
    return {"messages": msgs, "samples": samples, "readings": readings}


# ---- the simulator publishing (child processes, forked: they share the parent's Site) ----------
def sim_publisher_main(
    q: Any,
    role: str,
    broker: dict[str, Any],
    site: Site,
    share: int,
    shares: int,
    client_kind: str,
    rate_hz: float,
    start_epoch: float,
    ticks: int,
    stop: Any,
) -> None:
    """Tick k at ``start_epoch + k / rate_hz`` (wall clock, and the samples' timestamp)."""
    from twin.simulator import SiteSimulator

    start = datetime.fromtimestamp(start_epoch, UTC)
    sim = SiteSimulator(site, seed=0, start=start, rate_hz=rate_hz)
    cls = bench_ingest.RawPublisher if client_kind == "raw" else bench_ingest.PahoPublisher
    pub = cls(broker, f"scale-{role}-{os.getpid()}")
    mine: dict[str, bool] = {}
    q.put(("ready", role, os.getpid()))
    published, behind = 0, []
    timeline = [(time.monotonic(), 0)]
    done_wall: list[float] = []  # when each tick's last message was acknowledged (wall)
    for k in range(ticks):
        wait = start_epoch + k / rate_hz - time.time()
        if wait > 0 and stop.wait(wait):
            break
        behind.append(max(0.0, -wait))
        for topic, payload in sim.step():
            ok = mine.get(topic)
            if ok is None:
                ok = mine[topic] = zlib.crc32(topic.encode()) % shares == share
            if ok:
                pub.publish(topic, payload)
                published += 1
                if pub.outstanding() >= 2000:
                    pub.wait_below(1000)
        pub.flush()
        done_wall.append(time.time())
        timeline.append((time.monotonic(), published))
        if stop.is_set():
            break
    unacked = pub.finish(120)
    q.put(
        (
            "result",
            role,
            {
                "published": published,
                "unacked": unacked,
                "ticks": len(behind),
                "behind_schedule_max_s": round(max(behind, default=0.0), 3),
                "behind_schedule_last_s": round(behind[-1] if behind else 0.0, 3),
                "cpu_s": round(sum(os.times()[:2]), 1),
                "timeline": timeline,
                "tick_done_wall": done_wall,
            },
        )
    )


class Publishers:
    """``n`` forked simulator processes publishing one site, each its hash share of topics."""

    def __init__(self, ctx: Any, broker: dict[str, Any], site: Site, args: argparse.Namespace):
        self.ctx, self.broker, self.site, self.args = ctx, broker, site, args
        self.q = ctx.Queue()
        self.inbox = bench_ingest.Inbox(self.q)
        self.stop = ctx.Event()
        self.procs: list[Any] = []

    def start(self, rate_hz: float, ticks: int, lead_s: float = 5.0) -> float:
        """Start them; returns the wall time of tick 0."""
        start_epoch = float(int(time.time() + lead_s))
        n = self.args.publishers
        for i in range(n):
            role = f"sim{i}"
            cargs = (self.broker, self.site, i, n, self.args.client, rate_hz, start_epoch, ticks)
            p = self.ctx.Process(
                target=bench_ingest._child,
                args=(self.q, role, sim_publisher_main, *cargs, self.stop),
                name=role,
            )
            p.start()
            self.procs.append((role, p))
        for role, _ in self.procs:
            self.inbox.get("ready", role, 120, [p for _, p in self.procs])
        if time.time() > start_epoch:
            print(f"warning: publishers ready {time.time() - start_epoch:.1f} s after tick 0")
        return start_epoch

    def results(self, timeout_s: float) -> dict[str, Any]:
        out = {
            role: self.inbox.get("result", role, timeout_s, [p for _, p in self.procs])
            for role, _ in self.procs
        }
        for _, p in self.procs:
            p.join(30)
        return out

    def kill(self) -> None:
        self.stop.set()
        for _, p in self.procs:
            if p.is_alive():
                p.join(5)
            if p.is_alive():
                p.terminate()


def _window_rate(timeline: list[tuple[Any, ...]], a: float, b: float, col: int = 1) -> float:
    return bench_ingest._rate(timeline, a, b, col)


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def tick_lags(
    rows: list[dict[str, Any]],
    start_epoch: float,
    rate_hz: float,
    gpus: int,
    ticks: int,
    dues: list[float] | None = None,
) -> list[float]:
    """Ingest lag of each tick: when the service had stored all of its ``gpus`` GPU samples
    (the first /metrics read that counts them) minus the tick's time (``dues[k]`` where given,
    e.g. when the simulator had published it); a tick never seen complete counts from its time
    to the last read."""
    out: list[float] = []
    i = 0
    for k in range(ticks):
        due = dues[k] if dues is not None and k < len(dues) else start_epoch + k / rate_hz
        need = (k + 1) * gpus
        while i < len(rows) and rows[i]["samples"].get("gpu", 0.0) < need:
            i += 1
        if i == len(rows):
            if rows and rows[-1]["wall"] > due:
                out.append(rows[-1]["wall"] - due)
            break
        out.append(max(0.0, rows[i]["wall"] - due))
    return out


def _lag_summary(lags: list[float]) -> dict[str, Any]:
    return {
        "ticks": len(lags),
        "p50": _pct(lags, 50),
        "p95": _pct(lags, 95),
        "max": max(lags, default=None),
        "share_under_5s": sum(x < TARGET_LAG_S for x in lags) / len(lags) if lags else None,
    }


# ---- dctwin serve ------------------------------------------------------------------------------
def start_serve(
    site: Path, broker: str, db: Path, port: int, log: Path, extra: list[str]
) -> subprocess.Popen:
    cmd = [
        *DCTWIN,
        "serve",
        "--site",
        str(site),
        "--broker",
        broker,
        "--db",
        str(db),
        "--api-port",
        str(port),
        "--client-id",
        f"scale-{db.stem}",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def stop_proc(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Monitor(threading.Thread):
    """Reads a service's /healthz every ``every_s``: samples stored per kind, ingest lag, RSS.

    Not /metrics: a 25,000-GPU shard exports ~37,000 headroom limits (4 series each, 13.6 MB),
    which took the service seconds to write out on a loaded machine (0.2-0.5 s since issue 30,
    mode ``metrics``); /healthz carries what the monitor needs in a few hundred bytes."""

    def __init__(self, url: str, pid: int, every_s: float):
        super().__init__(daemon=True, name=f"monitor-{url}")
        self.url, self.pid, self.every_s = url, pid, every_s
        self.rows: list[dict[str, Any]] = []
        self.errors = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = time.monotonic()
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=5.0) as r:
                    h = json.loads(r.read())
            except urllib.error.HTTPError as e:  # 503 (stalled) still carries the body
                h = json.loads(e.read() or b"{}")
            except Exception:  # a timeout, a reset, a half answer: count it, go on
                self.errors += 1
                h = None
            if h is not None:
                ingest = h.get("ingest") or {}
                self.rows.append(
                    {
                        "t": t,
                        "wall": time.time(),
                        "samples": {k: float(v) for k, v in (ingest.get("samples") or {}).items()},
                        "service_lag_s": ingest.get("lag_s"),
                        "rss_mib": _rss_mib(self.pid, "VmRSS"),
                    }
                )
            self.done.wait(max(0.0, self.every_s - (time.monotonic() - t)))


def serve_help_has(option: str) -> bool:
    r = subprocess.run([*DCTWIN, "serve", "--help"], capture_output=True, text=True, timeout=120)
    return option in r.stdout


def command_exists(name: str) -> bool:
    r = subprocess.run([*DCTWIN, name, "--help"], capture_output=True, text=True, timeout=120)
    return r.returncode == 0


# ---- (a) ingest --------------------------------------------------------------------------------
def run_ingest(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    site_path, site = make_site(tmp, args.gpus, 1, 0, args.seed)
    prof = tick_profile(site, args.rate)
    per_tick_msgs = sum(prof["messages"].values())
    per_tick_readings = sum(prof["readings"].values())
    readings_per_msg = per_tick_readings / per_tick_msgs
    ticks = int((args.warmup + args.seconds) * args.rate) + 1
    broker = start_broker("mosquitto")
    bcfg = {"host": broker.host, "port": broker.port}
    addr = f"{broker.host}:{broker.port}"
    out: dict[str, Any] = {
        "mode": "ingest",
        "gpus": args.gpus,
        "rate_hz": args.rate,
        "per_tick": prof,
        "offered_readings_s": per_tick_readings * args.rate,
        "offered_msgs_s": per_tick_msgs * args.rate,
        "publishers": args.publishers,
        "client": args.client,
    }
    try:
        if "bare" in args.phases:
            out["bare"] = _bare_phase(ctx, bcfg, site, args, ticks, readings_per_msg)
        if "dctwin" in args.phases:
            out["dctwin"] = _dctwin_phase(ctx, bcfg, addr, site_path, site, args, ticks, prof, tmp)
    finally:
        broker.stop()
    if "bare" in out and "dctwin" in out:
        out["ratio_to_bare"] = out["dctwin"]["readings_s"] / out["bare"]["readings_s"]
    return out


def _bare_phase(ctx, bcfg, site, args, ticks, readings_per_msg) -> dict[str, Any]:
    q = ctx.Queue()
    inbox = bench_ingest.Inbox(q)
    stop = ctx.Event()
    handled = ctx.RawValue("q", 0)
    consumer = ctx.Process(
        target=bench_ingest._child,
        args=(q, "bare", bench_ingest.bare_main, {**bcfg, "protocol": "auto"}, stop, handled),
    )
    consumer.start()
    inbox.get("ready", "bare", 60, [consumer])
    pubs = Publishers(ctx, bcfg, site, args)
    try:
        t0_wall = pubs.start(args.rate, ticks)
        mono0 = time.monotonic() + (t0_wall - time.time())
        a, b = mono0 + args.warmup, mono0 + args.warmup + args.seconds
        pub_res = pubs.results(args.warmup + args.seconds + 300)
        published = sum(r["published"] for r in pub_res.values())
        t_end = time.monotonic() + 60
        while handled.value < published and time.monotonic() < t_end:
            time.sleep(0.2)
        stop.set()
        res = inbox.get("result", "bare", 120, [consumer])
        consumer.join(30)
    finally:
        pubs.kill()
        stop.set()
    msgs_s = _window_rate(res["timeline"], a, b)
    return {
        "published": published,
        "received": res["messages"],
        "msgs_s": msgs_s,
        "readings_s": msgs_s * readings_per_msg,
        "publishers": {
            k: {x: y for x, y in v.items() if x not in ("timeline", "tick_done_wall")}
            for k, v in pub_res.items()
        },
    }


def _dctwin_phase(ctx, bcfg, addr, site_path, site, args, ticks, prof, tmp) -> dict[str, Any]:
    db = tmp / "ingest.duckdb"
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    log = tmp / "serve-ingest.log"
    proc = start_serve(site_path, addr, db, port, log, args.serve_args)
    pubs = Publishers(ctx, bcfg, site, args)
    mon = None
    try:
        wait_http(url, 300, proc)
        mon = Monitor(url, proc.pid, 1.0)
        mon.start()
        t0_wall = pubs.start(args.rate, ticks)
        mono0 = time.monotonic() + (t0_wall - time.time())
        a, b = mono0 + args.warmup, mono0 + args.warmup + args.seconds
        pub_res = pubs.results(args.warmup + args.seconds + 300)
        published = sum(r["published"] for r in pub_res.values())
        want = {
            k: v * sum(r["ticks"] for r in pub_res.values()) / args.publishers
            for k, v in prof["samples"].items()
        }
        t_end = time.monotonic() + args.drain_timeout
        while time.monotonic() < t_end:  # drain: until every published GPU sample is stored
            last = mon.rows[-1]["samples"] if mon.rows else {}
            if last.get("gpu", 0) >= want["gpu"]:
                break
            time.sleep(1.0)
        drain_s = time.monotonic() - b
        peak = _rss_mib(proc.pid)
    finally:
        if mon is not None:
            mon.done.set()
            mon.join(10)
        pubs.kill()
        stop_proc(proc)
    rows = mon.rows if mon else []
    rate = {}
    for kind, per in prof["readings"].items():
        per_sample = per / prof["samples"][kind]
        tl = [(r["t"], r["samples"].get(kind, 0.0)) for r in rows]
        rate[kind] = _window_rate(tl, a, b) * per_sample
    lags = tick_lags(rows, t0_wall, args.rate, prof["samples"]["gpu"], ticks)
    service_lags = [r["service_lag_s"] or 0.0 for r in rows if a <= r["t"] <= b]
    check = _exactly_once(db)
    return {
        "published": published,
        "readings_s": sum(rate.values()),
        "readings_s_by_kind": rate,
        "lag_s": _lag_summary(lags),
        "service_lag_gauge_max_s": max(service_lags, default=None),
        "drain_after_window_s": round(drain_s, 1),
        "serve_peak_rss_mib": round(peak),
        "store": check,
        "publishers": {
            k: {x: y for x, y in v.items() if x not in ("timeline", "tick_done_wall")}
            for k, v in pub_res.items()
        },
        "serve_log_tail": log.read_text(errors="replace").splitlines()[-5:],
    }


def _exactly_once(db: Path) -> dict[str, Any]:
    from twin.store import Store

    store = Store(db, read_only=True)
    con = store.con
    gpu_rows = con.execute("SELECT count(*) FROM gpu").fetchone()[0]
    dups = con.execute(
        "SELECT coalesce(sum(n - 1), 0) FROM"
        " (SELECT count(*) AS n FROM gpu GROUP BY ts, source, id HAVING count(*) > 1)"
    ).fetchone()[0]
    dead = con.execute("SELECT count(*) FROM dead_letters").fetchone()[0]
    store.close()
    return {"gpu_rows": int(gpu_rows), "duplicate_rows": int(dups), "dead_letters": int(dead)}


# ---- (b) passes --------------------------------------------------------------------------------
def build_store(db: Path, site: Site, minutes: float, step_s: float, seed: int) -> dict[str, Any]:
    """``minutes`` of the simulated site every ``step_s`` s, through the real Ingester."""
    from twin.ingest import Ingester, IngestLimits
    from twin.simulator import SiteSimulator
    from twin.store import Store

    ticks = int(minutes * 60 / step_s)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=ticks * step_s)
    sim = SiteSimulator(site, seed=seed, start=start, rate_hz=1.0 / step_s)
    t0 = time.perf_counter()
    sim_s = 0.0
    with Store(db) as store:
        ing = Ingester(store, site, IngestLimits(max_future_s=300, max_past_s=30 * 86400))
        for _ in range(ticks):
            t = time.perf_counter()
            items = sim.step()
            sim_s += time.perf_counter() - t
            ing.ingest(items)
        store.rollup()
        counters = ing.counters.as_dict()
    return {
        "ticks": ticks,
        "step_s": step_s,
        "build_s": round(time.perf_counter() - t0, 1),
        "simulate_s": round(sim_s, 1),
        "stored_samples": counters.get("samples"),
        "dead_letters": counters.get("dead_letters"),
    }


def child_pass(args: argparse.Namespace) -> None:
    """One detection pass or one calibration in this (fresh) process; prints JSON."""
    from twin.store import Store

    site = load_site(args.site) if args.site_yaml else _site_of(args)
    if args.shard_name:  # what `serve --shard` calibrates and detects on: the shard's sub-site
        from twin.site.shards import shard_view

        site = shard_view(site, args.shard_name).site
    rss0 = _peak_self_mib()
    out: dict[str, Any] = {"pass": args.child, "rss_before_mib": round(rss0)}
    if args.child == "detect":
        from twin.analysis.detect import detect

        store = Store(args.db, read_only=True)
        t = time.perf_counter()
        d = detect(store, site)
        out["cold_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        d = detect(store, site)
        out["warm_s"] = round(time.perf_counter() - t, 2)
        out["failures"] = {k: repr(v)[:200] for k, v in d.failures.items()}
        out["stages_s"] = _stages(store, site, d)
        out["headroom_rows"] = len(d.headroom.rows)
        store.close()
    else:
        from twin.calibrate.schedule import CalibrationScheduler

        store = Store(args.db)
        window_s = args.minutes * 60
        sched = CalibrationScheduler(
            store, site, interval_s=3600, window_s=window_s, holdout_s=window_s / 6
        )  # holdout share: serve's defaults, 1200 s of 7200 s
        t = time.perf_counter()
        try:
            out["run_id"] = sched.run_once()
        except ValueError as e:  # e.g. a window too short for the data's step: say so, go on
            out["error"] = str(e)
        out["calibrate_s"] = round(time.perf_counter() - t, 2)
        sched.store.close()
        store.close()
    out["peak_rss_mib"] = round(_peak_self_mib())
    print("RESULT " + json.dumps(out), flush=True)


def _stages(store: Any, site: Site, d: Any) -> dict[str, float]:
    """Each stage of the pass on its own, as bench_detect.py times them."""
    from twin.analysis.coverage import missing_kinds
    from twin.analysis.detect import observations, pump_states
    from twin.analysis.fleets import underused_fleets
    from twin.analysis.headroom import compute_headroom
    from twin.analysis.hotspots import find_hotspots

    stages = {
        "headroom": lambda: compute_headroom(store, site, now=d.now),
        "hotspots": lambda: find_hotspots(store, site, now=d.now),
        "pumps": lambda: pump_states(store, site, d.now),
        "fleets": lambda: underused_fleets(store, site, now=d.now),
        "coverage": lambda: missing_kinds(store, site, d.now),
        "observations": lambda: observations(d),
    }
    out = {}
    for name, fn in stages.items():
        t = time.perf_counter()
        fn()
        out[name] = round(time.perf_counter() - t, 2)
    return out


def _site_of(args: argparse.Namespace) -> Site:
    return generate_site(
        GenerateOptions(gpus=args.gpus, halls=args.halls, shards=0, seed=args.seed)
    ).site


def run_child(
    kind: str, db: Path, args: argparse.Namespace, site: Path | None = None, shard: str = ""
) -> dict:
    cmd = [sys.executable, __file__, "passes", "--child", kind, "--db", str(db)]
    if shard:
        cmd += ["--shard-name", shard]
    cmd += ["--gpus", str(args.gpus), "--halls", str(args.halls), "--seed", str(args.seed)]
    cmd += ["--minutes", str(args.minutes)]
    if site is not None:
        cmd += ["--site", str(site), "--site-yaml"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{kind} pass failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def run_passes(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    _, site = make_site(tmp, args.gpus, args.halls, 0, args.seed)
    db = tmp / "passes.duckdb"
    if db.exists() and args.keep is not None:  # a kept store of an earlier run: time the passes
        built: dict[str, Any] = {"reused": str(db)}
    else:
        print(f"building the store: {args.minutes} min every {args.step} s ...", flush=True)
        built = build_store(db, site, args.minutes, args.step, args.seed)
    print(json.dumps(built), flush=True)
    det = run_child("detect", db, args)
    print(json.dumps(det), flush=True)
    cal = run_child("calibrate", db, args)
    print(json.dumps(cal), flush=True)
    return {
        "mode": "passes",
        "gpus": args.gpus,
        "store": built,
        "db_mib": round(db.stat().st_size / 2**20),
        "detect": det,
        "calibrate": cal,
        "targets": {
            "detect_s<=15": det["cold_s"] <= TARGET_DETECT_S,
            "rss_mib<=4096": max(det["peak_rss_mib"], cal["peak_rss_mib"]) <= TARGET_RSS_MIB,
        },
    }


# ---- metrics (issue 30 item 7) -----------------------------------------------------------------
def _time_get(url: str, runs: int) -> dict[str, Any]:
    """``runs`` GETs of ``url``, each from request to last byte: median, min, max [s], bytes."""
    times, size = [], 0
    for _ in range(runs):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as r:
            body = r.read()
        times.append(time.perf_counter() - t)
        size = len(body)
    samples = sum(1 for ln in body.decode().splitlines() if ln and not ln.startswith("#"))
    return {
        "median_s": round(sorted(times)[len(times) // 2], 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "bytes": size,
        "samples": samples,
    }


def run_metrics(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from twin.analysis.headroom import compute_headroom
    from twin.store import Store
    from twin.store.reads import save_headroom

    site_path, site = make_site(tmp, args.gpus, args.halls, 0, args.seed)
    db = tmp / "metrics.duckdb"
    if db.exists() and args.keep is not None:
        built: dict[str, Any] = {"reused": str(db)}
    else:
        print(f"building the store: {args.minutes} min every {args.step} s ...", flush=True)
        built = build_store(db, site, args.minutes, args.step, args.seed)
        with Store(db) as store:  # the report a detection pass of `dctwin serve` stores
            t = time.perf_counter()
            report = compute_headroom(store, site)
            save_headroom(store, report)
            built["headroom_rows"] = len(report.rows)
            built["headroom_s"] = round(time.perf_counter() - t, 1)
    print(json.dumps(built), flush=True)
    broker = start_broker("auto", log_path=tmp / "broker.log")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    off = ["--detect-every", "0", "--calibrate-every", "0"]
    serve = start_serve(site_path, broker.address, db, port, tmp / "serve.log", off)
    try:
        wait_http(url, 300, serve)
        _time_get(url + "/metrics", 1)  # the first read warms DuckDB's caches
        full = _time_get(url + "/metrics", args.scrapes)
        one = _time_get(url + "/metrics?name[]=dctwin_headroom_celsius", args.scrapes)
        sel = urllib.parse.quote('{__name__=~"dctwin_headroom_.*"}')
        headroom_only = _time_get(f"{url}/metrics?match[]={sel}", args.scrapes)
        rss = _rss_mib(serve.pid)
    finally:
        stop_proc(serve)
        broker.stop()
    print(json.dumps({"full": full, "name": one, "match": headroom_only}), flush=True)
    return {
        "mode": "metrics",
        "gpus": args.gpus,
        "store": built,
        "scrapes": args.scrapes,
        "metrics": full,
        "metrics_name_headroom_celsius": one,
        "metrics_match_headroom": headroom_only,
        "serve_peak_rss_mib": round(rss),
        "targets": {"metrics_s<=0.5": full["median_s"] <= TARGET_METRICS_S},
    }


def shard_gpus(site: Site, shard: dict[str, Any]) -> int:
    """GPUs in a shard's halls and rows (of the generated shards: section)."""
    rows = set(shard.get("rows", []))
    halls = set(shard.get("halls", []))
    return sum(
        n.spec.gpus
        for h in site.halls
        for row in h.rows
        if h.name in halls or f"{h.name}/{row.name}" in rows
        for r in row.racks
        for n in r.nodes
    )


# ---- (c) shards --------------------------------------------------------------------------------
def run_shards(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    if not serve_help_has("--shard"):
        print(
            "error: `dctwin serve --help` lists no --shard: the 4-shard run needs serve --shard"
            " (issue 17 item 1)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    import yaml

    ctx = mp.get_context("fork")
    site_path, site = make_site(tmp, args.gpus, args.halls, args.shards, args.seed)
    shards = yaml.load(site_path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))[
        "shards"
    ]
    broker = start_broker("mosquitto")
    bcfg = {"host": broker.host, "port": broker.port}
    addr = f"{broker.host}:{broker.port}"
    rate = 1.0 / args.step
    ticks = int(args.minutes * 60 * rate) + 1
    procs: dict[str, subprocess.Popen] = {}
    mons: dict[str, Monitor] = {}
    view = None
    overview: list[float] = []
    #: per overview answer, the shards it showed stale (name, age [s]): a slow shard is shown
    #: with its last answer past the site view's --answer-within
    stale_in_overview: list[list[tuple[str, float | None]]] = []
    pubs = Publishers(ctx, bcfg, site, args)
    out: dict[str, Any] = {"mode": "shards", "gpus": args.gpus, "shards": len(shards)}
    try:
        for s in shards:
            port = int(s["api_url"].rsplit(":", 1)[1])
            db = tmp / f"{s['name']}.duckdb"
            extra = ["--shard", s["name"], *args.serve_args]
            log = tmp / f"serve-{s['name']}.log"
            procs[s["name"]] = start_serve(site_path, addr, db, port, log, extra)
        for s in shards:
            wait_http(s["api_url"], 600, procs[s["name"]])
            mons[s["name"]] = Monitor(s["api_url"], procs[s["name"]].pid, 1.0)
            mons[s["name"]].start()
        if command_exists("site-view"):
            vport = free_port("127.0.0.1")
            cmd = [*DCTWIN, "site-view", "--site", str(site_path), "--port", str(vport)]
            view = subprocess.Popen(
                cmd, stdout=(tmp / "site-view.log").open("wb"), stderr=subprocess.STDOUT
            )
            wait_http(f"http://127.0.0.1:{vport}", 120, view)
        t0_wall = pubs.start(rate, ticks, lead_s=10.0)
        print(f"running {args.minutes} min from {datetime.fromtimestamp(t0_wall, UTC)}", flush=True)
        t_end = t0_wall + args.minutes * 60
        while time.time() < t_end:
            time.sleep(args.step)
            if view is not None:
                t = time.perf_counter()
                try:
                    body = urllib.request.urlopen(
                        f"http://127.0.0.1:{vport}/api/v1/overview", timeout=30
                    ).read()
                    overview.append(time.perf_counter() - t)
                    stale_in_overview.append(
                        [
                            (s["name"], s.get("age_s"))
                            for s in json.loads(body).get("shards", [])
                            if s.get("status") == "stale"
                        ]
                    )
                except (OSError, ValueError):
                    overview.append(float("inf"))
        pub_res = pubs.results(600)
        time.sleep(2 * args.step)
        peaks = {name: _rss_mib(p.pid) for name, p in procs.items()}
    finally:
        for m in mons.values():
            m.done.set()
        pubs.kill()
        if view is not None:
            stop_proc(view)
        for p in procs.values():
            stop_proc(p)
        broker.stop()
    per: dict[str, Any] = {}
    # when every publisher had published (and the broker acknowledged) each tick: the lag from
    # there is the twin's own, apart from a simulator that falls behind its schedule
    done = [v.get("tick_done_wall", []) for v in pub_res.values()]
    published_at = [max(d[k] for d in done) for k in range(min(map(len, done), default=0))]
    for s in shards:
        name = s["name"]
        lags = tick_lags(mons[name].rows, t0_wall, rate, shard_gpus(site, s), ticks)
        lags_pub = tick_lags(
            mons[name].rows, t0_wall, rate, shard_gpus(site, s), len(published_at), published_at
        )
        det = run_child("detect", tmp / f"{name}.duckdb", args, site_path, name)
        cal = run_child("calibrate", tmp / f"{name}.duckdb", args, site_path, name)
        calib_log = re.findall(
            r"calibration run \d+: .* ([\d.]+) s", (tmp / f"serve-{name}.log").read_text()
        )
        per[name] = {
            "gpus": shard_gpus(site, s),
            "lag_s": _lag_summary(lags),
            "lag_after_publish_s": _lag_summary(lags_pub),
            "monitor": {"reads": len(mons[name].rows), "failed_reads": mons[name].errors},
            "serve_peak_rss_mib": round(peaks[name]),
            "detect": det,
            "calibrate": cal,
            "serve_calibration_runs_s": [float(x) for x in calib_log],
        }
    out["per_shard"] = per
    out["publishers"] = {
        k: {x: y for x, y in v.items() if x not in ("timeline", "tick_done_wall")}
        for k, v in pub_res.items()
    }
    out["overview_s"] = (
        {"p50": _pct(overview, 50), "p95": _pct(overview, 95), "max": max(overview)}
        if overview
        else None
    )
    ages = [a for row in stale_in_overview for _, a in row if a is not None]
    out["overview_stale"] = {
        "answers": len(stale_in_overview),
        "with_a_stale_shard": sum(1 for row in stale_in_overview if row),
        "stale_shard_answers": sum(len(row) for row in stale_in_overview),
        "age_s_p50": _pct(ages, 50) if ages else None,
        "age_s_max": max(ages) if ages else None,
    }
    out["targets"] = {
        "lag<5s": all((p["lag_s"]["max"] or 1e9) < TARGET_LAG_S for p in per.values()),
        "ticks_complete_in_every_shard": all(p["lag_s"]["ticks"] == ticks for p in per.values()),
        "detect<=15s": all(p["detect"]["cold_s"] <= TARGET_DETECT_S for p in per.values()),
        "rss<=4GB": all(p["serve_peak_rss_mib"] <= TARGET_RSS_MIB for p in per.values()),
        "overview<=1s": None if not overview else max(overview) <= TARGET_OVERVIEW_S,
    }
    return out


# ---- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench_scale.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("mode", choices=("ingest", "passes", "shards", "metrics"))
    ap.add_argument("--gpus", type=int, default=None, help="default 25000 (100000 for shards)")
    ap.add_argument("--halls", type=int, default=None, help="default 1 (4 for shards)")
    ap.add_argument("--shards", type=int, default=4, help="shards (mode shards)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=1.0, help="ingest: sampling rate [Hz]")
    ap.add_argument("--seconds", type=float, default=60.0, help="ingest: measuring window [s]")
    ap.add_argument("--warmup", type=float, default=10.0, help="ingest: load before the window")
    ap.add_argument("--phases", default="bare,dctwin", help="ingest: bare, dctwin or both")
    ap.add_argument("--publishers", type=int, default=1, help="simulator processes")
    ap.add_argument("--client", choices=("raw", "paho"), default="raw", help="publishers' client")
    ap.add_argument("--drain-timeout", type=float, default=120.0, help="ingest: drain limit [s]")
    ap.add_argument("--minutes", type=float, default=None, help="passes, shards: 30; metrics: 3")
    ap.add_argument("--scrapes", type=int, default=7, help="metrics: timed reads of each URL")
    ap.add_argument("--step", type=float, default=10.0, help="passes/shards: sampling step [s]")
    ap.add_argument(
        "--serve-arg",
        dest="serve_args",
        action="append",
        default=[],
        help="extra argument for each `dctwin serve` (repeatable: --serve-arg=--detect-every=60)",
    )
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default bench/results/)")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--db", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--site", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--site-yaml", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard-name", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    big = args.mode == "shards"
    args.gpus = args.gpus or (100_000 if big else 25_000)
    args.halls = args.halls or (4 if big else 1)
    args.minutes = args.minutes or (3.0 if args.mode == "metrics" else 30.0)
    if args.child:
        child_pass(args)
        return 0
    if shutil.which("mosquitto") is None and args.mode in ("ingest", "shards"):
        print("error: mosquitto is not on PATH (modes ingest and shards need it)", file=sys.stderr)
        return 2
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="dctwin-scale-"))
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    machine = _machine()
    try:
        run = {
            "ingest": run_ingest,
            "passes": run_passes,
            "shards": run_shards,
            "metrics": run_metrics,
        }[args.mode]
        result = run(args, tmp)
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    result["machine"] = {**machine, "load_avg_at_end": os.getloadavg()}
    result["wall_s"] = round(time.time() - t0, 1)
    result["when_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    out = args.out or RESULTS / f"scale_{args.mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
