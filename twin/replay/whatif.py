"""What-if: a recording run through the twin's chain, as it was and as a scenario changes it.

Both runs go through ``twin.chain``, and a scenario's value is the recorded value plus what the
chain says the scenario changes (``measured + model(scenario) - model(baseline)``), so the
calibration's residual error cancels and a neutral scenario reproduces the recording exactly
(docs/physics.md §12.1). Per step of the recording:

1. **GPU power**: recorded power plus the calibrated curve's change for a scaled activity,
   within a power cap; new racks run their fleet's mean recorded activity on the catalog curve.
2. **CDU supply and flow**: supply ``max(setpoint, FW + approach)`` with the approach read off
   the recording; flow after a pump failure from the pump model; a failed CDU's racks move to
   the CDUs of its ``loop``, which share their flow among more racks (without a peer they
   lose their coolant).
3. **GPU temperature** with the thermal controller (``twin.chain.thermal``): a GPU the
   scenario takes past its max operating temperature draws only the power that holds it
   there; the power it does not draw is reported as energy not delivered.
4. **Racks, PDU phases**: recorded rack power plus beta x the change of its GPUs' power;
   phase currents scale with their racks; a failed feed's current moves to the surviving feed.
5. **CDU heat, return, flow needed**: recorded heat plus capture x the change in rack power.
6. **Links**: recorded traffic scaled with the activity of the fleet at its ends; a failed
   link's traffic moves to the parallel links of the same tier.

The verdict is relative to the recording (``twin.replay.verdict``). With a rule file, every
metric a rule watches is offered to :class:`twin.replay.alert_feed.AlertFeed` (headroom now,
time-to-breach forecasts per minute from :mod:`twin.chain.breach`, pumps, and the residuals and
drift of :mod:`twin.replay.hotspot_feed`) and the live service's engine evaluates them
minute by minute.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from collectors.contract import phase_id, sub_id
from models.gpu_thermal import rc_simulate
from twin.alerts import metrics as am
from twin.blocks import in_order
from twin.chain import breach, gpu_temperatures, rack_capacity_kw
from twin.chain import propagate as chain
from twin.chain.thermal import ThermalResult
from twin.replay import hotspot_feed
from twin.replay.alert_feed import (
    M_CDU_FREE,
    M_GPU_K,
    M_PHASE_A,
    M_PUMPS,
    AlertFeed,
)
from twin.replay.bundle import Bundle
from twin.replay.recording import Recording
from twin.replay.recording import load as _load
from twin.replay.result import RunResult
from twin.replay.scenario import (
    AddRacks,
    CapGpuPower,
    CduSetpoint,
    FacilityWater,
    FailCdu,
    FailFeed,
    FailLink,
    FailPump,
    ScaleFleet,
    Scenario,
)
from twin.replay.verdict import Judge, KindStats, Tolerance, compare, summarize, verdict
from twin.site.catalog import GPU_MODELS, NODE_MODELS

GPU_CHUNK = 128  # GPUs per block of the GPU pass: (T, 128) float64 is 8.8 MB at 24 h / 10 s
#: A GPU this close to its max operating temperature is held there (1 °C sensors read 87.0). [K]
AT_LIMIT_K = 0.05
SERIES_POINTS = 600  # points per path in the report's figures
#: Bytes of GPU blocks kept across runs (:func:`_keep_block`): the demo's 880 GPUs take 24 MB;
#: 10,016 GPUs would take 0.27 GB, and their peak must stay under 3 GB (issue 27).
BLOCK_CACHE_BYTES = 128 * 2**20


def load(bundle: Bundle) -> Recording:
    """Read a bundle for the what-if (``twin.replay.recording.load``)."""
    return _load(bundle)


def _mask(d: Recording, at: float, for_s: float | None) -> np.ndarray:
    """(T,) bool: the steps a timed change is active."""
    t = np.arange(d.n) * d.dt_s
    end = np.inf if for_s is None else at + for_s
    return (t >= at) & (t < end)


@dataclass
class _Cooling:
    supply: np.ndarray  # (T, C) scenario supply
    flow: np.ndarray  # (T, C) scenario flow (NaN: a CDU without a flow reading)
    serve: np.ndarray  # (T, R) CDU index serving each rack (-1: none)
    per_rack_flow: np.ndarray  # (T, C) each CDU's flow over the racks it serves [L/min]
    per_rack_base: np.ndarray  # (T, C) the recording's flow over its own racks [L/min]
    per_rack_ref: np.ndarray  # (C,) each CDU's reference flow over its own racks [L/min]
    own_racks: np.ndarray  # (C,) racks each CDU serves in the site file
    running: np.ndarray  # (T, C) pumps running in the scenario
    uncooled: np.ndarray  # (T, R) bool: liquid racks with no CDU left
    notes: list[str]


def _cooling(d: Recording, changes: list[Any]) -> _Cooling:
    """Scenario supply, flow and which CDU serves each rack, step by step."""
    site, idx, n = d.site, d.idx, d.n
    cdus = site.cdus
    n_c = len(cdus)
    pos = {c.name: i for i, c in enumerate(cdus)}
    supply, fw = d.cdu["supply_temp_c"], d.cdu["fw_supply_temp_c"]
    setpoint = np.array([c.supply_setpoint_c for c in cdus], float)
    approach = np.empty(n_c)
    for i, c in enumerate(cdus):  # the approach the recording shows where FW limits supply
        limited = supply[:, i] > setpoint[i] + 0.3
        approach[i] = (
            float(np.nanmedian(supply[limited, i] - fw[limited, i]))
            if limited.sum() > 10
            else float(c.approach_k)
        )
    fw_delta, setpoint_s = np.zeros(n_c), setpoint.copy()
    for ch in changes:
        if isinstance(ch, FacilityWater):
            for name in ch.cdus or [x.name for x in cdus]:
                fw_delta[pos[name]] += ch.delta_k
        elif isinstance(ch, CduSetpoint):
            setpoint_s[pos[ch.cdu]] = ch.supply_setpoint_c
    model_b = chain.cdu_supply_c(setpoint[None, :], fw, approach[None, :])
    model_s = chain.cdu_supply_c(setpoint_s[None, :], fw + fw_delta[None, :], approach[None, :])
    supply_s = np.where(np.isfinite(model_b), supply + (model_s - model_b), supply)
    flow = d.cdu["flow_lpm"]  # NaN where a CDU reports no flow: unknown, not stopped
    ratio = np.ones((n, n_c))
    running_s = np.zeros((n, n_c))
    for i, c in enumerate(cdus):
        on = d.pump_on[c.name]
        on_s = on.copy()
        for ch in changes:
            if isinstance(ch, FailPump) and ch.cdu == c.name:
                on_s[:, c.pumps.index(ch.pump)] &= ~_mask(d, ch.at, ch.for_s)
        now, after = on.sum(axis=1), on_s.sum(axis=1)
        running_s[:, i] = after
        table = np.array([chain.pump_flow_ratio(c, k) for k in range(len(c.pumps) + 1)])
        ratio[:, i] = np.where(table[now] > 0, table[after] / np.maximum(table[now], 1e-12), 0.0)
    flow_s = flow * ratio
    serve = np.broadcast_to(idx.rack_cdu[None, :], (n, len(site.racks))).copy()
    uncooled = np.zeros(serve.shape, bool)
    notes: list[str] = []
    for ch in changes:
        if not isinstance(ch, FailCdu):
            continue
        on = _mask(d, ch.at, ch.for_s)
        i = pos[ch.cdu]
        loop = cdus[i].loop
        peers = [j for j, x in enumerate(cdus) if loop and x.loop == loop and j != i]
        mine = np.flatnonzero(idx.rack_cdu == i)
        if peers:  # the moved racks go to the peers in turn
            for k, r_i in enumerate(mine):
                serve[on, r_i] = peers[k % len(peers)]
            notes.append(
                f"{ch.cdu} failed: its racks move to "
                f"{', '.join(cdus[j].name for j in peers)} on loop {loop}"
            )
        else:
            serve[on[:, None] & (idx.rack_cdu == i)[None, :]] = -1
            uncooled[on[:, None] & (idx.rack_cdu == i)[None, :]] = True
            notes.append(f"{ch.cdu} failed and shares no loop: its racks lose their coolant")
        flow_s[:, i] = np.where(on, 0.0, flow_s[:, i])
        running_s[:, i] = np.where(on, 0.0, running_s[:, i])
    # per-rack flow share: a CDU's flow over the racks it serves, against its own at reference
    served = np.stack([(serve == c).sum(axis=1) for c in range(n_c)], axis=1) if n_c else flow
    own_racks = np.array([(idx.rack_cdu == c).sum() for c in range(n_c)], float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a CDU without any flow reading
        median = np.nanmedian(flow, axis=0) if n_c else np.ones(0)
    ref = np.where(np.isfinite(d.params.cdu_flow_ref_lpm), d.params.cdu_flow_ref_lpm, median)
    ref = np.where(np.isfinite(ref), ref, 1.0)
    # the flows R is taken at: a CDU without a flow reading is at its reference in the
    # recording (R as fitted, as the live pass takes an unknown flow), and a pump's loss or a
    # failed peer's racks change that by the pump model's ratio and the racks it serves
    flow_r = np.where(np.isfinite(flow), flow, ref[None, :])
    flow_r_s = np.where(np.isfinite(flow_s), flow_s, ref[None, :] * ratio)
    unknown = [c.name for i, c in enumerate(cdus) if np.isnan(flow[:, i]).all()]
    if unknown:
        its = "its" if len(unknown) == 1 else "their"
        notes.append(
            f"no flow reading from {', '.join(unknown)}: {its} capacity and flow headroom are"
            f" unknown; {its} GPUs' R is taken at the flow it was fitted at, changed by the pump"
            " model's ratio where a pump is lost"
        )
    per_rack_s = flow_r_s / np.maximum(served, 1)
    per_rack_b = flow_r / np.maximum(own_racks, 1)
    per_rack_ref = ref / np.maximum(own_racks, 1)
    return _Cooling(
        supply_s, flow_s, serve, per_rack_s, per_rack_b, per_rack_ref, own_racks, running_s,
        uncooled, notes,
    )  # fmt: skip


def _gpu_cap(d: Recording, changes: list[Any]) -> np.ndarray:
    idx = d.idx
    rack_pos = {r.name: i for i, r in enumerate(d.site.racks)}
    cap = np.full(len(idx.gpu_ids), np.inf)  # the recording's own limits are in its power
    fleet = np.array(idx.gpu_fleet)
    for c in changes:
        if isinstance(c, CapGpuPower):
            sel = np.ones(len(cap), bool)
            if c.fleet is not None:
                sel &= fleet == c.fleet
            if c.racks:
                sel &= np.isin(idx.gpu_rack, [rack_pos[r] for r in c.racks])
            cap[sel] = np.minimum(cap[sel], c.limit_w)
    return cap


def _activity_scale(d: Recording, changes: list[Any]) -> np.ndarray:
    scale = np.ones(len(d.idx.gpu_ids))
    fleet = np.array(d.idx.gpu_fleet)
    for c in changes:
        if isinstance(c, ScaleFleet):
            scale[fleet == c.fleet] *= c.factor
    return scale


def _baseline_model(d: Recording, sl: slice, ref_b: np.ndarray, r_b: np.ndarray) -> np.ndarray:
    """The chain's temperatures for the recording's own inputs (cached across scenarios)."""
    key = ("tb", sl.start)
    if key not in d.cache:
        gp = d.params.gpu
        t0 = np.nan_to_num(d.gpu_temp_c[0, sl], nan=40.0)
        p = d.gpu_power_w[:, sl].astype(float)
        d.cache[key] = rc_simulate(t0, ref_b, p, r_b, gp.c_j_per_k[sl], d.dt_s).astype(np.float32)
    return d.cache[key]


#: The kinds of change that reach the GPUs' power or temperature; others leave them as recorded.
_GPU_CHANGES = (ScaleFleet, CapGpuPower, FacilityWater, CduSetpoint, FailPump, FailCdu)
#: ... and those of them that reach a GPU's coolant or its loop's flow.
_COOLING_CHANGES = (FacilityWater, CduSetpoint, FailPump, FailCdu)


def _thermal(d, sl, tb, moved, p_meas, ref_s, r_s, p_dem) -> ThermalResult:
    """The controller's run on the GPUs whose inputs the scenario changes; the rest as recorded
    (``moved``: (B,) the GPUs whose coolant, R or power demand the scenario changes)."""
    gp = d.params.gpu
    meas = d.gpu_temp_c[:, sl].astype(float)
    meas = np.where(np.isfinite(meas), meas, tb)
    n, g = meas.shape
    temp, power = meas, p_meas.copy()
    held = np.zeros((n, g), bool)
    throttled, undelivered = np.zeros(g), np.zeros(g)
    if moved.any():
        c = np.flatnonzero(moved)
        every = len(c) == g  # a change that reaches every GPU: no column copies

        def cols(a: np.ndarray) -> np.ndarray:
            return a if every else a[:, c]

        gsl = np.arange(sl.start, sl.stop)[c]
        res = gpu_temperatures(
            np.nan_to_num(d.gpu_temp_c[0, gsl], nan=40.0),
            cols(ref_s),
            cols(p_dem),
            cols(r_s),
            gp.c_j_per_k[gsl],
            d.dt_s,
            idle_w=gp.idle_w[gsl],
            max_temp_c=gp.max_temp_c[gsl],
            measured_c=cols(meas),
            baseline_model_c=cols(tb).astype(float),
        )
        if every:
            return ThermalResult(
                res.temp_c, res.power_w, res.throttled_s, res.undelivered_j, res.held
            )
        temp = meas.copy()
        temp[:, c], power[:, c], held[:, c] = res.temp_c, res.power_w, res.held
        throttled[c], undelivered[c] = res.throttled_s, res.undelivered_j
    return ThermalResult(temp, power, throttled, undelivered, held)


def _differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(G,) columns where ``a`` and ``b`` differ at some step (NaN equals NaN: an input the
    recording lacks, a CDU's supply, is unknown in both, not changed)."""
    return ((a != b) & ~(np.isnan(a) & np.isnan(b))).any(axis=0)


