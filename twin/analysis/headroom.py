"""Headroom: how far each limit is, now and over a horizon, through the calibrated chain.

For every GPU (K to its max operating temperature, where thermal slowdown starts), PDU phase
and branch breaker (A to the derated limit), rack (kW to what one feed can carry), CDU (kW of
capacity at the flow it has, L/min of flow over what the heat needs at the return limit), loop
(K to the return-temperature limit) and link (Gb/s), this module computes the headroom now,
its minimum over the horizon and the time until it reaches zero, at p50 and p90 of the load.

The load path of each rack comes from the forecast (``twin.forecast``) when it can be made;
otherwise from persistence, with the 90th percentile of the last hour's power over its present
value as the p90 path (``basis`` says which). The physics then carries it, device by device:

- GPU: power = present power plus the calibrated curve's change for the present activity x
  the rack's load ratio (``twin.chain.propagate.gpu_power_at_ratio_w``), capped at the
  enforced limit;
  temperature = the present temperature plus the calibrated RC model's change
  (``twin.chain.gpu_temperatures``, with the thermal controller) over the present coolant
  supply (or inlet air), with the GPU's fitted R, C and coolant offset (catalog R and tau where
  no usable fit exists yet); the model's level error now is taken out; the path is
  ``twin.chain.breach.gpu_temp_path``, whose closed form a replay takes under persistence.
- PDU phase / breaker: present current x the load ratio of the racks it feeds, plus the
  recent linear trend of the current that the rack load does not explain (load creeping onto
  a phase); the p90 path adds 1.28 standard errors of that slope.
- Rack: present input power x load ratio, against what its feeds carry together at 80 % of
  their rating (NEC 210.20(A)). Whether one feed could carry the rack alone is a what-if
  (``fail_feed``), seen on the surviving feed's phases.
- CDU: heat = the measured heat plus the fitted capture fraction x the change of rack power
  along the path (``twin.chain.propagate.cdu_rack_heat_kw``, as a what-if moves it);
  capacity scaled by present flow over rated flow (``models.cdu.available_capacity_kw``); flow
  needed to carry the heat with the return at its limit (``models.coolant.flow_for_heat_lpm``).
- Loop: return temperature = the measured return plus the change of supply + heat /
  (rho V c_p) at the present flow from the heat now to the path's
  (``twin.chain.propagate.moved_return_c``, the what-if's).
- Link: the busier direction x the load ratio of its node's rack (site-wide ratio for switch
  links), against capacity.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from twin.analysis.coverage import newest_sample
from twin.chain import phase_table, rack_capacity_kw, resolve
from twin.chain import propagate as chain
from twin.chain.breach import (
    NOW_WINDOW_S,
    PERSISTENCE_WINDOW_S,
    Z90,
    breach_in_s,
    gpu_temp_path,
    last_minute_bias_k,
    p90_ratio,
)
from twin.chain.params import history_capped_r
from twin.chain.trend import TREND_WINDOW_S, unexplained_trend
from twin.forecast import ForecastCache, rack_ratio_paths
from twin.site import Site
from twin.site.index import gpu_flow_ratio, gpu_reference, index_site
from twin.store import Store
from twin.store.windows import Window, WindowReader, last_valid

log = logging.getLogger(__name__)

Kind = Literal["gpu", "pdu_phase", "rack", "cdu", "loop", "link"]


class HeadroomRow(BaseModel):
    """Headroom of one limit of one entity. ``headroom_*`` = limit - value, in ``unit``."""

    kind: Kind
    id: str
    quantity: str
    unit: str
    limit: float
    value_now: float | None
    headroom_now: float | None
    headroom_min_p50: float | None
    headroom_min_p90: float | None
    breach_in_s_p50: float | None  # None: no breach within the horizon; 0: breached now
    breach_in_s_p90: float | None
    rack: str | None = None
    cdu: str | None = None
    basis: str = ""


class HeadroomReport(BaseModel):
    computed_at: datetime
    data_until: datetime
    horizon_s: float
    step_s: float
    load_basis: str
    rows: list[HeadroomRow]
    problems: list[str]


def _f(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _nanmin0(a: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        out = np.fmin.reduce(a, axis=0)
    return out


def _mean(a: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(a, axis=0)


def _latest_params(store: Store) -> dict[tuple[str, str, str], float]:
    """(kind, id, param) -> value of the newest run's usable parameters (the store reads them)."""
    return store.latest_calibration_params()


