"""The hot-spot detectors over a what-if replay: residual and R drift, minute by minute.

:func:`hotspot_series` computes, for every evaluation minute of a replay (the alert feed's
rows: one per minute from the recording's start) and every GPU, what the live service's
detection pass would have observed at that minute (``twin.analysis.hotspots``), from the data up to
that minute only:

- ``hotspot.gpu.residual_sigma``: the smallest of the last ``minutes`` minute residuals
  (measured over the calibrated RC model, ``models.thermal_watch``) over the GPU's sigma,
  labelled ``measured_c``, ``model_c`` (the last minute's means) and ``sigma_k``;
- ``drift.gpu.r_k_per_w``: R re-estimated over the last ``window_min`` minutes against the
  median of its fleet's, minus 1, labelled ``r_k_per_w``, ``fleet_r_k_per_w`` and
  ``excess_k`` (its excess: (R - the fleet's median) x the heat R was estimated at, in K).

The model is the replay's own (``Recording.params``: the bundle's calibration where it has a
usable fit, else the catalog's R and tau), its R capped at :data:`HISTORY_MARGIN` over the mean
of the GPU's own R re-estimates up to the minute, and sigma the bundle's held-out error of each GPU
(``temp_c@600s`` MAE x sqrt(pi/2), at least ``twin.analysis.hotspots.MIN_SIGMA_K``); a GPU without a
calibrated thermal model gets no residual (a catalog R says nothing about its cold plate), and
its R is re-estimated for the drift with offset 0 and no heat-storage term, as live.

The value at evaluation minute ``i`` (row ``r``, ``t0 + i`` min) uses the minutes that end at
and include row ``r``'s sample, as the live pass's last minute ends at its newest sample (at
10 s: the samples of ``(t - 60 s, t]``); minute 0 has none (NaN). Labels are ``(M, N)`` float
arrays with a format each (:data:`LABEL_FORMAT`); :func:`labels_at` renders one entity's at
one minute.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from models import thermal_watch as tw
from models.gpu_thermal import r_at_flow_k_per_w
from twin.alerts.metrics import DRIFT_GPU_R, HOTSPOT_GPU_RESIDUAL_SIGMA
from twin.analysis.hotspots import (
    DRIFT_WINDOW_MIN,
    MIN_SIGMA_K,
    RESIDUAL_MINUTES,
    RMSE_PER_MAE,
    gpu_groups,
)
from twin.blocks import in_order
from twin.replay.recording import Recording
from twin.site.index import gpu_flow_ratio
from twin.store.windows import hold_fill

#: str.format spec of each label (K and °C to 0.1, R to 0.1 mK/W).
LABEL_FORMAT = {
    "excess_k": ".1f",
    "measured_c": ".1f",
    "model_c": ".1f",
    "sigma_k": ".2f",
    "r_k_per_w": ".4f",
    "fleet_r_k_per_w": ".4f",
}
#: The model's R is at most this factor over the mean of the GPU's own R re-estimates so far
#: (the live detector's "no more than its own history", twin.analysis.hotspots): a bundle's
#: calibration may be fitted after a fault (the demo bundle's is its last two hours, hours after
#: its cold plate degraded), and a model that already holds the fault cannot see it. Healthy GPUs'
#: mean re-estimate sits within 2 % of their calibrated R all the demo day (the minute-mean estimate
#: is not the RC trajectory fit): 5 % leaves them on their calibration. [1]
HISTORY_MARGIN = 1.05
#: GPUs per block of the minute aggregates (bounds the (T, block) copies); blocks run a core
#: each (twin.blocks.in_order)
GPU_CHUNK = 256


@dataclass
class HotspotSeries:
    """One metric for every GPU at every evaluation minute: ``values`` ``(M, N)``."""

    metric: str
    kind: str
    ids: list[str]
    values: np.ndarray
    labels: dict[str, np.ndarray] = field(default_factory=dict)
    #: the excess in K that ``values`` stands for, ``(M, N)``: the residual's over the model,
    #: the R drift's (R - the fleet's median) x the heat R was estimated at
    excess: np.ndarray | None = None


def labels_at(s: HotspotSeries, i: int, j: int) -> dict[str, str]:
    """Series ``s``'s labels for entity ``j`` at evaluation minute ``i``, as text."""
    out = {}
    for name, a in s.labels.items():
        v = float(a[i, j])
        if math.isfinite(v):
            out[name] = format(v, LABEL_FORMAT.get(name, "g"))
    return out


