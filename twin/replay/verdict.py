"""Judging a run: per component headroom over the recording, and the verdict on a scenario.

A verdict is relative to the recording (docs/physics.md §12.4): a scenario **does not fit**
when it creates a breach or worsens one the recording already had; it **fits with risks** when
it takes away more headroom than the tolerance from some component without breaching, or when
its breaches are all shorter than the duration tolerance (``Tolerance.min_breach_s``: a CDU 10 s
over its capacity is a risk to watch, not a hall that cannot take the change); else it
**fits**. What the recording itself breached is reported apart, as the recording's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from pydantic import BaseModel, Field

from twin.chain.breach import NOW_WINDOW_S
from twin.replay.result import ComponentChange, ComponentResult, Kind, KindSummary

#: Relative noise a scenario's change must exceed to count at all (float32 sums).
EPS = 1e-4


class Tolerance(BaseModel):
    """How much minimum headroom a scenario may take from a component and still "fit"."""

    fraction: float = Field(
        0.05, ge=0, le=1, description="of the component's limit (A, kW, L/min, Gb/s)"
    )
    temp_k: float = Field(2.0, ge=0, description="for temperatures (GPU, loop return) [K]")
    min_breach_s: float = Field(
        300.0,
        ge=0,
        description="a new breach shorter than this (or a breach lengthened by less) is a risk,"
        " not a misfit [s]",
    )

    def of(self, kind: str, limit: float) -> float:
        if kind in ("gpu", "loop"):
            return self.temp_k
        return self.fraction * abs(limit)


@dataclass
class KindStats:
    ids: list[str]
    unit: str
    limit: np.ndarray
    peak: np.ndarray
    min_headroom: np.ndarray
    over_steps: np.ndarray
    first: np.ndarray  # first step over, -1 for never
    end: np.ndarray  # value at the end of the run (see ComponentResult.value_end)


@dataclass
class Judge:
    """Collects per component statistics, kind by kind, chunk by chunk."""

    dt_s: float
    times: list[datetime]
    kinds: dict[str, KindStats] = field(default_factory=dict)

    def add(
        self,
        kind: Kind,
        ids: list[str],
        unit: str,
        value: np.ndarray,
        limit: np.ndarray,
        over: np.ndarray | None = None,
    ) -> None:
        """value (T, N); limit (N,) or (T, N); ``over``: more steps to count as over (held)."""
        self.merge(kind, self.stats(kind, ids, unit, value, limit, over))

    def stats(
        self,
        kind: Kind,
        ids: list[str],
        unit: str,
        value: np.ndarray,
        limit: np.ndarray,
        over: np.ndarray | None = None,
    ) -> KindStats:
        """:meth:`add`'s statistics of one chunk, without adding them (a chunk computed in a
        worker thread is merged by the caller, in order)."""
        lim = limit if np.ndim(limit) == 2 else np.asarray(limit, dtype=float)[None, :]
        with np.errstate(invalid="ignore"):
            head = lim - value
            # a breach is beyond float rounding (float32 recordings): 1e-6 of the limit
            is_over = head < -1e-6 * np.maximum(np.abs(lim), 1.0)
        if over is not None:
            is_over = is_over | over
        any_over = is_over.any(axis=0)
        first = np.where(any_over, np.argmax(is_over, axis=0), -1)
        with np.errstate(all="ignore"):
            minh = np.fmin.reduce(head, axis=0)
            peak = np.fmax.reduce(value, axis=0)
            lim_rep = np.fmin.reduce(np.broadcast_to(lim, value.shape), axis=0)
        k = 1 if kind in ("gpu", "loop") else max(1, round(NOW_WINDOW_S / self.dt_s))
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            end = np.nanmean(value[-k:], axis=0)
        return KindStats(list(ids), unit, lim_rep, peak, minh, is_over.sum(axis=0), first, end)

    def merge(self, kind: Kind, s: KindStats) -> None:
        """Add one chunk's statistics (:meth:`stats`) after the kind's others."""
        old = self.kinds.get(kind)
        if old is None:
            self.kinds[kind] = s
        else:  # another chunk of the same kind
            self.kinds[kind] = KindStats(
                old.ids + s.ids,
                s.unit,
                *(
                    np.concatenate([a, b])
                    for a, b in (
                        (old.limit, s.limit),
                        (old.peak, s.peak),
                        (old.min_headroom, s.min_headroom),
                        (old.over_steps, s.over_steps),
                        (old.first, s.first),
                        (old.end, s.end),
                    )
                ),
            )

    def components(self) -> list[ComponentResult]:
        out = []
        for kind, s in self.kinds.items():
            for j, sid in enumerate(s.ids):
                out.append(
                    ComponentResult(
                        kind=kind,
                        id=sid,
                        unit=s.unit,
                        limit=float(s.limit[j]),  # type: ignore[arg-type]
                        peak=float(s.peak[j]),
                        min_headroom=float(s.min_headroom[j]),
                        time_over_s=float(s.over_steps[j] * self.dt_s),
                        first_breach=self.times[s.first[j]] if s.first[j] >= 0 else None,
                        value_end=float(s.end[j]) if np.isfinite(s.end[j]) else None,
                    )
                )
        return out


def _rel(c: ComponentResult) -> float:
    return c.min_headroom / c.limit if c.limit else c.min_headroom


def summarize(
    comps: list[ComponentResult], base: list[ComponentResult] | None = None
) -> list[KindSummary]:
    """Per kind of limit: its tightest component (least headroom relative to its limit), how
    many breach and for how long. ``base``: the baseline's components, to give each kind's
    worst component its own baseline headroom (the report compares one component, never the
    scenario's worst against the baseline's worst)."""
    before = {(c.kind, c.id): c.min_headroom for c in base or [] if np.isfinite(c.min_headroom)}
    by_kind: dict[str, list[ComponentResult]] = {}
    for c in comps:
        if np.isfinite(c.min_headroom):
            by_kind.setdefault(c.kind, []).append(c)
    out = []
    for kind, cs in by_kind.items():
        w = min(cs, key=_rel)
        breaching = [c for c in cs if c.time_over_s > 0]
        firsts = [c.first_breach for c in breaching if c.first_breach]
        out.append(
            KindSummary(
                kind=kind,  # type: ignore[arg-type]
                unit=w.unit,
                components=len(cs),
                worst_id=w.id,
                worst_min_headroom=w.min_headroom,
                worst_baseline_min_headroom=before.get((w.kind, w.id)),
                breaching=len(breaching),
                time_over_s=max((c.time_over_s for c in breaching), default=0.0),
                component_over_s=sum(c.time_over_s for c in breaching),
                first_breach=min(firsts) if firsts else None,
            )
        )
    return out


def compare(
    base: list[ComponentResult], scen: list[ComponentResult], tol: Tolerance, dt_s: float
) -> list[ComponentChange]:
    """Every component whose headroom the scenario moved, with what kind of change it is."""
    before = {(c.kind, c.id): c for c in base}
    out = []
    for c in scen:
        b = before.get((c.kind, c.id))
        b_min = b.min_headroom if b is not None else np.inf
        b_over = b.time_over_s if b is not None else 0.0
        if not (np.isfinite(c.min_headroom) or np.isfinite(b_min)):
            continue
        scale = max(abs(c.limit), 1.0)
        delta = c.min_headroom - b_min if np.isfinite(b_min) else -np.inf
        worse_time = c.time_over_s > b_over + dt_s / 2
        added_s = c.time_over_s - b_over
        if c.time_over_s > 0 and b_over == 0:
            change = "new breach" if c.time_over_s >= tol.min_breach_s else "short breach"
        elif b_over > 0 and (worse_time or delta < -EPS * scale):
            deeper = delta < -max(tol.of(c.kind, c.limit), EPS * scale)
            if added_s >= tol.min_breach_s or deeper:
                change = "worse breach"
            else:
                change = "short breach" if worse_time else "already breaching"
        elif b_over > 0:
            change = "already breaching"
        elif delta < -max(tol.of(c.kind, c.limit), EPS * scale):
            change = "less headroom"
        elif abs(delta) <= EPS * scale:
            continue
        else:
            change = "more headroom" if delta > 0 else "within tolerance"
        out.append(
            ComponentChange(
                kind=c.kind,
                id=c.id,
                unit=c.unit,
                limit=c.limit,
                baseline_min_headroom=float(b_min) if np.isfinite(b_min) else c.min_headroom,
                min_headroom=c.min_headroom,
                delta=float(delta) if np.isfinite(delta) else 0.0,
                baseline_time_over_s=b_over,
                time_over_s=c.time_over_s,
                change=change,
                first_breach=c.first_breach,
            )
        )
    order = {
        "new breach": 0,
        "worse breach": 1,
        "short breach": 2,
        "less headroom": 3,
        "already breaching": 4,
        "within tolerance": 5,
        "more headroom": 6,
    }
    out.sort(key=lambda x: (order[x.change], x.delta / max(abs(x.limit), 1.0)))
    return out


#: The kinds of change that decide a verdict, most serious first, and the verdict each gives.
DECIDING = {
    "new breach": "does not fit",
    "worse breach": "does not fit",
    "short breach": "fits with risks",
    "less headroom": "fits with risks",
}


def _example(w: ComponentChange) -> str:
    """One component's change in a clause: its kind and id, headroom before and after (in K for
    temperatures), and its time over the limit."""
    unit = headroom_unit(w.unit)
    over = (
        f", over the limit {_dur(w.baseline_time_over_s)} -> {_dur(w.time_over_s)}"
        if w.baseline_time_over_s
        else f", {_dur(w.time_over_s)} over the limit"
        if w.time_over_s
        else ""
    )
    return (
        f"{w.kind} {w.id}: min headroom {num(w.baseline_min_headroom)} -> "
        f"{num(w.min_headroom)} {unit}{over}"
    )


def verdict(changes: list[ComponentChange]) -> tuple[str, list[str]]:
    """The verdict and its reasons, from the scenario's changes against the recording."""
    reasons: list[str] = []
    by: dict[str, list[ComponentChange]] = {}
    for ch in changes:
        by.setdefault(ch.change, []).append(ch)
    for what in DECIDING:
        cs = by.get(what, [])
        if not cs:
            continue
        kinds = sorted({c.kind for c in cs})
        w = cs[0]
        label = "breach shorter than the duration tolerance" if what == "short breach" else what
        reasons.append(
            f"{label}: {len(cs)} component(s) ({', '.join(kinds)}); e.g. {_example(w)}"
            + (f", first at {w.first_breach:%Y-%m-%d %H:%M} UTC" if w.first_breach else "")
        )
    decided = next((DECIDING[w] for w in DECIDING if by.get(w)), None)
    if decided is not None:
        return decided, reasons
    reasons.append("no component loses more headroom than the tolerance; no new breach")
    return "fits", reasons


