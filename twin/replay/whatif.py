"""What-if: a recording run through the calibrated twin, as it was and as a scenario changes it.

Both runs use the same model, and a scenario's value is the recorded value plus what the
model says the scenario changes (``measured + model(scenario) - model(baseline)``), so the
calibration's residual error cancels and an empty scenario reproduces the recording exactly.
Per step of the recording (its resolution):

1. **GPU power**: the recorded power plus the power curve's change for a scaled activity
   (``models.gpu_power.gpu_power_w`` with each GPU's calibrated idle, limit and gamma), capped
   by a power cap; new racks run their fleet's median recorded activity on the catalog curve.
2. **Rack power**: recorded input power plus beta x the change in the sum of its GPUs
   (calibrated ``alpha + beta * sum(P_gpu)``); new racks from the catalog node model
   (``models.electrical.node_power_w``, ``psu_input_w``).
3. **PDU phases**: recorded current scaled with the racks they feed; a failed feed's current
   moves to the same phase of the rack's other feed. New racks' PDUs are like their
   ``like_rack``'s, with balanced phases.
4. **CDU**: heat = recorded + fitted capture fraction x change in rack power (+ new racks);
   flow after a pump failure from the pump model (``models.cdu.parallel_pump_flow_lpm``: the
   ratio of n-1 to n pumps on the CDU's curve); supply = ``max(setpoint, FW + approach)`` with
   the approach read off the recording; capacity scaled by flow over rated flow; return =
   supply + heat / (rho V c_p). A failed CDU's racks move to the CDUs on the same ``loop``
   (site file), shared by capacity; without one they lose their coolant flow.
5. **GPU temperature**: the calibrated RC model (``models.gpu_thermal.rc_step``) over the
   coolant (supply + offset) or inlet air, with R at the loop's flow
   (``r_at_flow_k_per_w``). A GPU the scenario takes past its max operating temperature
   throttles: its power is cut to what holds it there, as the driver does.
6. **Links**: recorded traffic scaled with the activity of the fleet its node runs; a failed
   link's traffic moves to the links of the same switch toward the same tier.

Per component it reports the minimum headroom, the time over the limit and the first breach;
the alerts the rule file would have fired; the IT energy; and a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from models import cdu as cdu_model
from models import coolant, electrical, gpu_power, gpu_thermal
from twin.calibrate.calibrate import index_site
from twin.calibrate.windows import hold_fill
from twin.replay.bundle import Bundle
from twin.replay.result import ComponentResult, Kind, KindSummary, RunResult
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
from twin.site import Site
from twin.site.catalog import CDU_MODELS, GPU_MODELS, NODE_MODELS

F64 = np.ndarray
DERATE = 0.8  # continuous load at 80 % of a breaker's rating (NEC 210.20(A), physics.md §4.3)
PUMP_SPEED = 0.8  # pumps run at 80 % speed in normal operation (as the simulator assumes)
DEFAULT_DESIGN_DP_KPA = 100.0
PF_DEFAULT = 0.98
RISK_FRACTION = 0.10  # "fits with risks": a headroom below 10 % of its limit
RISK_GPU_K = 3.0  # ... or a GPU within 3 K of its max operating temperature
GPU_CHUNK = 2048  # GPUs per block of the thermal loop (bounds memory at 10,000 GPUs)


@dataclass
class _Data:
    """The recording on its time grid, and the site flattened."""

    bundle: Bundle
    site: Site
    t0: datetime
    dt_s: float
    n: int
    idx: Any
    gpu: dict[str, F64]
    node: dict[str, F64]
    pdu: dict[str, F64]
    pdu_ids: list[str]
    cdu: dict[str, F64]
    pump_speed: dict[str, F64]  # cdu name -> (T, pumps) speed
    link: dict[str, F64]
    params: dict[tuple[str, str, str], float]
    rack_in: F64  # (T, R) recorded rack input power (its PDUs), W
    extra: dict[str, Any] = field(default_factory=dict)


def _grid(bundle: Bundle, kind: str, ids: list[str], quantities: list[str], t0, dt_s, n):
    """(T, N) arrays of ``quantities`` for ``ids`` on the recording's grid (NaN: no sample)."""
    out = {q: np.full((n, len(ids)), np.nan) for q in quantities}
    if kind not in bundle.manifest.rows:
        return out
    present = [q for q in quantities if q in bundle.manifest.resolutions.get(kind, {})]
    t = bundle.table(kind, present)
    ts = t.column("ts").cast(pa.timestamp("us", tz="UTC")).to_numpy().astype("int64")
    start_us = int(t0.timestamp() * 1e6)
    row = np.round((ts - start_us) / (dt_s * 1e6)).astype(np.int64)
    enc = t.column("id").combine_chunks().dictionary_encode()
    pos = {s: i for i, s in enumerate(ids)}
    lut = np.array([pos.get(s, -1) for s in enc.dictionary.to_pylist()], dtype=np.int64)
    col = lut[enc.indices.to_numpy(zero_copy_only=False)]
    ok = (col >= 0) & (row >= 0) & (row < n)
    for q in present:
        v = t.column(q).to_numpy(zero_copy_only=False).astype(float)
        out[q][row[ok], col[ok]] = v[ok]
    return out


