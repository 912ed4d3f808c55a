"""Which parameter each device runs on: its calibrated value where usable, else the catalog's.

One resolver for headroom, what-if and the API (docs/physics.md §6).
``source`` says, per GPU, which of the two the thermal model uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from models import gpu_power
from twin.site import Site
from twin.site.catalog import ASSUMPTIONS
from twin.site.index import SiteIndex

#: The stored parameter holding the shape of each util-only power curve (its threshold or
#: u0, models.gpu_power); the family itself is stored as ``curve_kind``.
UTIL_SHAPE_PARAM = {gpu_power.TWO_LEVEL: "util_threshold", gpu_power.SATURATING: "util_u0"}

#: (kind, id, param) -> value: the newest calibration run's usable parameters
Calibration = dict[tuple[str, str, str], float]


@dataclass(frozen=True)
class GpuParams:
    """Per GPU (the site index's order): power curve, thermal model and temperature limits."""

    idle_w: np.ndarray
    limit_w: np.ndarray
    gamma: np.ndarray
    r_k_per_w: np.ndarray  # at the flow of ``flow_ref_lpm`` of its CDU
    c_j_per_k: np.ndarray
    offset_k: np.ndarray  # local coolant (or air) above the reference temperature
    max_temp_c: np.ndarray  # max operating temperature: where the thermal slowdown holds it
    curve_source: list[str]  # "calibrated", "catalog" or "calibrated on GPU-Util (<kind>)"
    thermal_source: list[str]  # "calibrated" or "catalog R and tau (no usable fit)"
    # A curve calibrated on GPU-Util alone (models.gpu_power.UTIL_ONLY_KINDS; 0 where none):
    # it applies to util input only, so idle_w/limit_w/gamma above stay the power law (the
    # catalog's) that SM activity goes through. docs/physics.md §1.3.1.
    util_kind: np.ndarray | None = None  # (G,) int, models.gpu_power.CURVE_KINDS codes
    util_idle_w: np.ndarray | None = None
    util_limit_w: np.ndarray | None = None  # power at util 1 (the busy level if two-level)
    util_shape: np.ndarray | None = None  # threshold (two-level) or u0 (saturating)


@dataclass(frozen=True)
class ChainParams:
    gpu: GpuParams
    rack_beta: np.ndarray  # rack input power per W of GPU power (calibrated, else PSU model)
    rack_capture: np.ndarray  # share of rack power to liquid (0 for a rack without CDU)
    cdu_flow_ref_lpm: np.ndarray  # flow each CDU's GPUs' R was fitted at (NaN: unknown)


def _gpu(site: Site, idx: SiteIndex, cal: Calibration) -> GpuParams:
    nodes = {nd.name: nd for nd in site.nodes}
    cols: dict[str, list[float]] = {
        k: [] for k in ("idle", "limit", "gamma", "r", "c", "off", "tmax")
    }
    curve_src: list[str] = []
    thermal_src: list[str] = []
    util = np.zeros((4, len(idx.gpu_ids)))  # kind, idle, limit, shape of util-only curves
    for i, gid in enumerate(idx.gpu_ids):
        spec = nodes[idx.gpu_node[i]].gpu_spec
        liquid = idx.gpu_cdu[i] >= 0
        idle = cal.get(("gpu", gid, "idle_w"))
        limit = cal.get(("gpu", gid, "limit_w"))
        gamma = cal.get(("gpu", gid, "gamma"))
        stored_kind = int(cal.get(("gpu", gid, "curve_kind"), gpu_power.POWER_LAW))
        if stored_kind in UTIL_SHAPE_PARAM:  # fitted on util: SM activity gets the catalog's
            idle = limit = gamma = None
            kind = util_curve(cal, gid)
            if kind is None:
                curve_src.append("catalog (stored GPU-Util curve incomplete)")
            else:
                util[:, i] = kind
                curve_src.append(f"calibrated on GPU-Util ({gpu_power.CURVE_KINDS[stored_kind]})")
        else:
            curve_src.append("catalog" if idle is None and gamma is None else "calibrated")
        cols["idle"].append(spec.idle_w if idle is None else idle)
        cols["limit"].append(spec.tdp_w if limit is None else limit)
        cols["gamma"].append(spec.gamma if gamma is None else gamma)
        r = cal.get(("gpu", gid, "r_k_per_w"))
        c = cal.get(("gpu", gid, "c_j_per_k"))
        if r is not None and c is not None and r > 0 and c > 0:
            thermal_src.append("calibrated")
            cols["off"].append(cal.get(("gpu", gid, "offset_k"), 0.0))
        else:
            r_nom = spec.r_liquid_k_per_w if liquid else spec.r_air_k_per_w
            tau = spec.tau_liquid_s if liquid else spec.tau_air_s
            r, c = r_nom, tau / r_nom
            thermal_src.append("catalog R and tau (no usable fit)")
            cols["off"].append(0.0)
        cols["r"].append(r)
        cols["c"].append(c)
        cols["tmax"].append(spec.max_operating_temp_c)
    a = {k: np.array(v, dtype=float) for k, v in cols.items()}
    return GpuParams(
        a["idle"],
        a["limit"],
        a["gamma"],
        a["r"],
        a["c"],
        a["off"],
        a["tmax"],
        curve_src,
        thermal_src,
        util_kind=util[0].astype(np.int64),
        util_idle_w=util[1],
        util_limit_w=util[2],
        util_shape=util[3],
    )


def history_capped_r(r_fit: np.ndarray, r_hist: np.ndarray) -> np.ndarray:
    """A GPU's R for the model: this run's fit, but never above the median of its fits on
    this store (its history), so that a fit learned while a cold plate was fouled does not
    forecast heat for hours after it healed. A GPU without a fit in this run keeps NaN (the
    history alone is a model this run refused); one without history keeps its fit."""
    both = np.isfinite(r_fit) & np.isfinite(r_hist)
    return np.where(both, np.fmin(r_fit, r_hist), r_fit)


def util_curve(cal: Calibration, gid: str) -> tuple[float, float, float, float] | None:
    """(kind, idle, limit, shape) of GPU ``gid``'s stored util-only curve, None where its
    curve is the power law (no ``curve_kind``, or 0) or the stored curve is incomplete."""
    kind = cal.get(("gpu", gid, "curve_kind"))
    if kind is None or int(kind) not in UTIL_SHAPE_PARAM:
        return None
    idle = cal.get(("gpu", gid, "idle_w"))
    limit = cal.get(("gpu", gid, "limit_w"))
    shape = cal.get(("gpu", gid, UTIL_SHAPE_PARAM[int(kind)]))
    if idle is None or limit is None or shape is None:
        return None
    return float(int(kind)), float(idle), float(limit), float(shape)


def default_rack_beta(rack: Any) -> float:
    """Rack input W per W of GPU power from the catalog: (1 + overhead) / PSU efficiency."""
    over = [nd.spec.gpu_overhead_frac for nd in rack.nodes]
    frac = float(np.mean(over)) if over else 0.0
    return (1.0 + frac) / ASSUMPTIONS.psu_efficiency


def resolve(site: Site, idx: SiteIndex, cal: Calibration) -> ChainParams:
    """Every chain parameter of ``site``: ``cal`` where it holds one, else the catalog."""
    racks = site.racks
    beta = np.array(
        [cal.get(("rack", r.name, "beta"), default_rack_beta(r)) for r in racks], dtype=float
    )
    capture = np.array(
        [
            cal.get(("rack", r.name, "capture_fraction"), idx.rack_prior[i])
            for i, r in enumerate(racks)
        ],
        dtype=float,
    )
    capture = np.where(idx.rack_cdu >= 0, capture, 0.0)
    flow_ref = np.array(
        [cal.get(("cdu", c.name, "flow_ref_lpm"), np.nan) for c in site.cdus], dtype=float
    )
    return ChainParams(_gpu(site, idx, cal), beta, capture, flow_ref)