def headline(verdict_: str, changes: list[ComponentChange]) -> str:
    """The verdict's reason in one line, for the report's summary: the change that decided it
    (the first of its kind in ``changes``, which :func:`compare` sorts most serious first)."""
    if verdict_ == "baseline":
        return "the recording as it happened"
    for what, gives in DECIDING.items():
        if gives != verdict_:
            continue
        cs = [c for c in changes if c.change == what]
        if not cs:
            continue
        w = cs[0]
        more = f" (and {len(cs) - 1} more)" if len(cs) > 1 else ""
        if what == "short breach":
            extra = _dur(w.time_over_s - w.baseline_time_over_s)
            return (
                f"{w.kind} {w.id} over its limit for only {extra}"
                f" (shorter than the duration tolerance){more}"
            )
        return f"{what}: {_example(w)}{more}"
    if verdict_ == "fits":
        return "no component loses more headroom than the tolerance; no new breach"
    return "see the scenario's section"


def headroom_unit(unit: str) -> str:
    """The unit of a headroom or a difference: kelvin for a temperature (°C) limit."""
    return "K" if unit == "°C" else unit


def num(v: float, digits: int = 1) -> str:
    """A figure with thousands separators and ``digits`` decimals, never "-0.0"."""
    text = f"{v:,.{digits}f}"
    if text.startswith("-") and float(text[1:].replace(",", "")) == 0:
        text = text[1:]
    return text


def _dur(s: float) -> str:
    """A duration for a sentence: seconds under a minute, minutes under two hours, else hours."""
    if s < 60:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