def load(bundle: Bundle) -> _Data:
    """Read a bundle onto its time grid."""
    m = bundle.manifest
    dt = m.resolution_s or 1.0
    n = round((m.end - m.start).total_seconds() / dt)
    site = bundle.site
    idx = index_site(site)
    t0 = m.start
    gpu = _grid(
        bundle,
        "gpu",
        idx.gpu_ids,
        ["power_w", "temp_c", "sm_active", "util_pct", "power_limit_w"],
        t0,
        dt,
        n,
    )
    act = gpu["sm_active"]
    no_sm = np.isnan(act).all(axis=0)
    act[:, no_sm] = gpu["util_pct"][:, no_sm] / 100.0
    for q in ("power_w", "temp_c", "sm_active"):
        gpu[q] = hold_fill(gpu[q], backfill=True)
    node_ids = [nd.name for nd in site.nodes]
    node = _grid(bundle, "node", node_ids, ["power_w", "inlet_temp_c"], t0, dt, n)
    node = {q: hold_fill(v, backfill=True) for q, v in node.items()}
    pdu_ids: list[str] = []
    for p in site.pdus:
        pdu_ids.append(p.name)
        pdu_ids += [f"{p.name}/L{k}" for k in range(1, (3 if p.phases == 3 else 1) + 1)]
        pdu_ids += [f"{p.name}/{b.name}" for b in p.breakers]
    pdu = _grid(bundle, "pdu", pdu_ids, ["power_w", "current_a", "inlet_temp_c"], t0, dt, n)
    pdu = {q: hold_fill(v, backfill=True) for q, v in pdu.items()}
    cdu = _grid(
        bundle,
        "cdu",
        idx.cdu_names,
        ["supply_temp_c", "return_temp_c", "flow_lpm", "heat_kw", "fw_supply_temp_c"],
        t0,
        dt,
        n,
    )
    cdu = {q: hold_fill(v, backfill=True) for q, v in cdu.items()}
    pump_ids = [f"{c.name}/{p}" for c in site.cdus for p in c.pumps]
    pumps = _grid(bundle, "cdu", pump_ids, ["pump_speed_pct"], t0, dt, n)["pump_speed_pct"]
    pump_speed: dict[str, F64] = {}
    k = 0
    for c in site.cdus:
        pump_speed[c.name] = hold_fill(pumps[:, k : k + len(c.pumps)], backfill=True)
        k += len(c.pumps)
    links = [lk.name for lk in site.links]
    link = _grid(bundle, "link", links, ["tx_bps", "rx_bps"], t0, dt, n)
    link = {q: np.nan_to_num(hold_fill(v, backfill=True)) for q, v in link.items()}
    pos = {p: i for i, p in enumerate(pdu_ids)}
    rack_in = np.zeros((n, len(idx.rack_names)))
    for r, pdus in enumerate(idx.rack_pdus):
        cols = [pos[p] for p in pdus if p in pos]
        rack_in[:, r] = np.nansum(pdu["power_w"][:, cols], axis=1)
    return _Data(
        bundle,
        site,
        t0,
        dt,
        n,
        idx,
        gpu,
        node,
        pdu,
        pdu_ids,
        cdu,
        pump_speed,
        link,
        bundle.params(),
        rack_in,
    )


def _mask(d: _Data, at: float, for_s: float | None) -> F64:
    """(T,) bool: the steps a timed change is active."""
    t = np.arange(d.n) * d.dt_s
    end = np.inf if for_s is None else at + for_s
    return (t >= at) & (t < end)


def _gpu_params(d: _Data) -> dict[str, F64]:
    """Per GPU: calibrated idle, limit, gamma, R, C, offset (catalog where not usable)."""
    idx, p = d.idx, d.params
    nodes = {nd.name: nd for nd in d.site.nodes}
    out: dict[str, list[float]] = {
        k: [] for k in ("idle", "limit", "gamma", "r", "c", "off", "tmax")
    }
    for i, gid in enumerate(idx.gpu_ids):
        spec = nodes[idx.gpu_node[i]].gpu_spec
        liquid = idx.gpu_cdu[i] >= 0
        r_nom = spec.r_liquid_k_per_w if liquid else spec.r_air_k_per_w
        tau = spec.tau_liquid_s if liquid else spec.tau_air_s
        out["idle"].append(p.get(("gpu", gid, "idle_w"), spec.idle_w))
        out["limit"].append(p.get(("gpu", gid, "limit_w"), spec.tdp_w))
        out["gamma"].append(p.get(("gpu", gid, "gamma"), spec.gamma))
        r = p.get(("gpu", gid, "r_k_per_w"))
        c = p.get(("gpu", gid, "c_j_per_k"))
        if r is None or c is None:
            r, c = r_nom, tau / r_nom
        out["r"].append(r)
        out["c"].append(c)
        out["off"].append(p.get(("gpu", gid, "offset_k"), 0.0))
        out["tmax"].append(spec.max_operating_temp_c)
    return {k: np.array(v, dtype=float) for k, v in out.items()}


