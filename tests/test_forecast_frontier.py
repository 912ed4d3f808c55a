"""The load forecast backtested on real load: 25 CDU power channels of a liquid-cooled
supercomputer and their total (sample_telemetry/frontier_25cdu_power_oa_wetbulb_15s_24h.csv,
MIT, (c) 2024 Hewlett Packard Enterprise), at 15 min and 1 h, against persistence.

What it found (bench/README.md has the full table): on this load -- jobs, steps of several MW
within minutes, no daily cycle inside one day -- the forecast loses to persistence. As shipped
(recent-residual correction over the last hour) its 15 min MAE is about 2.3 times
persistence's; with the correction on the last minute's residual it is about 1.1 times. The
90 % intervals cover 77-89 % when calibrated on 6 h of history; with the default (one day)
24 h of data leave no calibration origin and the interval collapses to the point.
"""

from __future__ import annotations

import numpy as np
import pytest

from models import forecast as fc

from .helpers import REPO

DATA = REPO / "sample_telemetry" / "frontier_25cdu_power_oa_wetbulb_15s_24h.csv"
NOTICE = DATA.with_suffix(".NOTICE")
STEP_S = 60.0
START_S = 1712448000.0  # 2024-04-07 00:00 UTC, the day the source file is named after
CALIB = dict(min_calib_history_s=6 * 3600.0, calib_spacing_s=900.0, n_calib=16)


@pytest.fixture(scope="module")
def load_kw() -> np.ndarray:
    """(1440, 26): the 25 channels and the total, 60 s means, kW."""
    head = DATA.open().readline().strip().split(",")
    raw = np.loadtxt(DATA, delimiter=",", skiprows=1)
    assert raw.shape == (5761, 27) and head[0] == "time" and head[-1] == "OA Wetbulb Temp"
    assert (np.diff(raw[:, 0]) == 15.0).all()
    p = raw[:-1, 1:26].reshape(-1, 4, 25).mean(axis=1) / 1e3
    return np.column_stack([p, p.sum(axis=1)])


def test_the_shipped_copy_carries_its_licence_notice():
    text = NOTICE.read_text()
    for must in (
        "HewlettPackard/sustain-lc",
        "input_04-07-24.csv",
        "3a90a08",
        "Copyright (c) 2024 Hewlett Packard Enterprise",
        "MIT License",
        "Permission is hereby granted, free of charge",
        'THE SOFTWARE IS PROVIDED "AS IS"',
    ):
        assert must in text, must


def test_the_load_is_what_the_reference_describes(load_kw):
    total_mw = load_kw[:, -1] / 1e3
    assert 5.0 < total_mw.min() < 5.6 and 26.0 < total_mw.max() < 27.0  # 5.2-26.6 MW (15 s)
    # swings of more than 5 MW within 2 minutes (at 60 s means: between neighbouring minutes)
    assert (np.abs(total_mw[2:] - total_mw[:-2]) > 5).sum() >= 10


def _backtest(y, horizon_s, **kw):
    h = round(horizon_s / STEP_S)
    origins = list(range(round(8 * 3600 / STEP_S), y.shape[0] - h + 1, round(3600 / STEP_S)))
    r = fc.backtest(y, START_S, STEP_S, h, ["training"] * y.shape[1], origins, **CALIB, **kw)
    ch = slice(0, y.shape[1] - 1)
    cov = float(np.sum(r.coverage_90[ch] * r.n[ch]) / np.sum(r.n[ch]))
    below = float(np.sum(r.below_p90[ch] * r.n[ch]) / np.sum(r.n[ch]))
    return r, cov, below


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("horizon_s", "recent_s", "ratio_band"),
    [
        (900.0, None, (1.7, 2.8)),  # as shipped: 2.04 on hourly origins (2.34 on 15 min ones)
        (3600.0, None, (1.2, 1.8)),  # 1.47 on 15 min origins
        (900.0, 60.0, (1.0, 1.25)),  # correction on the last minute: 1.06 (1.11)
        (3600.0, 60.0, (1.0, 1.3)),  # 1.11 on 15 min origins
    ],
)
def test_the_forecast_loses_to_persistence_by_the_margin_found(
    load_kw, horizon_s, recent_s, ratio_band
):
    kw = {} if recent_s is None else {"recent_s": recent_s}
    r, cov, below = _backtest(load_kw, horizon_s, **kw)
    ratio = r.mae_p50 / r.mae_baseline
    lo, hi = ratio_band
    # the total within the band found, and every channel worse than persistence
    assert lo < ratio[-1] < hi, ratio[-1]
    assert (ratio > 1.0).all(), ratio
    # nominal 0.90 for the p05-p95 interval and for the share under p90; observed on the
    # channels pooled 0.77-0.89: the band is 0.70-0.97 (the interval runs narrow, not wide)
    assert 0.70 <= cov <= 0.97, cov
    assert 0.70 <= below <= 0.97, below


def test_with_the_default_calibration_24_h_give_no_interval(load_kw):
    """The conformal quantiles need calibration origins with one day of data before them by
    default: 24 h of history has none, and the interval is the point forecast."""
    f = fc.forecast(load_kw, START_S, STEP_S, 15, ["training"] * 26)
    assert f.n_calib == 0 and np.array_equal(f.p05, f.p95)
    g = fc.forecast(load_kw, START_S, STEP_S, 15, ["training"] * 26, **CALIB)
    assert g.n_calib == 16 and (g.p95 > g.p05).all()


def test_daily_seasonal_naive_has_no_history_here(load_kw):
    """A daily season needs a day of history before each target: with 24 h the baseline falls
    back to persistence even for an inference series -- seasonal-naive is not computable."""
    hist = load_kw[:-60]
    out = fc.seasonal_naive(hist, START_S, STEP_S, 60, ["inference"] * 26)
    assert np.array_equal(out, np.broadcast_to(hist[-1], out.shape))
