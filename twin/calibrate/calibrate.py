"""Calibrate every device of a site against a window of telemetry from the store.

The chain of DESIGN.md "The physics", fitted link by link with the functions of ``models``:
GPU power curve (activity to power), GPU and HBM thermal RC (power to temperature above the
coolant or inlet air), rack input power (GPU power to PDU power) and liquid capture (rack
power to CDU heat). The last part of the window is held out: each model predicts it from the
measured inputs, and the errors (MAE, CV(RMSE), NMBE, MAPE) are stored with the parameters.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from models import fit_quality
from models.cdu import fit_capture_fraction, predict_return_temp_c
from models.electrical import fit_rack_power
from models.gpu_power import (
    CURVE_KINDS,
    POWER_LAW,
    PowerCurveFit,
    UtilCurveFit,
    curve_power_w,
    fit_power_curve,
    fit_util_power_curve,
)
from models.gpu_thermal import RcFit, fit_rc_many, predict_temp_c
from twin.chain.params import UTIL_SHAPE_PARAM
from twin.site import Site
from twin.site.index import SiteIndex, gpu_reference, index_site
from twin.store import Store
from twin.store.reads import newest_ts
from twin.store.windows import (
    MAX_STEP_S,
    MIN_STEP_S,
    Window,
    first_valid,
    grid_end,
    hold_fill,
    infer_step_s,
    load_max,
    load_window,
    mean_intervals_s,
)

#: A GPU's R is an event when it sits this far above its fleet's median (wider than the spread
#: of healthy cold plates, ±15 % in docs/physics.md §9.2's range) ...
FLEET_BAND = 0.50
#: ... and this far above its own history (the median of its earlier usable fits), if any.
OWN_BAND = 0.20
#: Largest standard error of a rack's capture fraction for it to count as identified: a
#: usable per-rack value is then within ±0.02 (issue 3's tolerance) at two standard errors.
CAPTURE_MAX_STDERR = 0.01
#: Temperature prediction horizon for the held-out quality figure (the issue's 10 minutes). [s]
TEMP_HORIZON_S = 600.0
#: Least data each fit needs, as time, not as a count of samples, so that a 10 s recording
#: needs the same span as a 1 Hz one and not ten times more: the fitters' own defaults at
#: 1 Hz (300, 100, 10, 30 and 300 samples). Whether that span *excites* the model enough is
#: judged by each fitter from the standard errors of its parameters (power steps for R and C,
#: an activity spread for the power curve, load changes for the rack and capture fits). [s]
MIN_RC_S = 300.0
MIN_POWER_CURVE_S = 100.0
MIN_IDLE_S = 10.0
MIN_RACK_S = 30.0
MIN_CAPTURE_S = 300.0
#: ... and never fewer samples than this, whatever the step: five per parameter of the largest
#: model (R, tau, offset and initial temperature of the RC fit).
MIN_FIT_SAMPLES = 20
#: Fewest samples at idle for the idle power to count as seen, whatever the step.
MIN_IDLE_SAMPLES = 3


#: Finest step at which the RC fit also tries the interval-mean input model (below). At 1 s and
#: finer the zero-order hold of the samples is kept alone: the half-step lag it ignores is
#: under 5 % of the shortest GPU time constant (10 s on a cold plate, docs/physics.md §2.3). [s]
INTERVAL_MEAN_MIN_STEP_S = 2.0


@dataclass(frozen=True)
class StepRcFit(RcFit):
    """:class:`models.gpu_thermal.RcFit` with the input model chosen per GPU: the power driving
    the step from sample k to k + 1 is ``(1 - w) P_k + w P_{k+1}`` with ``w = input_weight``;
    0 is the zero-order hold of the samples (the fitters' model). [1]"""

    input_weight: np.ndarray


def interval_mean_weight(tau_s: np.ndarray, step_s: float) -> np.ndarray:
    """The weight ``w`` of the next sample's power when each sample is the mean over its step
    (a recording's buckets: ``dctwin record`` averages) of a first-order response to a power
    held over the step. Point samples of a power held from one sample to the next follow the
    zero-order hold instead (weight 0); :func:`fit_rc_at_step` lets the data choose.

    With ``a = exp(-step/tau)`` and ``g = tau (1 - a) / step`` (the step-mean of an exponential
    decay), the step means obey ``T_{k+1} = a T_k + (1 - a) ss_k + (1 - g)(ss_{k+1} - ss_k)``,
    i.e. the RC step driven by ``(1 - w) P_k + w P_{k+1}``, ``w = (1 - g) / (1 - a)``: 0.5 for
    ``tau >> step``, towards 1 for ``tau << step``. Unknown ``tau`` gives 0.5."""
    tau = np.where(np.isfinite(tau_s) & (tau_s > 0), tau_s, np.inf)
    x = step_s / tau
    with np.errstate(divide="ignore", invalid="ignore"):
        one_minus_a = -np.expm1(-x)
        g = one_minus_a / x
        w = (1.0 - g) / one_minus_a
    return np.where(np.isfinite(w), np.clip(w, 0.5, 1.0), 0.5)


def interval_power_w(power_w: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per step k, the power that drives it under :func:`interval_mean_weight`'s model:
    ``(1 - w) P_k + w P_{k+1}``; where ``P_{k+1}`` is missing (or at the end), ``P_k``."""
    p = np.asarray(power_w, dtype=float)
    if p.shape[0] < 2:
        return p.copy()
    # P_k + w (P_{k+1} - P_k), in place in one output array (no stacked or masked copies of
    # the whole window: 0.13 s a call at 10,000 GPUs x 720 samples before)
    out = np.empty_like(p)
    head = out[:-1]
    np.subtract(p[1:], p[:-1], out=head)
    head *= weight
    head += p[:-1]
    out[-1] = p[-1]
    gap = np.isnan(head)
    if gap.any():  # P_{k+1} missing: P_k alone (NaN where P_k is missing too)
        head[gap] = p[:-1][gap]
    return out


def _pick(zoh: RcFit, other: RcFit, weight: np.ndarray) -> StepRcFit:
    """Per GPU, the fit with the smaller output error (a usable fit over an unusable one)."""

    def score(f: RcFit) -> np.ndarray:
        return np.where(f.usable & np.isfinite(f.sim_mae_k), f.sim_mae_k, np.inf)

    s_zoh, s_other = score(zoh), score(other)
    take = s_other < s_zoh
    values: dict[str, Any] = {}
    for f in fields(RcFit):
        a, b = getattr(zoh, f.name), getattr(other, f.name)
        if isinstance(a, list):
            values[f.name] = [y if t else x for x, y, t in zip(a, b, take, strict=True)]
        else:
            values[f.name] = np.where(take, b, a)
    return StepRcFit(**values, input_weight=np.where(take, weight, 0.0))


def fit_rc_at_step(
    temps_c: dict[str, np.ndarray],
    ref_temp_c: np.ndarray,
    power_w: np.ndarray,
    step_s: float,
    **kw: Any,
) -> dict[str, StepRcFit]:
    """``fit_rc_many`` at any step: at :data:`INTERVAL_MEAN_MIN_STEP_S` and coarser, each
    temperature is also fitted with the interval-mean input (the weight from the time constant
    of its zero-order-hold fit), and each GPU keeps the model of smaller output error. On a
    10 s recording of bucket means (time constants 8-12 s on the cold plates of the small
    site), the zero-order hold alone put C 7-41 % low and left 8 of 24 GPUs unidentified; with
    the interval-mean input C came within the 1 Hz tolerance for all 24
    (tests/test_calibrate_any_step.py).

    The quantities run in turn, in this thread: the zero-order-hold fits of all of them in one
    ``fit_rc_many`` call (the power and reference checks and working copies made once), then
    each quantity's interval-mean refit (its input depends on its own time constant). One
    thread per quantity lost more to the GIL than it gained on a shared 2-CPU machine: the
    output-error passes are a few numpy calls per sample on 10,000-wide rows, each holding
    the GIL for its dispatch (bench/README.md)."""
    zoh_all = fit_rc_many(temps_c, ref_temp_c, power_w, step_s, **kw)
    out: dict[str, StepRcFit] = {}
    for q, temp in temps_c.items():
        zoh = zoh_all[q]
        if step_s < INTERVAL_MEAN_MIN_STEP_S:
            values = {k.name: getattr(zoh, k.name) for k in fields(RcFit)}
            out[q] = StepRcFit(**values, input_weight=np.zeros(zoh.r_k_per_w.shape))
            continue
        w = interval_mean_weight(zoh.tau_s, step_s)
        p_mean = interval_power_w(power_w, w)
        refit = fit_rc_many({q: temp}, ref_temp_c, p_mean, step_s, **kw)[q]
        out[q] = _pick(zoh, refit, w)
    return out


def min_samples(duration_s: float, step_s: float, floor: int = MIN_FIT_SAMPLES) -> int:
    """The sample count that covers ``duration_s`` at ``step_s`` (at least ``floor``)."""
    return max(floor, int(np.ceil(duration_s / step_s - 1e-9)))


def fit_gpu_links(
    activity: np.ndarray,
    power_w: np.ndarray,
    limit_w: np.ndarray,
    temps_c: dict[str, np.ndarray],
    ref_temp_c: np.ndarray,
    step_s: float,
    *,
    threads: int = 1,
) -> tuple[PowerCurveFit, dict[str, StepRcFit]]:
    """Fit the GPU power curve and one RC model per temperature quantity, all GPUs at once.

    ``activity``, ``power_w`` and every array of ``temps_c`` (``temp_c``, ``mem_temp_c``) are
    ``(T, N)``; ``ref_temp_c`` is the coolant or inlet reference per GPU. The fits share no
    state: ``threads`` 2 or more runs the power curve in a thread beside the RC fits (numpy
    releases the GIL inside its array loops); the default, 1, runs everything in turn in
    this thread. On an idle 2-CPU machine the thread saves wall time; on a shared one it
    costs some, and CPU time either way (bench/README.md).
    """
    # in-sample MAE skipped: calibrate() scores the curve on its held-out window
    pc_args = (activity, power_w, limit_w)
    pc_kw = {
        "dt_s": step_s,
        "in_sample_mae": False,
        "min_samples": min_samples(MIN_POWER_CURVE_S, step_s),
        "min_idle_samples": min_samples(MIN_IDLE_S, step_s, MIN_IDLE_SAMPLES),
    }
    rc_kw = {"min_samples": min_samples(MIN_RC_S, step_s)}
    if threads <= 1 or not temps_c:
        pc = fit_power_curve(*pc_args, **pc_kw)
        return pc, fit_rc_at_step(temps_c, ref_temp_c, power_w, step_s, **rc_kw)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="calibrate") as pool:
        rc_job = pool.submit(fit_rc_at_step, temps_c, ref_temp_c, power_w, step_s, **rc_kw)
        pc_job = pool.submit(fit_power_curve, *pc_args, **pc_kw)
        return pc_job.result(), rc_job.result()


def power_curves(
    pc: PowerCurveFit,
    activity: np.ndarray,
    power_w: np.ndarray,
    limit_w: np.ndarray,
    from_util: np.ndarray,
    step_s: float,
) -> UtilCurveFit:
    """Every GPU's power curve: the power law ``pc`` where ``activity`` is SM activity, and
    where it is GPU-Util (``from_util``, per GPU) the family of least held-out error
    (:func:`models.gpu_power.fit_util_power_curve`: power law, two-level or saturating, the
    last quarter of the fit window held out). A util GPU that keeps the power law keeps
    ``pc``'s numbers, so a site with SM activity everywhere is calibrated as before."""
    n = pc.idle_w.size
    out = {
        "kind": np.full(n, POWER_LAW, dtype=np.int64),
        "idle_w": pc.idle_w.copy(),
        "limit_w": pc.limit_w.copy(),
        "shape": pc.gamma.copy(),
        "idle_stderr_w": pc.idle_stderr_w.copy(),
        "limit_stderr_w": pc.limit_stderr_w.copy(),
        "shape_stderr": pc.gamma_stderr.copy(),
        "holdout_mae_w": np.full((n, len(CURVE_KINDS)), np.nan),
        "n_samples": pc.n_samples.copy(),
        "usable": pc.usable.copy(),
    }
    reason = list(pc.reason)
    cols = np.flatnonzero(from_util)
    if cols.size:
        lim = np.broadcast_to(np.asarray(limit_w, dtype=float), (n,))[cols]
        uf = fit_util_power_curve(
            activity[:, cols],
            power_w[:, cols],
            lim,
            min_samples=min_samples(MIN_POWER_CURVE_S, step_s),
            min_idle_samples=min_samples(MIN_IDLE_S, step_s, MIN_IDLE_SAMPLES),
            dt_s=step_s,
        )
        out["holdout_mae_w"][cols] = uf.holdout_mae_w
        # a util-only family, or the straight line published where every family was refused
        linear = uf.linear if uf.linear is not None else np.zeros(cols.size, bool)
        util = (uf.kind != POWER_LAW) | linear
        for name in out:
            if name != "holdout_mae_w":
                out[name][cols[util]] = getattr(uf, name)[util]
        # a util-only family's reason where it won; where no family is usable, every
        # family's reason (not the power law's alone: the util families were tried too)
        for j in np.flatnonzero(util | ~uf.usable):
            reason[cols[j]] = uf.reason[j]
        for j in np.flatnonzero(linear):  # usable, and marked as the line it is
            reason[cols[j]] = uf.note[j] if uf.note is not None else None
    return UtilCurveFit(**out, reason=reason)


def _power_curve_results(
    results: dict[str, Any],
    params: Callable[..., None],
    ids: list[str],
    curve: UtilCurveFit,
    from_util: np.ndarray,
) -> None:
    """The power-curve parameter rows of every GPU: idle, limit and gamma (NaN for a
    util-only family), then the family rows of the GPUs seen through GPU-Util."""
    params(
        "gpu",
        ids,
        curve.usable,
        curve.reason,
        idle_w=(curve.idle_w, curve.idle_stderr_w),
        limit_w=(curve.limit_w, curve.limit_stderr_w),
        gamma=(
            np.where(curve.kind == POWER_LAW, curve.shape, np.nan),
            np.where(curve.kind == POWER_LAW, curve.shape_stderr, np.nan),
        ),
    )
    results["params"].extend(_util_curve_rows(ids, curve, from_util))


def _util_curve_rows(ids: list[str], curve: UtilCurveFit, from_util: np.ndarray):
    """Parameter rows of the curve family of each GPU seen through GPU-Util: ``curve_kind``
    (a :data:`models.gpu_power.CURVE_KINDS` code) and, for a util-only family, its shape
    (``util_threshold`` or ``util_u0``). A GPU with SM activity keeps the power law and gets
    no such row (no ``curve_kind`` reads as the power law)."""
    for j in np.flatnonzero(from_util):
        kind = int(curve.kind[j])
        row = {"kind": "gpu", "id": ids[j], "usable": bool(curve.usable[j])}
        row["reason"] = curve.reason[j]
        yield {**row, "param": "curve_kind", "value": float(kind), "stderr": None}
        if kind in UTIL_SHAPE_PARAM:
            yield {
                **row,
                "param": UTIL_SHAPE_PARAM[kind],
                "value": _f(curve.shape[j]),
                "stderr": _f(curve.shape_stderr[j]),
            }


def _quality(
    kind: str,
    ids: list[str],
    quantity: str,
    meas: np.ndarray,
    pred: np.ndarray,
    usable: np.ndarray | None = None,
):
    """Held-out fit quality of each device whose fit is usable: a refused fit publishes its
    reasons, never an error figure (its prediction is the seed or nothing, and a first-value
    "forecast" scores 0.0 on one sample)."""
    q = fit_quality.fit_quality(meas, pred)
    for i, sid in enumerate(ids):
        if usable is not None and not bool(usable[i]):
            continue
        yield {
            "kind": kind,
            "id": sid,
            "quantity": quantity,
            "mae": float(q.mae[i]),
            "cv_rmse": float(q.cv_rmse[i]),
            "nmbe": float(q.nmbe[i]),
            "mape": float(q.mape[i]),
            "n": int(q.n_samples[i]),
        }


def _fit_gpu_group(
    results: dict[str, Any],
    params: Callable[..., None],
    idx: SiteIndex,
    gpu: Window,
    limit: np.ndarray,
    ref: np.ndarray,
    step_s: float,
    split: int,
) -> StepRcFit | None:
    """The GPU links of :func:`calibrate` for the GPUs of ``idx`` on one grid: parameters via
    ``params``, held-out quality into ``results``; returns the core temperature's RC fit."""
    power = gpu.values["power_w"]
    activity = gpu.values["sm_active"].copy()
    no_sm = np.isnan(activity).all(axis=0)
    activity[:, no_sm] = gpu.values["util_pct"][:, no_sm] / 100.0
    fit, hold = slice(0, split), slice(split, None)
    # 1. and 2.: GPU power curve, GPU and HBM temperature (fitted in turn)
    temps = {
        q: gpu.values[q][fit] for q in ("temp_c", "mem_temp_c") if not np.isnan(gpu.values[q]).all()
    }
    pc, rc_fits = fit_gpu_links(activity[fit], power[fit], limit, temps, ref[fit], step_s)
    curve = power_curves(pc, activity[fit], power[fit], limit, no_sm, step_s)
    _power_curve_results(results, params, idx.gpu_ids, curve, no_sm)
    cap = np.where(np.isfinite(limit), limit, np.inf)
    pred_p = curve_power_w(
        curve.kind, np.clip(activity[hold], 0.0, 1.0), curve.idle_w, curve.limit_w, curve.shape, cap
    )
    results["quality"].extend(
        _quality("gpu", idx.gpu_ids, "power_w", power[hold], pred_p, curve.usable)
    )
    for quantity, prefix in (("temp_c", ""), ("mem_temp_c", "mem_")):
        if quantity not in rc_fits:
            continue
        temp = gpu.values[quantity]
        rc = rc_fits[quantity]
        params(
            "gpu",
            idx.gpu_ids,
            rc.usable,
            rc.reason,
            **{
                f"{prefix}r_k_per_w": (rc.r_k_per_w, rc.r_stderr_k_per_w),
                f"{prefix}c_j_per_k": (rc.c_j_per_k, rc.c_stderr_j_per_k),
                f"{prefix}offset_k": (rc.offset_k, None),
                f"{prefix}input_weight": (rc.input_weight, None),
            },
        )
        n_ahead = min(int(TEMP_HORIZON_S / step_s), temp.shape[0] - split)
        if n_ahead > 1:
            h = slice(split, split + n_ahead)
            pred = predict_temp_c(
                first_valid(temp[h]),
                ref[h],
                interval_power_w(hold_fill(power[h]), rc.input_weight),
                rc.r_k_per_w,
                rc.c_j_per_k,
                step_s,
                rc.offset_k,
            )
            results["quality"].extend(
                _quality(
                    "gpu",
                    idx.gpu_ids,
                    f"{quantity}@{int(TEMP_HORIZON_S)}s",
                    temp[h],
                    pred,
                    rc.usable,
                )
            )
    return rc_fits.get("temp_c")


@dataclass(frozen=True)
class _RView:
    """The core R of every GPU of the site, merged over the step groups (for drift events)."""

    r_k_per_w: np.ndarray
    usable: np.ndarray


def _sub_index(idx: SiteIndex, members: np.ndarray) -> SiteIndex:
    """``idx`` restricted to the GPUs at positions ``members`` (racks and CDUs kept; no node
    placement: a fit needs none)."""
    pick = [int(g) for g in members]
    return SiteIndex(
        gpu_ids=[idx.gpu_ids[g] for g in pick],
        gpu_node=[idx.gpu_node[g] for g in pick],
        gpu_rack=idx.gpu_rack[members],
        gpu_cdu=idx.gpu_cdu[members],
        gpu_class=[idx.gpu_class[g] for g in pick],
        gpu_fleet=[idx.gpu_fleet[g] for g in pick],
        rack_names=idx.rack_names,
        rack_pdus=idx.rack_pdus,
        rack_cdu=idx.rack_cdu,
        rack_prior=idx.rack_prior,
        cdu_names=idx.cdu_names,
        cdu_fluid=idx.cdu_fluid,
    )


def _grid_end(
    store: Store, ids: list[str], step_s: float, window_s: float, newest: datetime | None = None
) -> datetime:
    """The end of the ``step_s`` grid for the GPUs ``ids``
    (:func:`twin.store.windows.grid_end`)."""
    return grid_end(store, "gpu", ids, step_s, window_s, newest)


def calibrate(
    store: Store,
    site: Site,
    *,
    end: datetime | None = None,
    window_s: float = 7200.0,
    holdout_s: float = 1200.0,
    step_s: float | None = None,
) -> dict[str, Any]:
    """Fit every device on [end - window_s, end - holdout_s) and score it on the rest.

    ``step_s`` is the grid the window is loaded on. By default each GPU is fitted at the
    data's own step (:func:`step_groups`: GPUs grouped by sampling rate, each group at the
    coarsest median interval of its GPUs and the reference series they join), so gaps are
    counted against the rate each device reports at; rack power and capture on the coarsest
    group's grid. Irregular timestamps are resampled onto the grid (one sample per step, NaN
    where none: a gap), phased at the timestamps' median offset (:func:`_grid_end`). The run
    says the steps (``step_groups``); each GPU's ``step_s`` is saved with its parameters.
    Returns a JSON-serializable result; :func:`save_run` stores it.
    """
    t_start = time.perf_counter()
    idx = index_site(site)
    newest = None
    if end is None:
        newest = newest_ts(store, "gpu")
        if newest is None:
            raise ValueError("the store holds no GPU samples to calibrate against")
    probe_end = end if end is not None else newest + timedelta(microseconds=1)
    probe_start = probe_end - timedelta(seconds=window_s)
    if step_s is None:
        groups = step_groups(store, idx, probe_start, probe_end)
    elif not step_s > 0:
        raise ValueError(f"step {step_s!r} s must be > 0")
    else:
        groups = [(step_s, np.arange(len(idx.gpu_ids)))]
    # racks and CDUs sum every GPU of a rack: they are fitted on the coarsest group's grid
    step_s = max(s for s, _ in groups)
    if end is None:
        # the newest samples (of the coarsest group) mid-step: jittered ones land one a step
        members = groups[-1][1]
        known = newest if len(members) == len(idx.gpu_ids) else None
        end = _grid_end(store, [idx.gpu_ids[g] for g in members], step_s, window_s, known)
    start = end - timedelta(seconds=window_s)
    split = round((window_s - holdout_s) / step_s)

    gpu, limit, cdu, node, pdu = _load_windows(store, idx, start, end, step_s)
    power = gpu.values["power_w"]
    fit, hold = slice(0, split), slice(split, None)

    results: dict[str, Any] = {"params": [], "quality": []}

    def params(kind: str, ids: list[str], usable, reason, **values) -> None:
        for i, sid in enumerate(ids):
            for name, (val, err) in values.items():
                results["params"].append(
                    {
                        "kind": kind,
                        "id": sid,
                        "param": name,
                        "value": _f(val[i]),
                        "stderr": _f(err[i]) if err is not None else None,
                        "usable": bool(usable[i]),
                        "reason": reason[i],
                    }
                )

    # 1. and 2.: GPU power curve, GPU and HBM temperature, each group of GPUs at its own step
    n_gpu = len(idx.gpu_ids)
    r_all, usable_all = np.full(n_gpu, np.nan), np.zeros(n_gpu, dtype=bool)
    step_of = np.full(n_gpu, step_s)
    for g_step, members in groups:
        if g_step == step_s:  # the coarsest group: on the window already read
            g_idx = idx if len(members) == n_gpu else _sub_index(idx, members)
            g_gpu = gpu if len(members) == n_gpu else gpu.select(g_idx.gpu_ids)
            g_limit, g_ref = limit[members], gpu_reference(g_idx, cdu, node, pdu)
        else:
            g_idx = _sub_index(idx, members)
            g_end = end if newest is None else _grid_end(store, g_idx.gpu_ids, g_step, window_s)
            g_gpu, g_limit, g_cdu, g_node, g_pdu = _load_windows(
                store, g_idx, g_end - timedelta(seconds=window_s), g_end, g_step
            )
            g_ref = gpu_reference(g_idx, g_cdu, g_node, g_pdu)
        g_split = round((window_s - holdout_s) / g_step)
        rc = _fit_gpu_group(results, params, g_idx, g_gpu, g_limit, g_ref, g_step, g_split)
        step_of[members] = g_step
        if rc is not None:
            r_all[members], usable_all[members] = rc.r_k_per_w, rc.usable
    # 3. rack power: sum of the rack's GPUs against its PDUs
    n_r = len(idx.rack_names)
    sum_gpu = np.zeros((power.shape[0], n_r))
    np.add.at(sum_gpu.T, idx.gpu_rack, np.nan_to_num(power.T))
    pdu_pos = {p: i for i, p in enumerate(pdu.ids)}
    rack_in = np.zeros_like(sum_gpu)
    for r, pdus in enumerate(idx.rack_pdus):
        feeds = pdu.values["power_w"][:, [pdu_pos[p] for p in pdus]]
        rack_in[:, r] = np.where(np.isnan(feeds).all(axis=1), np.nan, np.nansum(feeds, axis=1))
    rp = fit_rack_power(
        sum_gpu[fit], rack_in[fit], dt_s=step_s, min_samples=min_samples(MIN_RACK_S, step_s)
    )
    params(
        "rack",
        idx.rack_names,
        rp.usable,
        rp.reason,
        alpha_w=(rp.alpha_w, rp.alpha_stderr_w),
        beta=(rp.beta, rp.beta_stderr),
    )
    pred_rack = rp.alpha_w + rp.beta * sum_gpu[hold]
    results["quality"].extend(
        _quality("rack", idx.rack_names, "power_w", rack_in[hold], pred_rack, rp.usable)
    )
    # 4. liquid capture per rack, from each CDU's heat balance
    if idx.cdu_names:
        results["quality"].extend(_fit_capture(params, idx, cdu, rack_in, fit, hold, step_s))
    results["events"] = _drift_events(store, idx, _RView(r_all, usable_all))
    results["run"] = {
        "fitted_at": datetime.now(UTC).isoformat(),
        "window_start": start.isoformat(),
        "window_end": end.isoformat(),
        "holdout_start": (start + timedelta(seconds=split * step_s)).isoformat(),
        "step_s": step_s,
        "step_groups": [{"step_s": s, "gpus": len(m)} for s, m in groups],
        "gpus": len(idx.gpu_ids),
        "racks": n_r,
        "cdus": len(idx.cdu_names),
        "seconds": round(time.perf_counter() - t_start, 3),
    }
    results["classes"] = _class_summary(idx, results)
    # the step each GPU was fitted at, saved with its parameters (after the summary: not a fit)
    ok = np.ones(n_gpu, dtype=bool)
    params("gpu", idx.gpu_ids, ok, [None] * n_gpu, step_s=(step_of, None))
    return results


#: GPUs whose mean sampling intervals lie within this factor of the finest of their group
#: are fitted together on one grid: a jittered 10 s exporter, or one that dropped a third of
#: its samples, is one group; 1 s and 10 s exporters are two. [1]
STEP_GROUP_FACTOR = 1.5


def step_groups(
    store: Store, idx: SiteIndex, start: datetime, end: datetime
) -> list[tuple[float, np.ndarray]]:
    """The grids calibration fits the GPUs on: GPUs grouped by their own sampling rate (the
    mean interval of each GPU's samples in [start, end), one aggregate query,
    :func:`~twin.store.windows.mean_intervals_s`), each group's step then the median
    interval of its GPUs and of the reference series they join, the coarsest of those
    (:func:`data_step_s`); groups that end at one step are one. Returns ``(step_s, GPU
    positions in idx)`` per group, finest first; GPUs with fewer than two samples, or sampled
    more rarely than :data:`MAX_STEP_S`, join the coarsest group (their fits are refused there
    for the missing data). Raises ValueError as :func:`data_step_s` when no group is left."""
    own = mean_intervals_s(store, "gpu", start, end, idx.gpu_ids)
    known = np.flatnonzero(np.isfinite(own))
    if not known.size:
        raise ValueError(
            f"no GPU of the site has two samples between {start.isoformat()} and"
            f" {end.isoformat()}: no sampling step to calibrate at"
        )
    clusters: list[list[int]] = []
    for g in known[np.argsort(own[known], kind="stable")]:
        if clusters and own[g] <= own[clusters[-1][0]] * STEP_GROUP_FACTOR:
            clusters[-1].append(int(g))
        else:
            clusters.append([int(g)])
    clusters[-1].extend(int(g) for g in np.flatnonzero(~np.isfinite(own)))
    by_step: dict[float, list[int]] = {}
    too_coarse: list[int] = []
    error: ValueError | None = None
    for members in clusters:
        try:
            step = data_step_s(store, idx, start, end, np.array(sorted(members)))
        except ValueError as e:  # a few samples over the window (a node down most of it)
            too_coarse.extend(members)
            error = error or e
            continue
        by_step.setdefault(step, []).extend(members)
    if not by_step:
        assert error is not None
        raise error
    # GPUs sampled too rarely to fit join the coarsest grid, where they are refused for gaps
    by_step[max(by_step)].extend(too_coarse)
    return [(step, np.array(sorted(m), dtype=np.int64)) for step, m in sorted(by_step.items())]


def data_step_s(
    store: Store,
    idx: SiteIndex,
    start: datetime,
    end: datetime,
    members: np.ndarray | None = None,
) -> float:
    """The grid step the GPUs at positions ``members`` of ``idx`` (default: all) are loaded on
    for [start, end): per kind their fits join (GPU, their CDUs, PDUs and nodes), the median
    interval of its timestamps (:func:`infer_step_s`), and of those the coarsest, so that
    every series is dense on the grid; below :data:`MIN_STEP_S` it is that floor. Raises
    ValueError when there is no GPU step to infer or it is over :data:`MAX_STEP_S`."""
    sub = idx if members is None else _sub_index(idx, members)
    pdus = sorted({p for r in set(sub.gpu_rack.tolist()) for p in idx.rack_pdus[r]})
    cdus = sorted({idx.cdu_names[c] for c in set(sub.gpu_cdu.tolist()) if c >= 0})
    steps = {
        "gpu": infer_step_s(store, "gpu", start, end, sub.gpu_ids),
        "cdu": infer_step_s(store, "cdu", start, end, cdus) if cdus else None,
        "pdu": infer_step_s(store, "pdu", start, end, pdus) if pdus else None,
        "node": infer_step_s(store, "node", start, end, sorted(set(sub.gpu_node))),
    }
    if steps["gpu"] is None:
        raise ValueError(
            f"no GPU of the site has two samples between {start.isoformat()} and"
            f" {end.isoformat()}: no sampling step to calibrate at"
        )
    kind, step = max(((k, v) for k, v in steps.items() if v is not None), key=lambda kv: kv[1])
    if step > MAX_STEP_S:
        raise ValueError(
            f"{kind} telemetry is sampled every {step:g} s (median interval): calibration needs"
            f" a step of at most {MAX_STEP_S:g} s"
        )
    return max(step, MIN_STEP_S)


def _load_windows(
    store: Store, idx: SiteIndex, start: datetime, end: datetime, step_s: float
) -> tuple[Window, np.ndarray, Window, Window, Window]:
    """The GPU, CDU, node and PDU telemetry calibration fits on, and each GPU's highest
    power limit over the window."""
    gpu = load_window(
        store,
        "gpu",
        start,
        end,
        step_s=step_s,
        ids=idx.gpu_ids,
        quantities=["power_w", "temp_c", "mem_temp_c", "sm_active", "util_pct"],
    )
    limit = load_max(store, "gpu", start, end, "power_limit_w", idx.gpu_ids)
    cdu = load_window(
        store,
        "cdu",
        start,
        end,
        step_s=step_s,
        ids=idx.cdu_names,
        quantities=["supply_temp_c", "return_temp_c", "flow_lpm", "heat_kw"],
    )
    node = load_window(store, "node", start, end, step_s=step_s, quantities=["inlet_temp_c"])
    all_pdus = sorted({p for ps in idx.rack_pdus for p in ps})
    pdu = load_window(
        store,
        "pdu",
        start,
        end,
        step_s=step_s,
        ids=all_pdus,
        quantities=["power_w", "inlet_temp_c"],
    )
    return gpu, limit, cdu, node, pdu


def _fit_capture(
    params: Callable[..., None],
    idx: SiteIndex,
    cdu: Window,
    rack_in: np.ndarray,
    fit: slice,
    hold: slice,
    step_s: float,
) -> Iterator[dict[str, Any]]:
    """Liquid capture per rack from each CDU's heat balance, the flow the GPUs' R values were
    fitted at, and the held-out quality of the predicted return temperature; the parameters
    go through ``params`` (of :func:`calibrate`), the quality rows are returned."""
    cf = fit_capture_fraction(
        rack_in[fit],
        cdu.values["heat_kw"][fit],
        idx.rack_cdu,
        idx.rack_prior,
        dt_s=step_s,
        max_stderr=CAPTURE_MAX_STDERR,
        min_samples=min_samples(MIN_CAPTURE_S, step_s),
    )
    params(
        "rack",
        idx.rack_names,
        cf.usable,
        cf.reason,
        capture_fraction=(cf.fraction, cf.stderr),
        capture_identifiable=(cf.identifiable.astype(float), None),
    )
    # the flow the GPUs' R values were fitted at: R at another flow scales from it
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        flow_ref = np.nanmedian(cdu.values["flow_lpm"][fit], axis=0)
    params(
        "cdu",
        idx.cdu_names,
        cf.cdu_usable,
        cf.cdu_reason,
        capture_fraction=(cf.cdu_fraction, cf.cdu_fraction_stderr),
        lag_tau_s=(cf.lag_tau_s, None),
        flow_ref_lpm=(flow_ref, None),
    )
    ret = cdu.values["return_temp_c"]
    pred_ret = predict_return_temp_c(
        hold_fill(cdu.values["supply_temp_c"][hold]),
        hold_fill(rack_in[hold]),
        np.nan_to_num(cf.fraction),
        idx.rack_cdu,
        hold_fill(cdu.values["flow_lpm"][hold]),
        idx.cdu_fluid,
        lag_tau_s=np.nan_to_num(cf.lag_tau_s),
        dt_s=step_s,
        return0_c=first_valid(ret[hold]),
    )
    return _quality("cdu", idx.cdu_names, "return_temp_c", ret[hold], pred_ret, cf.cdu_usable)


def _f(x: Any) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def _median(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.median(finite)) if finite else None


def _drift_events(store: Store, idx: SiteIndex, rc) -> list[dict[str, Any]]:
    """GPUs whose R sits FLEET_BAND above their fleet's median and OWN_BAND above their own
    history (when they have one): a cold plate, TIM or flow problem before it is hot."""
    if rc is None:
        return []
    r = rc.r_k_per_w
    history = store.calibration_param_medians("gpu", "r_k_per_w")
    groups: dict[tuple[str, str], list[int]] = {}
    for g, (fleet, cls) in enumerate(zip(idx.gpu_fleet, idx.gpu_class, strict=True)):
        cooling = "liquid" if idx.gpu_cdu[g] >= 0 else "air"
        groups.setdefault((fleet or cls, cooling), []).append(g)
    events = []
    for (group, _cooling), members in groups.items():
        vals = r[members]
        ok = np.isfinite(vals) & rc.usable[members]
        if ok.sum() < 3:
            continue
        fleet_median = float(np.median(vals[ok]))
        for g in np.array(members)[ok]:
            own = history.get(idx.gpu_ids[g])
            over_fleet = r[g] > fleet_median * (1 + FLEET_BAND)
            if over_fleet and (own is None or r[g] > own * (1 + OWN_BAND)):
                events.append(
                    {
                        "kind": "gpu",
                        "id": idx.gpu_ids[g],
                        "param": "r_k_per_w",
                        "value": float(r[g]),
                        "own_median": own,
                        "fleet_median": fleet_median,
                        "group": group,
                        "detail": (
                            f"R {r[g]:.4f} K/W is {r[g] / fleet_median - 1:+.0%} over its group"
                            + (f" and {r[g] / own - 1:+.0%} over its own history" if own else "")
                        ),
                    }
                )
    return events


def _class_summary(idx: SiteIndex, results: dict[str, Any]) -> dict[str, Any]:
    by_param: dict[tuple[str, str], list[float]] = {}
    usable: dict[str, list[bool]] = {}
    cls_of = dict(zip(idx.gpu_ids, idx.gpu_class, strict=True))
    for p in results["params"]:
        cls = f"gpu:{cls_of[p['id']]}" if p["kind"] == "gpu" else p["kind"]
        if p["value"] is not None and p["usable"]:
            by_param.setdefault((cls, p["param"]), []).append(p["value"])
        usable.setdefault(cls, []).append(p["usable"])
    out: dict[str, Any] = {}
    for (cls, name), vals in by_param.items():
        out.setdefault(cls, {})[name] = {
            "median": float(np.median(vals)),
            "p10": float(np.percentile(vals, 10)),
            "p90": float(np.percentile(vals, 90)),
            "n": len(vals),
        }
    for q in results["quality"]:
        cls = f"gpu:{cls_of[q['id']]}" if q["kind"] == "gpu" else q["kind"]
        out.setdefault(cls, {}).setdefault("quality", {}).setdefault(q["quantity"], []).append(q)
    for cls, d in out.items():
        for quantity, rows in list(d.get("quality", {}).items()):
            d["quality"][quantity] = {
                m: _median([r[m] for r in rows]) for m in ("mae", "cv_rmse", "nmbe", "mape")
            }
        d["usable_fraction"] = float(np.mean(usable.get(cls, [True])))
    return out


def save_run(store: Store, result: dict[str, Any]) -> int:
    """Store a calibration result as a new version (:meth:`Store.save_calibration_run`);
    returns its run id, also set as ``result["run"]["run_id"]``."""
    run_id = store.save_calibration_run(
        result["run"], result["params"], result["quality"], result["events"]
    )
    result["run"]["run_id"] = run_id
    return run_id