def _pump_flow_ratio(cdu: Any, running: int) -> float:
    """Flow with ``running`` pumps over the flow with all of them (pump model, same speed)."""
    n_all = len(cdu.pumps)
    if running >= n_all:
        return 1.0
    if running <= 0:
        return 0.0
    dp = CDU_MODELS[cdu.model].design_dp_kpa if cdu.model else DEFAULT_DESIGN_DP_KPA
    h0, kp, ks = cdu_model.pump_curve_from_design(cdu.max_flow_lpm, dp, n_all)
    q = cdu_model.parallel_pump_flow_lpm(np.array([running, n_all], float), PUMP_SPEED, h0, kp, ks)
    return float(q[0] / q[1])


def run(d: _Data, scenario: Scenario | None, rules: Any = None) -> RunResult:
    """One run of the twin over the recording: the baseline (``scenario=None``) or a scenario."""
    site, idx, n, dt = d.site, d.idx, d.n, d.dt_s
    racks = site.racks
    n_r = len(racks)
    rack_pos = {r.name: i for i, r in enumerate(racks)}
    fleet_of_node = site.fleet_of_node
    gp = _gpu_params(d)
    changes = list(scenario.changes) if scenario else []
    g = len(idx.gpu_ids)
    gpu_fleet = np.array(
        [fleet_of_node[nd].name if nd in fleet_of_node else "" for nd in idx.gpu_node]
    )

    # ---- 1. GPU activity and power
    act = np.clip(np.nan_to_num(d.gpu["sm_active"]), 0.0, 1.0)
    p_meas = np.nan_to_num(d.gpu["power_w"])
    act_s = act.copy()
    for c in changes:
        if isinstance(c, ScaleFleet):
            sel = gpu_fleet == c.fleet
            act_s[:, sel] = np.clip(act[:, sel] * c.factor, 0.0, 1.0)
    curve = lambda a: gpu_power.gpu_power_w(a, gp["idle"], gp["limit"], gp["gamma"])  # noqa: E731
    p_s = (
        p_meas + (curve(act_s) - curve(act))
        if any(isinstance(c, ScaleFleet) for c in changes)
        else p_meas.copy()
    )
    plimit = np.fmax.reduce(np.nan_to_num(d.gpu["power_limit_w"], nan=0.0), axis=0)
    plimit = np.where(plimit > 0, plimit, gp["limit"])
    cap = plimit.copy()
    for c in changes:
        if isinstance(c, CapGpuPower):
            sel = np.ones(g, bool)
            if c.fleet is not None:
                sel &= gpu_fleet == c.fleet
            if c.racks:
                sel &= np.isin(idx.gpu_rack, [rack_pos[r] for r in c.racks])
            cap[sel] = np.minimum(cap[sel], c.limit_w)
    p_s = np.clip(p_s, 0.0, cap[None, :])

    # ---- new racks (appended after the site's racks)
    new: list[dict[str, Any]] = []
    for c in changes:
        if isinstance(c, AddRacks):
            spec = NODE_MODELS[c.node_model]
            gspec = GPU_MODELS[spec.gpu]
            fleet_sel = gpu_fleet == c.fleet
            a_path = np.median(act_s[:, fleet_sel], axis=1) if fleet_sel.any() else np.zeros(n)
            p_gpu = gpu_power.gpu_power_w(a_path, gspec.idle_w, gspec.tdp_w, gspec.gamma)
            node_dc = electrical.node_power_w(
                spec.gpus * p_gpu, spec.base_w, spec.gpu_overhead_frac
            )
            node_in = electrical.psu_input_w(node_dc, 17.0, 0.96)  # physics.md §4.2 / §9.5
            like = racks[rack_pos[c.like_rack]]
            for _ in range(c.count):
                new.append(
                    {
                        "name": f"new-{c.node_model.lower()}-{len(new) + 1}",
                        "power_w": c.nodes_per_rack * node_in,
                        "gpu_power_w": p_gpu,
                        "gpus": c.nodes_per_rack * spec.gpus,
                        "gspec": gspec,
                        "liquid": spec.cooling == "liquid",
                        "capture": spec.capture_fraction if spec.cooling == "liquid" else 0.0,
                        "cdu": c.cdu,
                        "like": like,
                    }
                )

    # ---- 2. rack power
    sum_gpu = np.zeros((n, n_r))
    np.add.at(sum_gpu.T, idx.gpu_rack, (p_s - p_meas).T)
    beta = np.array([d.params.get(("rack", r.name, "beta"), 1.0 / 0.96 * 1.05) for r in racks])
    rack_s = d.rack_in + beta[None, :] * sum_gpu
    ratio = np.where(d.rack_in > 0, rack_s / np.where(d.rack_in > 0, d.rack_in, 1.0), 1.0)

    comps: list[ComponentResult] = []
    ts = [d.t0 + timedelta(seconds=k * dt) for k in range(n)]

    def judge(kind: Kind, ids: list[str], unit: str, value: F64, limit: F64) -> None:
        """value, limit: (T, N) or (N,) limits; higher value is worse."""
        lim = np.broadcast_to(limit, value.shape) if np.ndim(limit) == 2 else limit[None, :]
        head = lim - value
        over = head < 0
        first = np.where(over.any(axis=0), np.argmax(over, axis=0), -1)
        minh = np.nanmin(head, axis=0)
        peak = np.nanmax(value, axis=0)
        lim_rep = np.nanmin(np.broadcast_to(lim, value.shape), axis=0)
        for j, sid in enumerate(ids):
            comps.append(
                ComponentResult(
                    kind=kind,
                    id=sid,
                    unit=unit,
                    limit=float(lim_rep[j]),
                    peak=float(peak[j]),
                    min_headroom=float(minh[j]),
                    time_over_s=float(over[:, j].sum() * dt),
                    first_breach=ts[first[j]] if first[j] >= 0 else None,
                )
            )

    # ---- 3. PDU phases (recorded current x the load ratio of the rack they feed)
    pdus = site.pdu_by_name
    rack_of_pdu: dict[str, int] = {}
    for r_i, r in enumerate(racks):
        for p in r.pdus:
            rack_of_pdu.setdefault(p, r_i)
    phase_ids = [pid for pid in d.pdu_ids if "/" in pid]
    ph_pos = {p: i for i, p in enumerate(d.pdu_ids)}
    cur = np.nan_to_num(d.pdu["current_a"][:, [ph_pos[p] for p in phase_ids]])
    ph_rack = np.array([rack_of_pdu.get(p.split("/")[0], -1) for p in phase_ids])
    cur_s = cur * np.where(ph_rack >= 0, ratio[:, np.maximum(ph_rack, 0)], 1.0)
    for c in changes:
        if isinstance(c, FailFeed):
            on = _mask(d, c.at, c.for_s)[:, None]
            r_i = rack_of_pdu.get(c.pdu)
            others = [p for p in racks[r_i].pdus if p != c.pdu] if r_i is not None else []
            for j, pid in enumerate(phase_ids):
                base, _, leg = pid.partition("/")
                if base == c.pdu:
                    for o in others:  # the same phase (or breaker) of the surviving feed
                        k = phase_ids.index(f"{o}/{leg}") if f"{o}/{leg}" in phase_ids else None
                        if k is not None:
                            cur_s[:, k] = np.where(
                                on[:, 0], cur_s[:, k] + cur_s[:, j] / len(others), cur_s[:, k]
                            )
                    cur_s[:, j] = np.where(on[:, 0], 0.0, cur_s[:, j])
    ph_limit = []
    for pid in phase_ids:
        base, _, leg = pid.partition("/")
        p = pdus[base]
        br = next((b for b in p.breakers if b.name == leg), None)
        ph_limit.append(DERATE * (br.rated_current_a if br else p.rated_current_a))
    new_phase_ids, new_phase_cur, new_phase_lim = [], [], []
    for nr in new:
        for p_name in nr["like"].pdus:
            p = pdus[p_name]
            v_ph = float(
                electrical.phase_voltage_v(p.voltage_v, p.wiring if p.phases == 3 else "single")
            )
            legs = 3 if p.phases == 3 else 1
            per = nr["power_w"] / len(nr["like"].pdus) / legs / (v_ph * PF_DEFAULT)
            if p.wiring == "delta" and p.phases == 3:
                per = per * math.sqrt(3.0)  # balanced delta: line current = sqrt(3) x branch
            for k in range(1, legs + 1):
                new_phase_ids.append(f"{nr['name']}-{p.feed.lower()}/L{k}")
                new_phase_cur.append(per)
                new_phase_lim.append(DERATE * p.rated_current_a)
    all_ph = phase_ids + new_phase_ids
    all_cur = np.column_stack([cur_s, *new_phase_cur]) if new_phase_cur else cur_s
    judge("pdu_phase", all_ph, "A", all_cur, np.array(ph_limit + new_phase_lim))

    # ---- rack kW against what its feeds carry together (a failed feed shows on the phases)
    pf = PF_DEFAULT

    def feed_cap_kw(p: Any) -> float:
        amps = DERATE * p.rated_current_a
        return (p.voltage_v if p.phases == 1 else math.sqrt(3.0) * p.voltage_v) * amps * pf / 1e3

    rack_cap = []
    for r in racks:
        feeds: dict[str, float] = {}
        for pn in r.pdus:
            feeds[pdus[pn].feed] = feeds.get(pdus[pn].feed, 0.0) + feed_cap_kw(pdus[pn])
        rack_cap.append(sum(feeds.values()) if feeds else np.inf)
    new_rack_cap = []
    for nr in new:
        feeds = {}
        for pn in nr["like"].pdus:
            feeds[pdus[pn].feed] = feeds.get(pdus[pn].feed, 0.0) + feed_cap_kw(pdus[pn])
        new_rack_cap.append(sum(feeds.values()))
    rack_all = np.column_stack([rack_s, *[nr["power_w"] for nr in new]]) if new else rack_s
    judge(
        "rack",
        [r.name for r in racks] + [nr["name"] for nr in new],
        "kW",
        rack_all / 1e3,
        np.array(rack_cap + new_rack_cap),
    )

    # ---- 4. CDUs
    cdus = site.cdus
    n_c = len(cdus)
    cdu_pos = {c.name: i for i, c in enumerate(cdus)}
    supply = d.cdu["supply_temp_c"]
    fw = d.cdu["fw_supply_temp_c"]
    flow = np.nan_to_num(d.cdu["flow_lpm"])
    heat = np.nan_to_num(d.cdu["heat_kw"])
    setpoint = np.array([c.supply_setpoint_c for c in cdus], float)
    approach = np.empty(n_c)
    for i, c in enumerate(cdus):
        fw_limited = supply[:, i] > setpoint[i] + 0.3
        approach[i] = (
            float(np.nanmedian(supply[fw_limited, i] - fw[fw_limited, i]))
            if fw_limited.sum() > 10
            else float(c.approach_k)
        )
    fw_delta = np.zeros(n_c)
    setpoint_s = setpoint.copy()
    for c in changes:
        if isinstance(c, FacilityWater):
            for name in c.cdus or [x.name for x in cdus]:
                fw_delta[cdu_pos[name]] += c.delta_k
        elif isinstance(c, CduSetpoint):
            setpoint_s[cdu_pos[c.cdu]] = c.supply_setpoint_c
    model_b = np.maximum(setpoint[None, :], fw + approach[None, :])
    model_s = np.maximum(setpoint_s[None, :], fw + fw_delta[None, :] + approach[None, :])
    supply_s = np.where(np.isfinite(model_b), supply + (model_s - model_b), supply)
    # pumps: which ran in the recording (speed > 5 %), less the ones the scenario fails
    flow_ratio_s = np.ones((n, n_c))
    running = np.zeros((n, n_c))
    running_s = np.zeros((n, n_c))
    for i, c in enumerate(cdus):
        on = np.nan_to_num(d.pump_speed[c.name]) > 5.0  # (T, pumps)
        on_s = on.copy()
        for ch in changes:
            if isinstance(ch, FailPump) and ch.cdu == c.name:
                on_s[:, c.pumps.index(ch.pump)] &= ~_mask(d, ch.at, ch.for_s)
        now, after = on.sum(axis=1), on_s.sum(axis=1)
        running[:, i], running_s[:, i] = now, after
        base_ratio = np.array([_pump_flow_ratio(c, k) for k in range(len(c.pumps) + 1)])
        flow_ratio_s[:, i] = np.where(
            base_ratio[now] > 0, base_ratio[after] / np.maximum(base_ratio[now], 1e-12), 0.0
        )
    flow_s = flow * flow_ratio_s
    # capture per rack; heat change from rack power
    capture = np.array(
        [
            d.params.get(("rack", r.name, "capture_fraction"), idx.rack_prior[i])
            for i, r in enumerate(racks)
        ]
    )
    capture = np.where(idx.rack_cdu >= 0, capture, 0.0)
    heat_s = heat.copy()
    d_heat = (rack_s - d.rack_in) * capture[None, :] / 1e3
    for r_i in range(n_r):
        if idx.rack_cdu[r_i] >= 0:
            heat_s[:, idx.rack_cdu[r_i]] += d_heat[:, r_i]
    for nr in new:
        if nr["cdu"] is not None:
            heat_s[:, cdu_pos[nr["cdu"]]] += nr["capture"] * nr["power_w"] / 1e3
    uncooled = np.zeros((n, n_r), bool)
    reasons_extra: list[str] = []
    for c in changes:
        if isinstance(c, FailCdu):
            on = _mask(d, c.at, c.for_s)
            i = cdu_pos[c.cdu]
            loop = cdus[i].loop
            peers = [j for j, x in enumerate(cdus) if loop and x.loop == loop and j != i]
            moved = heat_s[:, i].copy()
            if peers:
                caps = np.array([cdus[j].capacity_kw for j in peers], float)
                for j, share in zip(peers, caps / caps.sum(), strict=True):
                    heat_s[:, j] += np.where(on, moved * share, 0.0)
                reasons_extra.append(
                    f"{c.cdu} failed: its racks move to {', '.join(cdus[j].name for j in peers)}"
                    f" on loop {loop}"
                )
            else:
                for r_i in np.flatnonzero(idx.rack_cdu == i):
                    uncooled[:, r_i] |= on
                reasons_extra.append(
                    f"{c.cdu} failed and shares no loop: its racks lose their coolant flow"
                )
            heat_s[:, i] = np.where(on, 0.0, heat_s[:, i])
            flow_s[:, i] = np.where(on, 0.0, flow_s[:, i])
            flow_ratio_s[:, i] = np.where(on, 0.0, flow_ratio_s[:, i])
    rated = np.array([c.capacity_kw for c in cdus], float)
    max_flow = np.array([c.max_flow_lpm for c in cdus], float)
    cap_s = rated[None, :] * np.minimum(1.0, flow_s / max_flow[None, :])
    judge("cdu_heat", [c.name for c in cdus], "kW", heat_s, cap_s)
    ret_s = np.empty_like(heat_s)
    need = np.empty_like(heat_s)
    ret_limit = np.array([c.return_limit_c for c in cdus], float)
    ret_meas = d.cdu["return_temp_c"]

    def ret_model(sup: F64, q: F64, v: F64, fluid: str) -> F64:
        r = coolant.return_temp_c(sup, q, np.maximum(v, 1e-3), fluid)
        return np.minimum(r, sup + 40.0)  # a stagnant loop

    for i, c in enumerate(cdus):
        # recorded return plus the model's change (the lag and meter bias cancel)
        change = ret_model(supply_s[:, i], heat_s[:, i], flow_s[:, i], c.coolant) - ret_model(
            supply[:, i], heat[:, i], flow[:, i], c.coolant
        )
        ret_s[:, i] = np.where(np.isfinite(ret_meas[:, i]), ret_meas[:, i], supply[:, i]) + change
        rise = np.maximum(ret_limit[i] - supply_s[:, i], 0.1)
        need[:, i] = coolant.flow_for_heat_lpm(heat_s[:, i], rise, c.coolant, supply_s[:, i])
    judge("cdu_flow", [c.name for c in cdus], "L/min", need, flow_s)
    judge("loop", [c.name for c in cdus], "°C", ret_s, ret_limit)

    # ---- 5. GPU temperatures (model over baseline and scenario; the scenario's change added)
    flow_ref = np.array(
        [d.params.get(("cdu", c.name, "flow_ref_lpm"), np.nan) for c in cdus], float
    )
    flow_ref = np.where(np.isfinite(flow_ref), flow_ref, np.nanmedian(flow, axis=0) if n_c else 1.0)
    liquid = idx.gpu_cdu >= 0
    inlet = np.nan_to_num(d.node["inlet_temp_c"], nan=25.0)
    node_pos = {nd.name: i for i, nd in enumerate(site.nodes)}
    gpu_node_col = np.array([node_pos[nd] for nd in idx.gpu_node])
    temp_meas = d.gpu["temp_c"]
    t_out = np.empty((n, g))
    throttled_s = 0.0
    for lo in range(0, g, GPU_CHUNK):
        sl = slice(lo, min(lo + GPU_CHUNK, g))
        liq = liquid[sl]
        cdu_i = np.maximum(idx.gpu_cdu[sl], 0)
        ref_b = np.where(liq[None, :], supply[:, cdu_i], inlet[:, gpu_node_col[sl]])
        ref_s = np.where(liq[None, :], supply_s[:, cdu_i], inlet[:, gpu_node_col[sl]])
        fr_b = np.where(liq[None, :], (flow / flow_ref[None, :])[:, cdu_i], 1.0)
        fr_s = np.where(liq[None, :], (flow_s / flow_ref[None, :])[:, cdu_i], 1.0)
        unc = uncooled[:, idx.gpu_rack[sl]] & liq[None, :]
        fr_s = np.where(unc, 0.0, fr_s)
        r_b = gpu_thermal.r_at_flow_k_per_w(gp["r"][sl][None, :], fr_b)
        r_s = gpu_thermal.r_at_flow_k_per_w(gp["r"][sl][None, :], fr_s)
        c_j, off, tmax = gp["c"][sl], gp["off"][sl], gp["tmax"][sl]
        p_b = p_meas[:, sl]
        p_sc = p_s[:, sl].copy()
        t0 = np.nan_to_num(temp_meas[0, sl], nan=40.0)
        tb = np.empty((n, sl.stop - sl.start))
        tsc = np.empty_like(tb)
        tb[0] = t0
        tsc[0] = t0
        xb, xs = t0.copy(), t0.copy()
        for k in range(1, n):
            xb = gpu_thermal.rc_step(xb, ref_b[k - 1] + off, p_b[k - 1], r_b[k - 1], c_j, dt)
            # the driver's thermal slowdown: power held to what keeps the GPU at tmax
            pred = np.where(np.isnan(temp_meas[k - 1, sl]), xb, temp_meas[k - 1, sl]) + (xs - xb)
            hot = pred > tmax
            if hot.any():
                p_hold = (tmax - (ref_s[k - 1] + off)) / r_s[k - 1]
                p_sc[k - 1] = np.where(
                    hot, np.maximum(np.minimum(p_sc[k - 1], p_hold), 0.0), p_sc[k - 1]
                )
                throttled_s += float(hot.sum()) * dt
            xs = gpu_thermal.rc_step(xs, ref_s[k - 1] + off, p_sc[k - 1], r_s[k - 1], c_j, dt)
            tb[k], tsc[k] = xb, xs
        t_out[:, sl] = np.nan_to_num(temp_meas[:, sl], nan=0.0) + (tsc - tb)
    judge("gpu", idx.gpu_ids, "°C", t_out, gp["tmax"])
    for nr in new:  # new GPUs: the catalog RC model at steady state over their loop's supply
        gs = nr["gspec"]
        if nr["liquid"] and nr["cdu"] is not None:
            i = cdu_pos[nr["cdu"]]
            ref = supply_s[:, i]
            r_new = gpu_thermal.r_at_flow_k_per_w(gs.r_liquid_k_per_w, flow_s[:, i] / flow_ref[i])
        else:
            ref = np.nanmean(inlet, axis=1)
            r_new = np.full(n, gs.r_air_k_per_w)
        t_new = ref + r_new * nr["gpu_power_w"]
        judge("gpu", [f"{nr['name']}:*"], "°C", t_new[:, None], np.array([gs.max_operating_temp_c]))

    # ---- 6. links
    if site.links:
        names = [lk.name for lk in site.links]
        busy = np.maximum(d.link["tx_bps"], d.link["rx_bps"]) / 1e9
        node_fleet_ratio = {}
        for f in site.fleets:
            sel = gpu_fleet == f.name
            if sel.any():
                base_a = act[:, sel].mean(axis=1)
                node_fleet_ratio[f.name] = np.where(
                    base_a > 0, act_s[:, sel].mean(axis=1) / np.maximum(base_a, 1e-9), 1.0
                )
        busy_s = busy.copy()
        for j, lk in enumerate(site.links):
            for end in (lk.a, lk.b):
                fl = fleet_of_node.get(end)
                if fl is not None and fl.name in node_fleet_ratio:
                    busy_s[:, j] = busy[:, j] * node_fleet_ratio[fl.name]
        cap_l = np.array([lk.capacity_gbps for lk in site.links], float)
        cap_t = np.broadcast_to(cap_l, busy_s.shape).copy()
        for c in changes:
            if isinstance(c, FailLink):
                on = _mask(d, c.at, c.for_s)
                j = names.index(c.link)
                lk = site.links[j]
                peers = [
                    k
                    for k, o in enumerate(site.links)
                    if k != j
                    and (o.a == lk.a or o.b == lk.b or o.a == lk.b or o.b == lk.a)
                    and {o.a, o.b} != {lk.a, lk.b}
                    and _same_tier(site, o, lk)
                ]
                moved = busy_s[:, j].copy()
                for k in peers:
                    busy_s[:, k] += np.where(on, moved / len(peers), 0.0)
                busy_s[:, j] = np.where(on, 0.0, busy_s[:, j])
                if not peers:
                    reasons_extra.append(f"link {c.link} failed with no parallel path")
                    busy_s[:, j] = np.where(on, moved, busy_s[:, j])
                    cap_t[:, j] = np.where(on, 0.0, cap_t[:, j])
        judge("link", names, "Gb/s", busy_s, cap_t)

    # ---- verdict, summaries
    rack_total = rack_all.sum(axis=1)
    it_kwh = float(rack_total.sum() * dt / 3.6e6)
    liquid_kwh = float(heat_s.sum() * dt / 3600.0)
    alerts = _alerts(
        rules,
        d,
        ts,
        t_out,
        gp["tmax"],
        idx.gpu_ids,
        all_ph,
        all_cur,
        np.array(ph_limit + new_phase_lim),
        cdus,
        heat_s,
        cap_s,
        running_s,
    )
    kinds, worst, verdict, reasons = _summarize(comps, scenario is None)
    reasons = reasons_extra + reasons
    if throttled_s > 0:
        reasons.append(
            f"GPUs throttle: {throttled_s / 3600:.1f} GPU-hours at max operating temperature"
        )
    step = max(1, n // 600)
    series = {
        "t_h": [k * dt / 3600 for k in range(0, n, step)],
        "it_power_kw": (rack_total[::step] / 1e3).round(2).tolist(),
        "liquid_heat_kw": heat_s.sum(axis=1)[::step].round(2).tolist(),
        "cdu_capacity_kw": cap_s.sum(axis=1)[::step].round(2).tolist(),
        "gpu_temp_max_c": np.nanmax(t_out, axis=1)[::step].round(2).tolist(),
        "cdu_util_max": np.nanmax(heat_s / np.maximum(cap_s, 1e-9), axis=1)[::step]
        .round(4)
        .tolist(),
        "phase_util_max": np.nanmax(all_cur / np.array(ph_limit + new_phase_lim)[None, :], axis=1)[
            ::step
        ]
        .round(4)
        .tolist(),
    }
    cdu_means = {
        c.name: {
            "flow_lpm": float(np.mean(flow_s[:, i])),
            "supply_c": float(np.mean(supply_s[:, i])),
            "return_c": float(np.mean(ret_s[:, i])),
            "heat_kw": float(np.mean(heat_s[:, i])),
            "capacity_kw": float(np.mean(cap_s[:, i])),
            "peak_utilization": float(np.max(heat_s[:, i] / np.maximum(cap_s[:, i], 1e-9))),
        }
        for i, c in enumerate(cdus)
    }
    with np.errstate(all="ignore"):
        gpu_means = dict(zip(idx.gpu_ids, np.nanmean(t_out, axis=0).round(4).tolist(), strict=True))
    return RunResult(
        cdus=cdu_means,
        gpu_mean_temp_c=gpu_means,
        name=scenario.name if scenario else "baseline",
        description=scenario.description if scenario else "the recording as it happened",
        verdict="baseline" if scenario is None else verdict,
        reasons=reasons,
        kinds=kinds,
        worst=worst,
        alerts=alerts,
        it_energy_kwh=round(it_kwh, 3),
        liquid_heat_kwh=round(liquid_kwh, 3),
        throttled_gpu_s=throttled_s,
        series=series,
    )


def _same_tier(site: Site, a: Any, b: Any) -> bool:
    """Two links connect the same tiers (node-leaf, leaf-spine)."""
    roles = {s.name: s.role for s in site.switches}

    def tiers(lk: Any) -> tuple[str, str]:
        return tuple(sorted(roles.get(x, "node") for x in (lk.a, lk.b)))  # type: ignore[return-value]

    return tiers(a) == tiers(b)


def _summarize(
    comps: list[ComponentResult], baseline: bool
) -> tuple[list[KindSummary], list[ComponentResult], str, list[str]]:
    kinds: list[KindSummary] = []
    reasons: list[str] = []
    risky = False
    by_kind: dict[str, list[ComponentResult]] = {}
    for c in comps:
        by_kind.setdefault(c.kind, []).append(c)
    for kind, cs in by_kind.items():
        rel = [c.min_headroom / c.limit if c.limit else c.min_headroom for c in cs]
        w = cs[int(np.argmin(rel))]
        breaching = [c for c in cs if c.time_over_s > 0]
        firsts = [c.first_breach for c in breaching if c.first_breach]
        kinds.append(
            KindSummary(
                kind=kind,  # type: ignore[arg-type]
                unit=w.unit,
                components=len(cs),
                worst_id=w.id,
                worst_min_headroom=w.min_headroom,
                breaching=len(breaching),
                time_over_s=max((c.time_over_s for c in breaching), default=0.0),
                component_over_s=sum(c.time_over_s for c in breaching),
                first_breach=min(firsts) if firsts else None,
            )
        )
        if breaching:
            first = min(breaching, key=lambda c: c.first_breach or datetime.max)
            reasons.append(
                f"{len(breaching)} {kind} over the limit, first {first.id} at "
                f"{first.first_breach:%Y-%m-%d %H:%M} UTC (peak {first.peak:.1f} {first.unit}"
                f" against {first.limit:.1f})"
            )
        else:
            near = (
                w.min_headroom < RISK_GPU_K
                if kind == "gpu"
                else w.min_headroom < RISK_FRACTION * w.limit
            )
            if near:
                risky = True
                reasons.append(
                    f"{kind} {w.id} comes within {w.min_headroom:.1f} {w.unit} of its limit"
                    f" {w.limit:.1f}"
                )
    order = sorted(comps, key=lambda c: c.min_headroom / c.limit if c.limit else c.min_headroom)
    worst = order[:15]
    if any(k.breaching for k in kinds):
        verdict = "does not fit"
    elif risky:
        verdict = "fits with risks"
    else:
        verdict = "fits"
        reasons.append("every component keeps its headroom over the whole recording")
    return kinds, worst, verdict, reasons


def _alerts(
    rules, d, ts, t_gpu, tmax, gpu_ids, ph_ids, ph_cur, ph_lim, cdus, heat, cap, running
) -> list[dict[str, Any]]:
    """The notifications the rule file would have sent over this run (evaluated each minute).

    An entity whose value never meets any rule's condition on its metric can neither fire nor
    need a resolve, so only the others are handed to the engine: at 880 GPUs that is a
    handful of series instead of 1.3 M observations.
    """
    if rules is None:
        return []
    from twin.alerts import AlertEngine, Observation, Topology
    from twin.alerts import metrics as am
    from twin.alerts.rules import OPS

    engine = AlertEngine(rules, Topology.from_site(d.site), None, clock=lambda: ts[-1])
    step = max(1, round(60.0 / d.dt_s))
    rows = np.arange(0, d.n, step)
    n_ph = len(ph_lim)
    with np.errstate(divide="ignore", invalid="ignore"):
        free = np.where(cap > 0, (cap - heat) / cap, np.nan)
    # (metric, entity kind, ids, values at the evaluated rows)
    series = [
        (am.HEADROOM_GPU_K_TO_SLOWDOWN, "gpu", gpu_ids, (tmax[None, :] - t_gpu)[rows]),
        (
            am.HEADROOM_PDU_PHASE_A_TO_LIMIT,
            "pdu_phase",
            ph_ids[:n_ph],
            (ph_lim[None, :] - ph_cur[:, :n_ph])[rows],
        ),
        (am.HEADROOM_CDU_FREE_FRACTION, "cdu", [c.name for c in cdus], free[rows]),
        (am.CDU_PUMPS_RUNNING, "cdu", [c.name for c in cdus], running[rows].astype(float)),
    ]
    index = rules.index()
    watched = []
    for metric, kind, ids, vals in series:
        conds = [(r.op, r.value) for r in index.get((metric, kind), ()) if r.op is not None]
        if not conds:
            continue
        with np.errstate(invalid="ignore"):
            hit = np.zeros(vals.shape[1], bool)
            for op, value in conds:
                hit |= OPS[op](vals, value).any(axis=0)
        watched += [(metric, kind, ids[j], vals[:, j]) for j in np.flatnonzero(hit)]
    sent: list[dict[str, Any]] = []
    for i, k in enumerate(rows):
        now = ts[k]
        obs = [
            Observation(metric=m, entity_kind=kind, entity_id=sid, value=float(v[i]), ts=now)
            for m, kind, sid, v in watched
            if np.isfinite(v[i])
        ]
        for note in engine.evaluate(obs, now=now):
            sent.append(
                {
                    "at": now.isoformat(),
                    "status": note.status,
                    "rule": note.rule,
                    "severity": note.severity,
                    "group": f"{note.group.kind} {note.group.id}",
                    "summary": note.summary,
                }
            )
    return sent