def _forecast_ratio_paths(
    store: Store,
    site: Site,
    now: datetime,
    horizon_s: float,
    step_s: float,
    it_now: np.ndarray,
    cache: ForecastCache | None,
) -> tuple[np.ndarray, np.ndarray, str] | str:
    """Rack load ratio paths (p50, p90), each (n_steps + 1, n_racks), from twin.forecast, over
    the racks' present IT load ``it_now`` (the load the rows multiply them with), or why there
    are none."""
    try:
        return rack_ratio_paths(store, site, now, horizon_s, step_s, present_w=it_now, cache=cache)
    except ValueError as e:  # no forecast (too little history, still being made): persistence
        log.info("headroom: no load forecast (%s); using persistence", e)
        return str(e)


@dataclass
class _Pass:
    """What the stages of one headroom computation share: windows, rack loads, ratio paths."""

    store: Store
    site: Site
    idx: Any
    n: int  # path samples, the first is "now"
    step_s: float
    basis: str
    r50: np.ndarray  # (n, racks) load ratio paths
    r90: np.ndarray
    gpu: Window
    cdu: Window
    node: Window
    pdu_hist: Window  # the hour (and trend window) as minute means
    pdu_now: Window  # the last minute's samples
    link: Window
    rack_now: np.ndarray  # (racks,) PDU input power now, NaN where a feed is silent [W]
    rack_w_now: np.ndarray  # its PDU input, else its nodes' IT load, else 0 [W]
    it_now: np.ndarray  # (racks,) IT load now [W]
    it_hist: np.ndarray  # (T, racks) IT load over the hour [W]
    cp: Any  # the chain's parameters (twin.chain.resolve)
    rows: list[HeadroomRow] = field(default_factory=list)

    @property
    def racks(self) -> list[Any]:
        return self.site.racks

    def emit(
        self,
        kind: Kind,
        ids: list[str],
        quantity: str,
        unit: str,
        limit: np.ndarray,
        now_v: np.ndarray,
        path50: np.ndarray,
        path90: np.ndarray,
        *,
        higher_is_worse: bool = True,
        rack: list[str | None] | None = None,
        cdu_of: list[str | None] | None = None,
        basis_of: list[str] | None = None,
    ) -> None:
        sign = 1.0 if higher_is_worse else -1.0
        h_now = sign * (limit - now_v)
        h50 = sign * (limit[None, :] - path50)
        h90 = sign * (limit[None, :] - path90)
        b50, b90 = breach_in_s(h50, self.step_s), breach_in_s(h90, self.step_s)
        min50, min90 = _nanmin0(h50), _nanmin0(h90)
        for i, sid in enumerate(ids):
            if not math.isfinite(now_v[i]):
                continue
            self.rows.append(
                HeadroomRow.model_construct(  # typed here; 140,000 rows at 100,000 GPUs
                    kind=kind,
                    id=sid,
                    quantity=quantity,
                    unit=unit,
                    limit=float(limit[i]),
                    value_now=_f(now_v[i]),
                    headroom_now=_f(h_now[i]),
                    headroom_min_p50=_f(min50[i]),
                    headroom_min_p90=_f(min90[i]),
                    breach_in_s_p50=_f(b50[i]),
                    breach_in_s_p90=_f(b90[i]),
                    rack=rack[i] if rack else None,
                    cdu=cdu_of[i] if cdu_of else None,
                    basis=(basis_of[i] if basis_of else self.basis),
                )
            )


