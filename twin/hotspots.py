"""Hot spots: GPUs and racks running hotter than they should, with the reason.

Five detectors, each on the store's newest data:

- ``over_limit``: a GPU at or over its max operating temperature (where thermal slowdown
  starts) or its HBM at or over the HBM limit, from the catalog.
- ``above_model``: a GPU measured above its calibrated RC model's prediction (given the measured
  power and coolant) by ``k_sigma`` standard deviations in every one of the last ``minutes``
  minutes. The model runs from the measured temperature at the start of a window a few
  minutes longer than that, so its start is forgotten (tau is seconds to a minute) and what
  remains is the gap between the GPU and its healthy self: a fouling cold plate or paste
  pumping out shows here long before the GPU slows down. The standard deviation is the GPU's
  own held-out error from its calibration (RMSE ~ 1.25 MAE), at least ``MIN_SIGMA_K``.
- ``r_drift``: the calibration's drift events (a GPU's R over its fleet and its own history).
- ``inlet_high``: rack inlet air above the ASHRAE TC 9.9 recommended envelope's 27 °C.
- ``cooling_changed``: a GPU's temperature fell by at least ``MIN_STEP_K`` over the model while
  its power stayed flat, in the last ``COOLING_LOOKBACK_MIN`` minutes
  (:func:`models.cooling_change.cooling_steps`): the airflow, inlet or coolant changed, not
  the load. Not a hot spot but the same residual seen from the other side: a fixed-R model
  must show such a step, not absorb it. R is the calibrated one, else the catalog's.
"""

from __future__ import annotations

import math
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from models import gpu_thermal
from models.cooling_change import FLAT_FRACTION, cooling_steps
from twin.calibrate.calibrate import gpu_flow_ratio, gpu_reference, index_site
from twin.calibrate.windows import first_valid, hold_fill, load_window
from twin.coverage import newest_sample
from twin.site import Site
from twin.store import Store

#: Upper end of the ASHRAE TC 9.9 recommended inlet range (18-27 °C), 2021 thermal guidelines.
ASHRAE_RECOMMENDED_MAX_C = 27.0
#: Floor of the residual's standard deviation: the sensors' 1 K resolution, averaged. [K]
MIN_SIGMA_K = 0.3
#: sigma = RMSE; for normal errors RMSE = sqrt(pi / 2) * MAE.
RMSE_PER_MAE = math.sqrt(math.pi / 2.0)
#: Extra minutes the model runs before the judged window, to forget its starting point.
WARMUP_MIN = 3
#: Minutes of the residual judged: the residual-sigma figure is the smallest of their minute
#: residuals, so one transient minute (a checkpoint's step) cannot raise it. [min]
RESIDUAL_MINUTES = 5
#: The trailing window R is re-estimated over, every pass: long enough for a training fleet's
#: checkpoint dips (every ~30 min) to leave 10 loaded minutes, short enough that a cold plate
#: degrading over hours is seen within half of it. [min]
DRIFT_WINDOW_MIN = 30
#: How far back the cooling-change detector looks: a fall is seen by every pass for several
#: minutes after it (it needs 2.5 min of context around it). [min]
COOLING_LOOKBACK_MIN = 10

Reason = Literal["over_limit", "above_model", "r_drift", "inlet_high", "cooling_changed"]


def gpu_groups(idx: Any) -> np.ndarray:
    """(G,) int: each GPU's drift group, its fleet (else its model class) and its cooling, as
    the calibration's drift events group them (``twin.calibrate.calibrate._drift_events``)."""
    codes: dict[tuple[str, bool], int] = {}
    return np.array(
        [
            codes.setdefault((fleet or cls, bool(idx.gpu_cdu[g] >= 0)), len(codes))
            for g, (fleet, cls) in enumerate(zip(idx.gpu_fleet, idx.gpu_class, strict=True))
        ],
        dtype=np.int64,
    )


class HotSpot(BaseModel):
    kind: Literal["gpu", "rack"]
    id: str
    reason: Reason
    value: float  # the measured quantity (°C), or R (K/W) for r_drift
    reference: float | None  # the limit, the model's prediction, or the fleet median
    excess: float  # value - reference, in the quantity's unit
    sigma: float | None = None  # above_model: the residual's standard deviation [K]
    residual_sigma: float | None = None  # above_model: the smallest minute mean / sigma
    rack: str | None = None
    at: datetime | None = None  # cooling_changed: when the fall started (UTC)
    detail: str


class HotSpotReport(BaseModel):
    computed_at: datetime
    data_until: datetime
    k_sigma: float
    minutes: int
    hotspots: list[HotSpot]
    residual_sigma: dict[str, float]  # every GPU with a calibrated model: min minute residual/σ
    rack_inlet_c: dict[str, float]  # every rack with an inlet reading: the last minute's warmest
    problems: list[str]