def _sigma(d: Recording) -> np.ndarray:
    """(G,) each GPU's residual sigma from the bundle's held-out error (NaN: none)."""
    mae: dict[str, float] = {}
    cal = d.bundle.calibration or {}
    for q in cal.get("quality", []):
        temp = str(q.get("quantity", "")).startswith("temp_c@")
        if q.get("kind") == "gpu" and temp and q.get("mae") is not None:
            mae[q["id"]] = float(q["mae"])
    return np.array(
        [max(MIN_SIGMA_K, RMSE_PER_MAE * mae[g]) if g in mae else np.nan for g in d.idx.gpu_ids]
    )


def _model_r(r_cal: np.ndarray, est: np.ndarray) -> np.ndarray:
    """(M, N) the model's R per minute: the calibrated R, but never more than HISTORY_MARGIN
    over the mean of the GPU's own re-estimates so far (its history in the recording)."""
    seen = np.isfinite(est)
    with np.errstate(all="ignore"):
        hist = np.cumsum(np.where(seen, est, 0.0), axis=0) / np.cumsum(seen, axis=0)
    capped = np.fmin(r_cal[None, :], HISTORY_MARGIN * hist)
    return np.where(np.isfinite(capped), capped, r_cal[None, :])


def _minute_means(d: Recording, a: np.ndarray, quantity: str) -> np.ndarray:
    """(M, N) minute means of a coolant or inlet reading ``a`` (T, N) from row 1, each minute's
    mean over the steps with a reading (``Recording.reading``: not the values held over a gap),
    a minute without one held at the mean before it (else after), as the live pass takes its
    reference windows (``twin.analysis.hotspots``)."""
    told = d.reading.get(quantity)
    if told is None or told.all():
        return tw.minute_aggregates(a[1:], a[1:], d.dt_s)[0]
    x = np.where(told[1:], a[1:], np.nan)
    return hold_fill(tw.minute_aggregates(x, x, d.dt_s)[0], backfill=True)