def compute_headroom(
    store: Store,
    site: Site,
    *,
    now: datetime | None = None,
    horizon_s: float = 3600.0,
    step_s: float = 60.0,
    use_forecast: bool = True,
    windows: WindowReader | None = None,
    forecasts: ForecastCache | None = None,
) -> HeadroomReport:
    """Headroom of every limit of ``site`` from the store's newest data and calibration.

    ``windows``: the pass's reader, when other stages read the same windows (detection).
    ``forecasts``: the load forecast kept between passes (the detection loop's), made once
    per forecast step instead of every pass."""
    if not (horizon_s > 0 and step_s > 0 and horizon_s >= step_s):
        raise ValueError(f"horizon_s ({horizon_s}) and step_s ({step_s}) must be > 0, h >= step")
    problems: list[str] = []
    if now is None:  # the newest sample of any kind: a site may lack a kind, GPUs included
        newest = newest_sample(store)
        if newest is None:
            raise ValueError("the store holds no telemetry: nothing to compute headroom from")
        now = newest
    now = now.astimezone(UTC)
    reader = windows if windows is not None else WindowReader(store)
    p = _load(store, reader, site, now, horizon_s, step_s, use_forecast, problems, forecasts)
    for stage in (_racks_rows, _phases_rows, _gpus_rows, _cdus_rows, _links_rows):
        stage(p)
    rows, basis = p.rows, p.basis
    return HeadroomReport(
        computed_at=datetime.now(UTC),
        data_until=now,
        horizon_s=horizon_s,
        step_s=step_s,
        load_basis=basis,
        rows=rows,
        problems=problems,
    )