def _gpus(
    d: Recording, changes: list[Any], cool: _Cooling, judge: Judge, feed: AlertFeed
) -> dict[str, Any]:
    """GPU power and temperature chunk by chunk; returns the sums the racks and links need.

    A scenario that changes nothing the GPUs see (a failed feed or link, new racks) reuses the
    recording's own GPU pass, computed once.
    """
    if not any(isinstance(c, _GPU_CHANGES) for c in changes):
        key = ("gpu-pass", id(feed.rules))
        if key not in d.cache:
            sub = Judge(d.dt_s, judge.times)
            sub_feed = AlertFeed(feed.rules, d)
            out = _gpus_run(d, [], cool, sub, sub_feed)
            d.cache[key] = (out, sub.kinds["gpu"], sub_feed)
        out, stats, watched = d.cache[key]
        judge.kinds["gpu"] = stats
        feed.extend(watched)
        return out
    return _gpus_run(d, changes, cool, judge, feed)


@dataclass
class _GpuRun:
    """What every block of one run's GPU pass shares (:func:`_gpu_block`)."""

    d: Recording
    cool: _Cooling
    cap: np.ndarray  # (G,) the scenario's power cap [W] (inf: none)
    scale: np.ndarray  # (G,) the scenario's activity factor
    node_col: np.ndarray  # (G,) each GPU's node's column of d.node_inlet_c
    r_factor_b: np.ndarray | None  # (T, C) the recording's R flow factor per CDU
    sup_rack: np.ndarray | None  # (T, R) each rack's coolant supply in the scenario [°C]
    judge: Judge  # the run's (its stats of a block: Judge.stats reads, never writes)
    #: no change of the run reaches a coolant or a flow: every GPU's reference and R are the
    #: recording's (not computed twice and compared)
    cooling_as_recorded: bool
    rules_key: int  # the rule set's id: what the blocks offer depends on the rules
    k_rows: np.ndarray | None  # the evaluation rows, where the K to the limit is watched
    rows: np.ndarray | None = None  # the evaluation rows, where the p90 forecast is wanted
    ratio90: np.ndarray | None = None  # (M, R) the racks' p90 load ratio per minute
    r_scale: np.ndarray | None = None  # (M, G) the causal R factor (causal_r_scale)