def find_hotspots(
    store: Store,
    site: Site,
    *,
    now: datetime | None = None,
    k_sigma: float = 3.0,
    minutes: int = 5,
) -> HotSpotReport:
    """Every hot spot of ``site`` from the store's newest data and calibration."""
    if k_sigma <= 0 or minutes < 1:
        raise ValueError(f"k_sigma ({k_sigma}) must be > 0 and minutes ({minutes}) >= 1")
    if now is None:  # the newest sample of any kind: rack inlets need no GPU data
        newest = newest_sample(store)
        if newest is None:
            raise ValueError("the store holds no telemetry: nothing to look at")
        now = newest
    now = now.astimezone(UTC)
    idx = index_site(site)
    racks = site.racks
    nodes = {nd.name: nd for nd in site.nodes}
    problems: list[str] = []
    out: list[HotSpot] = []
    end = now + timedelta(seconds=1)
    span_s = 60.0 * (minutes + WARMUP_MIN)
    start = end - timedelta(seconds=span_s)
    gpu = load_window(
        store, "gpu", start, end, ids=idx.gpu_ids, quantities=["power_w", "temp_c", "mem_temp_c"]
    )
    cdu = load_window(
        store, "cdu", start, end, ids=idx.cdu_names, quantities=["supply_temp_c", "flow_lpm"]
    )
    node = load_window(store, "node", start, end, quantities=["inlet_temp_c"])
    pdu = load_window(store, "pdu", start, end, quantities=["inlet_temp_c"])
    temp = gpu.values["temp_c"]
    last_min = slice(-60, None)

    out += _over_limit(idx, nodes, racks, temp[last_min], gpu.values["mem_temp_c"][last_min])
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t_now = np.nanmean(temp[last_min], axis=0)

    # ---- above the calibrated model, and drift events of the latest run
    run = store.latest_calibration_run_id()
    residual_sigma: dict[str, float] = {}
    if run is None:
        problems.append("no calibration run yet: the model-residual detector has nothing to use")
    else:
        found, residual_sigma, missing = _above_model(
            store, run, idx, racks, (gpu, cdu, node, pdu), t_now, k_sigma, minutes
        )
        out += found + _drift_hotspots(store, run, idx, racks)
        problems += missing
    out += _cooling_changes(store, run, idx, nodes, racks, end)

    # ---- rack inlet air over the ASHRAE recommended envelope
    inlet = _rack_inlet(site, node, pdu)
    out += _inlet_hotspots(inlet)
    return HotSpotReport(
        computed_at=datetime.now(UTC),
        data_until=now,
        k_sigma=k_sigma,
        minutes=minutes,
        hotspots=out,
        residual_sigma=residual_sigma,
        rack_inlet_c=inlet,
        problems=problems,
    )


def _over_limit(
    idx: Any, nodes: dict[str, Any], racks: list[Any], temp_last: Any, mem_last: Any
) -> list[HotSpot]:
    """GPUs whose last minute's mean temperature or HBM temperature is at its catalog limit
    (``temp_last``, ``mem_last``: the last minute's samples, ``(60, GPUs)``)."""
    out: list[HotSpot] = []
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t_now = np.nanmean(temp_last, axis=0)
        m_now = np.nanmean(mem_last, axis=0)
    # per GPU, its node's catalog limits (looked up once per node, not per GPU)
    node_limits = {
        name: (nd.gpu_spec.max_operating_temp_c, nd.gpu_spec.hbm_max_temp_c)
        for name, nd in nodes.items()
    }
    limits = np.array([node_limits[n] for n in idx.gpu_node], dtype=float).reshape(-1, 2)
    for values, limit, what in (
        (t_now, limits[:, 0], "GPU at its max operating temperature"),
        (m_now, limits[:, 1], "HBM at its temperature limit"),
    ):
        with np.errstate(invalid="ignore"):
            over = np.flatnonzero(np.isfinite(values) & (values >= limit))
        for i in over:  # only the GPUs at or over a limit
            value, lim = float(values[i]), float(limit[i])
            out.append(
                HotSpot(
                    kind="gpu",
                    id=idx.gpu_ids[i],
                    reason="over_limit",
                    value=value,
                    reference=lim,
                    excess=value - lim,
                    rack=racks[idx.gpu_rack[i]].name,
                    detail=f"{what}: {value:.1f} °C >= {lim:g} °C",
                )
            )
    # GPU and HBM hot spots of one GPU side by side, in site order
    pos = {gid: i for i, gid in enumerate(idx.gpu_ids)}
    out.sort(key=lambda h: pos[h.id])
    return out