def _load(
    store: Store,
    reader: WindowReader,
    site: Site,
    now: datetime,
    horizon_s: float,
    step_s: float,
    use_forecast: bool,
    problems: list[str],
    forecasts: ForecastCache | None = None,
) -> _Pass:
    """The windows a headroom pass reads, the racks' loads now and their load-ratio paths."""
    idx = index_site(site)
    n = round(horizon_s / step_s) + 1  # path samples, the first is "now"
    end = now + timedelta(seconds=1)
    w_start = end - timedelta(seconds=NOW_WINDOW_S)
    gpu = reader.load(
        "gpu",
        w_start,
        end,
        ids=idx.gpu_ids,
        quantities=["power_w", "temp_c", "power_limit_w", "sm_active", "util_pct"],
    )
    cdu = reader.load(
        "cdu",
        w_start,
        end,
        ids=idx.cdu_names,
        quantities=["supply_temp_c", "return_temp_c", "flow_lpm", "heat_kw"],
    )
    node = reader.load("node", w_start, end, quantities=["inlet_temp_c", "power_w"])
    # the hour (and the trend's window) as minute means, the minutes ending at the newest
    # second: what a replay's forecast takes at each of its minutes (twin.chain.breach)
    hist_s = max(TREND_WINDOW_S, PERSISTENCE_WINDOW_S)
    hist_start, n_min = end - timedelta(seconds=hist_s), round(hist_s / 60.0)
    pdu_ids = [pu.name for pu in site.pdus] + phase_table(site).ids
    pdu_hist = reader.minute_means("pdu", pdu_ids, hist_start, n_min, ["power_w", "current_a"])
    # "now" is the mean of the last minute's samples, as for every kind (the hour's grid keeps
    # one sample per PDU and minute); the hot spots read its inlet air from the same window
    pdu_now = reader.load(
        "pdu", w_start, end, quantities=["power_w", "current_a", "power_factor", "inlet_temp_c"]
    )
    link = reader.load("link", w_start, end, quantities=["tx_bps", "rx_bps"])

    # ---- rack input power: sum of the rack's PDU units (feeds)
    racks = site.racks
    r_pdus = [r.pdus for r in racks]
    rack_hist = chain.rack_sum_w(pdu_hist.values["power_w"], pdu_hist.ids, r_pdus)
    # "now" is the last minute: a PDU that stopped reporting has no present power (its hour
    # of history still shapes the persistence p90 and the phase trend); a rack with a feed
    # that has no power now has no load now (the reporting feeds' sum is not its load)
    feed_now = _mean(pdu_now.values["power_w"])[None, :]
    rack_now = chain.rack_sum_w(feed_now, pdu_now.ids, r_pdus, every_member=True)[0]
    # the IT load of each rack (sum of its nodes' input power), the load the forecast and the
    # ratio paths describe, where every node reports in the last minute; else its PDUs'
    node_ids = [nd.name for nd in site.nodes]
    node_hist = reader.minute_means("node", node_ids, hist_start, n_min, ["power_w"])
    r_nodes = [[nd.name for nd in r.nodes] for r in racks]
    nodes_w = chain.rack_sum_w(node_hist.values["power_w"], node_ids, r_nodes, every_member=True)
    it_hist = np.where(np.isfinite(nodes_w[-1])[None, :], nodes_w, rack_hist)
    it_now = it_hist[-1]
    # a rack's load now for weighting and heat: its PDU input, else its nodes' IT load, else 0
    rack_w_now = np.nan_to_num(np.where(np.isfinite(rack_now), rack_now, it_now), nan=0.0)
    if np.isnan(rack_now).any():
        missing = [racks[i].name for i in np.flatnonzero(np.isnan(rack_now))]
        problems.append(
            f"no recent PDU power on every feed of racks {missing}: their kW headroom is unknown"
        )

    # ---- load ratio paths per rack
    paths = (
        _forecast_ratio_paths(store, site, now, horizon_s, step_s, it_now, forecasts)
        if use_forecast
        else None
    )
    if isinstance(paths, tuple) and paths[0].shape == (n, len(racks)):
        r50, r90, basis = paths
    else:
        # p50: the present load; p90: the last hour's 90th percentile over the present
        r90_now = p90_ratio(it_hist, pdu_hist.step_s, last=True)
        r50, r90 = np.ones((n, len(racks))), np.tile(r90_now, (n, 1))
        # the basis says why there is no forecast, where one was asked for
        basis = f"persistence ({paths})" if isinstance(paths, str) else "persistence"
    cp = resolve(site, idx, _latest_params(store))
    return _Pass(
        store, site, idx, n, step_s, basis, r50, r90, gpu, cdu, node, pdu_hist, pdu_now, link,
        rack_now, rack_w_now, it_now, it_hist, cp,
    )  # fmt: skip


def _racks_rows(p: _Pass) -> None:
    """Racks: kW against what their feeds carry together (twin.chain.limits)."""
    pf_now = _mean(p.pdu_now.values["power_factor"])
    pf = {pdu: float(v) for pdu, v in zip(p.pdu_now.ids, pf_now, strict=True) if "/" not in pdu}
    names = [r.name for r in p.racks]
    kw_now = p.rack_now / 1000.0
    cap_kw = rack_capacity_kw(p.site, p.racks, pf)
    kw50, kw90 = kw_now[None, :] * p.r50, kw_now[None, :] * p.r90
    cdu_of = [r.cdu for r in p.racks]
    p.emit("rack", names, "power_kw", "kW", cap_kw, kw_now, kw50, kw90, rack=names, cdu_of=cdu_of)