def hotspot_series(
    d: Recording, *, minutes: int = RESIDUAL_MINUTES, window_min: int = DRIFT_WINDOW_MIN
) -> list[HotspotSeries]:
    """The residual-sigma and R-drift series of every GPU of the replay (module doc)."""
    idx, gp = d.idx, d.params.gpu
    g = len(idx.gpu_ids)
    per = max(1, round(60.0 / d.dt_s))
    m_eval = len(range(0, d.n, per))
    node_pos = {nd.name: i for i, nd in enumerate(d.site.nodes)}
    node_col = np.array([node_pos[nd] for nd in idx.gpu_node], dtype=np.int64)
    liquid = idx.gpu_cdu >= 0
    own = np.maximum(idx.gpu_cdu, 0)
    calibrated = np.array([s == "calibrated" for s in gp.thermal_source])
    # a GPU without a usable fit: offset 0 and no heat-storage term, as the live detector
    # takes it (twin.analysis.hotspots), not the catalog's C
    offset = np.where(calibrated, gp.offset_k, 0.0)
    c_fit = np.where(calibrated, gp.c_j_per_k, np.nan)
    sigma = np.where(calibrated, _sigma(d), np.nan)
    # each CDU's flow over the flow its GPUs were calibrated at (the recording's median
    # without); a CDU without a flow reading is at it (1), as the live pass takes it
    flow = d.cdu["flow_lpm"] if idx.cdu_names else np.zeros((d.n, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a CDU without any flow reading
        median = np.nanmedian(flow, axis=0)
    ref_flow = np.where(np.isfinite(d.params.cdu_flow_ref_lpm), d.params.cdu_flow_ref_lpm, median)
    shape = (m_eval, g)
    res_sig, meas, model = (np.full(shape, np.nan, np.float32) for _ in range(3))
    r_est = np.full(shape, np.nan)
    r_heat = np.full(shape, np.nan)
    # the coolant and inlet minute means once per CDU and node (a column's means are its own)
    if idx.cdu_names:
        sup_c = _minute_means(d, d.cdu["supply_temp_c"], "cdu.supply_temp_c")
        fl_c = _minute_means(d, flow, "cdu.flow_lpm")
    inlet_n = _minute_means(d, d.node_inlet_c, "node.inlet_temp_c")

    def block(sl: slice) -> tuple[np.ndarray, ...]:
        t_m, p_m, slope = tw.minute_aggregates(d.gpu_temp_c[1:, sl], d.gpu_power_w[1:, sl], d.dt_s)
        # a minute without a reading of the GPU's temperature or power is no minute mean (the
        # recording holds the value before it), as the live pass's minutes have none
        ends = (np.arange(t_m.shape[0]) + 1) * per  # each minute's last row (from row 1)
        for q, minute in (("temp_c", t_m), ("power_w", p_m)):
            told = d.gpu_told(q, sl)
            if told is not None:
                minute[~told[ends]] = np.nan
        liq = liquid[sl]
        inlet = inlet_n[:, node_col[sl]]
        ref = np.where(liq[None, :], sup_c[:, own[sl]], inlet) if idx.cdu_names else inlet
        ratio = gpu_flow_ratio(idx, ref_flow, fl_c, sl) if idx.cdu_names else 1.0
        factor = np.where(liq[None, :], r_at_flow_k_per_w(1.0, ratio), 1.0)
        watched = tw.watch(
            t_m,
            p_m,
            slope,
            ref,
            offset[sl][None, :],
            c_fit[sl][None, :],
            factor,
            sigma[sl][None, :],
            partial(_model_r, gp.r_k_per_w[sl]),  # capped by its own re-estimates so far
            minutes=minutes,
            window=window_min,
        )
        return (t_m, *watched)

    blocks = [slice(lo, min(lo + GPU_CHUNK, g)) for lo in range(0, g, GPU_CHUNK)]
    for sl, (t_m, z, mod, est, heat) in zip(blocks, in_order(block, blocks), strict=True):
        # the minutes start at row 1, so minute k ends at row (k + 1) x per: evaluation minute
        # k + 1's own sample, the newest its live pass would have (twin.analysis.hotspots)
        k = min(t_m.shape[0], m_eval - 1)
        res_sig[1 : k + 1, sl] = z[:k]
        meas[1 : k + 1, sl] = t_m[:k]
        model[1 : k + 1, sl] = mod[:k]
        r_est[1 : k + 1, sl] = est[:k]
        r_heat[1 : k + 1, sl] = heat[:k]
    fleet, drift, r_excess = tw.fleet_drift(r_est, r_heat, gpu_groups(idx))
    r_excess = r_excess.astype(np.float32)  # K, as the live detector's
    sig_lab = np.broadcast_to(sigma.astype(np.float32)[None, :], shape)
    excess = res_sig * sig_lab  # the smallest minute residual in K, as the live detector's
    ids = list(idx.gpu_ids)
    return [
        HotspotSeries(
            HOTSPOT_GPU_RESIDUAL_SIGMA,
            "gpu",
            ids,
            res_sig,
            {"excess_k": excess, "sigma_k": sig_lab, "measured_c": meas, "model_c": model},
            excess=excess,
        ),
        HotspotSeries(
            DRIFT_GPU_R,
            "gpu",
            ids,
            drift.astype(np.float32),
            {
                "r_k_per_w": r_est.astype(np.float32),
                "fleet_r_k_per_w": fleet.astype(np.float32),
                "excess_k": r_excess,
            },
            excess=r_excess,
        ),
    ]


def causal_r_scale(d: Recording) -> np.ndarray:
    """(M, G) per evaluation minute, the factor (<= 1) that takes each GPU's calibrated R to
    the R a model may use at that minute: never more than HISTORY_MARGIN over the mean of the
    GPU's own re-estimates so far (as the residual does, :func:`_model_r`). A bundle's
    calibration may have been fitted after a fault (the demo's was, at 22:00-24:00); a replay
    minute must not know that R yet, or a forecast pages the fault before it began."""
    if "hotspot-series" not in d.cache:
        d.cache["hotspot-series"] = hotspot_series(d)
    if "r-scale" not in d.cache:
        drift = next(s for s in d.cache["hotspot-series"] if s.metric == DRIFT_GPU_R)
        r_cal = np.asarray(d.params.gpu.r_k_per_w, dtype=float)
        model = _model_r(r_cal, np.asarray(drift.labels["r_k_per_w"], dtype=float))
        with np.errstate(all="ignore"):
            scale = np.where(r_cal[None, :] > 0, model / r_cal[None, :], 1.0)
        d.cache["r-scale"] = np.where(np.isfinite(scale), np.fmin(scale, 1.0), 1.0)
    return d.cache["r-scale"]
