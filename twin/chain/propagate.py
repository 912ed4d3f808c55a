"""The electrical and cooling links of the chain, vectorized over devices and time.

Each function is one link of docs/physics.md's chain; arrays are (T, N) or (N,). Headroom and
what-if call these with their own inputs (a forecast path, a recording) and keep no copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from models import cdu as cdu_model
from models import coolant, gpu_power, gpu_thermal
from twin.chain.params import GpuParams
from twin.site.catalog import ASSUMPTIONS, CDU_MODELS


# ---- GPU power -------------------------------------------------------------------------------
def gpu_power_w(
    activity: np.ndarray, gp: GpuParams, cols: Any = slice(None), from_util: Any = None
) -> np.ndarray:
    """Board power from SM activity (utilization where no SM activity) through the curve.

    ``from_util`` (per GPU of ``cols``, bool) says which columns of ``activity`` are GPU-Util
    (``util_pct / 100``): only those go through a curve calibrated on GPU-Util
    (``gp.util_kind``), the others through the power law; None is SM activity everywhere.
    """
    p = gpu_power.gpu_power_w(activity, gp.idle_w[cols], gp.limit_w[cols], gp.gamma[cols])
    if from_util is None or gp.util_kind is None:
        return p
    kind = gp.util_kind[cols]
    on_util = np.asarray(from_util, dtype=bool) & (kind != gpu_power.POWER_LAW)
    if not on_util.any():
        return p
    assert gp.util_idle_w is not None and gp.util_limit_w is not None and gp.util_shape is not None
    u = gpu_power.curve_power_w(
        kind, activity, gp.util_idle_w[cols], gp.util_limit_w[cols], gp.util_shape[cols]
    )
    return np.where(on_util, u, p)


def gpu_power_after_w(
    power_w: np.ndarray,
    activity: np.ndarray,
    activity_after: np.ndarray,
    gp: GpuParams,
    cap_w: np.ndarray,
    cols: Any = slice(None),
    from_util: Any = None,
) -> np.ndarray:
    """Measured power plus the curve's change for a new activity, within [0, the cap];
    ``from_util`` as in :func:`gpu_power_w`."""
    after = gpu_power_w(activity_after, gp, cols, from_util)
    p = power_w + (after - gpu_power_w(activity, gp, cols, from_util))
    return np.clip(p, 0.0, cap_w)


def gpu_power_at_ratio_w(
    power_w: np.ndarray,
    activity: np.ndarray,
    ratio: np.ndarray,
    gp: GpuParams,
    cap_w: np.ndarray,
    cols: Any = slice(None),
    from_util: Any = None,
) -> np.ndarray:
    """A GPU's power when its rack's load is ``ratio`` times the present: its activity scaled by
    the ratio (within [0, 1]) on the calibrated curve (:func:`gpu_power_after_w`), within the
    cap. A GPU without activity telemetry (NaN) scales its power with the ratio instead.

    The one load-to-power step of the GPU temperature forecast, live (``twin.analysis.headroom``, a
    ratio path from now) and in a replay (``twin.chain.breach``, every minute's p90 ratio)."""
    known = np.isfinite(activity)
    act = np.where(known, activity, 0.0)
    p_now = np.nan_to_num(power_w)
    after = np.clip(act * ratio, 0.0, 1.0)
    p = gpu_power_after_w(p_now, act, after, gp, cap_w, cols, from_util)
    return np.where(known, p, np.minimum(p_now * ratio, cap_w))


# ---- racks and PDUs --------------------------------------------------------------------------
def rack_sum_w(
    x: np.ndarray, ids: list[str], members: list[list[str]], *, every_member: bool = False
) -> np.ndarray:
    """(T, R) each rack's sum of its members' columns of ``x`` (T, N), whose columns are
    ``ids``: its feeds' (PDU units') power, its input power, or its nodes' power, its IT load.
    NaN where none of them reports (and for a rack without members), or with ``every_member``
    where one of them does not (the others' sum is not the rack's: its load "now" live, a
    recording's rack with a silent feed, the IT load of a rack with a silent node)."""
    pos = {m: i for i, m in enumerate(ids)}
    out = np.full((x.shape[0], len(members)), np.nan)
    for r, names in enumerate(members):
        cols = [pos[m] for m in names if m in pos]
        if not cols or (every_member and len(cols) < len(names)):
            continue
        f = x[:, cols]
        gone = np.isnan(f).any(axis=1) if every_member else np.isnan(f).all(axis=1)
        out[:, r] = np.where(gone, np.nan, np.nansum(f, axis=1))
    return out


def rack_power_w(rack_w: np.ndarray, gpu_change_w: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Rack input power after a change of its GPUs' power (``alpha + beta * sum P_gpu``)."""
    return np.maximum(rack_w + beta * gpu_change_w, 0.0)


def load_ratio(after_w: np.ndarray, before_w: np.ndarray) -> np.ndarray:
    """after / before where there was load, 1 where there was none (nothing to scale)."""
    ok = np.isfinite(before_w) & (before_w > 0)
    safe = np.where(ok, before_w, 1.0)
    return np.where(ok, np.maximum(after_w, 0.0) / safe, 1.0)


def phase_load_ratio(ratio: np.ndarray, fed: list[list[int]], weight_w: np.ndarray) -> np.ndarray:
    """(T, P) each PDU phase's (or breaker's) load ratio: the load ratio (T, R) of the racks it
    feeds (``fed``: rack positions per phase), weighted by their load ``weight_w`` ((R,) or
    (T, R); alike where none is known); 1 for a phase that feeds no rack."""
    if not fed or ratio.shape[1] == 0:
        return np.ones((ratio.shape[0], len(fed)))
    # a phase of one rack takes its ratio: one gather for every phase, then the others
    out = np.asarray(ratio, dtype=float)[:, [r[0] if len(r) == 1 else 0 for r in fed]]
    weight = np.nan_to_num(np.asarray(weight_w, dtype=float))
    for j, racks in enumerate(fed):
        if not racks:
            out[:, j] = 1.0
        elif len(racks) > 1:
            w = weight[..., racks]
            w = np.where(w.sum(axis=-1, keepdims=True) > 0, w, 1.0)
            out[:, j] = (ratio[:, racks] * w).sum(axis=1) / w.sum(axis=-1)
    return out


def p90_load_ratio(q90_w: np.ndarray, now_w: np.ndarray) -> np.ndarray:
    """The persistence basis' p90 load ratio (docs/physics.md §11.1): a rack's 90th percentile
    of power over the last hour over its present power, at least 1; 1 where either is unknown
    or the rack draws nothing now. The live headroom and a replay's forecast both take it."""
    with np.errstate(all="ignore"):
        r = np.where(now_w > 0, np.maximum(q90_w / now_w, 1.0), 1.0)
    return np.nan_to_num(r, nan=1.0)


def rack_heat_kw(rack_w: Any, capture: Any) -> tuple[np.ndarray, np.ndarray]:
    """A rack's input power as heat: (to liquid, to the room's air); ``capture`` is the fitted
    (else catalog) share its cold plates take (docs/physics.md §3.7). [kW]"""
    w = np.asarray(rack_w, dtype=float) / 1e3
    c = np.asarray(capture, dtype=float)
    return w * c, w * (1.0 - c)


def node_input_w(gpu_w: np.ndarray, spec: Any) -> np.ndarray:
    """A catalog node's input power for its GPUs' power (docs/physics.md §4.1, §4.2)."""
    from models import electrical

    dc = electrical.node_power_w(spec.gpus * gpu_w, spec.base_w, spec.gpu_overhead_frac)
    return electrical.psu_input_w(dc, ASSUMPTIONS.psu_loss_const_w, ASSUMPTIONS.psu_efficiency)


def balanced_phase_current_a(power_w: np.ndarray, pdu: Any, pf: float) -> np.ndarray:
    """Line current of each phase of a PDU carrying ``power_w`` balanced (wye or delta)."""
    from models import electrical

    three = pdu.phases == 3
    v_ph = float(electrical.phase_voltage_v(pdu.voltage_v, pdu.wiring if three else "single"))
    per = power_w / (3 if three else 1) / (v_ph * pf)
    if three and pdu.wiring == "delta":
        per = per * np.sqrt(3.0)  # balanced delta: line current = sqrt(3) x branch current
    return per


# ---- CDUs and loops --------------------------------------------------------------------------
def cdu_supply_c(setpoint_c: np.ndarray, fw_c: np.ndarray, approach_k: np.ndarray) -> np.ndarray:
    """Supply: the setpoint, unless facility water plus the approach is warmer (§3.2)."""
    return cdu_model.supply_temp_c(setpoint_c, fw_c, approach_k)


def cdu_capacity_kw(rated_kw: np.ndarray, flow_lpm: np.ndarray, max_flow_lpm: np.ndarray) -> Any:
    """Heat a CDU carries at the flow it has: the rating scaled by flow over rated flow."""
    return cdu_model.available_capacity_kw(rated_kw, 0.0, flow_lpm, max_flow_lpm)


def loop_return_c(supply_c: Any, heat_kw: Any, flow_lpm: Any, fluid: str) -> np.ndarray:
    """Return temperature of a loop; a stopped loop's rise is capped (it boils off, not inf)."""
    r = coolant.return_temp_c(supply_c, heat_kw, np.maximum(flow_lpm, 1e-3), fluid)
    return np.minimum(r, np.asarray(supply_c) + ASSUMPTIONS.stagnant_rise_k)


def flow_needed_lpm(heat_kw: Any, supply_c: Any, return_limit_c: float, fluid: str) -> np.ndarray:
    """Flow that carries ``heat_kw`` with the return at its limit."""
    rise = np.maximum(return_limit_c - np.asarray(supply_c, dtype=float), 0.1)
    return coolant.flow_for_heat_lpm(heat_kw, rise, fluid, supply_c)


def loop_paths(cdus: list[Any], heat_kw: Any, supply_c: Any, flow_lpm: Any) -> tuple[Any, Any]:
    """(T, C) each CDU's loop return at ``flow_lpm`` (:func:`loop_return_c`) and the flow that
    carries the heat with the return at its limit (:func:`flow_needed_lpm`), for ``heat_kw``
    (T, C) with ``supply_c`` and ``flow_lpm`` broadcast to it, in each CDU's coolant."""
    heat = np.asarray(heat_kw, dtype=float)
    sup, flow = np.broadcast_to(supply_c, heat.shape), np.broadcast_to(flow_lpm, heat.shape)
    ret, need = np.empty_like(heat), np.empty_like(heat)
    for i, c in enumerate(cdus):
        ret[:, i] = loop_return_c(sup[:, i], heat[:, i], flow[:, i], c.coolant)
        need[:, i] = flow_needed_lpm(heat[:, i], sup[:, i], c.return_limit_c, c.coolant)
    return ret, need


def cdu_rack_heat_kw(rack_w: Any, capture: Any, rack_cdu: np.ndarray, n_cdus: int) -> np.ndarray:
    """(..., C) the heat each CDU's racks put on its loop (:func:`rack_heat_kw`'s liquid share
    of ``rack_w`` (..., R), summed per CDU; an air-cooled rack, ``rack_cdu`` -1, on none). [kW]"""
    on_cdu = (np.asarray(rack_cdu)[:, None] == np.arange(n_cdus)[None, :]).astype(float)
    liquid, _ = rack_heat_kw(rack_w, capture)
    return np.nan_to_num(liquid) @ on_cdu


def moved_return_c(
    cdus: list[Any], return_c: Any, before: tuple[Any, Any, Any], after: tuple[Any, Any, Any]
) -> np.ndarray:
    """Each loop's return when its (heat [kW], supply [°C], flow [L/min]) move from ``before``
    to ``after`` (broadcast to (..., C)): the measured ``return_c`` plus the model's change
    (:func:`loop_paths`), so the model's level error is no headroom; where the model cannot
    tell the change (a supply or flow not read) the measured return stays. The live headroom's
    forecast path and a what-if's run alike."""
    moved, _ = loop_paths(cdus, *after)
    base, _ = loop_paths(cdus, *before)
    change = moved - base
    return return_c + np.where(np.isfinite(change), change, 0.0)


def pump_flow_ratio(cdu: Any, running: int) -> float:
    """Flow with ``running`` pumps over the flow with all of them (pump model, same speed)."""
    n_all = len(cdu.pumps)
    if running >= n_all:
        return 1.0
    if running <= 0:
        return 0.0
    dp = CDU_MODELS[cdu.model].design_dp_kpa if cdu.model else ASSUMPTIONS.design_dp_kpa
    h0, kp, ks = cdu_model.pump_curve_from_design(cdu.max_flow_lpm, dp, n_all)
    q = cdu_model.parallel_pump_flow_lpm(
        np.array([running, n_all], float), ASSUMPTIONS.pump_speed_frac, h0, kp, ks
    )
    return float(q[0] / q[1])


def gpu_r_k_per_w(r_k_per_w: np.ndarray, flow_ratio: np.ndarray) -> np.ndarray:
    """R of each GPU at its loop's flow over the flow its R was fitted at (1 for air)."""
    return gpu_thermal.r_at_flow_k_per_w(r_k_per_w, flow_ratio)


# ---- links -----------------------------------------------------------------------------------
def link_busy_gbps(tx_bps: Any, rx_bps: Any) -> np.ndarray:
    """A link's load: the busier of its two directions (a link is full when one way is). [Gb/s]"""
    return np.fmax(np.asarray(tx_bps, dtype=float), np.asarray(rx_bps, dtype=float)) / 1e9


def parallel_links(site: Any, j: int) -> list[int]:
    """The links that take link ``j``'s traffic when it fails: those sharing one of its ends,
    between the same tiers (node-leaf, leaf-spine), not a duplicate of the same pair."""
    roles = {s.name: s.role for s in site.switches}

    def tiers(lk: Any) -> tuple[str, ...]:
        return tuple(sorted(roles.get(x, "node") for x in (lk.a, lk.b)))

    lk = site.links[j]
    return [
        k
        for k, o in enumerate(site.links)
        if k != j
        and {o.a, o.b} & {lk.a, lk.b}
        and {o.a, o.b} != {lk.a, lk.b}
        and tiers(o) == tiers(lk)
    ]