def _phases_rows(p: _Pass) -> None:
    """PDU phases and breakers: current x the load ratio of the racks they feed (weighted by
    their load now), plus the trend of the current that the load does not explain."""
    table = phase_table(p.site)
    if not table.ids:
        return
    cur_hist = p.pdu_hist.select(table.ids).values["current_a"]
    cur_now = _mean(p.pdu_now.select(table.ids).values["current_a"])
    ratio50 = chain.phase_load_ratio(p.r50, table.racks, p.rack_w_now)
    ratio90 = chain.phase_load_ratio(p.r90, table.racks, p.rack_w_now)
    # the load the trend is explained by: the IT load of the racks it feeds, over its present
    load_hist = np.ones((cur_hist.shape[0], len(table.ids)))
    for j, fed in enumerate(table.racks):
        total_now = np.nansum(p.it_now[fed])
        if fed and total_now > 0:
            load_hist[:, j] = np.nansum(p.it_hist[:, fed], axis=1) / total_now
    slope, slope_se = unexplained_trend(cur_hist, load_hist, p.pdu_hist.step_s)
    t = np.arange(p.n)[:, None] * p.step_s
    path50 = cur_now[None, :] * ratio50 + slope[None, :] * t
    path90 = cur_now[None, :] * ratio90 + (slope + Z90 * slope_se)[None, :] * t
    p.emit(
        "pdu_phase",
        table.ids,
        "current_a",
        "A",
        table.limit_a,
        cur_now,
        path50,
        path90,
        rack=[p.racks[f[0]].name if len(f) == 1 else None for f in table.racks],
        # a significant trend was applied
        basis_of=[p.basis + (", trend" if s != 0 else "") for s in np.nan_to_num(slope)],
    )


def _gpus_rows(p: _Pass) -> None:
    """GPUs: temperature to the max operating temperature, through the chain: power from
    activity on the calibrated curve, the RC model at the loop's flow, the thermal controller."""
    idx, gp, gpu = p.idx, p.cp.gpu, p.gpu
    power_now = _mean(gpu.values["power_w"])
    temp_now = last_valid(gpu.values["temp_c"])
    act_now = _mean(gpu.values["sm_active"])
    no_sm = ~np.isfinite(act_now)
    act_now[no_sm] = _mean(gpu.values["util_pct"])[no_sm] / 100.0
    with np.errstate(all="ignore"):
        plimit = np.fmax.reduce(gpu.values["power_limit_w"], axis=0)
    ref_grid = gpu_reference(idx, p.cdu, p.node, p.pdu_now)
    ref_now = last_valid(ref_grid)
    # a fitted R is capped by the GPU's fit history (twin.chain.params.history_capped_r): a fit
    # learned while a cold plate was fouled must not forecast a slowdown after it healed
    hist = p.store.calibration_param_medians("gpu", "r_k_per_w")
    fitted = np.array([t == "calibrated" for t in gp.thermal_source])
    r_hist = np.array([hist.get(g, np.nan) for g in idx.gpu_ids], dtype=float)
    r_gpu = np.asarray(gp.r_k_per_w, float)
    r_fit = np.where(fitted, history_capped_r(r_gpu, r_hist), gp.r_k_per_w)
    flow_now = _mean(p.cdu.values["flow_lpm"])
    r_k = chain.gpu_r_k_per_w(r_fit, gpu_flow_ratio(idx, p.cp.cdu_flow_ref_lpm, flow_now))
    cap = np.where(np.isfinite(plimit) & (plimit > 0), plimit, gp.limit_w)
    t_w, p_w = gpu.values["temp_c"], gpu.values["power_w"]
    ref_c = _mean(ref_grid) + gp.offset_k
    bias = last_minute_bias_k(t_w, p_w, gpu.step_s, ref_c, r_k, gp.c_j_per_k)
    now = (temp_now, ref_now, power_now, act_now, bias)
    t50 = gpu_temp_path(*now, p.r50[:, idx.gpu_rack], cap, r_k, gp, p.step_s, from_util=no_sm)
    t90 = gpu_temp_path(*now, p.r90[:, idx.gpu_rack], cap, r_k, gp, p.step_s, from_util=no_sm)
    p.emit(
        "gpu",
        idx.gpu_ids,
        "temp_c",
        "K",
        gp.max_temp_c,
        temp_now,
        t50,
        t90,
        rack=[p.racks[k].name for k in idx.gpu_rack],
        cdu_of=[idx.cdu_names[k] if k >= 0 else None for k in idx.gpu_cdu],
        basis_of=[f"{p.basis}, {t}" for t in gp.thermal_source],
    )


