"""Fleet drain: a fleet's load falling far below its own recent level.

A drained fleet (jobs gone, a scheduler or router stuck, a partition cut off) uses less power,
so no limit sees it and the underused-fleet report, judged on a day's p95, does not move for a
few idle hours. This detector compares each fleet with itself, minute by minute:

- ``level_now``: the fleet's mean activity (SM activity, else ``util_pct / 100``, as
  :mod:`twin.analysis.fleets`) over the last :data:`NOW_MIN` minutes;
- ``level_before``: the fleet's level at the same time yesterday (the mean of the same
  :data:`NOW_MIN` minutes 24 h earlier), when that window has data: an inference fleet's
  daily cycle is then its own reference; else the median of its minute means over the
  :data:`BEFORE_MIN` minutes before the "now" window (the trailing level; a median, so
  checkpoint dips of a training fleet do not lower it). Once the drain has lasted that
  long, the trailing level is the drained one and the observation stops (the drop was
  paged; the rule's ``resolve_if_absent_s`` resolves it);
- the observation's value is the drop, ``1 - level_now / level_before``, emitted only while
  ``level_before`` is at least :data:`MIN_LEVEL` (a fleet idle already cannot drain).

The same function, :func:`drain_series`, computes it in the live detection pass
(:func:`fleet_drain_observations` reads the minute means from the store) and in a what-if
replay (:mod:`twin.replay.whatif`, the run's fleet activity), so both page the same way.
Labels: ``level_now``, ``level_before`` (activity, 0..1), ``basis`` (``same time yesterday`` |
``previous 1 h``), ``window`` (the "now" window, e.g. ``15 min``).
"""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from twin.site import Site
from twin.store import Store
from twin.store.windows import load_group_activity

__all__ = [
    "BEFORE_MIN",
    "DAY_MIN",
    "MIN_LEVEL",
    "NOW_MIN",
    "DrainSeries",
    "drain_labels",
    "drain_series",
    "fleet_drain_observations",
    "fleet_minute_activity",
]

#: The "now" window [min]: long enough that a training fleet's checkpoint dip (a few minutes,
#: twin/simulator) does not read as a drain, short enough to page a drain within ~20 min.
NOW_MIN = 15
#: The trailing level's window [min] when yesterday has no data. An hour: a drain is a step,
#: seen against any window, while an inference fleet's evening decline, gradual over hours,
#: drops at most 46 % against the hour before on the demo day (63 % against 3 h: it would
#: page). sample_telemetry/demo_bundle, infer-chat.
BEFORE_MIN = 60
#: Minutes in a day: the seasonal (same time yesterday) reference of an inference fleet.
DAY_MIN = 1440
#: A fleet whose reference level is below this activity is idle already: no drain is judged.
#: (The simulator's idle level is 0.03, twin/simulator/engine.py IDLE_ACTIVITY.)
MIN_LEVEL = 0.10
#: A window counts only with at least this share of its minutes reporting (a collector polling
#: every 2 minutes fills half of the one-minute buckets).
MIN_SHARE = 0.3


class DrainSeries:
    """Per minute and fleet: ``drop``, ``level_now``, ``level_before`` (M, F) and ``yesterday``
    (M, F) bool: the reference was the same time yesterday (else the trailing level)."""

    def __init__(
        self,
        drop: np.ndarray,
        level_now: np.ndarray,
        level_before: np.ndarray,
        yesterday: np.ndarray,
    ) -> None:
        self.drop = drop
        self.level_now = level_now
        self.level_before = level_before
        self.yesterday = yesterday