@dataclass
class _GpuBlock:
    """One block of GPUs through the chain: what the run keeps of it (:func:`_gpus_run`)."""

    sl: slice
    #: every input as recorded (no cap, no activity scale, coolant and flow as recorded):
    #: the block's figures are the recording's, the same in every run (:data:`BLOCK_CACHE_BYTES`)
    as_recorded: bool
    stats: KindStats  # the verdict's figures of the block's temperatures (Judge.stats)
    k_left: np.ndarray | None  # (M, B) K to the max operating temperature, where watched
    b90: np.ndarray | None  # (M, B) p90 time to breach, where forecast
    in_rack: np.ndarray
    rack_w: np.ndarray  # (T, racks present) the blocks's power change per rack [W]
    in_fleet: np.ndarray
    fleet_n: np.ndarray  # (fleets present,) GPUs
    act: np.ndarray  # (T, fleets present) summed activity, recorded
    act_s: np.ndarray  # (T, fleets present) summed activity, scenario
    power_w: np.ndarray  # (T, fleets present) summed board power, scenario [W]
    temp_max: np.ndarray  # (T,)
    held: np.ndarray  # (T,) GPUs held by the controller
    mean_temp: np.ndarray  # (B,)
    throttled_s: float
    undelivered_j: float


def _gpu_refs(ctx: _GpuRun, sl: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(T, B) each GPU's reference temperature (coolant or inlet, plus its offset) and R at
    its loop's flow, in the recording and in the scenario."""
    d, cool, n = ctx.d, ctx.cool, ctx.d.n
    idx, gp = d.idx, d.params.gpu
    liq = idx.gpu_cdu[sl] >= 0
    off = gp.offset_k[sl][None, :]
    # the inlet only where a GPU is air-cooled: a (T, B) gather of node columns is no copy
    # worth making for a block of liquid-cooled GPUs
    inlet = d.node_inlet_c[:, ctx.node_col[sl]] if not liq.all() else None
    if not idx.cdu_names:
        ref = inlet + off
        r = np.broadcast_to(gp.r_k_per_w[sl][None, :], (n, sl.stop - sl.start))
        return ref, r, ref, r

    def by_liquid(coolant: np.ndarray) -> np.ndarray:
        return coolant + off if inlet is None else np.where(liq[None, :], coolant, inlet) + off

    # the coolant and R's flow factor once per (rack, own CDU) pair of the block, then taken
    # by each GPU: the same arithmetic as per GPU, a fraction of the gathers
    n_c = len(idx.cdu_names)
    own = np.maximum(idx.gpu_cdu[sl], 0)
    pair, col = np.unique(idx.gpu_rack[sl] * n_c + own, return_inverse=True)
    p_rack, p_own = pair // n_c, pair % n_c
    supply = d.cdu["supply_temp_c"]
    ref_b = by_liquid(supply[:, p_own][:, col])
    r0 = gp.r_k_per_w[sl][None, :]
    r_b = r0 * np.where(liq[None, :], ctx.r_factor_b[:, own], 1.0)
    if ctx.cooling_as_recorded:
        return ref_b, r_b, ref_b, r_b

    # in the scenario a GPU's cold plate gets its serving CDU's supply and flow per rack (its
    # own CDU's supply where none serves it), the flow over the flow per rack its R was fitted
    # at (its own CDU's)
    p_serve = cool.serve[:, p_rack]
    ref_s = by_liquid(np.where(p_serve >= 0, ctx.sup_rack[:, p_rack], supply[:, p_own])[:, col])
    fr_s = cool.per_rack_flow[np.arange(n)[:, None], np.maximum(p_serve, 0)]
    fr_s = fr_s / np.maximum(cool.per_rack_ref, 1e-9)[p_own][None, :]
    fr_s = np.where(p_serve >= 0, fr_s, 0.0)
    r_s = r0 * np.where(liq[None, :], chain.gpu_r_k_per_w(1.0, fr_s)[:, col], 1.0)
    return ref_b, r_b, ref_s, r_s


def _gpu_block(ctx: _GpuRun, fleet_of: np.ndarray, sl: slice) -> _GpuBlock:
    """GPUs ``sl`` through the chain in the scenario: power, temperature under the controller,
    the p90 forecast, and their sums per rack and fleet. Reads ``ctx`` and writes only the
    recording's cache of its own block's baseline model: blocks may run at once."""
    d = ctx.d
    idx, gp = d.idx, d.params.gpu
    ref_b, r_b, ref_s, r_s = _gpu_refs(ctx, sl)
    if ctx.cooling_as_recorded:
        cooled = np.zeros(sl.stop - sl.start, bool)
    else:
        cooled = _differ(ref_s, ref_b) | _differ(r_s, r_b)  # (B,) coolant or R changed
    demand_as_recorded = bool(np.isposinf(ctx.cap[sl]).all() and (ctx.scale[sl] == 1).all())
    as_recorded = demand_as_recorded and not cooled.any()
    if as_recorded:  # the recording's own figures, computed once (the first run's kept)
        kept = d.cache.get(("gpu-block", ctx.rules_key, sl.start, sl.stop))
        if kept is not None:
            return kept
        ref_s, r_s = ref_b, r_b  # equal (NaN as NaN): one input, whichever run computes it
    p_meas = d.gpu_power_w[:, sl].astype(float)
    act = d.gpu_activity[:, sl].astype(float)
    act_s = np.clip(act * ctx.scale[sl][None, :], 0.0, 1.0)
    cap = ctx.cap[sl][None, :]
    from_util = None if d.gpu_activity_from_util is None else d.gpu_activity_from_util[sl]
    if demand_as_recorded:
        p_dem, moved = p_meas, cooled
    else:
        p_dem = (
            chain.gpu_power_after_w(p_meas, act, act_s, gp, cap, sl, from_util)
            if (ctx.scale[sl] != 1).any()
            else np.minimum(p_meas, cap)
        )
        moved = cooled | _differ(p_dem, p_meas)
    tb = _baseline_model(d, sl, ref_b, r_b)
    res = _thermal(d, sl, tb, moved, p_meas, ref_s, r_s, p_dem)
    # a GPU at its limit is being throttled (by the scenario's controller, or by its own in
    # the recording): that counts as time over the limit, in the baseline and the scenario
    at_limit = res.temp_c >= gp.max_temp_c[sl][None, :] - AT_LIMIT_K
    at_max = res.held | at_limit
    # a GPU that never reported its temperature has no temperature headroom, as live
    told = d.gpu_told("temp_c", sl)  # a fresh temperature reading (None: at every step)
    t_told = res.temp_c if told is None else np.where(told, res.temp_c, np.nan)
    over = at_max if told is None else at_max & told
    b90 = None
    if ctx.rows is not None:
        rows = ctx.rows
        r_rows = np.asarray(r_s, dtype=float)[rows] if np.ndim(r_s) == 2 else r_s
        seen = d.gpu_activity_reported
        unseen = seen is not None and not seen[sl].all()  # else no (T, chunk) copy
        act_f = np.where(seen[sl][None, :], act_s, np.nan) if unseen else act_s
        b90 = breach.gpu_p90_breach_in_s(
            breach.GpuSeries(res.temp_c, res.power_w, act_f, ref_s, rows, d.dt_s),
            r_rows * ctx.r_scale[:, sl],  # causal: no R the recording had not shown yet
            ctx.ratio90[:, idx.gpu_rack[sl]],
            np.fmin(d.gpu_power_limit_w[sl], ctx.cap[sl])[None, :],
            gp,
            sl,
            from_util,
        )
        # only a calibrated model forecasts a page, as live (a catalog R serves headroom)
        fitted = np.array([t == "calibrated" for t in gp.thermal_source[sl]])
        b90 = b90 if fitted.all() else np.where(fitted[None, :], b90, np.nan)
        b90 = b90 if told is None else np.where(told[rows], b90, np.nan)
    # each GPU's power change summed into its rack, its activity and power into its fleet:
    # one product with the block's (GPU x group) membership each (the inputs are finite)
    in_rack, rack_col = _membership(idx.gpu_rack[sl])
    in_fleet, fleet_col = _membership(fleet_of[sl])
    k_left = None
    if ctx.k_rows is not None:
        k_left = gp.max_temp_c[sl][None, :] - np.asarray(t_told[ctx.k_rows], dtype=float)
    return _GpuBlock(
        sl=sl,
        as_recorded=as_recorded,
        stats=ctx.judge.stats("gpu", idx.gpu_ids[sl], "°C", t_told, gp.max_temp_c[sl], over),
        k_left=k_left,
        b90=b90,
        in_rack=in_rack,
        rack_w=(res.power_w - p_meas) @ rack_col,
        in_fleet=in_fleet,
        fleet_n=fleet_col.sum(axis=0),
        act=act @ fleet_col,
        act_s=act_s @ fleet_col,
        power_w=np.nan_to_num(res.power_w) @ fleet_col,
        temp_max=np.fmax.reduce(res.temp_c, axis=1),
        held=res.held.sum(axis=1),
        mean_temp=np.nanmean(res.temp_c, axis=0),
        # throttled GPU-seconds, one definition for the baseline and every scenario: steps a
        # GPU spends at its max operating temperature (held there by the controller, or read)
        throttled_s=float(at_max.sum()) * d.dt_s,
        undelivered_j=float(res.undelivered_j.sum()),
    )


def _keep_block(d: Recording, rules_key: int, b: _GpuBlock) -> None:
    """Keep a block computed with every input as recorded for the runs after it (a scenario
    that changes one CDU's cooling leaves the other CDUs' GPU blocks as recorded), within
    :data:`BLOCK_CACHE_BYTES` per recording."""
    key = ("gpu-block", rules_key, b.sl.start, b.sl.stop)
    if not b.as_recorded or key in d.cache:
        return
    size = sum(a.nbytes for a in vars(b).values() if isinstance(a, np.ndarray))
    size += sum(a.nbytes for a in vars(b.stats).values() if isinstance(a, np.ndarray))
    used = d.cache.get("gpu-block-bytes", 0)
    if used + size <= BLOCK_CACHE_BYTES:
        d.cache[key] = b
        d.cache["gpu-block-bytes"] = used + size


def _gpus_run(
    d: Recording, changes: list[Any], cool: _Cooling, judge: Judge, feed: AlertFeed
) -> dict[str, Any]:
    idx, n = d.idx, d.n
    g = len(idx.gpu_ids)
    node_pos = {nd.name: i for i, nd in enumerate(d.site.nodes)}
    # the baseline's flow per rack over the reference, computed as the scenario's is
    fr_b_cdu = (
        cool.per_rack_base / np.maximum(cool.per_rack_ref, 1e-9)[None, :] if idx.cdu_names else None
    )
    ctx = _GpuRun(
        d,
        cool,
        _gpu_cap(d, changes),
        _activity_scale(d, changes),
        np.array([node_pos[nd] for nd in idx.gpu_node], dtype=np.int64),
        chain.gpu_r_k_per_w(1.0, fr_b_cdu) if fr_b_cdu is not None else None,
        # each rack's coolant supply in the scenario (its serving CDU's), once for all its GPUs
        cool.supply[np.arange(n)[:, None], np.maximum(cool.serve, 0)] if idx.cdu_names else None,
        judge,
        not any(isinstance(c, _COOLING_CHANGES) for c in changes),
        id(feed.rules),
        feed.rows if feed.wants(M_GPU_K, "gpu") else None,
    )
    if feed.wants(am.HEADROOM_GPU_TIME_TO_BREACH_P90_S, "gpu"):
        # the rack's p90 load ratio per minute (the live headroom's persistence p90)
        ctx.rows = feed.rows
        if "p90-ratio" not in d.cache:  # the recording's, the same for every run
            d.cache["p90-ratio"] = breach.p90_ratio(_it_minutes(d, d.rack_in_w, ctx.rows))
        ctx.ratio90 = d.cache["p90-ratio"]
        ctx.r_scale = hotspot_feed.causal_r_scale(d)
    rack_change = np.zeros((n, len(d.site.racks)))
    fleets = sorted(set(idx.gpu_fleet))
    f_pos = {f: i for i, f in enumerate(fleets)}
    fleet_of = np.array([f_pos[f] for f in idx.gpu_fleet], dtype=np.int64)
    act_sum = np.zeros((2, n, len(fleets)))
    pow_sum = np.zeros((n, len(fleets)))  # the run's GPU board power per fleet [W]
    fleet_n = np.zeros(len(fleets), dtype=np.int64)
    temp_max = np.full(n, -np.inf)
    held_n = np.zeros(n)
    mean_t = np.empty(g)
    throttled = undelivered = 0.0
    blocks = [slice(lo, min(lo + GPU_CHUNK, g)) for lo in range(0, g, GPU_CHUNK)]
    for b in in_order(partial(_gpu_block, ctx, fleet_of), blocks):
        _keep_block(d, ctx.rules_key, b)
        ids = idx.gpu_ids[b.sl]
        judge.merge("gpu", b.stats)
        if b.k_left is not None:
            feed.offer_series(M_GPU_K, "gpu", ids, b.k_left)
        if b.b90 is not None:
            feed.offer_series(am.HEADROOM_GPU_TIME_TO_BREACH_P90_S, "gpu", ids, b.b90)
        rack_change[:, b.in_rack] += b.rack_w
        act_sum[0][:, b.in_fleet] += b.act
        act_sum[1][:, b.in_fleet] += b.act_s
        pow_sum[:, b.in_fleet] += b.power_w
        fleet_n[b.in_fleet] += b.fleet_n.astype(np.int64)
        temp_max = np.fmax(temp_max, b.temp_max)
        held_n += b.held
        mean_t[b.sl] = b.mean_temp
        throttled += b.throttled_s
        undelivered += b.undelivered_j
    per = np.maximum(fleet_n, 1)
    return {
        "rack_change_w": rack_change,
        "fleet_act": {
            f: (act_sum[0][:, i] / per[i], act_sum[1][:, i] / per[i]) for f, i in f_pos.items()
        },
        "fleet_n": {f: int(fleet_n[i]) for f, i in f_pos.items()},
        "fleet_gpu_w": {f: pow_sum[:, i] / per[i] for f, i in f_pos.items()},
        "temp_max": temp_max,
        "held": held_n,
        "mean_temp": mean_t,
        "throttled_s": throttled,
        "undelivered_j": undelivered,
    }


def _membership(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The groups present in ``group`` (one index per column) and the (columns x groups)
    0/1 matrix whose product with a (T x columns) array sums each group's columns."""
    present, col = np.unique(group, return_inverse=True)
    onehot = np.zeros((len(group), len(present)))
    onehot[np.arange(len(group)), col] = 1.0
    return present, onehot


def _new_racks(d: Recording, changes: list[Any], fleet_act: dict) -> list[dict[str, Any]]:
    """Racks a scenario adds, running their fleet's mean recorded activity on the catalog."""
    racks = d.site.racks
    rack_pos = {r.name: i for i, r in enumerate(racks)}
    new: list[dict[str, Any]] = []
    for c in changes:
        if not isinstance(c, AddRacks):
            continue
        spec = NODE_MODELS[c.node_model]
        gspec = GPU_MODELS[spec.gpu]
        a = fleet_act.get(c.fleet, (np.zeros(d.n), np.zeros(d.n)))[1]
        from models import gpu_power

        p_gpu = gpu_power.gpu_power_w(a, gspec.idle_w, gspec.tdp_w, gspec.gamma)
        node_in = chain.node_input_w(p_gpu, spec)
        for _ in range(c.count):
            new.append(
                {
                    "name": f"new-{c.node_model.lower()}-{len(new) + 1}",
                    "power_w": c.nodes_per_rack * node_in,
                    "gpu_power_w": p_gpu,
                    "gspec": gspec,
                    "liquid": spec.cooling == "liquid",
                    "capture": spec.capture_fraction if spec.cooling == "liquid" else 0.0,
                    "cdu": c.cdu,
                    "like": racks[rack_pos[c.like_rack]],
                }
            )
    return new


def _electrical(d: Recording, changes, rack_s, new, judge: Judge, feed) -> dict[str, Any]:
    """Racks against their feeds, PDU phases and breakers against their derated limits."""
    site = d.site
    racks = site.racks
    pdus = site.pdu_by_name
    pf = {p.name: float(d.pdu_pf[i]) for i, p in enumerate(site.pdus)}
    ratio = chain.load_ratio(rack_s, np.where(np.isfinite(d.rack_in_w), d.rack_in_w, np.nan))
    ph = d.phases
    cur = d.phase_current_a.astype(float) * chain.phase_load_ratio(ratio, ph.racks, d.rack_in_w)
    for c in changes:
        if not isinstance(c, FailFeed):
            continue
        on = _mask(d, c.at, c.for_s)
        rk = next((r for r in racks if c.pdu in r.pdus), None)
        others = [p for p in rk.pdus if p != c.pdu] if rk is not None else []
        where = {pid: j for j, pid in enumerate(ph.ids)}
        for j, (p_name, leg) in enumerate(zip(ph.pdu, ph.leg, strict=True)):
            if p_name != c.pdu:
                continue
            for o in others:  # the same phase (or breaker) of the surviving feed
                k = where.get(sub_id(o, leg))
                if k is not None:
                    cur[:, k] = np.where(on, cur[:, k] + cur[:, j] / len(others), cur[:, k])
            cur[:, j] = np.where(on, 0.0, cur[:, j])
    ids, cols, lims = list(ph.ids), [cur], list(ph.limit_a)
    from twin.chain import derated_a, power_factor

    for nr in new:
        for p_name in nr["like"].pdus:
            p = pdus[p_name]
            per = chain.balanced_phase_current_a(
                nr["power_w"] / len(nr["like"].pdus), p, float(power_factor(pf.get(p_name)))
            )
            for k in range(1, (3 if p.phases == 3 else 1) + 1):
                ids.append(phase_id(f"{nr['name']}-{p.feed.lower()}", k))
                cols.append(per[:, None])
                lims.append(float(derated_a(p.rated_current_a)))
    # a phase's headroom needs a fresh current reading, as live (the held one feeds the rest)
    cols[0] = np.where(d.fresh["phase.current_a"], cur, np.nan)
    all_cur = np.column_stack(cols) if len(cols) > 1 else cols[0]
    lim = np.array(lims, dtype=float)
    if ids:
        judge.add("pdu_phase", ids, "A", all_cur, lim)
        n_ph = len(ph.ids)
        if feed.wants(M_PHASE_A, "pdu_phase"):
            now_a = _now(d, feed, all_cur[:, :n_ph])
            feed.offer_series(M_PHASE_A, "pdu_phase", ph.ids, lim[None, :n_ph] - now_a)
        if feed.wants(am.HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S, "pdu_phase"):
            _phase_forecast(d, feed, all_cur[:, :n_ph], rack_s, lim[:n_ph])
    cap = list(rack_capacity_kw(site, racks, pf))
    for nr in new:
        cap.append(float(rack_capacity_kw(site, [nr["like"]], pf)[0]))
    rack_all = np.column_stack([rack_s, *[nr["power_w"] for nr in new]]) if new else rack_s
    names = [r.name for r in racks] + [nr["name"] for nr in new]
    capa = np.array(cap, dtype=float)
    has = np.isfinite(capa)
    rack_ids = [x for x, h in zip(names, has, strict=True) if h]
    # a rack whose feeds do not all report has no kW headroom, as live (its load is unknown)
    told = d.fresh["rack.power"]  # every feed fresh (a silent one never is)
    told = np.column_stack([told, np.ones((d.n, len(new)), bool)]) if new else told
    kw = np.where(told, rack_all, np.nan)[:, has] / 1e3
    judge.add("rack", rack_ids, "kW", kw, capa[has])
    _offer_now_and_flat(
        feed,
        am.HEADROOM_RACK_KW_TO_LIMIT,
        am.HEADROOM_RACK_TIME_TO_BREACH_P50_S,
        "rack",
        rack_ids,
        capa[has][None, :] - _now(d, feed, kw),
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        util = np.fmax.reduce(all_cur / lim[None, :], axis=1) if ids else np.zeros(d.n)
    return {"rack_all": rack_all, "phase_util_max": util}


def _cdus(d: Recording, cool: _Cooling, rack_s: np.ndarray, new, judge: Judge, feed) -> dict:
    """CDU heat against capacity, flow needed against flow, loop return against its limit."""
    idx, cdus = d.idx, d.site.cdus
    base_in = np.where(np.isfinite(d.rack_in_w), d.rack_in_w, 0.0)
    rack_change_w = np.where(np.isfinite(d.rack_in_w), rack_s, 0.0) - base_in
    rack_heat_change, _ = chain.rack_heat_kw(rack_change_w, d.params.rack_capture[None, :])
    # a CDU without a fresh heat reading: its racks' modelled heat carries its flow and return
    # (as the live pass takes it), and its capacity headroom is unknown
    heat = d.cdu["heat_kw"]
    told = d.fresh["cdu.heat_kw"]
    if not told.all():
        modelled = chain.cdu_rack_heat_kw(base_in, d.params.rack_capture, idx.rack_cdu, len(cdus))
        heat = np.where(told, heat, modelled)
    heat = np.nan_to_num(heat)
    # the heat each rack puts on a loop: its share of its own CDU's recorded heat plus change
    heat_s = np.zeros_like(heat)
    for c in range(len(cdus)):
        mine = np.flatnonzero(idx.rack_cdu == c)
        if mine.size == 0:
            heat_s[:, c] += heat[:, c]
            continue
        w = np.maximum(base_in[:, mine] * d.params.rack_capture[mine][None, :], 0.0)
        tot = w.sum(axis=1, keepdims=True)
        share = np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), 1.0 / mine.size)
        per_rack = heat[:, c : c + 1] * share + rack_heat_change[:, mine]
        dest = cool.serve[:, mine]
        for k in range(mine.size):
            for tgt in np.unique(dest[:, k]):
                if tgt >= 0:
                    heat_s[:, tgt] += np.where(dest[:, k] == tgt, per_rack[:, k], 0.0)
    pos = {c.name: i for i, c in enumerate(cdus)}
    for nr in new:
        if nr["cdu"] is not None:
            heat_s[:, pos[nr["cdu"]]] += nr["capture"] * nr["power_w"] / 1e3
    names = [c.name for c in cdus]
    rated = np.array([c.capacity_kw for c in cdus], float)
    max_flow = np.array([c.max_flow_lpm for c in cdus], float)
    cap_s = chain.cdu_capacity_kw(rated[None, :], cool.flow, max_flow[None, :])
    # a headroom figure needs its readings fresh (d.fresh), as live: capacity the heat and the
    # flow, the flow needed the supply and the flow, the return its own
    fresh = {q: d.fresh[f"cdu.{q}"] for q in ("heat_kw", "flow_lpm", "supply_temp_c")}
    heat_told = np.where(fresh["heat_kw"] & fresh["flow_lpm"], heat_s, np.nan)
    judge.add("cdu_heat", names, "kW", heat_told, cap_s)
    # now (as live): the means of the last minute's heat and flow, the supply at the minute
    heat_m, flow_m = _now(d, feed, heat_told), _now(d, feed, cool.flow)
    cap_m = chain.cdu_capacity_kw(rated[None, :], flow_m, max_flow[None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        free = np.where(cap_m > 0, (cap_m - heat_m) / cap_m, np.nan)
    if feed.wants(M_CDU_FREE, "cdu"):
        feed.offer_series(M_CDU_FREE, "cdu", names, free)
    pumps = d.cdu_pumps_reported if d.cdu_pumps_reported is not None else True
    feed.offer(M_PUMPS, "cdu", names, np.where(pumps, cool.running, np.nan))
    # the return: recorded plus the model's change; the flow the scenario's heat needs
    supply, flow = d.cdu["supply_temp_c"], d.cdu["flow_lpm"]
    _, need = chain.loop_paths(cdus, heat_s, cool.supply, cool.flow)
    after = (heat_s, cool.supply, cool.flow)
    ret_s = chain.moved_return_c(cdus, d.cdu["return_temp_c"], (heat, supply, flow), after)
    # a loop without a return reading has no return headroom, as live
    ret_told = np.where(d.fresh["cdu.return_temp_c"], ret_s, np.nan)
    need = np.where(fresh["supply_temp_c"] & fresh["flow_lpm"], need, np.nan)
    judge.add("cdu_flow", names, "L/min", need, cool.flow)
    ret_limit = np.array([c.return_limit_c for c in cdus], float)
    judge.add("loop", names, "°C", ret_told, ret_limit)
    _offer_flat_breach(feed, am.HEADROOM_CDU_TIME_TO_BREACH_P50_S, "cdu", names, cap_m - heat_m)
    rows = feed.rows
    _, need_m = chain.loop_paths(cdus, _now(d, feed, heat_s), cool.supply[rows], flow_m)
    told = (fresh["supply_temp_c"] & fresh["flow_lpm"])[rows]
    _offer_now_and_flat(
        feed,
        am.HEADROOM_CDU_FLOW_LPM_TO_LIMIT,
        am.HEADROOM_CDU_FLOW_TIME_TO_BREACH_P50_S,
        "cdu",
        names,
        np.where(told, flow_m - need_m, np.nan),
    )
    _offer_now_and_flat(
        feed,
        am.HEADROOM_LOOP_K_TO_RETURN_LIMIT,
        am.HEADROOM_LOOP_TIME_TO_BREACH_P50_S,
        "cdu",
        names,
        ret_limit[None, :] - ret_told[feed.rows],  # the reading at the minute, as live
    )
    return {"heat": heat_s, "cap": cap_s, "ret": ret_s, "ret_limit": ret_limit}


def _links(
    d: Recording, changes: list[Any], fleet_act: dict, judge: Judge, notes, feed: AlertFeed
) -> np.ndarray:
    """Link traffic scaled with the fleets at its ends; a failed link's traffic moves over."""
    site = d.site
    if not site.links:
        return np.zeros(d.n)
    names = [lk.name for lk in site.links]
    busy = d.link_busy_gbps.astype(float)
    ratio = {}
    for f, (a_b, a_s) in fleet_act.items():
        ratio[f] = np.where(a_b > 0, a_s / np.maximum(a_b, 1e-9), 1.0)
    busy_s = busy.copy()
    fleet_of_node = site.fleet_of_node
    for j, lk in enumerate(site.links):
        for end in (lk.a, lk.b):
            fl = fleet_of_node.get(end)
            if fl is not None and fl.name in ratio:
                busy_s[:, j] = busy[:, j] * ratio[fl.name]
    cap = np.broadcast_to(
        np.array([lk.capacity_gbps for lk in site.links], float), busy_s.shape
    ).copy()
    for c in changes:
        if not isinstance(c, FailLink):
            continue
        on = _mask(d, c.at, c.for_s)
        j = names.index(c.link)
        peers = chain.parallel_links(site, j)
        moved = busy_s[:, j].copy()
        if peers:
            for k in peers:
                busy_s[:, k] += np.where(on, moved / len(peers), 0.0)
            busy_s[:, j] = np.where(on, 0.0, busy_s[:, j])
        else:
            notes.append(f"link {c.link} failed with no parallel path")
            cap[:, j] = np.where(on, 0.0, cap[:, j])
    busy_s = np.where(d.fresh["link.busy"], busy_s, np.nan)  # fresh only, as live
    judge.add("link", names, "Gb/s", busy_s, cap)
    _offer_now_and_flat(
        feed,
        am.HEADROOM_LINK_GBPS_TO_LIMIT,
        am.HEADROOM_LINK_TIME_TO_BREACH_P50_S,
        "link",
        names,
        cap[feed.rows] - _now(d, feed, busy_s),
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.fmax.reduce(busy_s / np.where(cap > 0, cap, np.nan), axis=1)


def _now(d: Recording, feed: AlertFeed, x: np.ndarray) -> np.ndarray:
    """(M, N) at each evaluation minute, the mean of ``x`` (T, N) over the live pass's "now"
    window up to it (``breach.minute_means``): the live headroom's "now" of a current, a
    power, a heat, a flow or a traffic is that mean, not the sample."""
    return breach.minute_means(x, feed.rows, d.dt_s)


def _offer_flat_breach(
    feed: AlertFeed, metric: str, kind: str, ids: list[str], headroom: np.ndarray
) -> None:
    """Time to breach under a flat (persistence) p50 path from the headroom now (M, N): 0 when
    breached now, else twice the horizon (no breach forecast); none where it is unknown."""
    if not feed.wants(metric, kind):
        return
    h = np.asarray(headroom, dtype=float)
    b = breach.beyond_horizon(breach.flat_breach_in_s(h))
    feed.offer_series(metric, kind, ids, np.where(np.isfinite(h), b, np.nan))


def _offer_now_and_flat(
    feed: AlertFeed, now_metric: str, breach_metric: str, kind: str, ids, headroom: np.ndarray
) -> None:
    """A limit's headroom now (M, N) and its time to breach under a flat p50 path."""
    if feed.wants(now_metric, kind):
        feed.offer_series(now_metric, kind, ids, headroom)
    _offer_flat_breach(feed, breach_metric, kind, ids, headroom)


def _fleet_underuse(
    d: Recording,
    fleet_act: dict[str, Any],
    fleet_n: dict[str, int],
    fleet_gpu_w: dict[str, np.ndarray],
    feed: AlertFeed,
) -> None:
    """Inference fleets' GPUs to reclaim each minute, as
    :func:`twin.analysis.fleets.underused_fleets` judges them live (its rule and sizing,
    :func:`twin.analysis.fleets.underuse_rule` and :func:`twin.analysis.fleets.underuse_sizing`,
    with the site file's per-fleet ``underuse``): the mean and p95 over the window up to the minute
    of the fleet's minute activity (the run's), judged once the window holds the rule's coverage;
    kw_freed from the run's mean GPU board power over the same window (the recording has no node
    input power, so the hosts' share the live report adds is not in it: a lower bound)."""
    if not feed.wants(am.FLEET_UNDERUSED_GPUS, "fleet"):
        return
    from twin.analysis.fleets import DEFAULT_WINDOW_S, span_text, underuse_rule, underuse_sizing

    rows = feed.rows
    k = max(1, round(DEFAULT_WINDOW_S / 60.0))
    covered = np.minimum(np.arange(len(rows)) * 60.0 + 60.0, DEFAULT_WINDOW_S)
    hi = np.arange(1, len(rows) + 1)
    lo = np.maximum(hi - k, 0)

    def trailing_mean(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The mean over the window up to each minute, and the minutes with data in it."""
        cs = np.concatenate([[0.0], np.cumsum(np.nan_to_num(x))])
        cn = np.concatenate([[0], np.cumsum(np.isfinite(x))])
        with np.errstate(invalid="ignore", divide="ignore"):
            return (cs[hi] - cs[lo]) / (cn[hi] - cn[lo]), cn[hi] - cn[lo]

    for f in d.site.fleets:
        if f.role != "inference" or f.name not in fleet_act or not fleet_n.get(f.name):
            continue
        a = breach.minute_means(np.asarray(fleet_act[f.name][1])[:, None], rows, d.dt_s)[:, 0]
        mean_a, minutes = trailing_mean(a)
        # mean board power per GPU over the window up to each minute
        pw = breach.minute_means(np.asarray(fleet_gpu_w[f.name])[:, None], rows, d.dt_s)[:, 0]
        gpu_w, _ = trailing_mean(pw)
        p95 = breach.trailing_quantile(a, k, 0.95)
        rule = underuse_rule(f)
        _, reclaim, _, flagged = underuse_sizing(mean_a, p95, fleet_n[f.name], minutes * 60.0, rule)
        value = np.where(flagged, reclaim, np.nan)[:, None]
        labels = {
            "covered_s": [f"{c:.0f}" for c in covered],
            "covered": [span_text(c) for c in covered],
            "kw_freed": [
                f"{r * w / 1000.0:.1f}" if np.isfinite(r * w) else "unknown (no GPU power)"
                for r, w in zip(reclaim, gpu_w, strict=True)
            ],
        }
        feed.offer_series(am.FLEET_UNDERUSED_GPUS, "fleet", [f.name], value, labels)


def _fleet_drain(d: Recording, fleet_act: dict[str, Any], feed: AlertFeed) -> None:
    """Every fleet's drain each minute (:func:`twin.analysis.fleet_drain.drain_series` on the run's
    minute activity), as the live detection pass computes it from the store."""
    if not feed.wants(am.FLEET_DRAIN_DROP, "fleet"):
        return
    from twin.analysis.fleet_drain import drain_labels, drain_series

    names = [f.name for f in d.site.fleets if f.name in fleet_act]
    if not names:
        return
    rows = feed.rows
    act = np.stack([np.asarray(fleet_act[n][1], dtype=float) for n in names], axis=1)
    # the minute up to each evaluation row (the live query's one-minute buckets)
    s = drain_series(breach.minute_means(act, rows, d.dt_s))
    for j, name in enumerate(names):
        col = s.drop[:, j]
        if not np.isfinite(col).any():
            continue
        ok = np.flatnonzero(np.isfinite(col))
        labels = {key: [""] * len(rows) for key in ("level_now", "level_before", "basis", "window")}
        for i in ok:
            for key, v in drain_labels(s, i, j).items():
                labels[key][i] = v
        feed.offer_series(am.FLEET_DRAIN_DROP, "fleet", [name], col[:, None], labels)


def _phase_forecast(
    d: Recording, feed: AlertFeed, cur: np.ndarray, rack_s: np.ndarray, limit_a: np.ndarray
) -> None:
    """Phases' and breakers' p50 time to breach each minute: the live headroom's trend forecast."""
    rows, ph = feed.rows, d.phases
    cur_m = breach.minute_means(cur, rows, d.dt_s)
    rack_m = np.nan_to_num(_it_minutes(d, rack_s, rows))
    fed = np.zeros((rack_s.shape[1], len(ph.ids)))
    for j, racks in enumerate(ph.racks):
        fed[racks, j] = 1.0
    load = rack_m @ fed
    load = np.where(fed.sum(axis=0)[None, :] > 0, load, 1.0)  # feeds no rack: no load to explain
    # the trend fit is the costly part: refit only the phases whose inputs the run changed
    prev = d.cache.get("phase-forecast")
    if prev is not None and prev[0].shape == cur_m.shape:
        same = (
            ((prev[0] == cur_m) | (np.isnan(prev[0]) & np.isnan(cur_m))).all(axis=0)
            & (prev[1] == load).all(axis=0)
            & (prev[3] == limit_a)
        )
    else:
        same = np.zeros(cur_m.shape[1], bool)
    b = np.empty_like(cur_m)
    if same.any():
        b[:, same] = prev[2][:, same]
    if (~same).any():
        b[:, ~same] = breach.trend_breach_in_s(cur_m[:, ~same], load[:, ~same], limit_a[~same])
    if prev is None:
        d.cache["phase-forecast"] = (cur_m, load, b, limit_a.copy())
    b = np.where(np.isfinite(cur_m), breach.beyond_horizon(b), np.nan)
    feed.offer_series(am.HEADROOM_PDU_PHASE_TIME_TO_BREACH_P50_S, "pdu_phase", list(ph.ids), b)


def _it_minutes(d: Recording, rack_w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(M, R) each rack's load at each evaluation minute as the live headroom's persistence p90
    and phase trend take it (``twin.analysis.headroom``): the minute's mean IT load (its nodes'
    power, the recording's plus the run's change ``rack_w - rack_in_w``) where every node of
    the rack reported in the minute, else the minute's mean of ``rack_w`` (its PDUs'). The IT
    load is the load a phase's current is explained by: load creeping onto a phase from outside
    the site's nodes shows in the PDU's power too, and must stay in the trend."""
    pdu_m = breach.minute_means(rack_w, rows, d.dt_s)
    change = np.where(np.isfinite(d.rack_in_w), rack_w - d.rack_in_w, 0.0)
    it_m = breach.minute_means(d.rack_it_w + change, rows, d.dt_s)
    return np.where(d.fresh["rack.it"][rows] & np.isfinite(it_m), it_m, pdu_m)


def _series(d: Recording, **paths: np.ndarray) -> dict[str, list[float]]:
    """Site-level paths on at most SERIES_POINTS points: means of sums, maxima of maxima."""
    step = max(1, math.ceil(d.n / SERIES_POINTS))
    starts = np.arange(0, d.n, step)
    out: dict[str, list[float]] = {"t_h": (starts * d.dt_s / 3600).round(4).tolist()}
    for key, v in paths.items():
        v = np.asarray(v, dtype=float)
        if key.endswith(("_max", "_max_c")):
            r = np.fmax.reduceat(np.nan_to_num(v, nan=-np.inf), starts)
        else:
            r = np.add.reduceat(np.nan_to_num(v), starts) / np.diff(np.append(starts, d.n))
        out[key] = np.where(np.isfinite(r), r, np.nan).round(4).tolist()
    return out


@dataclass
class _Pass:
    judge: Judge
    cool: _Cooling
    gpu: dict[str, Any]
    rack_s: np.ndarray
    elec: dict[str, np.ndarray]
    cdu: dict[str, np.ndarray]
    link_util: np.ndarray
    feed: AlertFeed  # every series a rule watches, to evaluate (AlertFeed.evaluate)
    new: list[dict[str, Any]]  # the racks the scenario adds


def _pass(d: Recording, changes: list[Any], rules: Any) -> _Pass:
    """The chain over the whole recording for one set of changes (none: the baseline)."""
    judge = Judge(d.dt_s, d.times())
    feed = AlertFeed(rules, d)
    cool = _cooling(d, changes)
    gpu = _gpus(d, changes, cool, judge, feed)
    _offer_hotspots(d, changes, feed)
    base_in = np.where(np.isfinite(d.rack_in_w), d.rack_in_w, np.nan)
    rack_s = chain.rack_power_w(
        np.nan_to_num(base_in), gpu["rack_change_w"], d.params.rack_beta[None, :]
    )
    rack_s = np.where(np.isfinite(base_in), rack_s, 0.0)
    new = _new_racks(d, changes, gpu["fleet_act"])
    elec = _electrical(d, changes, rack_s, new, judge, feed)
    cdu = _cdus(d, cool, rack_s, new, judge, feed)
    link_util = _links(d, changes, gpu["fleet_act"], judge, cool.notes, feed)
    _fleet_underuse(d, gpu["fleet_act"], gpu["fleet_n"], gpu["fleet_gpu_w"], feed)
    _fleet_drain(d, gpu["fleet_act"], feed)
    return _Pass(judge, cool, gpu, rack_s, elec, cdu, link_util, feed, new)


# ---- hot-spot detectors (issue 16 item 4) ---------------------------------------------------
def _offer_hotspots(d: Recording, changes: list[Any], feed: AlertFeed) -> None:
    """The residual and R-drift series (``twin.replay.hotspot_feed``) to the alert feed, for a
    run whose GPUs are as recorded (the baseline, or a scenario that leaves them alone); the
    recording's series are computed once and cached on ``d``."""
    if feed.rules is None or any(isinstance(c, _GPU_CHANGES) for c in changes):
        return
    if "hotspot-series" not in d.cache:
        d.cache["hotspot-series"] = hotspot_feed.hotspot_series(d)
    for s in d.cache["hotspot-series"]:  # the GPUs some rule could fire on, with their labels
        feed.offer_series(
            s.metric, s.kind, s.ids, s.values, s.labels, hotspot_feed.LABEL_FORMAT, s.excess
        )


def run(
    d: Recording,
    scenario: Scenario | None,
    rules: Any = None,
    tolerance: Tolerance | None = None,
) -> RunResult:
    """One run of the chain over the recording: the baseline (``scenario=None``) or a scenario.

    A scenario's verdict compares it with the baseline run (computed once per recording and
    rules, and cached on ``d``).
    """
    ps = _pass(d, list(scenario.changes) if scenario else [], rules)
    return _result(d, scenario, ps, ps.feed.evaluate(), tolerance)


def run_all(
    d: Recording,
    scenarios: list[Scenario],
    rules: Any = None,
    tolerance: Tolerance | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[RunResult, list[RunResult]]:
    """The baseline and each scenario (:func:`run`), as ``dctwin whatif``, the API's what-if
    jobs and the benchmark run them; ``progress(name)`` is called as each run starts.

    One run after another: a run's alert evaluation (the rule engine minute by minute, Python
    that holds the GIL) was tried in a thread beside the next run's chain, and the chain,
    whose GPU blocks already keep both cores of the 2-vCPU machine busy, lost more than the
    overlap won (bench/README.md, bench_whatif)."""
    out: list[RunResult] = []
    for scenario in [None, *scenarios]:
        if progress is not None:
            progress(scenario.name if scenario else "baseline")
        out.append(run(d, scenario, rules, tolerance))
    return out[0], out[1:]


def _result(
    d: Recording,
    scenario: Scenario | None,
    ps: _Pass,
    alerts: list[dict[str, Any]],
    tolerance: Tolerance | None,
) -> RunResult:
    """A run's result from its pass and its alerts: the verdict against the baseline."""
    tol = tolerance or Tolerance()
    cool, gpu, elec, cdu, link_util = ps.cool, ps.gpu, ps.elec, ps.cdu, ps.link_util
    racks = d.site.racks
    comps = ps.judge.components()
    if scenario is None:
        d.cache["baseline"] = comps
    rack_total = elec["rack_all"].sum(axis=1)
    kinds = summarize(comps, _baseline(d) if scenario is not None else None)
    order = sorted(
        (c for c in comps if np.isfinite(c.min_headroom)),
        key=lambda c: c.min_headroom / c.limit if c.limit else c.min_headroom,
    )
    throttled_s = gpu["throttled_s"]
    if scenario is None:
        recorded = [c for c in comps if c.time_over_s > 0]
        verdict_, reasons, changed = "baseline", _baseline_reasons(recorded, throttled_s), []
    else:
        base = _baseline(d)
        changed = compare(base, comps, tol, d.dt_s)
        verdict_, reasons = verdict(changed)
        recorded = [c for c in base if c.time_over_s > 0]
        if gpu["undelivered_j"] > 0:
            reasons.append(
                f"GPUs at their max operating temperature for {throttled_s / 3600:.1f}"
                f" GPU-hours (the thermal controller holds them there);"
                f" {gpu['undelivered_j'] / 3.6e6:,.1f} kWh of GPU energy not delivered"
                " (work not done)"
            )
    reasons = cool.notes + reasons
    series = _series(
        d,
        it_power_kw=rack_total / 1e3,
        liquid_heat_kw=cdu["heat"].sum(axis=1),
        air_heat_kw=_air_heat_kw(d, elec["rack_all"], ps.new),
        cdu_capacity_kw=cdu["cap"].sum(axis=1),
        gpu_temp_max_c=gpu["temp_max"],
        gpus_throttled=gpu["held"],
        cdu_util_max=np.fmax.reduce(cdu["heat"] / np.maximum(cdu["cap"], 1e-9), axis=1)
        if racks and d.site.cdus
        else np.zeros(d.n),
        loop_return_max_c=np.fmax.reduce(cdu["ret"], axis=1) if d.site.cdus else np.zeros(d.n),
        phase_util_max=elec["phase_util_max"],
        link_util_max=link_util,
    )
    cdus = d.site.cdus
    cdu_means = {
        c.name: {
            "flow_lpm": float(np.mean(cool.flow[:, i])),
            "supply_c": float(np.mean(cool.supply[:, i])),
            "return_c": float(np.mean(cdu["ret"][:, i])),
            "heat_kw": float(np.mean(cdu["heat"][:, i])),
            "capacity_kw": float(np.mean(cdu["cap"][:, i])),
            "peak_utilization": float(
                np.max(cdu["heat"][:, i] / np.maximum(cdu["cap"][:, i], 1e-9))
            ),
        }
        for i, c in enumerate(cdus)
    }
    return RunResult(
        name=scenario.name if scenario else "baseline",
        description=scenario.description if scenario else "the recording as it happened",
        verdict=verdict_,  # type: ignore[arg-type]
        reasons=reasons,
        kinds=kinds,
        worst=order[:15],
        recorded_breaches=recorded[:50],
        changes=changed[:50],
        alerts=alerts,
        it_energy_kwh=round(float(rack_total.sum() * d.dt_s / 3.6e6), 3),
        liquid_heat_kwh=round(float(cdu["heat"].sum() * d.dt_s / 3600.0), 3),
        throttled_gpu_s=throttled_s,
        undelivered_energy_kwh=round(gpu["undelivered_j"] / 3.6e6, 3) if scenario else 0.0,
        duration_s=d.duration_s,
        series=series,
        cdus=cdu_means,
        gpu_mean_temp_c=dict(
            zip(d.idx.gpu_ids, np.round(gpu["mean_temp"], 4).tolist(), strict=True)
        ),
    )


def _air_heat_kw(d: Recording, rack_all: np.ndarray, new: list[dict[str, Any]]) -> np.ndarray:
    """(T,) heat the racks put into the room's air: what their cold plates do not capture."""
    capture = np.concatenate([d.params.rack_capture, [nr["capture"] for nr in new]])
    return chain.rack_heat_kw(rack_all, capture[None, :])[1].sum(axis=1)


def _baseline_reasons(recorded: list[Any], throttled_s: float) -> list[str]:
    out = []
    by: dict[str, list[Any]] = {}
    for c in recorded:
        by.setdefault(c.kind, []).append(c)
    for kind, cs in by.items():
        w = max(cs, key=lambda c: c.time_over_s)
        out.append(
            f"the recording already breaches: {len(cs)} {kind}, longest {w.id} "
            f"{w.time_over_s / 60:.0f} min over (peak {w.peak:.1f} {w.unit} against "
            f"{w.limit:.1f})"
        )
    if throttled_s > 0:
        out.append(
            f"GPUs at their max operating temperature in the recording: "
            f"{throttled_s / 3600:.1f} GPU-hours"
        )
    return out or ["the recording breaches no limit"]


def _baseline(d: Recording) -> list[Any]:
    """The recording's own components (the baseline run's), computed once per recording."""
    if "baseline" not in d.cache:
        d.cache["baseline"] = _pass(d, [], None).judge.components()
    return d.cache["baseline"]


def component_results(d: Recording, scenario: Scenario | None = None) -> list[Any]:
    """Every component's result for one run (``RunResult.worst`` keeps only the tightest)."""
    return _pass(d, list(scenario.changes) if scenario else [], None).judge.components()