def _cdus_rows(p: _Pass) -> None:
    """CDUs (heat against capacity at their flow, flow against what the heat needs) and their
    loops (return temperature), with the heat of the racks' load paths."""
    if not p.idx.cdu_names:
        return
    cdus, cdu = p.site.cdus, p.cdu
    supply = last_valid(cdu.values["supply_temp_c"])
    flow = _mean(cdu.values["flow_lpm"])
    heat_now = _mean(cdu.values["heat_kw"])

    # the heat over the load paths: the measured heat (where not read, its racks' modelled
    # heat) plus the captured share of the racks' change of load, as a what-if moves it
    def racks_kw(rack_w: np.ndarray) -> np.ndarray:
        return chain.cdu_rack_heat_kw(rack_w, p.cp.rack_capture, p.idx.rack_cdu, len(cdus))

    base = np.where(np.isfinite(heat_now), heat_now, racks_kw(p.rack_w_now))
    heat50 = base + racks_kw(p.rack_w_now * (p.r50 - 1.0))
    heat90 = base + racks_kw(p.rack_w_now * (p.r90 - 1.0))
    rated = np.array([c.capacity_kw for c in cdus], float)
    max_flow = np.array([c.max_flow_lpm for c in cdus], float)
    cap_now = chain.cdu_capacity_kw(rated, flow, max_flow)
    names = [c.name for c in cdus]
    p.emit("cdu", names, "heat_kw", "kW", cap_now, heat_now, heat50, heat90, cdu_of=names)
    _, need50 = chain.loop_paths(cdus, heat50, supply, flow)
    _, need90 = chain.loop_paths(cdus, heat90, supply, flow)
    # flow: headroom = present flow - flow needed; as "limit - value" with limit = flow
    p.emit("cdu", names, "flow_lpm", "L/min", flow, need50[0], need50, need90, cdu_of=names)
    ret_limit = np.array([c.return_limit_c for c in cdus], float)
    # the return: the measured one moved by the model's change over the path (the model's
    # level, off where a heat meter and the flow disagree, is no headroom)
    ret_now = last_valid(cdu.values["return_temp_c"])
    before = (heat50[:1], supply, flow)  # the path's start
    ret50 = chain.moved_return_c(cdus, ret_now, before, (heat50, supply, flow))
    ret90 = chain.moved_return_c(cdus, ret_now, before, (heat90, supply, flow))
    p.emit("loop", names, "return_temp_c", "K", ret_limit, ret_now, ret50, ret90, cdu_of=names)


def _links_rows(p: _Pass) -> None:
    """Links: the busier direction x the load ratio of the rack of a node at its ends (the
    site's load-weighted ratio for links between switches), against capacity."""
    site = p.site
    if not site.links:
        return
    names = [lk.name for lk in site.links]
    lw = p.link.select(names)
    busy = chain.link_busy_gbps(_mean(lw.values["tx_bps"]), _mean(lw.values["rx_bps"]))
    rack_pos = {r.name: i for i, r in enumerate(p.racks)}
    node_rack = {nd.name: rack_pos[site.rack_of_node[nd.name].name] for nd in site.nodes}
    w = p.rack_w_now if p.rack_w_now.sum() > 0 else np.ones(len(p.racks))
    site50 = (p.r50 * w).sum(axis=1) / (w.sum() or 1.0)
    site90 = (p.r90 * w).sum(axis=1) / (w.sum() or 1.0)
    l50, l90 = np.empty((p.n, len(names))), np.empty((p.n, len(names)))
    for j, lk in enumerate(site.links):
        ri = node_rack.get(lk.a, node_rack.get(lk.b))
        l50[:, j] = busy[j] * (p.r50[:, ri] if ri is not None else site50)
        l90[:, j] = busy[j] * (p.r90[:, ri] if ri is not None else site90)
    capacity = np.array([lk.capacity_gbps for lk in site.links], float)
    p.emit("link", names, "traffic_gbps", "Gb/s", capacity, busy, l50, l90)
