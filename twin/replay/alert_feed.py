"""The alerts a rule file would have sent over a what-if run, evaluated each minute.

The replay offers every metric the live detector (:func:`twin.analysis.detect.observations`) emits
that a rule watches: the headroom now of every limit, its time-to-breach forecast
(:mod:`twin.chain.breach`, computed per minute from the data up to it), running pumps, and
the residuals and drift :mod:`twin.replay.hotspot_feed` computes. The same
:class:`twin.alerts.AlertEngine` evaluates them minute by
minute, so the pages listed are the pages the service would have sent.

An entity whose value never meets any rule's condition on its metric can neither fire nor need
a resolve, so only the others are kept and handed to the engine: at 10,000 GPUs that is a
handful of series instead of millions of observations, and the GPU chunks of the run can
offer their values one chunk at a time.

Offering values::

    feed.offer(metric, kind, ids, values_TxN)         # every recording step; sampled per minute
    feed.offer_series(metric, kind, ids, values_MxN)  # already one row per evaluation minute
                                                      # (feed.rows / feed.eval_times); NaN: no
                                                      # observation that minute
    feed.wants(metric, kind)                          # some rule watches it: worth computing
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np

from twin.alerts.metrics import (
    CDU_PUMPS_RUNNING as M_PUMPS,
)
from twin.alerts.metrics import (
    HEADROOM_CDU_FREE_FRACTION as M_CDU_FREE,
)
from twin.alerts.metrics import (
    HEADROOM_GPU_K_TO_SLOWDOWN as M_GPU_K,
)
from twin.alerts.metrics import (
    HEADROOM_PDU_PHASE_A_TO_LIMIT as M_PHASE_A,
)
from twin.replay.recording import Recording

__all__ = [
    "M_CDU_FREE",
    "M_GPU_K",
    "M_PHASE_A",
    "M_PUMPS",
    "AlertFeed",
]


class AlertFeed:
    def __init__(self, rules: Any, d: Recording) -> None:
        self.rules = rules
        self.d = d
        #: the recording rows evaluated: one per minute
        self.rows = np.arange(0, d.n, max(1, round(60.0 / d.dt_s)))
        self.watched: list[tuple[str, str, str, np.ndarray]] = []
        #: labels of watched series, by index in :attr:`watched`: name -> one value per minute
        self.labels: dict[int, dict[str, list[str]]] = {}
        #: residual series' excess over the model [K], by index in :attr:`watched`
        self.excess: dict[int, np.ndarray] = {}
        #: per watched series, the minutes where some rule's firing condition holds (M,)
        self.hot: list[np.ndarray] = []
        self._index = rules.index() if rules is not None else {}

    @property
    def eval_times(self) -> list[datetime]:
        """The evaluation times, one per row of :attr:`rows` (aware UTC)."""
        times = self.d.times()
        return [times[k] for k in self.rows]

    def wants(self, metric: str, kind: str) -> bool:
        """Some rule watches ``metric`` on ``kind``: worth computing."""
        return bool(self._index.get((metric, kind)))

    def offer(self, metric: str, kind: str, ids: list[str], values: np.ndarray) -> None:
        """values (T, N), one row per recording step: sampled at each evaluation minute."""
        if not self.wants(metric, kind):
            return
        self.offer_series(metric, kind, ids, np.asarray(values, dtype=float)[self.rows])

    def offer_series(
        self,
        metric: str,
        kind: str,
        ids: list[str],
        values: np.ndarray,
        labels: dict[str, Any] | None = None,
        label_format: dict[str, str] | None = None,
        excess: np.ndarray | None = None,
    ) -> None:
        """values (M, N), one row per evaluation minute (:attr:`rows`); NaN: no observation.
        ``excess`` (M, N): a residual metric's excess in K (:attr:`Observation.excess`).

        ``labels``: observation labels by name, each either one text per minute (a list of M
        strings, the same for every id) or per column, an (M, N) numeric array rendered with
        ``label_format[name]`` (a :func:`format` spec, default ``"g"``; NaN: the label is
        left empty). Only the columns kept have their labels rendered.

        Keeps the columns that meet some rule's condition at some minute.
        """
        if self.rules is None:
            return
        from twin.alerts.rules import OPS

        conds = [(r.op, r.value) for r in self._index.get((metric, kind), ()) if r.op is not None]
        if not conds:
            return
        vals = np.asarray(values, dtype=float)
        m = len(self.rows)
        if vals.shape != (m, len(ids)):
            raise ValueError(
                f"offer_series({metric!r}): values of shape {vals.shape}, expected"
                f" ({m}, {len(ids)}): one row per evaluation minute, one column per id"
            )
        per_col: dict[str, np.ndarray] = {}
        shared: dict[str, list[str]] = {}
        for name, lab in (labels or {}).items():
            if isinstance(lab, np.ndarray) and lab.ndim == 2:
                if lab.shape != vals.shape:
                    raise ValueError(
                        f"offer_series({metric!r}): label {name!r} of shape {lab.shape},"
                        f" expected {vals.shape} (one value per minute and id)"
                    )
                per_col[name] = lab
            else:
                if len(lab) != m:
                    raise ValueError(
                        f"offer_series({metric!r}): label {name!r} has {len(lab)} values,"
                        f" expected {m} (one per evaluation minute)"
                    )
                shared[name] = list(lab)
        fmt = label_format or {}
        hot = np.zeros(vals.shape, bool)
        with np.errstate(invalid="ignore"):
            for op, value in conds:
                hot |= OPS[op](vals, value)
        for j in np.flatnonzero(hot.any(axis=0)):
            col = dict(shared)
            for name, lab in per_col.items():
                spec = fmt.get(name, "g")
                col[name] = [format(float(x), spec) if np.isfinite(x) else "" for x in lab[:, j]]
            if col:
                self.labels[len(self.watched)] = col
            if excess is not None:
                self.excess[len(self.watched)] = np.asarray(excess[:, j], dtype=float)
            self.hot.append(hot[:, j])
            self.watched.append((metric, kind, ids[j], vals[:, j]))

    def extend(self, other: AlertFeed) -> None:
        """Watch ``other``'s series too, with their labels, excess and hot minutes (a run that
        reuses another's GPU pass)."""
        at = len(self.watched)
        self.labels.update({at + j: lab for j, lab in other.labels.items()})
        self.excess.update({at + j: x for j, x in other.excess.items()})
        self.hot += other.hot
        self.watched += other.watched

    def evaluate(self, *, every: bool = False) -> list[dict[str, Any]]:
        """The notifications the live engine sends over the run, minute by minute.

        A minute's observations are the watched series that meet some rule's firing condition
        then, and those with an open alert (:meth:`twin.alerts.AlertEngine.open_series`); any
        other observation is one the engine would pass over without a change, and a minute
        with none while the engine is quiet (:meth:`twin.alerts.AlertEngine.quiet`) is not
        evaluated. ``every``: hand the engine every finite value at every minute instead (the
        same notifications, several times the work: the test holds them equal)."""
        if self.rules is None:
            return []
        from twin.alerts import AlertEngine, Observation, Topology

        times = self.d.times()
        engine = AlertEngine(
            self.rules, Topology.from_site(self.d.site), None, clock=lambda: times[-1]
        )
        sent: list[dict[str, Any]] = []
        # every watched series' values as Python floats, minute by minute, and where they are
        # finite: read once, not one numpy scalar per series and minute
        m_rows = len(self.rows)
        vals = (
            np.stack([np.asarray(v, dtype=float) for *_, v in self.watched], axis=1)
            if self.watched
            else np.zeros((m_rows, 0))
        )
        seen = np.isfinite(vals)
        hot = np.stack(self.hot, axis=1) if self.hot else np.zeros((m_rows, 0), bool)
        wanted = seen if every else seen & hot
        series: dict[tuple[str, str, str], list[int]] = {}
        for j, (m, kind, sid, _) in enumerate(self.watched):
            series.setdefault((m, kind, sid), []).append(j)
        excess = {j: np.asarray(x, dtype=float).tolist() for j, x in self.excess.items()}
        for i, k in enumerate(self.rows):
            now = times[k]
            row = vals[i].tolist()
            cols = set(np.flatnonzero(wanted[i]).tolist())
            if not every:
                for key in engine.open_series():
                    cols.update(j for j in series.get(key, ()) if seen[i, j])
            if not cols and not every and engine.quiet():
                continue  # nothing observed and nothing open: the engine would do nothing
            obs = []
            for j in sorted(cols):
                m, kind, sid, _ = self.watched[j]
                ex = excess.get(j)
                obs.append(
                    Observation(
                        metric=m,
                        entity_kind=kind,  # type: ignore[arg-type]
                        entity_id=sid,
                        value=row[j],
                        excess=ex[i] if ex is not None else None,
                        ts=now,
                        labels={name: x[i] for name, x in self.labels.get(j, {}).items()},
                    )
                )
            for note in engine.evaluate(obs, now=now):
                sent.append(
                    {
                        "at": now.isoformat(),
                        "status": note.status,
                        "rule": note.rule,
                        "severity": note.severity,
                        "group": f"{note.group.kind} {note.group.id}",
                        "summary": note.summary,
                        "repeat": note.repeat,
                        "flapping": note.flapping,
                    }
                )
        return sent
