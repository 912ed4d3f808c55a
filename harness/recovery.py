"""Calibration against known truth: how many devices' parameters a calibration identified and
how far each is from the value that produced the data (the simulator's ``truth()``).

Used by ``bench/recover_site.py`` (whole-site recovery report) and the recovery acceptance
test (tests/test_recover_demo.py); it is not shipped in the wheel. The tolerances are issue
3's: R within 5 %, C within 15 %, idle and limit power within 3 %, capture fraction within
0.02; held-out prediction: GPU temperature 10 min ahead MAE <= 1 K, rack power MAPE <= 2 %,
CDU return temperature MAE <= 0.5 K.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

from twin.ingest import Ingester, IngestLimits
from twin.site import Site
from twin.store import Store

#: A fixed start makes a run reproducible (the workload follows the time of day and weekday).
DEFAULT_START = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)

#: (kind, fitted parameter, truth section, truth key, relative?, tolerance)
CHECKS = [
    ("gpu", "r_k_per_w", "gpus", "r_k_per_w", True, 0.05),
    ("gpu", "c_j_per_k", "gpus", "c_j_per_k", True, 0.15),
    ("gpu", "mem_r_k_per_w", "gpus", "mem_r_k_per_w", True, 0.05),
    ("gpu", "mem_c_j_per_k", "gpus", "mem_c_j_per_k", True, 0.15),
    ("gpu", "idle_w", "gpus", "idle_w", True, 0.03),
    ("gpu", "limit_w", "gpus", "limit_w", True, 0.03),
    ("rack", "capture_fraction", "racks", "capture_fraction", False, 0.02),
]
#: (kind, quantity prefix, metric, limit)
PREDICTION = [
    ("gpu", "temp_c@600s", "mae", 1.0),
    ("rack", "", "mape", 0.02),
    ("cdu", "", "mae", 0.5),
]


class Simulation(Protocol):
    """What :func:`ingest_simulation` needs of a simulator (``SiteSimulator`` is one)."""

    def step(self) -> list[tuple[str, bytes]]: ...

    def truth(self) -> dict[str, Any]: ...


def ingest_simulation(
    store: Store,
    site: Site,
    sim: Simulation,
    seconds: float,
) -> dict[str, Any]:
    """Step ``sim`` (1 Hz) for ``seconds`` and ingest its messages into ``store`` through the
    normal ingest path, in batches of about 20,000 messages; return the simulator's truth."""
    ingester = Ingester(store, site, IngestLimits(max_past_s=0))
    batch: list[tuple[str, bytes]] = []
    for _ in range(round(seconds)):
        batch.extend(sim.step())
        if len(batch) >= 20_000:
            ingester.ingest(batch)
            batch = []
    ingester.ingest(batch)
    return sim.truth()


def compare(result: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Per parameter: devices, usable, worst error and the devices outside the tolerance."""
    by_key = {(p["kind"], p["param"], p["id"]): p for p in result["params"]}
    report: dict[str, Any] = {}
    for kind, param, section, key, relative, tol in CHECKS:
        misses, unusable, worst = [], [], 0.0
        devices = truth[section]
        if section == "racks":  # air-cooled racks capture nothing and are not fitted
            devices = {k: v for k, v in devices.items() if v[key] > 0}
        for dev, t in devices.items():
            p = by_key.get((kind, param, dev))
            if p is None or not p["usable"] or p["value"] is None:
                unusable.append((dev, None if p is None else p["reason"]))
                continue
            ident = by_key.get((kind, "capture_identifiable", dev))
            if param == "capture_fraction" and ident is not None and not ident["value"]:
                unusable.append((dev, p["reason"]))  # a prior-weighted share, not a fit
                continue
            err = p["value"] / t[key] - 1.0 if relative else p["value"] - t[key]
            worst = max(worst, abs(err))
            if abs(err) > tol:
                misses.append((dev, round(err, 4), p["stderr"]))
        report[param] = {
            "devices": len(devices),
            "usable": len(devices) - len(unusable),
            "worst_error": round(worst, 4),
            "tolerance": tol,
            "relative": relative,
            "misses": misses,
            "unusable": unusable[:10],
        }
    for kind, prefix, metric, limit in PREDICTION:
        rows = [
            q
            for q in result["quality"]
            if q["kind"] == kind and q["quantity"].startswith(prefix) and q[metric] is not None
        ]
        worst_q = max((q[metric] for q in rows), default=None)
        report[f"{kind}:{prefix or 'all'}:{metric}"] = {
            "devices": len(rows),
            "worst": None if worst_q is None else round(worst_q, 4),
            "limit": limit,
            "misses": [(q["id"], round(q[metric], 4)) for q in rows if q[metric] > limit],
        }
    return report
