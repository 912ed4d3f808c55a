"""Backtest the load forecast on real load: 25 CDU power channels of a liquid-cooled
supercomputer and their total, 24 h at 15 s (sample_telemetry/frontier_25cdu_power_oa_wetbulb_
15s_24h.csv, MIT, (c) 2024 Hewlett Packard Enterprise; see its NOTICE).

    PYTHONPATH=. .venv/bin/python bench/bench_forecast_frontier.py [--json FILE]

Rolling origins every ``--origin-every`` s from ``--first-origin`` s into the day; at each, the
forecast (:func:`models.forecast.backtest`, training model: an HPC machine's load is jobs, a
level with steps, not a daily cycle) sees only the data before the origin and is scored on the
next 15 min and 1 h against persistence (the last value). Its 90 % interval (p05-p95) and p90
are scored for coverage. The conformal quantiles need calibration origins with history before
them: the model's default asks one day (for the inference model's daily profile), which 24 h of
data never give (the intervals collapse to the point forecast); here they need 6 h, the
training model's level window (``min_calib_history_s``), with calibration origins every 15 min.

Seasonal-naive at one day is not computable: its first target needs 24 h of history and the
recording is 24 h. No shorter season is justified: the total's autocorrelation has no peak
under 11 h, and one at 11.4-11.9 h would be one cycle, chosen on the data it is scored on.

The series are averaged to 60 s steps first (the backtest's cost grows with the steps; the
service forecasts on 300 s); persistence is the last 60 s mean.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models import forecast as fc  # noqa: E402

DATA = ROOT / "sample_telemetry" / "frontier_25cdu_power_oa_wetbulb_15s_24h.csv"
HORIZONS_S = (900.0, 3600.0)
#: 2024-04-07 00:00 UTC, the day the source file is named after (its `time` column starts at 0)
START_S = 1712448000.0
CALIB = dict(min_calib_history_s=6 * 3600.0, calib_spacing_s=900.0, n_calib=16)
#: the model as shipped, and with the recent-residual correction on the last value (60 s)
VARIANTS = {"default (recent_s 1 h)": {}, "recent_s 60 s": {"recent_s": 60.0}}


def load(step_s: float = 60.0) -> tuple[np.ndarray, list[str]]:
    """``(T, 26)`` kW on a ``step_s`` grid (means of the 15 s rows), channels then the total."""
    head = DATA.open().readline().strip().split(",")
    raw = np.loadtxt(DATA, delimiter=",", skiprows=1)
    cols = [i for i, h in enumerate(head) if h.startswith("power[")]
    if not (raw[1:, 0] - raw[:-1, 0] == 15.0).all():
        raise SystemExit(f"{DATA}: expected a regular 15 s `time` column")
    per = round(step_s / 15.0)
    p = raw[:, cols]
    p = p[: p.shape[0] // per * per].reshape(-1, per, len(cols)).mean(axis=1) / 1e3
    return np.column_stack([p, p.sum(axis=1)]), [head[i] for i in cols] + ["total"]


def run(
    step_s: float = 60.0,
    first_origin_s: float = 8 * 3600.0,
    origin_every_s: float = 900.0,
    variants: dict[str, dict[str, float]] | None = None,
) -> dict:
    """Every figure of the table, as a dict (the test reads this)."""
    y, names = load(step_s)
    out: dict = {"step_s": step_s, "series": names, "rows": []}
    for label, kw in (variants or VARIANTS).items():
        for h_s in HORIZONS_S:
            h = round(h_s / step_s)
            origins = list(
                range(
                    round(first_origin_s / step_s),
                    y.shape[0] - h + 1,
                    round(origin_every_s / step_s),
                )
            )
            t0 = time.perf_counter()
            r = fc.backtest(
                y, START_S, step_s, h, ["training"] * y.shape[1], origins, **CALIB, **kw
            )
            ch = slice(0, y.shape[1] - 1)
            out["rows"].append(
                {
                    "variant": label,
                    "horizon_s": h_s,
                    "origins": len(r.origins),
                    "total_mae_kw": float(r.mae_p50[-1]),
                    "total_persistence_mae_kw": float(r.mae_baseline[-1]),
                    "total_improvement": float(r.improvement[-1]),
                    "channels_median_improvement": float(np.median(r.improvement[ch])),
                    "channels_beating_persistence": int((r.improvement[ch] > 0).sum()),
                    "channels_pooled_improvement": float(
                        1 - np.sum(r.mae_p50[ch] * r.n[ch]) / np.sum(r.mae_baseline[ch] * r.n[ch])
                    ),
                    "coverage_90_channels": float(
                        np.sum(r.coverage_90[ch] * r.n[ch]) / np.sum(r.n[ch])
                    ),
                    "coverage_90_total": float(r.coverage_90[-1]),
                    "below_p90_channels": float(
                        np.sum(r.below_p90[ch] * r.n[ch]) / np.sum(r.n[ch])
                    ),
                    "below_p90_total": float(r.below_p90[-1]),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
    out["seasonal_naive_daily"] = (
        "not computable: 24 h of data, a daily season needs 24 h of history"
    )
    return out


def table(res: dict) -> str:
    lines = [
        "| model | horizon | origins | total MAE (kW) | persistence MAE (kW) | total vs persistence"
        " | channels: median vs persistence (beating) | 90 % interval coverage: channels / total"
        " | under p90: channels / total | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['variant']} | {r['horizon_s'] / 60:.0f} min | {r['origins']}"
            f" | {r['total_mae_kw']:.0f} | {r['total_persistence_mae_kw']:.0f}"
            f" | {r['total_improvement']:+.0%} | {r['channels_median_improvement']:+.0%}"
            f" ({r['channels_beating_persistence']}/25) | {r['coverage_90_channels']:.0%} /"
            f" {r['coverage_90_total']:.0%} | {r['below_p90_channels']:.0%} /"
            f" {r['below_p90_total']:.0%} | {r['seconds']:.0f} |"
        )
    lines.append(f"\nseasonal-naive (daily): {res['seasonal_naive_daily']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step", type=float, default=60.0, help="grid step [s], a multiple of 15")
    ap.add_argument("--first-origin", type=float, default=8 * 3600.0, help="[s] into the day")
    ap.add_argument("--origin-every", type=float, default=900.0, help="[s]")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    res = run(a.step, a.first_origin, a.origin_every)
    print(table(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
