#!/usr/bin/env python
"""Calibration benchmark: N GPUs x T seconds of 1 Hz telemetry read from DuckDB and fitted.

Target (from the issue): 10,000 GPUs x 1 hour of 1 Hz data, read from DuckDB and fitted, in at
most 10 s on this machine; the ratio to a bare ``numpy.linalg.lstsq`` on the same matrices is
reported as the floor.

What one run does:

1. Build (timed, but not part of the figure). Synthetic telemetry from the physics of
   ``models`` (vectorized over GPUs): per-GPU true parameters around the H200 catalog defaults
   (idle 75 W +-5 %, limit 700 W, gamma 0.8-1.0, R 0.03 K/W +-15 %, tau 10 s +-20 %, C = tau/R,
   a coolant offset of 0-0.5 K; HBM R 1.1 x R +-5 % and tau 1.5 x tau as in the simulator), an
   SM-activity path per GPU (groups of 256 GPUs run training: a steady level with checkpoint
   dips and job gaps; inference: a daily swing plus AR(1) noise; or a training job that ends and
   hands over to inference), power from ``gpu_power_w`` (clamped at 700 W) with 1 % noise and
   temperatures from ``rc_simulate`` above a slowly drifting ~32 °C coolant supply (one per
   CDU of 576 GPUs) with 0.3 K noise, rounded to 0.1 as NVML does. The rows go straight into
   the ``gpu`` table (and the CDU supply temperature into the ``cdu`` table) through
   ``Store.write`` with a ``Batch``, one transaction per ``--chunk-s`` seconds of data; the
   Batch columns are Arrow arrays instead of Python lists (``Store.write`` hands them to
   ``pa.table`` unchanged), so building 36 M rows does not go through Python objects. No MQTT:
   this measures calibration, not ingest (``bench_ingest.py`` does that).
2. Timed part, ``--repeat`` times, each on a fresh read-only connection to the file:
   ``load_window`` of ``gpu`` (power_w, temp_c, mem_temp_c, sm_active) and of ``cdu``
   (supply_temp_c), ``load_max`` of the enforced power limit per GPU, the per-GPU reference
   as ``twin.calibrate.calibrate`` builds them, then its GPU fits, ``fit_gpu_links``: the power
   curve and ``fit_rc_many`` on temp_c and mem_temp_c in turn, in one thread, as calibrate()
   runs them (at 1 Hz each part timed; ``--threads 2``: the power curve in a thread beside the
   RC fits). The figure against the target is read + prep +
   all three fits. Accuracy against the true parameters is reported so that speed is not
   bought with wrong answers.
3. Floor: the one-step linear regression T[k+1] = a T[k] + b P[k] + c T_ref[k] + d per GPU,
   one (T-1) x 4 design matrix per GPU built (outside the timer) from the same arrays the fit
   got; a Python loop of ``np.linalg.lstsq`` over all GPUs is timed, and for information a
   batched normal-equations solve (``np.einsum(..., optimize=True)`` Gram matrices + one stacked
   ``np.linalg.solve``).
   Ratios: (read + fit) / lstsq loop, and fit / lstsq loop.

``--step-s S`` (issue 14: 10,000 GPUs x 2 h at 10 s in at most 5 s, ``--seconds 7200
--step-s 10``): the physics still runs at 1 s, and the store gets what an exporter scraping
every S seconds records (:func:`decimate`): power, temperatures, throttle reasons and the CDU
supply as the point reading of the last second of each interval, SM activity as the interval
mean (as DCGM averages its profiling metrics). The timed part then does what ``calibrate()``
does at that step (:func:`timed_calibration_at_step`): the step inference (``step_groups``)
included, the quantities ``calibrate()`` reads, ``fit_gpu_links`` at the inferred step. The
floor's R and C use ``a = exp(-S/tau)``. The CPU time of the timed part (all threads) is
reported beside the wall time: on a shared machine it is the steadier figure.

Exit status 0 when the run completed (whether or not the target was met), 1 if the store did
not hold the expected rows or ``--reuse`` found a file built for other options.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from collectors.contract import gpu_id
from models.gpu_power import fit_power_curve, gpu_power_w
from models.gpu_thermal import fit_rc_many, rc_simulate
from twin.calibrate.calibrate import fit_gpu_links, step_groups
from twin.site.index import SiteIndex
from twin.store import Store
from twin.store.schema import arrow_schema
from twin.store.store import Batch
from twin.store.windows import load_max, load_window

TARGET_S = 10.0  # 10,000 GPUs x 1 h at 1 Hz
TARGET_STEP_S = 5.0  # 10,000 GPUs x 2 h at 10 s (--step-s 10 --seconds 7200), issue 14
META_KEY = "bench_calibrate"  # meta row of a store built here: gpus, seconds, seed
START = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)  # window start; the daily cycle uses its hour
GPUS_PER_NODE = 8
GPUS_PER_CDU = 576  # 8 racks of 72 GPUs
GROUP = 256  # GPUs that share a workload (a job or an inference service)
# workload per group, cycled: 5 training, 3 inference, 2 training-then-inference in 10
PATTERN = "TIMTITMTIT"
KIND_NAME = {"T": "training", "I": "inference", "M": "mixed"}

# truth, around the H200-SXM catalog entry (twin/site/catalog.py) and the simulator's spreads
IDLE_W, LIMIT_W, R_K_PER_W, TAU_S = 75.0, 700.0, 0.03, 10.0
MEM_R_FACTOR, MEM_TAU_FACTOR = 1.1, 1.5  # as twin/simulator/engine.py
POWER_NOISE, TEMP_NOISE_K, REF_NOISE_K = 0.01, 0.3, 0.05
CHECKPOINT_PERIOD_S, CHECKPOINT_S, CHECKPOINT_ACTIVITY = 1800.0, 60.0, 0.1

GPU_QUANTITIES = ["power_w", "temp_c", "mem_temp_c", "sm_active"]
# what calibrate()'s _load_windows reads (the --step-s mode reads these)
GPU_READ = ["power_w", "temp_c", "mem_temp_c", "sm_active", "util_pct"]
CDU_READ = ["supply_temp_c", "return_temp_c", "flow_lpm", "heat_kw"]


# ---- synthetic telemetry ------------------------------------------------------------------------


def _ar1(rng: np.random.Generator, n_t: int, sigma: np.ndarray, tau_s: float) -> np.ndarray:
    """AR(1) noise, (n_t, N) float32, stationary std ``sigma`` per column, correlation time."""
    phi = np.float32(np.exp(-1.0 / tau_s))
    gain = np.float32(np.sqrt(1.0 - phi * phi))
    sig = sigma.astype(np.float32)
    out = rng.standard_normal((n_t, sig.size), dtype=np.float32)
    out[0] *= sig
    for k in range(1, n_t):
        out[k] *= gain * sig
        out[k] += phi * out[k - 1]
    return out


def make_truth(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 0])
    r = R_K_PER_W * rng.uniform(0.85, 1.15, n)
    tau = TAU_S * rng.uniform(0.8, 1.2, n)
    mem_r = MEM_R_FACTOR * r * rng.uniform(0.95, 1.05, n)
    mem_tau = MEM_TAU_FACTOR * tau
    return {
        "idle_w": IDLE_W * rng.uniform(0.95, 1.05, n),
        "limit_w": np.full(n, LIMIT_W),
        "gamma": rng.uniform(0.8, 1.0, n),
        "r": r,
        "c": tau / r,
        "offset_k": rng.uniform(0.0, 0.5, n),
        "mem_r": mem_r,
        "mem_c": mem_tau / mem_r,
        "group": np.arange(n) // GROUP,
    }


def make_activity(rng: np.random.Generator, n_t: int, n: int) -> tuple[np.ndarray, list[str]]:
    """SM activity (n_t, n) float64 rounded to 0.001, and the workload kind of each GPU."""
    n_groups = -(-n // GROUP)
    kinds = [PATTERN[g % len(PATTERN)] for g in range(n_groups)]
    grp = np.arange(n) // GROUP
    t = np.arange(n_t, dtype=float)[:, None]
    hour = START.hour + START.minute / 60 + t / 3600.0
    # training: per-job level, checkpoint dips, sometimes a job gap (idle) of 2-6 min
    level = rng.uniform(0.85, 0.97, n_groups)
    ckpt_off = rng.uniform(0.0, CHECKPOINT_PERIOD_S, n_groups)
    gap_start = np.where(rng.random(n_groups) < 0.5, rng.uniform(0, n_t, n_groups), np.inf)
    gap_len = rng.uniform(120.0, 360.0, n_groups)
    # inference: floor + daily swing, per-GPU share of the service's load
    base = rng.uniform(0.10, 0.20, n_groups)
    amp = rng.uniform(0.40, 0.60, n_groups)
    peak = rng.uniform(13.0, 15.0, n_groups)
    # mixed: the training job ends at t_end, the GPUs idle 1-4 min, then serve inference
    t_end = rng.uniform(0.2 * n_t, 0.8 * n_t, n_groups)
    idle_len = rng.uniform(60.0, 240.0, n_groups)

    train = level[grp] * rng.uniform(0.98, 1.02, n)
    ckpt = ((t + ckpt_off[grp]) % CHECKPOINT_PERIOD_S) < CHECKPOINT_S
    train = np.where(ckpt, CHECKPOINT_ACTIVITY, train)
    in_gap = (t >= gap_start[grp]) & (t < gap_start[grp] + gap_len[grp])
    train = np.where(in_gap, 0.0, train)
    train += _ar1(rng, n_t, np.full(n, 0.02), 5.0)
    daily = np.maximum(0.0, np.sin(2 * np.pi * (hour - (peak[grp] - 6.0)) / 24.0))
    infer = (base[grp] + amp[grp] * daily) * rng.uniform(0.8, 1.2, n)
    infer += _ar1(rng, n_t, np.full(n, 0.04), 20.0)
    kind_g = np.array(kinds)[grp]
    after = t >= t_end[grp] + idle_len[grp]
    idle = (t >= t_end[grp]) & ~after
    mixed = np.where(after, infer, np.where(idle, 0.01 * rng.random((n_t, n)), train))
    act = np.where(kind_g == "T", train, np.where(kind_g == "I", infer, mixed))
    np.clip(act, 0.0, 1.0, out=act)
    return np.round(act, 3), [KIND_NAME[k] for k in kind_g]


def make_data(seed: int, n: int, n_t: int, truth: dict[str, np.ndarray]) -> dict[str, Any]:
    """Measured telemetry (rounded as NVML and the CDU report it) from the true parameters."""
    rng = np.random.default_rng([seed, 1])
    act, kinds = make_activity(rng, n_t, n)
    p_true = gpu_power_w(act, truth["idle_w"], truth["limit_w"], truth["gamma"], LIMIT_W)
    power = np.maximum(p_true * (1.0 + POWER_NOISE * rng.standard_normal((n_t, n))), 0.0)
    power = np.round(power, 1)
    # coolant supply per CDU: ~32 °C, slow sinusoid (2-4 h) plus a slow random walk
    n_cdu = -(-n // GPUS_PER_CDU)
    gpu_cdu = np.arange(n) // GPUS_PER_CDU
    t = np.arange(n_t, dtype=float)[:, None]
    period = rng.uniform(7200.0, 14400.0, n_cdu)
    supply = (
        32.0
        + rng.uniform(-0.5, 0.5, n_cdu)
        + rng.uniform(0.2, 0.5, n_cdu) * np.sin(2 * np.pi * t / period + rng.uniform(0, 7, n_cdu))
        + _ar1(rng, n_t, np.full(n_cdu, 0.1), 600.0)
    )
    supply_meas = np.round(supply + REF_NOISE_K * rng.standard_normal(supply.shape), 2)
    ref_gpu = supply[:, gpu_cdu] + truth["offset_k"]  # local coolant at each cold plate
    temps = {}
    for name, r, c in (
        ("temp_c", truth["r"], truth["c"]),
        ("mem_temp_c", truth["mem_r"], truth["mem_c"]),
    ):
        t0 = ref_gpu[0] + r * p_true[0]  # steady state at the first sample
        temp = rc_simulate(t0, ref_gpu, p_true, r, c, 1.0)
        temp += TEMP_NOISE_K * rng.standard_normal((n_t, n), dtype=np.float32)
        temps[name] = np.round(temp, 1)
        del temp
    throttle = np.where(p_true >= LIMIT_W - 1e-9, 4, 0).astype(np.int64)  # SW power cap
    del p_true, ref_gpu
    return {
        "activity": act,
        "power": power,
        **temps,
        "throttle": throttle,
        "supply": supply_meas,
        "gpu_cdu": gpu_cdu,
        "kinds": kinds,
    }


def decimate(data: dict[str, Any], step: int) -> dict[str, Any]:
    """The 1 s telemetry as an exporter scraping every ``step`` seconds records it: power,
    temperatures, throttle reasons and the coolant supply are point readings taken at the
    last second of each interval (NVML's instantaneous power and temperatures; the sample is
    time-stamped then), SM activity is the mean over the interval (DCGM's profiling metrics
    are averaged over the sampling interval), rounded to 0.001 as before."""
    if step == 1:
        return data
    n_t = data["power"].shape[0] // step * step
    pick = slice(step - 1, n_t, step)
    act = data["activity"][:n_t]
    mean_act = np.round(act.reshape(n_t // step, step, -1).mean(axis=1), 3)
    out = {k: v[pick] for k, v in data.items() if isinstance(v, np.ndarray) and v.ndim == 2}
    out.update(activity=mean_act, gpu_cdu=data["gpu_cdu"], kinds=data["kinds"])
    return out


def names(n: int) -> tuple[list[str], list[str], list[str]]:
    """GPU ids (``node:i``, as Node.gpu_ids), their sources (node names) and CDU names."""
    nodes = [f"gpu-node-{i // GPUS_PER_NODE:05d}" for i in range(n)]
    ids = [gpu_id(node, i % GPUS_PER_NODE) for i, node in enumerate(nodes)]
    cdus = [f"cdu-{j:03d}" for j in range(-(-n // GPUS_PER_CDU))]
    return ids, nodes, cdus


def build_store(
    path: str,
    data: dict[str, Any],
    n_t: int,
    chunk_s: int,
    meta: str,
    log: bool = True,
    step: int = 1,
) -> dict[str, Any]:
    """Write the telemetry through Store.write, one Batch (transaction) per chunk of seconds;
    sample k of ``data`` (one every ``step`` s, :func:`decimate`) is stamped
    ``START + (k + 1) * step - 1`` s."""
    chunk_s = max(1, chunk_s // step)  # samples per transaction
    n = data["power"].shape[1]
    ids, nodes, cdus = names(n)
    id_arr, node_arr, cdu_arr = pa.array(ids), pa.array(nodes), pa.array(cdus)
    n_cdu = len(cdus)
    gpu_schema, cdu_schema = arrow_schema("gpu"), arrow_schema("cdu")
    util = np.where(
        data["activity"] > 0.05, 100.0, np.clip(np.round(data["activity"] * 1000.0), 0, 100)
    )
    energy = np.round(1.0e9 + np.cumsum(data["power"] * step, axis=0), 0)
    ts0 = int(START.timestamp() * 1_000_000)
    t_wall = time.perf_counter()
    rows = 0
    with Store(path) as store:
        for k0 in range(0, n_t, chunk_s):
            k1 = min(k0 + chunk_s, n_t)
            m = k1 - k0
            ts_us = ts0 + ((np.arange(k0, k1, dtype=np.int64) + 1) * step - 1) * 1_000_000
            take_g = pa.array(np.tile(np.arange(n, dtype=np.int64), m))
            take_c = pa.array(np.tile(np.arange(n_cdu, dtype=np.int64), m))

            def f64(a: np.ndarray) -> pa.Array:
                return pa.array(np.ascontiguousarray(a).ravel(), pa.float64())

            gpu_cols = {
                "ts": pa.array(np.repeat(ts_us, n), gpu_schema.field("ts").type),
                "source": node_arr.take(take_g),
                "id": id_arr.take(take_g),
                "power_w": f64(data["power"][k0:k1]),
                "temp_c": f64(data["temp_c"][k0:k1]),
                "mem_temp_c": f64(data["mem_temp_c"][k0:k1]),
                "util_pct": f64(util[k0:k1]),
                "sm_active": f64(data["activity"][k0:k1]),
                "energy_j": f64(energy[k0:k1]),
                "power_limit_w": pa.array(np.full(m * n, LIMIT_W)),
                "clock_sm_mhz": pa.array(np.full(m * n, 1980.0)),
                "clock_mem_mhz": pa.array(np.full(m * n, 3201.0)),
                "throttle_reasons": pa.array(data["throttle"][k0:k1].ravel(), pa.int64()),
            }
            cdu_cols = {
                "ts": pa.array(np.repeat(ts_us, n_cdu), cdu_schema.field("ts").type),
                "source": cdu_arr.take(take_c),
                "id": cdu_arr.take(take_c),
                "supply_temp_c": f64(data["supply"][k0:k1]),
            }
            batch = Batch()
            for kind, cols, schema in (
                ("gpu", gpu_cols, gpu_schema),
                ("cdu", cdu_cols, cdu_schema),
            ):
                rows_k = len(cols["id"])
                batch.samples[kind] = {
                    f.name: cols.get(f.name, pa.nulls(rows_k, f.type)) for f in schema
                }
            store.write(batch)
            rows += m * n
            if log and (k1 == n_t or (k1 // chunk_s) % max(1, n_t // chunk_s // 5) == 0):
                print(
                    f"  build: {k1 * step}/{n_t * step} s, {rows:,} gpu rows,"
                    f" {time.perf_counter() - t_wall:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        store.con.execute("INSERT INTO meta VALUES (?, ?)", [META_KEY, meta])
        store.con.execute("CHECKPOINT")
    return {"insert_s": time.perf_counter() - t_wall, "gpu_rows": rows}


def stored_meta(path: str) -> str | None:
    with Store(path, read_only=True) as store:
        rows = store.con.execute("SELECT value FROM meta WHERE key = ?", [META_KEY]).fetchall()
    return rows[0][0] if rows else None


def check_store(path: str, n: int, n_t: int, step: int = 1) -> bool:
    with Store(path, read_only=True) as store:
        got, lo, hi, ids = store.con.execute(
            "SELECT count(*), min(ts), max(ts), count(DISTINCT id) FROM gpu"
        ).fetchall()[0]
    first, last = START + timedelta(seconds=step - 1), START + timedelta(seconds=n_t * step - 1)
    ok = got == n * n_t and ids == n and lo == first and hi == last
    if not ok:
        print(f"!!! store holds {got:,} gpu rows of {ids} ids ({lo} .. {hi}); expected"
              f" {n * n_t:,} of {n}", file=sys.stderr)  # fmt: skip
    return ok


# ---- the timed part -----------------------------------------------------------------------------


def site_index(n: int) -> SiteIndex:
    """The bench's site as ``calibrate()`` indexes it: 8 GPUs a node, 72 a rack (no PDU), 576
    a CDU, every GPU liquid-cooled."""
    ids, nodes, cdus = names(n)
    n_rack = -(-n // 72)
    return SiteIndex(
        gpu_ids=ids,
        gpu_node=nodes,
        gpu_rack=np.arange(n) // 72,
        gpu_cdu=np.arange(n) // GPUS_PER_CDU,
        gpu_class=["H200-SXM"] * n,
        gpu_fleet=[""] * n,
        rack_names=[f"rack-{r:04d}" for r in range(n_rack)],
        rack_pdus=[[] for _ in range(n_rack)],
        rack_cdu=np.arange(n_rack) * 72 // GPUS_PER_CDU,
        rack_prior=np.full(n_rack, 0.8),
        cdu_names=cdus,
        cdu_fluid=["water"] * len(cdus),
    )


def timed_calibration_at_step(
    path: str, n: int, n_t: int, step: int, threads: int = 1
) -> tuple[dict[str, float], dict[str, Any]]:
    """What ``calibrate()`` does for the GPU links of data recorded every ``step`` s: the newest
    sample, the step groups (each GPU's median interval, one query, then the CDUs' step:
    ``step_groups``), and on that grid, ending half a step after the newest sample, the reads of
    its ``_load_windows`` for GPUs and CDUs (power, temperatures, SM activity, GPU-Util, the
    CDU's four quantities; the enforced power limit), the reference per GPU, and
    ``fit_gpu_links`` (with the interval-mean RC refit at this step). The fits run on the whole
    window, as at 1 Hz (``calibrate()`` would hold out its last 20 minutes)."""
    idx = site_index(n)
    tm: dict[str, float] = {}
    t0 = time.perf_counter()
    c0 = time.process_time()
    with Store(path, read_only=True) as store:
        newest = store.con.execute("SELECT max(ts) FROM gpu").fetchall()[0][0]
        window = timedelta(seconds=n_t * step)
        probe_end = newest + timedelta(microseconds=1)
        groups = step_groups(store, idx, probe_end - window, probe_end)
        t_step = time.perf_counter()
        step_s = groups[-1][0]
        end = newest + timedelta(seconds=step_s / 2)
        start = end - window
        gpu = load_window(
            store, "gpu", start, end, step_s=step_s, ids=idx.gpu_ids, quantities=GPU_READ
        )
        cdu = load_window(
            store, "cdu", start, end, step_s=step_s, ids=idx.cdu_names, quantities=CDU_READ
        )
        limit = load_max(store, "gpu", start, end, "power_limit_w", idx.gpu_ids)
    t1 = time.perf_counter()
    tm["step_s"], tm["read_s"] = t_step - t0, t1 - t0
    ref = np.ascontiguousarray(cdu.values["supply_temp_c"][:, idx.gpu_cdu])
    power = gpu.values["power_w"]
    activity = gpu.values["sm_active"]
    temps = {q: gpu.values[q] for q in ("temp_c", "mem_temp_c")}
    t2 = time.perf_counter()
    tm["prep_s"] = t2 - t1
    pc, rcs = fit_gpu_links(activity, power, limit, temps, ref, step_s, threads=threads)
    tm["fit_s"] = time.perf_counter() - t2
    tm["total_s"] = time.perf_counter() - t0
    tm["cpu_s"] = time.process_time() - c0  # all threads: CPU-seconds
    arrays = {"temp": gpu.values["temp_c"], "power": power, "ref": ref}
    fits = {"power": pc, "rc": rcs["temp_c"], "rc_mem": rcs["mem_temp_c"], "arrays": arrays}
    fits["groups"] = [(s, len(m)) for s, m in groups]
    return tm, fits


def timed_calibration(
    path: str, n: int, n_t: int, threads: int = 1
) -> tuple[dict[str, float], dict[str, Any]]:
    """Read and fit as twin.calibrate.calibrate does for the GPU links; returns timings, fits.

    The fits are ``fit_gpu_links``'s: with ``threads=1`` (calibrate()'s) in turn, each part
    timed; with 2 the power curve in a thread beside the RC fits of temp_c and mem_temp_c.
    """
    ids, _, cdus = names(n)
    gpu_cdu = np.arange(n) // GPUS_PER_CDU
    end = START + timedelta(seconds=n_t)
    tm: dict[str, float] = {}
    t0 = time.perf_counter()
    c0 = time.process_time()
    with Store(path, read_only=True) as store:
        gpu = load_window(store, "gpu", START, end, ids=ids, quantities=GPU_QUANTITIES)
        cdu = load_window(store, "cdu", START, end, ids=cdus, quantities=["supply_temp_c"])
        limit = load_max(store, "gpu", START, end, "power_limit_w", ids)
    t1 = time.perf_counter()
    tm["read_s"] = t1 - t0
    # as calibrate(): reference per GPU from its CDU's supply, limit = largest enforced limit
    ref = np.ascontiguousarray(cdu.values["supply_temp_c"][:, gpu_cdu])
    power = gpu.values["power_w"]
    activity = gpu.values["sm_active"]
    temps = {q: gpu.values[q] for q in ("temp_c", "mem_temp_c")}
    t2 = time.perf_counter()
    tm["prep_s"] = t2 - t1
    if threads == 1:  # what fit_gpu_links does in one thread, each part timed
        pc = fit_power_curve(activity, power, limit, dt_s=1.0, in_sample_mae=False)
        t3 = time.perf_counter()
        rcs = fit_rc_many(temps, ref, power, 1.0)
        rc, rc_mem = rcs["temp_c"], rcs["mem_temp_c"]
        tm["fit_power_s"], tm["fit_rc_both_s"] = t3 - t2, time.perf_counter() - t3
    else:
        pc, rcs = fit_gpu_links(activity, power, limit, temps, ref, 1.0, threads=threads)
        rc, rc_mem = rcs["temp_c"], rcs["mem_temp_c"]
    tm["fit_s"] = time.perf_counter() - t2
    tm["total_s"] = time.perf_counter() - t0  # the figure against the target
    tm["cpu_s"] = time.process_time() - c0  # all threads: CPU-seconds
    arrays = {"temp": gpu.values["temp_c"], "power": power, "ref": ref}
    return tm, {"power": pc, "rc": rc, "rc_mem": rc_mem, "arrays": arrays}


# ---- the floor ----------------------------------------------------------------------------------


def design_matrices(temp: np.ndarray, power: np.ndarray, ref: np.ndarray):
    """Per GPU: X (T-1, 4) = [T[k], P[k], T_ref[k], 1], y = T[k+1]; stacked (N, T-1, 4)."""
    n_t, n = temp.shape
    x = np.empty((n, n_t - 1, 4))
    x[:, :, 0] = temp[:-1].T
    x[:, :, 1] = power[:-1].T
    x[:, :, 2] = ref[:-1].T
    x[:, :, 3] = 1.0
    y = np.ascontiguousarray(temp[1:].T)
    return x, y


def floor_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    coef = np.empty((x.shape[0], 4))
    for i in range(x.shape[0]):
        coef[i] = np.linalg.lstsq(x[i], y[i], rcond=None)[0]
    return time.perf_counter() - t0, coef


def floor_normal(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    gram = np.einsum("ntk,ntl->nkl", x, x, optimize=True)  # optimize: 10x faster here
    rhs = np.einsum("ntk,nt->nk", x, y, optimize=True)
    coef = np.linalg.solve(gram, rhs[:, :, None])[:, :, 0]
    return time.perf_counter() - t0, coef


# ---- accuracy -----------------------------------------------------------------------------------


def _rel(est: np.ndarray, true: np.ndarray, ok: np.ndarray) -> dict[str, Any]:
    ok = ok & np.isfinite(est)
    if not ok.any():
        return {"n": 0}
    e = est[ok] / true[ok] - 1.0
    return {
        "n": int(ok.sum()),
        "median_abs": float(np.median(np.abs(e))),
        "p99_abs": float(np.percentile(np.abs(e), 99)),
        "worst_abs": float(np.abs(e).max()),
        "median": float(np.median(e)),
    }


def _reasons(reasons: list[str | None], top: int = 3) -> list[tuple[str, int]]:
    # strip the numbers so that reasons of one kind count together
    short = [
        "".join(ch for ch in r.split("(")[0] if not ch.isdigit()).strip(" :;") for r in reasons if r
    ]
    return Counter(short).most_common(top)


def accuracy(fits: dict[str, Any], truth: dict[str, np.ndarray], kinds: list[str]):
    pc, rc, rc_mem = fits["power"], fits["rc"], fits["rc_mem"]
    kinds_a = np.array(kinds)
    out: dict[str, Any] = {}
    out["power"] = {
        "usable": float(pc.usable.mean()),
        "usable_by_workload": {
            k: float(pc.usable[kinds_a == k].mean()) for k in sorted(set(kinds))
        },
        "idle_identified": float(np.isfinite(pc.idle_w).mean()),
        "limit_identified": float(np.isfinite(pc.limit_w).mean()),
        "idle_w": _rel(pc.idle_w, truth["idle_w"], np.isfinite(pc.idle_w)),
        "limit_w": _rel(pc.limit_w, truth["limit_w"], np.isfinite(pc.limit_w)),
        "gamma": _rel(pc.gamma, truth["gamma"], pc.usable),
        "unusable_reasons": _reasons(pc.reason),
    }
    for key, fit, r_true, c_true in (
        ("rc_temp", rc, truth["r"], truth["c"]),
        ("rc_mem", rc_mem, truth["mem_r"], truth["mem_c"]),
    ):
        off_err = np.abs(fit.offset_k - truth["offset_k"])[fit.usable]
        out[key] = {
            "usable": float(fit.usable.mean()),
            "usable_by_workload": {
                k: float(fit.usable[kinds_a == k].mean()) for k in sorted(set(kinds))
            },
            "r": _rel(fit.r_k_per_w, r_true, fit.usable),
            "c": _rel(fit.c_j_per_k, c_true, fit.usable),
            "offset_abs_k": {
                "median": float(np.median(off_err)) if off_err.size else None,
                "worst": float(off_err.max()) if off_err.size else None,
            },
            "sim_mae_k_median": float(np.nanmedian(fit.sim_mae_k)),
            "unusable_reasons": _reasons(fit.reason),
        }
    return out


def floor_accuracy(
    coef: np.ndarray, truth: dict[str, np.ndarray], step_s: float = 1.0
) -> dict[str, Any]:
    """R and C from the one-step regression: a = exp(-step/tau), b = (1 - a) R."""
    a, b = coef[:, 0], coef[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = b / (1.0 - a)
        c = (-step_s / np.log(a)) / r
    ok = (a > 0) & (a < 1)
    return {"r": _rel(r, truth["r"], ok), "c": _rel(c, truth["c"], ok)}


# ---- main ---------------------------------------------------------------------------------------


def loadavg() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "ram_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "duckdb": duckdb.__version__,
        "pyarrow": pa.__version__,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(
            "Calibration benchmark: build a DuckDB store of N GPUs x T s of synthetic 1 Hz GPU"
            " telemetry (models/ physics, written with Store.write); then time load_window +"
            " the GPU fits of calibrate() (fit_power_curve, fit_rc on temp_c and on"
            " mem_temp_c, in turn), check the fits against the true"
            " parameters, and time a per-GPU numpy.linalg.lstsq loop on the same data as the"
            " floor."
            f" Target: 10,000 GPUs x 3,600 s read and fitted in <= {TARGET_S:g} s."
        )
    )
    p.add_argument("--gpus", type=int, default=10_000, help="GPUs (default 10000)")
    p.add_argument(
        "--seconds", type=int, default=3600, help="seconds of data per GPU (default 3600)"
    )
    p.add_argument(
        "--step-s",
        type=int,
        default=1,
        metavar="S",
        help="store one sample every S seconds (default 1): the physics runs at 1 s and the"
        " exporter keeps the last second's power and temperatures and the interval's mean SM"
        " activity; the timed part then infers the step as calibrate() does. Target with"
        f" --seconds 7200 --step-s 10: <= {TARGET_STEP_S:g} s",
    )
    p.add_argument(
        "--db",
        metavar="PATH",
        help="DuckDB file to build (default: one in a temporary directory); an existing file"
        " is replaced unless --reuse; a file this run builds is deleted at the end unless"
        " --keep",
    )
    p.add_argument("--keep", action="store_true", help="keep the DuckDB file after the run")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="use --db as it is when this script built it with the same --gpus/--seconds/"
        "--seed (checked; built when missing) instead of building it again",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="N",
        help="timed read+fit runs and floor runs; medians are reported (default 3)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the true parameters and data (default 0)"
    )
    p.add_argument(
        "--chunk-s",
        type=int,
        default=120,
        help="seconds of data per Store.write transaction while building (default 120)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="1 (default, as calibrate()): the fits in turn in one thread (at 1 Hz each part"
        " timed); 2: the power curve in a thread beside the RC fits",
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.gpus < 1 or args.seconds < 400 or args.repeat < 1 or args.chunk_s < 1:
        p.error("need --gpus >= 1, --seconds >= 400 (fit_rc needs 300 samples), --repeat >= 1")
    if not 1 <= args.step_s <= 60 or args.seconds // args.step_s < 40:
        p.error("--step-s must be 1..60 s with at least 40 samples in --seconds")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.reuse and not args.db:
        p.error("--reuse needs --db")
    return args


def _fmt_rel(d: dict[str, Any]) -> str:
    if not d.get("n"):
        return "n = 0"
    return (
        f"median |err| {100 * d['median_abs']:.2f} %, p99 {100 * d['p99_abs']:.2f} %,"
        f" worst {100 * d['worst_abs']:.2f} %, median err {100 * d['median']:+.2f} % (n = {d['n']})"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n, step = args.gpus, args.step_s
    n_t = args.seconds // step  # samples per GPU as stored
    target_s = TARGET_S if step == 1 else TARGET_STEP_S
    tmpdir = None
    built = False  # only a file this run built is deleted at the end (unless --keep)
    if args.db:
        path = args.db
    else:
        tmpdir = tempfile.mkdtemp(prefix="bench_calibrate_")
        path = os.path.join(tmpdir, "calibrate.duckdb")
    result: dict[str, Any] = {
        "args": vars(args),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "target_s": target_s,
    }
    print(
        f"bench_calibrate: {n:,} GPUs x {args.seconds:,} s every {step} s -> {n * n_t:,} gpu"
        f" rows, store {path}"
    )
    try:
        truth = make_truth(args.seed, n)
        t0 = time.perf_counter()
        data = decimate(make_data(args.seed, n, n_t * step, truth), step)
        gen_s = time.perf_counter() - t0
        kinds = data["kinds"]
        build: dict[str, Any] = {"generate_s": gen_s}
        meta_d = {"gpus": n, "seconds": n_t * step, "seed": args.seed}
        meta = json.dumps(meta_d | ({"step_s": step} if step > 1 else {}))
        if args.reuse and Path(path).exists():
            if stored_meta(path) != meta:
                print(f"!!! {path} was not built with {meta}", file=sys.stderr)
                return 1
            build["reused"] = True
            print(f"  reusing {path} (generation {gen_s:.1f} s, for the truth only)")
        else:
            for p in (path, path + ".wal"):
                if Path(p).exists():
                    os.remove(p)
            print(f"  generated telemetry in {gen_s:.1f} s; writing the store ...")
            built = True
            build.update(build_store(path, data, n_t, args.chunk_s, meta, step=step))
        build["file_mib"] = Path(path).stat().st_size / 2**20
        result["build"] = build
        del data
        gc.collect()
        if not check_store(path, n, n_t, step):
            return 1
        if built:
            print(
                f"  build: generate {gen_s:.1f} s, insert {build['insert_s']:.1f} s,"
                f" file {build['file_mib']:.0f} MiB (not part of the figure)"
            )

        runs = []
        fits: dict[str, Any] = {}
        for i in range(args.repeat):
            gc.collect()
            before = loadavg()
            if step == 1:
                tm, fits = timed_calibration(path, n, n_t, args.threads)
            else:
                tm, fits = timed_calibration_at_step(path, n, n_t, step, args.threads)
            tm["loadavg_before"] = before
            tm["loadavg_after"] = loadavg()
            runs.append(tm)
            each = (
                f" (power {tm['fit_power_s']:.2f}, rc temp + mem {tm['fit_rc_both_s']:.2f})"
                if "fit_power_s" in tm
                else ""
            )
            steps = f" (step groups {tm['step_s']:.2f})" if "step_s" in tm else ""
            print(
                f"  run {i + 1}: read {tm['read_s']:.2f} s{steps}, prep {tm['prep_s']:.2f} s,"
                f" fits {tm['fit_s']:.2f} s{each} -> total {tm['total_s']:.2f} s"
                f" ({tm['cpu_s']:.1f} CPU-s)"
                f"   [load {before[0]:.2f} -> {tm['loadavg_after'][0]:.2f}]"
            )
            if i < args.repeat - 1:
                fits = {}
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_s")}
        result["runs"] = runs
        result["median"] = med
        result["accuracy"] = accuracy(fits, truth, kinds)
        if "groups" in fits:
            result["step_groups"] = fits.pop("groups")
            for key in ("rc", "rc_mem"):
                w = fits[key].input_weight
                result["accuracy"]["rc_temp" if key == "rc" else "rc_mem"]["interval_mean"] = float(
                    np.mean(w > 0)
                )

        arr = fits.pop("arrays")
        fits.clear()
        gc.collect()
        x, y = design_matrices(arr["temp"], arr["power"], arr["ref"])
        del arr
        gc.collect()
        floor_runs = []
        coef = None
        for _ in range(args.repeat):
            before = loadavg()
            t_lstsq, coef = floor_lstsq(x, y)
            t_normal, coef_n = floor_normal(x, y)
            floor_runs.append(
                {"lstsq_loop_s": t_lstsq, "normal_eq_s": t_normal, "loadavg_before": before}
            )
            print(
                f"  floor: lstsq loop {t_lstsq:.2f} s, batched normal equations {t_normal:.2f} s"
                f"   [load {before[0]:.2f}]"
            )
        assert coef is not None
        agree = float(np.nanmax(np.abs(coef_n - coef) / np.maximum(np.abs(coef), 1e-3)))
        del x, y
        lstsq_s = statistics.median(r["lstsq_loop_s"] for r in floor_runs)
        normal_s = statistics.median(r["normal_eq_s"] for r in floor_runs)
        result["floor"] = {
            "runs": floor_runs,
            "lstsq_loop_s": lstsq_s,
            "normal_eq_s": normal_s,
            "normal_vs_lstsq_max_rel_diff": agree,
            "accuracy": floor_accuracy(coef, truth, float(step)),
        }
        result["ratio"] = {
            "total_over_lstsq": med["total_s"] / lstsq_s,
            "fit_over_lstsq": med["fit_s"] / lstsq_s,
            "total_over_normal_eq": med["total_s"] / normal_s,
        }
        result["target_met"] = med["total_s"] <= target_s
    finally:
        if built and not args.keep:
            for p in (path, path + ".wal"):
                if Path(p).exists():
                    os.remove(p)
        if tmpdir and not args.keep:
            os.rmdir(tmpdir)

    acc, fl, ratio = result["accuracy"], result["floor"], result["ratio"]
    print()
    print(f"== {n:,} GPUs x {args.seconds:,} s every {step} s, median of {args.repeat} ==")
    print(f"  read (load_window gpu + cdu)     {med['read_s']:7.2f} s")
    if "step_s" in med:
        print(f"    of which step groups           {med['step_s']:7.2f} s  {result['step_groups']}")
    print(f"  prep (reference, power limit)    {med['prep_s']:7.2f} s")
    threads = "one after the other" if args.threads == 1 else "power curve beside RC"
    print(f"  fits ({threads})          {med['fit_s']:7.2f} s")
    for key, label in (
        ("fit_power_s", "fit_power_curve"),
        ("fit_rc_both_s", "fit_rc_many temp_c + mem_temp_c"),
    ):
        if key in med:
            print(f"    {label:30s} {med[key]:7.2f} s")
    print(
        f"  total read + fit                 {med['total_s']:7.2f} s   target <= {target_s:g} s:"
        f" {'MET' if result['target_met'] else 'MISSED'}"
    )
    print(f"  CPU time of read + fit, all threads {med['cpu_s']:7.2f} s (wall on an idle machine >="
          f" this / {os.cpu_count()} CPUs)")  # fmt: skip
    print(f"  floor: lstsq loop ({n:,} x ({n_t - 1} x 4))  {lstsq_s:7.2f} s")
    print(f"  info: batched normal equations   {normal_s:7.2f} s")
    print(
        f"  ratio (read + fit) / lstsq = {ratio['total_over_lstsq']:.2f};"
        f" fit / lstsq = {ratio['fit_over_lstsq']:.2f}"
    )
    print("accuracy against the true parameters:")
    for key in ("rc_temp", "rc_mem"):
        a = acc[key]
        print(f"  {key}: usable {100 * a['usable']:.1f} % {a['usable_by_workload']}")
        if "interval_mean" in a:
            print(f"    interval-mean input model kept for {100 * a['interval_mean']:.1f} %")
        print(f"    R {_fmt_rel(a['r'])}")
        print(f"    C {_fmt_rel(a['c'])}")
        off = a["offset_abs_k"]
        if off["median"] is not None:
            print(
                f"    offset |err| median {off['median']:.3f} K, worst {off['worst']:.3f} K;"
                f" sim MAE {a['sim_mae_k_median']:.3f} K"
            )
        if a["unusable_reasons"]:
            print(f"    unusable: {a['unusable_reasons']}")
    a = acc["power"]
    print(f"  power: usable {100 * a['usable']:.1f} % {a['usable_by_workload']}")
    print(f"    idle identified {100 * a['idle_identified']:.1f} %: {_fmt_rel(a['idle_w'])}")
    print(f"    limit identified {100 * a['limit_identified']:.1f} %: {_fmt_rel(a['limit_w'])}")
    print(f"    gamma {_fmt_rel(a['gamma'])}")
    if a["unusable_reasons"]:
        print(f"    unusable: {a['unusable_reasons']}")
    print(
        f"  floor (one-step lstsq, R = b/(1-a), tau = -step/ln a):"
        f" R {_fmt_rel(fl['accuracy']['r'])}"
    )
    print(f"    C {_fmt_rel(fl['accuracy']['c'])}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