def _above_model(
    store: Store,
    run: int,
    idx: Any,
    racks: list[Any],
    windows: tuple[Any, Any, Any, Any],
    t_now: Any,
    k_sigma: float,
    minutes: int,
) -> tuple[list[HotSpot], dict[str, float], list[str]]:
    """GPUs above their calibrated model (of calibration run ``run``) by ``k_sigma`` in each
    of the last ``minutes`` minutes; with every judged GPU's smallest minute residual in
    sigma, and what could not be judged. ``windows``: the gpu, cdu, node and pdu windows."""
    gpu, cdu, node, pdu = windows
    temp = gpu.values["temp_c"]
    last_min = slice(-60, None)
    out: list[HotSpot] = []
    problems: list[str] = []
    residual_sigma: dict[str, float] = {}
    params = {
        (i_, p): v
        for (_, i_, p), v in store.calibration_params(
            run, kind="gpu", params=("r_k_per_w", "c_j_per_k", "offset_k", "flow_ref_lpm")
        ).items()
    }
    flow_ref = {i_: v for (i_, p), v in params.items() if p == "flow_ref_lpm"}
    mae = {
        q["id"]: q["mae"]
        for q in store.calibration_quality(run, kind="gpu")
        if q["quantity"].startswith("temp_c@")
    }
    g = len(idx.gpu_ids)
    r = np.array([params.get((gid, "r_k_per_w"), np.nan) for gid in idx.gpu_ids])
    c = np.array([params.get((gid, "c_j_per_k"), np.nan) for gid in idx.gpu_ids])
    off = np.array([params.get((gid, "offset_k"), 0.0) for gid in idx.gpu_ids])
    sigma = np.array(
        [
            max(MIN_SIGMA_K, RMSE_PER_MAE * m) if (m := mae.get(gid)) is not None else np.nan
            for gid in idx.gpu_ids
        ]
    )
    # R at the loop's flow over the window (it was fitted at the calibration's flow)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        flow_now = np.nanmean(cdu.values["flow_lpm"], axis=0)
    r = gpu_thermal.r_at_flow_k_per_w(r, gpu_flow_ratio(idx, flow_ref, flow_now))
    ref = gpu_reference(idx, cdu, node, pdu)
    power = hold_fill(gpu.values["power_w"], backfill=True)
    ref = hold_fill(ref, backfill=True)
    t0 = first_valid(temp)
    with np.errstate(all="ignore"):
        pred = gpu_thermal.predict_temp_c(t0, ref, power, r, c, 1.0, off)
    resid = temp - pred
    n_t = resid.shape[0]
    judged = resid[max(n_t - 60 * minutes, 0) :]
    usable = np.isfinite(r) & np.isfinite(c) & np.isfinite(sigma)
    if judged.shape[0] >= 60 * minutes:
        per_min = judged[: 60 * minutes].reshape(minutes, 60, g)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means = np.nanmean(per_min, axis=1)  # (minutes, g)
            worst = np.nanmin(means, axis=0) / sigma
            pred_now = np.nanmean(pred[last_min], axis=0)
        judged_ok = np.flatnonzero(usable & np.isfinite(worst))
        residual_sigma = dict(
            zip([idx.gpu_ids[i] for i in judged_ok], worst[judged_ok].tolist(), strict=True)
        )
        for i in judged_ok[worst[judged_ok] >= k_sigma]:  # only the flagged GPUs
            gid = idx.gpu_ids[i]
            out.append(
                HotSpot(
                    kind="gpu",
                    id=gid,
                    reason="above_model",
                    value=float(t_now[i]),
                    reference=float(pred_now[i]),
                    excess=float(t_now[i] - pred_now[i]),
                    sigma=float(sigma[i]),
                    residual_sigma=float(worst[i]),
                    rack=racks[idx.gpu_rack[i]].name,
                    detail=(
                        f"{t_now[i] - pred_now[i]:.1f} K above its calibrated model "
                        f"({worst[i]:.1f} sigma or more in each of the last {minutes} "
                        f"min; sigma {sigma[i]:.2f} K)"
                    ),
                )
            )
    else:
        problems.append(f"less than {minutes} min of GPU data: no model-residual check")
    return out, residual_sigma, problems


def _drift_hotspots(store: Store, run: int, idx: Any, racks: list[Any]) -> list[HotSpot]:
    """The GPU drift events of calibration run ``run``, as hot spots."""
    out: list[HotSpot] = []
    pos = {gid: i for i, gid in enumerate(idx.gpu_ids)}
    for ev in store.calibration_events(run, kind="gpu"):
        gid, param, value, fleet = ev["id"], ev["param"], ev["value"], ev["fleet_median"]
        detail = ev["detail"]
        gi = pos.get(gid)
        out.append(
            HotSpot(
                kind="gpu",
                id=gid,
                reason="r_drift",
                value=float(value),
                reference=None if fleet is None else float(fleet),
                excess=float(value - fleet) if fleet is not None else 0.0,
                rack=racks[idx.gpu_rack[gi]].name if gi is not None else None,
                detail=f"{param}: {detail}",
            )
        )
    return out


