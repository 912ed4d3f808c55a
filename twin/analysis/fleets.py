"""Underused inference fleets: how busy each inference fleet's GPUs were over a window, and how
many GPUs (and kW) it could give back.

For every inference fleet of the site, over ``[now - window_s, now)``:

- a GPU's activity is its SM activity (``sm_active``, 0..1), or ``util_pct / 100`` in samples
  where ``sm_active`` is missing (GPU-Util saturates at 100 % for any kernel, so that fallback
  overstates the load and a fleet judged on it is flagged later, never wrongly);
- each GPU is averaged per ``step_s`` bucket; the fleet's activity in a bucket is the mean over
  its GPUs that reported, and its total load in GPU-equivalents is that mean times the fleet's
  GPU count; ``activity_p50``/``activity_p95`` and ``load_p95_gpu_eq`` are quantiles over the
  buckets (DuckDB ``quantile_cont``);
- ``gpus_needed = ceil(load_p95_gpu_eq / target_util)`` (at least 1, at most the fleet),
  ``gpus_to_reclaim`` the rest, ``gpu_hours_to_reclaim`` that times the window's hours, and
  ``kw_freed = gpus_to_reclaim * (mean board power per GPU + non-GPU node power per
  GPU) / 1000``, both measured over the window: the reclaimed GPUs' share of the fleet's input
  power, which is what powering them down (with their share of the hosts) or repurposing them
  frees. The load moved onto the remaining GPUs raises their power a little; that is not
  subtracted.
- a fleet is judged only when its data cover ``min_coverage_s`` of the window (10-minute
  buckets with data; default 20 h of a 24 h window, the same share of any other), else it is "not
  judged: N h of data";
- a fleet is flagged when its mean activity is below ``threshold`` (default 0.4: the seeds this
  project answers state that inference rarely exceeds 40 % utilization) and at least one GPU
  can be reclaimed at ``target_util`` of its p95 load (default 0.7). Each fleet may set its
  own threshold, target and coverage in the site file (``underuse:``).

Everything is computed in two parameterized DuckDB queries; nothing is done per sample in
Python.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from twin.site import Site, load_site
from twin.store import Store
from twin.store.reads import newest_ts
from twin.store.windows import load_fleet_activity_stats, load_fleet_power_stats

__all__ = [
    "FleetReport",
    "FleetUsage",
    "fleet_report_json",
    "fleets_command_payload",
    "underused_fleets",
]

ASSUMPTIONS = [
    "activity = sm_active (0..1); util_pct/100 where sm_active is missing (overstates load)",
    "fleet load [GPU-equivalents] = mean activity of the reporting GPUs x the fleet's GPU count,"
    " per time bucket; p50/p95 are over the buckets of the window",
    "gpus_needed = ceil(p95 load / target_util), at least 1 and at most the fleet",
    "flagged when mean activity < threshold and at least one GPU can be reclaimed; judged only"
    " with min_coverage_s of data (10-minute buckets with any sample)",
    "gpu_hours_to_reclaim = gpus_to_reclaim x window hours",
    "kw_freed = reclaimed GPUs x (mean measured board power per GPU + (mean node input power"
    " - mean GPU board power of its node) per GPU): the reclaimed GPUs' share of the fleet's"
    " input power; the extra power of the GPUs that take over their load is not subtracted",
]


#: Mean activity under which an inference fleet is underused: the seeds this project answers
#: state that inference rarely exceeds 40 % utilization.
DEFAULT_THRESHOLD = 0.4
#: Utilization the remaining GPUs may run at, of the fleet's p95 load (headroom for bursts).
DEFAULT_TARGET_UTIL = 0.7
#: Coverage is counted in buckets of this length with any sample (or of the step, if longer):
#: a fleet sampled every 2 min covers its hours, one seen for 1 h covers 1 h. [s]
COVERAGE_BUCKET_S = 600.0
#: Share of the window that must have data before a fleet is judged: 20 h of 24 h.
DEFAULT_COVERAGE_SHARE = 20.0 / 24.0
#: The window a fleet is judged over (``dctwin fleets``, the detection pass). [s]
DEFAULT_WINDOW_S = 86400.0


def underuse_rule(
    fleet: Any,
    window_s: float = DEFAULT_WINDOW_S,
    threshold: float = DEFAULT_THRESHOLD,
    target_util: float = DEFAULT_TARGET_UTIL,
    min_coverage_s: float | None = None,
) -> tuple[float, float, float]:
    """A fleet's threshold, target utilization and the data it needs to be judged [s]: its
    site file's ``underuse`` block where it sets them, else the given ones (the coverage:
    :data:`DEFAULT_COVERAGE_SHARE` of the window). The live report and a replay take the rule
    from here."""
    rule = fleet.underuse
    thr = rule.threshold if rule and rule.threshold is not None else threshold
    tgt = rule.target_util if rule and rule.target_util is not None else target_util
    if rule and rule.min_coverage_s is not None:
        need_s = rule.min_coverage_s
    else:
        need_s = min_coverage_s if min_coverage_s is not None else DEFAULT_COVERAGE_SHARE * window_s
    return thr, tgt, need_s


def underuse_sizing(
    mean_a: Any, p95: Any, gpus: int, covered_s: Any, rule: tuple[float, float, float]
) -> tuple[Any, Any, Any, Any]:
    """GPUs needed for the p95 load at the target utilization (at least 1, at most the
    fleet), GPUs to reclaim, judged (enough data) and flagged (judged, mean activity under the
    threshold and a GPU to reclaim), from :func:`underuse_rule`'s ``rule``; scalars or arrays
    (a replay's every minute) alike."""
    thr, tgt, need_s = rule
    with np.errstate(invalid="ignore"):
        needed = np.minimum(gpus, np.maximum(1, np.ceil(np.multiply(p95, gpus) / tgt - 1e-9)))
        reclaim = np.maximum(0, gpus - needed)
        judged = np.asarray(covered_s) >= need_s - 1e-6
        flagged = judged & (np.asarray(mean_a) < thr) & (reclaim > 0)
    return needed, reclaim, judged, flagged


class FleetUsage(BaseModel):
    fleet: str
    role: str
    gpus: int = Field(description="GPUs of the fleet in the site model")
    gpus_reporting: int = Field(description="GPUs with activity samples in the window")
    buckets: int = Field(description="time buckets with data")
    covered_s: float = Field(
        0.0,
        description="seconds of the window the figures really cover (first to last sample plus"
        " one step, at most the 10-minute buckets with data x 600 s): a fleet seen for 1 hour"
        " is judged on 1 hour, whatever the window",
    )
    covered: str = Field("", description='covered_s as a person says it ("20 min", "24 h")')
    activity_source: str | None = Field(description="sm_active | util_pct | mixed")
    activity_mean: float | None
    activity_p50: float | None
    activity_p95: float | None
    load_p95_gpu_eq: float | None = Field(description="p95 of total load [GPU-equivalents]")
    gpus_needed: int | None
    gpus_to_reclaim: int | None
    gpu_hours_to_reclaim: float | None = Field(
        None, description="reclaimable GPUs x the window's hours"
    )
    judged: bool = Field(True, description="enough data in the window to judge")
    threshold: float | None = Field(None, description="mean activity below which it is flagged")
    target_util: float | None = None
    min_coverage_s: float | None = Field(None, description="data needed to judge [s]")
    gpu_power_mean_w: float | None = Field(description="mean board power per GPU [W]")
    non_gpu_power_per_gpu_w: float | None = Field(
        description="mean node input power not drawn by GPU boards, per GPU [W]"
    )
    kw_freed: float | None
    flagged: bool
    reason: str


class FleetReport(BaseModel):
    site: str
    window_start: datetime
    window_end: datetime
    window_s: float
    step_s: float
    threshold: float = Field(description="flag when mean activity is below this (default)")
    target_util: float
    assumptions: list[str]
    fleets: list[FleetUsage]


def span_text(seconds: float) -> str:
    """A duration as a person says it: "45 s", "12 min", "3.5 h", "2 d"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        h = seconds / 3600
        return f"{h:.0f} h" if h >= 10 or h == int(h) else f"{h:.1f} h"
    return f"{seconds / 86400:.1f} d".replace(".0 d", " d")


def _r(v: Any, nd: int = 4) -> float | None:
    return None if v is None or not math.isfinite(float(v)) else round(float(v), nd)


def _fleet_queries(
    store: Store,
    gpu_ids: list[str],
    gpu_fleet: list[str],
    gpu_node: list[str],
    start: datetime,
    end: datetime,
    step_s: float,
    coverage_bucket_s: float = 600.0,
) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Per fleet: (buckets, mean, p50, p95 activity, GPUs reporting, sm_active and util_pct
    sample counts, span of the samples in s, ``coverage_bucket_s`` buckets with data), and
    (mean board power per GPU, non-GPU node power per GPU)."""
    act = load_fleet_activity_stats(
        store, gpu_ids, gpu_fleet, start, end, step_s, coverage_bucket_s
    )
    # power: mean board power per GPU, and node input power beyond its GPUs' boards
    power = load_fleet_power_stats(store, gpu_ids, gpu_fleet, gpu_node, start, end)
    return act, power


def underused_fleets(
    store: Store,
    site: Site,
    now: datetime | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    threshold: float = DEFAULT_THRESHOLD,
    target_util: float = DEFAULT_TARGET_UTIL,
    step_s: float = 60.0,
    min_coverage_s: float | None = None,
) -> FleetReport:
    """The underused-fleet report for every inference fleet (see the module docstring).
    ``min_coverage_s`` defaults to :data:`DEFAULT_COVERAGE_SHARE` of ``window_s``; a fleet's
    ``underuse`` block in the site file overrides the three rule parameters."""
    if not 0 < target_util <= 1:
        raise ValueError(f"target_util must be in (0, 1], got {target_util}")
    end = (now or datetime.now(UTC)).astimezone(UTC)
    start = end - timedelta(seconds=window_s)
    fleet_of = site.fleet_of_node
    nodes = {n.name: n for n in site.nodes}
    fleets = [f for f in site.fleets if f.role == "inference"]
    gpu_ids: list[str] = []
    gpu_fleet: list[str] = []
    gpu_node: list[str] = []
    n_gpus: dict[str, int] = {f.name: 0 for f in fleets}
    for name, f in fleet_of.items():
        if f.role != "inference":
            continue
        ids = nodes[name].gpu_ids()
        gpu_ids += ids
        gpu_fleet += [f.name] * len(ids)
        gpu_node += [name] * len(ids)
        n_gpus[f.name] += len(ids)
    cov_s = max(COVERAGE_BUCKET_S, step_s)
    act, power = _fleet_queries(store, gpu_ids, gpu_fleet, gpu_node, start, end, step_s, cov_s)
    out: list[FleetUsage] = []
    for f in fleets:
        g = n_gpus[f.name]
        a = act.get(f.name)
        if a is None or not a[0]:
            reason = (
                "no GPU in the site model" if g == 0 else "no GPU activity samples in the window"
            )
            out.append(
                FleetUsage(
                    fleet=f.name,
                    role=f.role,
                    gpus=g,
                    gpus_reporting=0,
                    buckets=0,
                    activity_source=None,
                    activity_mean=None,
                    activity_p50=None,
                    activity_p95=None,
                    load_p95_gpu_eq=None,
                    gpus_needed=None,
                    gpus_to_reclaim=None,
                    gpu_power_mean_w=None,
                    non_gpu_power_per_gpu_w=None,
                    kw_freed=None,
                    flagged=False,
                    reason=reason,
                )
            )
            continue
        buckets, mean_a, p50, p95, reporting, n_sm, n_util, span_s, cov_buckets = a
        rule = underuse_rule(f, window_s, threshold, target_util, min_coverage_s)
        thr, tgt, need_s = rule
        source = "mixed" if n_sm and n_util else ("sm_active" if n_sm else "util_pct")
        load95 = p95 * g
        # first to last sample, less the 10-minute buckets without any
        covered = min(window_s, float(span_s or 0.0) + step_s, float(cov_buckets) * cov_s)
        sized = underuse_sizing(mean_a, p95, g, covered, rule)
        needed, reclaim = int(sized[0]), int(sized[1])
        judged, flagged = bool(sized[2]), bool(sized[3])
        gpu_w, non_gpu_w = power.get(f.name, (None, None))
        per_gpu_w = (gpu_w or 0.0) + max(0.0, non_gpu_w or 0.0)
        kw = reclaim * per_gpu_w / 1000.0 if gpu_w is not None else None
        if not judged:
            reason = (
                f"not judged: {span_text(covered)} of data in a {span_text(window_s)} window"
                f" ({span_text(need_s)} needed)"
            )
        elif flagged:
            reason = (
                f"mean activity {mean_a:.3f} < {thr}: {needed} of {g} GPUs serve the p95 load"
                f" ({load95:.2f} GPU-eq) at {tgt:.0%}; {reclaim} can be reclaimed"
            )
        elif mean_a >= thr:
            reason = f"mean activity {mean_a:.3f} >= {thr}"
        else:
            reason = (
                f"mean activity {mean_a:.3f} < {thr} but all {g} GPUs are needed for the p95"
                f" load ({load95:.2f} GPU-eq) at {tgt:.0%}"
            )
        if judged:
            reason += f", over {span_text(covered)} of data"
            if span_text(covered) != span_text(window_s):
                reason += f" (of a {span_text(window_s)} window)"
        if source != "sm_active":
            reason += f" (activity from {source}: GPU-Util overstates load)"
        out.append(
            FleetUsage(
                fleet=f.name,
                role=f.role,
                gpus=g,
                gpus_reporting=int(reporting or 0),
                buckets=int(buckets),
                covered_s=covered,
                covered=span_text(covered),
                activity_source=source,
                activity_mean=_r(mean_a),
                activity_p50=_r(p50),
                activity_p95=_r(p95),
                load_p95_gpu_eq=_r(load95, 3),
                gpus_needed=needed,
                gpus_to_reclaim=reclaim,
                gpu_hours_to_reclaim=_r(reclaim * window_s / 3600.0, 1),
                judged=judged,
                threshold=thr,
                target_util=tgt,
                min_coverage_s=need_s,
                gpu_power_mean_w=_r(gpu_w, 1),
                non_gpu_power_per_gpu_w=_r(non_gpu_w, 1),
                kw_freed=_r(kw, 3),
                flagged=flagged,
                reason=reason,
            )
        )
    return FleetReport(
        site=site.name,
        window_start=start,
        window_end=end,
        window_s=window_s,
        step_s=step_s,
        threshold=threshold,
        target_util=target_util,
        assumptions=ASSUMPTIONS,
        fleets=out,
    )


def fleet_report_json(report: FleetReport, indent: int | None = 2) -> str:
    """The report as JSON text (timestamps ISO 8601, UTC)."""
    return report.model_dump_json(indent=indent)


def fleets_command_payload(
    db_path: str | Path,
    site_path: str | Path,
    window_s: float = 86400.0,
    threshold: float = DEFAULT_THRESHOLD,
    target_util: float = DEFAULT_TARGET_UTIL,
    now: datetime | None = None,
    min_coverage_s: float | None = None,
) -> dict[str, Any]:
    """What ``dctwin fleets --db PATH --json`` prints: the report as a JSON-ready dict.

    Opens the store read-only. ``now`` defaults to just after the newest GPU sample in the
    store (a recorded or replayed file is judged on its own last day, not on the wall clock).
    """
    site = load_site(site_path)
    with Store(db_path, read_only=True) as store:
        if now is None:
            newest = newest_ts(store, "gpu")
            now = (newest + timedelta(microseconds=1)) if newest else datetime.now(UTC)
        report = underused_fleets(
            store, site, now, window_s, threshold, target_util, min_coverage_s=min_coverage_s
        )
    return report.model_dump(mode="json")
