"""Fit the GPU power curve to a real nvidia-smi log (utilization -> power) and report its error.

The log is not part of the repository (no licence was seen): pass its path. Expected columns,
as written by ``nvidia-smi --query-gpu=timestamp,name,utilization.gpu,utilization.memory,
memory.used,power.draw --format=csv -l 1``.

    python bench/fit_rtx4090.py ../shared/reference/nvidia_smi/rtx4090_1hz_load_cycle.csv
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from models import fit_quality
from models.gpu_power import (
    CURVE_KINDS,
    curve_power_w,
    fit_power_curve,
    fit_saturating,
    fit_two_level,
    fit_util_power_curve,
    gpu_power_w,
)


def load(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, skipinitialspace=True)
    df.columns = [c.strip() for c in df.columns]
    util = df["utilization.gpu [%]"].str.rstrip(" %").astype(float)
    power = df["power.draw [W]"].str.rstrip(" W").astype(float)
    return pd.DataFrame({"util_pct": util, "power_w": power})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path, help="nvidia-smi CSV log")
    ap.add_argument(
        "--limit-w",
        type=float,
        default=450.0,
        help="enforced power limit of the GPU (RTX 4090 default: 450 W)",
    )
    ap.add_argument(
        "--max-rel-stderr",
        type=float,
        default=0.01,
        help="identifiability threshold of fit_power_curve (its default: 0.01)",
    )
    ap.add_argument(
        "--holdout",
        type=float,
        default=0.25,
        help="last fraction of the log held out to score the fit",
    )
    args = ap.parse_args()
    df = load(args.csv)
    n = len(df)
    split = int(n * (1 - args.holdout))
    act = (df["util_pct"].to_numpy() / 100.0)[:, None]
    pw = df["power_w"].to_numpy()[:, None]
    fit = fit_power_curve(
        act[:split], pw[:split], np.array([args.limit_w]), max_rel_stderr=args.max_rel_stderr
    )
    out: dict[str, object] = {
        "samples": n,
        "fit_samples": split,
        "util_range_pct": [float(df.util_pct.min()), float(df.util_pct.max())],
        "power_range_w": [float(df.power_w.min()), float(df.power_w.max())],
        "usable": bool(fit.usable[0]),
        "reason": fit.reason[0],
        "idle_w": float(fit.idle_w[0]),
        "limit_w": float(fit.limit_w[0]),
        "gamma": float(fit.gamma[0]),
        "fit_mae_w": float(fit.mae_w[0]),
    }
    if np.isfinite(fit.idle_w[0]):
        pred = np.minimum(
            gpu_power_w(act, fit.idle_w[0], fit.limit_w[0], fit.gamma[0]), args.limit_w
        )
        for name, sl in (("fit", slice(0, split)), ("holdout", slice(split, None))):
            q = fit_quality.fit_quality(pw[sl], pred[sl])
            out[name] = {
                "mae_w": float(q.mae[0]),
                "cv_rmse": float(q.cv_rmse[0]),
                "nmbe": float(q.nmbe[0]),
                "mape": float(q.mape[0]),
            }
        busy = act[:, 0] > 0.05
        err = np.abs(pred[split:, 0] - pw[split:, 0])
        out["holdout_mae_busy_w"] = float(np.mean(err[busy[split:]]))
        out["holdout_mae_idle_w"] = float(np.mean(err[~busy[split:]]))
    # For comparison on the same split: the linear model of existing twins (RAPS, gamma = 1)
    # and a two-level model (idle below 5 % utilization, a busy level above).
    a = np.c_[np.ones(split), act[:split, 0]]
    coef, *_ = np.linalg.lstsq(a, pw[:split, 0], rcond=None)
    lin = coef[0] + coef[1] * act[:, 0]
    out["linear"] = {
        "idle_w": float(coef[0]),
        "full_w": float(coef.sum()),
        "holdout_mae_w": float(np.mean(np.abs(lin[split:] - pw[split:, 0]))),
    }
    busy = act[:, 0] > 0.05
    lv = np.where(busy, np.mean(pw[:split, 0][busy[:split]]), np.mean(pw[:split, 0][~busy[:split]]))
    out["two_level"] = {
        "idle_w": float(lv[~busy][0]) if (~busy).any() else None,
        "busy_w": float(lv[busy][0]) if busy.any() else None,
        "holdout_mae_w": float(np.mean(np.abs(lv[split:] - pw[split:, 0]))),
    }
    out["kinds"] = util_kinds(act[:, 0], pw[:, 0], split, args.limit_w)
    print(json.dumps(out, indent=1))


def util_kinds(util: np.ndarray, power: np.ndarray, split: int, limit_w: float) -> dict:
    """Each curve family of models.gpu_power fitted on [0, split) and scored on the rest, and
    the family fit_util_power_curve chooses from [0, split) alone (its own time-blocked split:
    the last quarter of that part), as calibration does."""
    fits = {
        "power_law": fit_util_power_curve(util[:split], power[:split], limit_w, min_gain=np.inf),
        "two_level": fit_two_level(util[:split], power[:split]),
        "saturating": fit_saturating(util[:split], power[:split]),
    }
    res: dict[str, object] = {}
    for name, f in fits.items():
        row: dict[str, object] = {"usable": bool(f.usable[0]), "reason": f.reason[0]}
        if f.usable[0]:
            pred = curve_power_w(f.kind, util, f.idle_w, f.limit_w, f.shape, limit_w)
            row |= {
                "idle_w": float(f.idle_w[0]),
                "limit_w": float(f.limit_w[0]),
                "shape": float(f.shape[0]),
                "holdout_mae_w": float(np.mean(np.abs(pred[split:] - power[split:]))),
            }
        res[name] = row
    chosen = fit_util_power_curve(util[:split], power[:split], limit_w)
    pred = curve_power_w(chosen.kind, util, chosen.idle_w, chosen.limit_w, chosen.shape, limit_w)
    res["chosen"] = {
        "kind": CURVE_KINDS[int(chosen.kind[0])],
        "usable": bool(chosen.usable[0]),
        "inner_holdout_mae_w": dict(
            zip(CURVE_KINDS, map(float, chosen.holdout_mae_w[0]), strict=True)
        ),
        "holdout_mae_w": float(np.mean(np.abs(pred[split:] - power[split:]))),
    }
    return res


if __name__ == "__main__":
    main()