def _cooling_changes(
    store: Store, run: int | None, idx: Any, nodes: dict[str, Any], racks: list[Any], end: datetime
) -> list[HotSpot]:
    """GPUs whose temperature fell at flat power in the last ``COOLING_LOOKBACK_MIN`` minutes
    (R of calibration run ``run`` where usable, else the catalog's for the node's cooling)."""
    start = end - timedelta(minutes=COOLING_LOOKBACK_MIN)
    win = load_window(store, "gpu", start, end, ids=idx.gpu_ids, quantities=["power_w", "temp_c"])
    fitted: dict[str, float] = {}
    if run is not None:
        fitted = {
            i_: v
            for (_, i_, _p), v in store.calibration_params(
                run, kind="gpu", params=("r_k_per_w",)
            ).items()
            if v is not None and math.isfinite(v)
        }
    catalog = {
        name: nd.gpu_spec.r_liquid_k_per_w
        if nd.spec.cooling == "liquid"
        else nd.gpu_spec.r_air_k_per_w
        for name, nd in nodes.items()
    }
    r = np.array(
        [fitted.get(gid, catalog[idx.gpu_node[i]]) for i, gid in enumerate(idx.gpu_ids)],
        dtype=float,
    )
    steps = cooling_steps(win.values["temp_c"], win.values["power_w"], r, win.step_s)
    out: list[HotSpot] = []
    for i in np.flatnonzero(steps.flagged):
        at = win.start + timedelta(seconds=float(steps.index[i]) * win.step_s)
        before, after = float(steps.temp_before_c[i]), float(steps.temp_after_c[i])
        p0, p1 = float(steps.power_before_w[i]), float(steps.power_after_w[i])
        out.append(
            HotSpot(
                kind="gpu",
                id=idx.gpu_ids[i],
                reason="cooling_changed",
                value=after,
                reference=before,
                excess=float(steps.step_k[i]),
                rack=racks[idx.gpu_rack[i]].name,
                at=at,
                detail=(
                    f"cooling changed at {at:%Y-%m-%d %H:%M:%S} UTC: temperature fell "
                    f"{before - after:.1f} K ({before:.1f} -> {after:.1f} °C) while power stayed "
                    f"flat ({p0:.0f} -> {p1:.0f} W, within {FLAT_FRACTION:.0%}); "
                    f"{-steps.step_k[i]:.1f} K below the model"
                    " (airflow, inlet or coolant changed, not the load)"
                ),
            )
        )
    return out


def _inlet_hotspots(inlet: dict[str, float]) -> list[HotSpot]:
    """Racks whose inlet air is over the ASHRAE recommended envelope."""
    out: list[HotSpot] = []
    for name, value in inlet.items():
        if value > ASHRAE_RECOMMENDED_MAX_C:
            out.append(
                HotSpot(
                    kind="rack",
                    id=name,
                    reason="inlet_high",
                    value=value,
                    reference=ASHRAE_RECOMMENDED_MAX_C,
                    excess=value - ASHRAE_RECOMMENDED_MAX_C,
                    rack=name,
                    detail=(
                        f"inlet air {value:.1f} °C above the ASHRAE recommended "
                        f"{ASHRAE_RECOMMENDED_MAX_C:g} °C"
                    ),
                )
            )
    return out


def _rack_inlet(site: Site, node: Any, pdu: Any) -> dict[str, float]:
    """The last minute's warmest inlet reading per rack: its nodes', else its PDUs'."""
    out: dict[str, float] = {}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        node_now = np.nanmean(node.values["inlet_temp_c"][-60:], axis=0) if node.ids else []
        pdu_now = np.nanmean(pdu.values["inlet_temp_c"][-60:], axis=0) if pdu.ids else []
    node_pos = {n: i for i, n in enumerate(node.ids)}
    pdu_pos = {p: i for i, p in enumerate(pdu.ids)}
    for rack in site.racks:
        vals = [node_now[node_pos[n.name]] for n in rack.nodes if n.name in node_pos]
        vals = [v for v in vals if np.isfinite(v)]
        if not vals:
            vals = [pdu_now[pdu_pos[p]] for p in rack.pdus if p in pdu_pos]
            vals = [v for v in vals if np.isfinite(v)]
        if vals:
            out[rack.name] = float(max(vals))
    return out