def _rolling(x: np.ndarray, k: int, how: str) -> np.ndarray:
    """(M, F): the nan-mean or nan-median of rows m-k+1..m of ``x``; NaN where fewer than
    MIN_SHARE of them are finite (or before the start)."""
    pad = np.concatenate([np.full((k - 1, x.shape[1]), np.nan), x])
    win = sliding_window_view(pad, k, axis=0)  # (M, F, k)
    n = np.isfinite(win).sum(axis=-1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows: NaN, judged below
        v = np.nanmedian(win, axis=-1) if how == "median" else np.nanmean(win, axis=-1)
    return np.where(n >= MIN_SHARE * k, v, np.nan)


def _shift(x: np.ndarray, k: int) -> np.ndarray:
    """Rows of ``x`` moved down by ``k`` (row m holds row m-k; NaN before the start)."""
    out = np.full_like(x, np.nan)
    if k < x.shape[0]:
        out[k:] = x[: x.shape[0] - k]
    return out


def drain_series(
    act_m: np.ndarray,
    *,
    now_min: int = NOW_MIN,
    before_min: int = BEFORE_MIN,
    day_min: int = DAY_MIN,
    min_level: float = MIN_LEVEL,
) -> DrainSeries:
    """The drain of every fleet at every minute from its minute-mean activity ``act_m``
    (M, F), row m the minute ending at m (NaN: no data). See the module docstring."""
    a = np.asarray(act_m, dtype=float)
    if a.ndim != 2:
        raise ValueError(f"act_m must be (minutes, fleets), got shape {a.shape}")
    now = _rolling(a, now_min, "mean")
    trailing = _shift(_rolling(a, before_min, "median"), now_min)
    yday = _shift(now, day_min)
    use_y = np.isfinite(yday)
    before = np.where(use_y, yday, trailing)
    with np.errstate(all="ignore"):
        drop = np.where(
            np.isfinite(now) & (before >= min_level), 1.0 - now / np.maximum(before, 1e-12), np.nan
        )
    return DrainSeries(drop, now, before, use_y)


def drain_labels(s: DrainSeries, i: int, j: int, now_min: int = NOW_MIN) -> dict[str, str]:
    """What the detector saw for fleet ``j`` at minute ``i``, as observation labels."""
    return {
        "level_now": f"{s.level_now[i, j]:.2f}",
        "level_before": f"{s.level_before[i, j]:.2f}",
        "basis": "same time yesterday"
        if s.yesterday[i, j]
        else f"previous {BEFORE_MIN} min"
        if BEFORE_MIN % 60
        else f"previous {BEFORE_MIN // 60} h",
        "window": f"{now_min} min",
    }


def fleet_minute_activity(
    store: Store, site: Site, now: datetime, minutes: int
) -> tuple[list[str], np.ndarray]:
    """Every fleet's mean GPU activity per minute over the ``minutes`` minutes up to ``now``:
    (fleet names, (minutes, F) array, row ``minutes - 1`` the minute ending with the sample at
    ``now``; NaN where no GPU of the fleet reported). One parameterized DuckDB query."""
    names = [f.name for f in site.fleets]
    nodes = {n.name: n for n in site.nodes}
    ids: list[str] = []
    fleet: list[str] = []
    for node, f in site.fleet_of_node.items():
        gids = nodes[node].gpu_ids()
        ids += gids
        fleet += [f.name] * len(gids)
    out = np.full((minutes, len(names)), np.nan)
    if not ids:
        return names, out
    # the last minute ends with the sample at ``now`` (the hot-spot detector's minutes and a
    # replay's: on the samples' 1 s grid)
    end = now + timedelta(seconds=1)
    start = end - timedelta(minutes=minutes)
    # only the minutes the detector reads: the trailing level's and yesterday's window
    recent = end - timedelta(minutes=min(minutes, NOW_MIN + BEFORE_MIN))
    y_lo = end - timedelta(minutes=DAY_MIN + NOW_MIN)
    y_hi = end - timedelta(minutes=DAY_MIN)
    rows = load_group_activity(
        store, ids, fleet, start, end, 60.0, keep=[(recent, end), (y_lo, y_hi)]
    )
    col = {n: j for j, n in enumerate(names)}
    for f, b, v in rows:
        if v is not None and 0 <= int(b) < minutes:
            out[int(b), col[f]] = float(v)
    return names, out


def fleet_drain_observations(store: Store, site: Site, now: datetime) -> list[dict]:
    """The live detector: per fleet with a judged drop at ``now``, ``{"fleet", "drop",
    "labels"}`` (the last minute of :func:`drain_series` over the store's minute means)."""
    if not site.fleets:
        return []
    minutes = DAY_MIN + NOW_MIN
    names, act = fleet_minute_activity(store, site, now, minutes)
    s = drain_series(act)
    i = minutes - 1
    return [
        {"fleet": name, "drop": float(s.drop[i, j]), "labels": drain_labels(s, i, j)}
        for j, name in enumerate(names)
        if np.isfinite(s.drop[i, j])
    ]
