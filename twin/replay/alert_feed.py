"""The alerts a rule file would have sent over a what-if run, evaluated each minute.

An entity whose value never meets any rule's condition on its metric can neither fire nor need
a resolve, so only the others are kept and handed to the engine: at 10,000 GPUs that is a
handful of series instead of millions of observations, and the GPU chunks of the run can
offer their values one chunk at a time.
"""

from __future__ import annotations

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

__all__ = ["M_CDU_FREE", "M_GPU_K", "M_PHASE_A", "M_PUMPS", "AlertFeed"]


class AlertFeed:
    def __init__(self, rules: Any, d: Recording) -> None:
        self.rules = rules
        self.d = d
        self.rows = np.arange(0, d.n, max(1, round(60.0 / d.dt_s)))
        self.watched: list[tuple[str, str, str, np.ndarray]] = []
        self._index = rules.index() if rules is not None else {}

    def offer(self, metric: str, kind: str, ids: list[str], values: np.ndarray) -> None:
        """values (T, N): keep the columns that meet some rule's condition at some minute."""
        if self.rules is None:
            return
        from twin.alerts.rules import OPS

        conds = [(r.op, r.value) for r in self._index.get((metric, kind), ()) if r.op is not None]
        if not conds:
            return
        vals = np.asarray(values, dtype=float)[self.rows]
        hit = np.zeros(vals.shape[1], bool)
        with np.errstate(invalid="ignore"):
            for op, value in conds:
                hit |= OPS[op](vals, value).any(axis=0)
        self.watched += [(metric, kind, ids[j], vals[:, j]) for j in np.flatnonzero(hit)]

    def evaluate(self) -> list[dict[str, Any]]:
        if self.rules is None:
            return []
        from twin.alerts import AlertEngine, Observation, Topology

        times = self.d.times()
        engine = AlertEngine(
            self.rules, Topology.from_site(self.d.site), None, clock=lambda: times[-1]
        )
        sent: list[dict[str, Any]] = []
        for i, k in enumerate(self.rows):
            now = times[k]
            obs = [
                Observation(metric=m, entity_kind=kind, entity_id=sid, value=float(v[i]), ts=now)
                for m, kind, sid, v in self.watched
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
