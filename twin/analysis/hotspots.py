"""Hot spots: GPUs and racks running hotter than they should, with the reason.

Five detectors, each on the store's newest data:

- ``over_limit``: a GPU at or over its max operating temperature (where thermal slowdown
  starts) or its HBM at or over the HBM limit, from the catalog.
- ``above_model``: a GPU measured above its calibrated RC model's prediction (given the measured
  power, coolant and loop flow) by ``k_sigma`` standard deviations in every one of the last
  ``minutes`` minutes. Both are minute means (``models.thermal_watch``: the RC model is exact
  in minute means once the heat stored by the GPU's own warming is taken out), aggregated in
  DuckDB, so 10,000 GPUs cost a GROUP BY, not a per-second simulation. The standard deviation
  is the GPU's own held-out error from its calibration (RMSE ~ 1.25 MAE), at least
  ``MIN_SIGMA_K``. The model's R is the lower of the latest run's and the median of the GPU's
  own fits, and its held-out error likewise: a refit over a degrading cold plate would
  otherwise learn the fault and hide it (a slow ramp is absorbed one refit at a time; a step
  in a refit's held-out minutes makes its error kelvins and sigma with it). A GPU whose
  latest fit was refused is judged by its newest usable fit on this store. What the GPU's
  figures were is in the report (``measured_c``, ``model_c``, ``sigma_k``).
- ``r_drift``: R re-estimated every pass over the last ``DRIFT_WINDOW_MIN`` minutes (least
  squares of the minute means, at the calibration's flow) more than ``R_DRIFT_BAND`` over the
  median of its fleet's same estimate (``r_k_per_w``, ``fleet_r_k_per_w``, ``r_drift``), and
  by at least ``min_excess_k`` kelvin at the heat it was estimated at (``r_excess_k``: at low
  heat a kelvin of offset error is a large share of R, docs/physics.md §2.6). It needs no
  refit (a drift event of the calibration comes only with a refit, and only past +50 %) and
  no calibration at all (without one, offset 0 and no heat-storage term).
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
from models import thermal_watch as tw
from models.cooling_change import FLAT_FRACTION, cooling_steps
from twin.alerts.metrics import RESIDUAL_MIN_EXCESS_K
from twin.analysis.coverage import newest_sample
from twin.chain.params import history_capped_r
from twin.site import Site
from twin.site.index import gpu_flow_ratio, gpu_reference, index_site
from twin.store import Store
from twin.store.windows import (
    Window,
    WindowReader,
    hold_fill,
    infer_step_s,
    load_minute_stats,
    load_window,
)

#: Upper end of the ASHRAE TC 9.9 recommended inlet range (18-27 °C), 2021 thermal guidelines.
ASHRAE_RECOMMENDED_MAX_C = 27.0
#: NVML and DCGM report the GPU core temperature in whole degrees Celsius (NVML
#: ``nvmlDeviceGetTemperature``: unsigned int, °C). [K]
SENSOR_RESOLUTION_K = 1.0
#: Floor of the residual's standard deviation: half the sensor's step. A steady die read
#: through a 1 °C sensor without dither gives the same reading every second, so a minute mean
#: is off by up to half a step, whatever the averaging (docs/physics.md §2.7). [K]
MIN_SIGMA_K = SENSOR_RESOLUTION_K / 2.0
#: A residual hot spot also needs this absolute excess over the model in each judged minute
#: (the shipped residual rule's default ``min_excess_k``; reasoning at its definition). [K]
MIN_EXCESS_K = RESIDUAL_MIN_EXCESS_K
#: sigma = RMSE; for normal errors RMSE = sqrt(pi / 2) * MAE.
RMSE_PER_MAE = math.sqrt(math.pi / 2.0)
#: A GPU whose R re-estimate is this far over its fleet's median is listed as an ``r_drift``
#: hot spot (when it also runs ``min_excess_k`` hotter for it): above healthy cold plates'
#: +-15 % spread (docs/physics.md §9.2) with margin; the shipped gpu_r_drift rule pages at
#: +35 % and 3 K. [1]
R_DRIFT_BAND = 0.25
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
    # ... the same minimum in K (= residual_sigma x sigma_k), and the last minute's mean
    # measured and modelled temperature and σ
    excess_k: dict[str, float] = {}
    measured_c: dict[str, float] = {}
    model_c: dict[str, float] = {}
    sigma_k: dict[str, float] = {}
    # every GPU loaded enough over the last DRIFT_WINDOW_MIN minutes: its R re-estimated there
    # (at its calibration's flow), its fleet's median, and R over that median - 1
    r_k_per_w: dict[str, float] = {}
    fleet_r_k_per_w: dict[str, float] = {}
    r_drift: dict[str, float] = {}
    #: (R - the fleet's median) x the mean heat R was estimated at: how many K hotter the GPU
    #: runs than its fleet's median R would run it [K]
    r_excess_k: dict[str, float] = {}
    rack_inlet_c: dict[str, float]  # every rack with an inlet reading: the last minute's warmest
    problems: list[str]
    #: the calibration run the model-based detectors judged with: the newest run fitted on this
    #: store's telemetry (None: none yet; a seeded run never arms them)
    model_run: int | None = None
    #: why the model-based detectors (residual, R drift) judge nothing or not every GPU ("":
    #: every GPU with telemetry is judged)
    model_note: str = ""
    #: GPUs the model does not judge because their fit was refused: id -> the fit's reason
    not_judged: dict[str, str] = {}
    min_excess_k: float = MIN_EXCESS_K


def find_hotspots(
    store: Store,
    site: Site,
    *,
    now: datetime | None = None,
    k_sigma: float = 3.0,
    minutes: int = 5,
    min_excess_k: float = MIN_EXCESS_K,
    windows: WindowReader | None = None,
) -> HotSpotReport:
    """Every hot spot of ``site`` from the store's newest data and calibration.

    The model-based detectors (residual, R drift) judge only with a calibration fitted on this
    store's telemetry (:meth:`twin.store.Store.latest_fit_run_id`): a run seeded from another
    recording serves headroom, never a residual. A GPU whose fit was refused is not judged
    (listed in ``not_judged`` with the fit's reason). ``windows``: the pass's reader, when
    other stages read the same windows (detection)."""
    if k_sigma <= 0 or minutes < 1 or min_excess_k < 0:
        raise ValueError(
            f"k_sigma ({k_sigma}) must be > 0, minutes ({minutes}) >= 1 and min_excess_k"
            f" ({min_excess_k}) >= 0"
        )
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
    start = end - timedelta(seconds=60.0)  # the last minute, on the samples' 1 s grid
    reader = windows if windows is not None else WindowReader(store)
    gpu = reader.load("gpu", start, end, ids=idx.gpu_ids, quantities=["temp_c", "mem_temp_c"])
    node = reader.load("node", start, end, quantities=["inlet_temp_c"])
    pdu = reader.load("pdu", start, end, quantities=["inlet_temp_c"])
    out += _over_limit(idx, nodes, racks, gpu.values["temp_c"], gpu.values["mem_temp_c"])

    # ---- above the calibrated model, and R drifting over its fleet (last minutes' aggregates)
    run = store.latest_calibration_run_id()
    fit = store.latest_fit_run_id()
    model_run = fit if fit is not None and fit == run else None
    found, figures, missing, not_judged, earlier = _watch(
        store, reader, model_run, idx, racks, end, k_sigma, minutes, min_excess_k
    )
    out += found
    problems += missing
    note = _model_note(run, model_run, not_judged, earlier)
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
        residual_sigma=figures["residual_sigma"],
        excess_k=figures["excess_k"],
        measured_c=figures["measured_c"],
        model_c=figures["model_c"],
        sigma_k=figures["sigma_k"],
        r_k_per_w=figures["r_k_per_w"],
        fleet_r_k_per_w=figures["fleet_r_k_per_w"],
        r_drift=figures["r_drift"],
        r_excess_k=figures["r_excess_k"],
        rack_inlet_c=inlet,
        problems=problems,
        model_run=model_run,
        model_note=note,
        not_judged=not_judged,
        min_excess_k=min_excess_k,
    )


def _model_note(
    run: int | None, model_run: int | None, not_judged: dict[str, str], earlier: dict[str, int]
) -> str:
    """Why the model-based detectors judge nothing, or not every GPU, or some by an earlier
    fit ("" when every GPU is judged by run ``model_run``)."""
    if model_run is None:
        if run is None:
            return "no calibration yet: the model-based rules wait for the first fit"
        return (
            f"calibration run {run} is seeded from another recording: the model-based rules"
            " (residual, R drift, GPU temperature forecast) wait for the first fit on this"
            " site's telemetry"
        )
    notes = []
    if not_judged:
        notes.append(
            f"{len(not_judged)} GPU(s) not judged by the model: their fit in run {model_run} was"
            " refused and they have no earlier usable fit on this site (see their reasons)"
        )
    if earlier:
        notes.append(
            f"{len(earlier)} GPU(s) judged by their newest usable fit (runs"
            f" {', '.join(str(r) for r in sorted(set(earlier.values())))}): run {model_run}"
            " refused or made none for them; that holds for the residual and R drift, while the"
            " GPU temperature forecast, which forecasts with the newest run's parameters, skips"
            " them until a run fits them again"
        )
    return "; ".join(notes)


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


def _gpu_minutes(
    store: Store, ids: list[str], start: datetime, n_min: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU and minute of ``[start, start + n_min min)``: mean temperature, mean power and
    the temperature's slope from the minute's first to its last sample [K/s], ``(n_min, G)``
    (:func:`twin.store.windows.load_minute_stats`)."""
    m = load_minute_stats(store, "gpu", ids, start, n_min, ["temp_c", "power_w"])
    return m.means["temp_c"], m.means["power_w"], m.slope


def _minute_window(
    reader: WindowReader,
    kind: str,
    start: datetime,
    n_min: int,
    ids: list[str],
    quantities: list[str],
) -> Window:
    """Each quantity's mean per id and minute of ``[start, start + n_min min)``
    (:meth:`twin.store.windows.WindowReader.minute_means`: the minute means the GPUs'
    temperature and power are taken as, and a replay's reference), held over missing minutes."""
    m = reader.minute_means(kind, ids, start, n_min, quantities)
    held = {q: hold_fill(v, backfill=True) for q, v in m.values.items()}
    return Window(kind, start, 60.0, m.ids, held)


def _watch(
    store: Store,
    reader: WindowReader,
    run: int | None,
    idx: Any,
    racks: list[Any],
    end: datetime,
    k_sigma: float,
    minutes: int,
    min_excess_k: float = MIN_EXCESS_K,
) -> tuple[list[HotSpot], dict[str, dict[str, float]], list[str], dict[str, str]]:
    """The model-residual and R-drift detectors on the last minutes' aggregates
    (``models.thermal_watch``), vectorized over GPUs.

    - residual: each minute's mean temperature against the calibrated model's (run ``run``)
      for the minute's mean heat, coolant and loop flow; the figure is the smallest of the
      last ``minutes`` minutes (``excess_k``) over sigma (the GPU's published held-out fit
      error x sqrt(pi/2), at least :data:`MIN_SIGMA_K`, the sensor's half step). A hot spot
      needs both ``k_sigma`` and ``min_excess_k``. The model's R is the lower of the run's and
      the median of the GPU's own fits so far: a refit on a degrading cold plate must not teach
      the model the fault and hide it; sigma likewise comes from the lower of the fit's
      held-out error and the median of the GPU's own. ``run`` None (no fit on this site's
      data): nothing is judged; a GPU whose fit ``run`` refused is judged by its newest usable
      fit on this store, and not at all without one.
    - drift: R re-estimated over the last :data:`DRIFT_WINDOW_MIN` minutes (at the
      calibration's flow) against its fleet's median of the same estimate.

    Returns the hot spots, the figures per GPU (``residual_sigma``, ``excess_k``,
    ``measured_c``, ``model_c``, ``sigma_k``, ``r_k_per_w``, ``fleet_r_k_per_w``,
    ``r_drift``, ``r_excess_k``: id -> value), what could not be judged, the GPUs whose refused
    fit keeps them from being judged (id -> the fit's reason: they have no earlier usable
    fit) and the GPUs judged by an earlier fit than ``run``'s (id -> its run)."""
    problems: list[str] = []
    n_min = max(minutes, DRIFT_WINDOW_MIN)
    start = end - timedelta(minutes=n_min)  # the last minute ends with the newest second
    ids = idx.gpu_ids
    t_m, p_m, slope = _gpu_minutes(store, ids, start, n_min)
    cdu = _minute_window(reader, "cdu", start, n_min, idx.cdu_names, ["supply_temp_c", "flow_lpm"])
    nodes = sorted(set(idx.gpu_node))
    node = _minute_window(reader, "node", start, n_min, nodes, ["inlet_temp_c"])
    pdus = sorted({p for rack in idx.rack_pdus for p in rack})
    pdu = _minute_window(reader, "pdu", start, n_min, pdus, ["inlet_temp_c"])
    ref = gpu_reference(idx, cdu, node, pdu)
    params, mae, history, not_judged, earlier = _model_inputs(store, run)

    def per_gpu(name: str, default: float) -> np.ndarray:
        return np.array([params.get((gid, name), default) for gid in ids], dtype=float)

    r = per_gpu("r_k_per_w", np.nan)
    hist = np.array([history.get(gid, np.nan) for gid in ids])
    r = history_capped_r(r, hist)
    c, off = per_gpu("c_j_per_k", np.nan), per_gpu("offset_k", 0.0)
    sigma = np.array(
        [max(MIN_SIGMA_K, RMSE_PER_MAE * mae[gid]) if gid in mae else np.nan for gid in ids]
    )
    # R's flow factor: each loop's flow over the flow the model run fitted its GPUs' R at (the
    # CDU's parameter; a replay takes its calibration's, the live headroom the newest run's)
    cdu_params = {} if run is None else store.calibration_params(run, params=["flow_ref_lpm"])
    flow_ref = {name: v for (kind, name, _), v in cdu_params.items() if kind == "cdu"}
    flow = cdu.values["flow_lpm"]
    factor = gpu_thermal.r_at_flow_k_per_w(1.0, gpu_flow_ratio(idx, flow_ref, flow))
    factor = np.where((idx.gpu_cdu >= 0)[None, :], factor, 1.0)
    w = tw.watch(
        t_m,
        p_m,
        slope,
        ref,
        off[None, :],
        c[None, :],
        factor,
        sigma[None, :],
        r[None, :],
        minutes=minutes,
        window=DRIFT_WINDOW_MIN,
    )
    z, model, r_est, r_heat = w.z[-1], w.model_c, w.r_est[-1], w.r_heat[-1]
    groups = gpu_groups(idx)
    # the fleet's median R and each GPU's drift over it, K at this GPU's heat
    fleet, drift, r_excess = (a[0] for a in tw.fleet_drift(r_est[None], r_heat[None], groups))
    if run is None:
        problems.append(
            "no calibration fitted on this site's telemetry yet: the model-residual and R-drift"
            " detectors judge nothing"
        )
    elif not np.isfinite(t_m[-minutes:]).any():
        problems.append(f"no GPU data in the last {minutes} min: no model-residual check")
    figures: dict[str, dict[str, float]] = {}

    def keep(name: str, values: np.ndarray, where: np.ndarray) -> None:
        j = np.flatnonzero(where)
        figures[name] = dict(zip([ids[i] for i in j], values[j].tolist(), strict=True))

    judged = np.isfinite(z)
    excess = z * sigma
    keep("residual_sigma", z, judged)
    keep("excess_k", excess, judged)
    keep("measured_c", t_m[-1], judged)
    keep("model_c", model[-1], judged)
    keep("sigma_k", sigma, judged)
    has_r = np.isfinite(drift)
    keep("r_k_per_w", r_est, has_r)
    keep("fleet_r_k_per_w", fleet, has_r)
    keep("r_drift", drift, has_r)
    keep("r_excess_k", r_excess, has_r)
    out: list[HotSpot] = []
    flagged = judged & (z >= k_sigma) & (excess >= min_excess_k)
    for i in np.flatnonzero(flagged):  # only the flagged GPUs
        meas, mod = float(t_m[-1, i]), float(model[-1, i])
        out.append(
            HotSpot(
                kind="gpu",
                id=ids[i],
                reason="above_model",
                value=meas,
                reference=mod,
                excess=float(excess[i]),
                sigma=float(sigma[i]),
                residual_sigma=float(z[i]),
                rack=racks[idx.gpu_rack[i]].name,
                detail=(
                    f"{excess[i]:.1f} K ({z[i]:.1f} sigma, sigma {sigma[i]:.2f} K) or more above"
                    f" its calibrated model in each loaded minute of the last {minutes} min;"
                    f" last minute {meas:.1f} °C measured, {mod:.1f} °C modelled"
                ),
            )
        )
    # R drift is judged against a fit on this site's data too (its offset is the fit's)
    drifted = has_r & (drift > R_DRIFT_BAND) & (r_excess >= min_excess_k)
    for i in np.flatnonzero(drifted & (run is not None)):
        out.append(
            HotSpot(
                kind="gpu",
                id=ids[i],
                reason="r_drift",
                value=float(r_est[i]),
                reference=float(fleet[i]),
                excess=float(r_est[i] - fleet[i]),
                rack=racks[idx.gpu_rack[i]].name,
                detail=(
                    f"R {r_est[i]:.4f} K/W over the last {DRIFT_WINDOW_MIN} min is "
                    f"{drift[i]:+.0%} over its fleet's median {fleet[i]:.4f} K/W:"
                    f" {r_excess[i]:.1f} K hotter than the median R at its mean loaded heat"
                    f" {r_heat[i]:.0f} W"
                ),
            )
        )
    return out, figures, problems, not_judged, earlier


def _model_inputs(
    store: Store, run: int | None
) -> tuple[
    dict[tuple[str, str], float], dict[str, float], dict[str, float], dict[str, str], dict[str, int]
]:
    """What the residual judges with as of run ``run`` (nothing when None): each GPU's newest
    usable fit on this store (``run``'s, else the latest earlier one: a refit refused over a
    fault must not stop the model judging the fault) as ((id, param) -> value); each GPU's
    held-out temperature MAE, that fit's but never above the median of its own fits' (a refit
    whose held-out minutes caught a fault, 6 K against 0.08 K, must not widen sigma and clear
    the page); each GPU's R history (the median of its fits); the GPUs with no usable fit on
    this store whose fit in ``run`` was refused (id -> reason); and the GPUs judged by an
    earlier fit (id -> its run)."""
    if run is None:
        return {}, {}, {}, {}, {}
    fits = store.gpu_thermal_fits(run, ("r_k_per_w", "c_j_per_k", "offset_k"))
    params = {(gid, p): v for gid, f in fits.items() for p, v in f["params"].items()}
    mae: dict[str, float] = {}
    for gid, f in fits.items():
        known = [v for v in (f["mae"], f["mae_median"]) if v is not None]
        if known:
            mae[gid] = min(known)
    history = store.calibration_param_medians("gpu", "r_k_per_w")
    not_judged, earlier = store.gpu_fit_standing(run)
    return params, mae, history, not_judged, earlier


def _cooling_changes(
    store: Store, run: int | None, idx: Any, nodes: dict[str, Any], racks: list[Any], end: datetime
) -> list[HotSpot]:
    """GPUs whose temperature fell at flat power in the last ``COOLING_LOOKBACK_MIN`` minutes
    (R of calibration run ``run`` where usable, else the catalog's for the node's cooling)."""
    start = end - timedelta(minutes=COOLING_LOOKBACK_MIN)
    # on the GPUs' own sampling step (1 s where they are sampled every second): a 1 s grid
    # of 10 s samples is nine tenths NaN, ten times the memory and time (2 GB and 6.9 s of a
    # 25,000-GPU pass, bench/README.md), for the same means
    step_s = max(1.0, infer_step_s(store, "gpu", start, end) or 1.0)
    win = load_window(
        store, "gpu", start, end, ids=idx.gpu_ids, quantities=["power_w", "temp_c"], step_s=step_s
    )
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
