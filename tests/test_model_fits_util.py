"""Power curves from GPU-Util alone (models.gpu_power, docs/physics.md §1.3.1).

Synthetic on/off and saturating util data with known parameters, vectorized over GPUs, with
gaps; 1-D input; refusals with reasons; the family chosen on held-out error; and the real RTX
4090 nvidia-smi log (read in place from ../shared, skipped when absent).
"""

from __future__ import annotations

import numpy as np
import pytest

from models import gpu_power as gp
from models.gpu_power import CURVE_KINDS

from .helpers import REPO

RTX4090_LOG = REPO.parent / "shared" / "reference" / "nvidia_smi" / "rtx4090_1hz_load_cycle.csv"
#: held-out MAE of a straight line in util on the last 25 % of that log (bench/README.md)
LINEAR_HOLDOUT_MAE_W = 20.8


def on_off_util(rng: np.random.Generator, n_t: int, n: int, idle_frac: float = 0.3) -> np.ndarray:
    """(T, N) GPU-Util of jobs that start and stop: 0-2 % between jobs, 85-100 % during."""
    util = np.empty((n_t, n))
    for j in range(n):
        t, busy = 0, False
        while t < n_t:
            dwell = int(rng.integers(30, 200))
            lo, hi = (0.85, 1.0) if busy else (0.0, 0.02)
            util[t : t + dwell, j] = rng.uniform(lo, hi, min(dwell, n_t - t))
            t += dwell
            busy = rng.random() > idle_frac
    return np.round(util, 2)


def test_two_level_recovered_per_gpu_with_gaps() -> None:
    rng = np.random.default_rng(3)
    n_t, idle, busy = 4000, np.array([30.0, 60.0, 90.0]), np.array([280.0, 400.0, 330.0])
    u = on_off_util(rng, n_t, 3)
    p = np.where(u > 0.1, busy, idle) * (1 + 0.02 * rng.standard_normal((n_t, 3)))
    u[rng.random((n_t, 3)) < 0.05] = np.nan  # missing readings
    p[rng.random((n_t, 3)) < 0.05] = np.nan
    f = gp.fit_two_level(u, p)
    assert f.usable.all(), f.reason
    np.testing.assert_allclose(f.idle_w, idle, rtol=0.01)
    np.testing.assert_allclose(f.limit_w, busy, rtol=0.01)
    assert ((f.shape > 0.02) & (f.shape < 0.85)).all()  # any threshold between the two bands
    assert (f.idle_stderr_w > 0).all() and (f.limit_stderr_w > 0).all()
    # one GPU as a 1-D series gives the same numbers as its column
    one = gp.fit_two_level(u[:, 1], p[:, 1])
    assert one.idle_w.shape == (1,)
    np.testing.assert_allclose(one.idle_w, f.idle_w[1:2])
    np.testing.assert_allclose(one.limit_w, f.limit_w[1:2])


def test_saturating_recovered() -> None:
    rng = np.random.default_rng(4)
    n_t = 5000
    u = np.round(np.clip(rng.beta(0.6, 0.6, (n_t, 2)), 0, 1), 2)
    truth = {"idle": np.array([40.0, 70.0]), "limit": np.array([300.0, 650.0])}
    u0 = np.array([0.1, 0.25])
    p = gp.saturating_power_w(u, truth["idle"], truth["limit"], u0)
    p = p + rng.normal(0.0, 3.0, p.shape)
    f = gp.fit_saturating(u, p)
    assert f.usable.all(), f.reason
    assert (f.kind == gp.SATURATING).all()
    np.testing.assert_allclose(f.idle_w, truth["idle"], rtol=0.03)
    np.testing.assert_allclose(f.limit_w, truth["limit"], rtol=0.01)
    np.testing.assert_allclose(f.shape, u0, rtol=0.05)
    assert (np.abs(f.shape - u0) < 3 * f.shape_stderr + 1e-3).all()


def test_the_family_is_chosen_on_held_out_error_per_gpu() -> None:
    rng = np.random.default_rng(5)
    n_t = 4000
    u = on_off_util(rng, n_t, 3)
    # GPU 2 sweeps its util evenly: a power law (linear) in util is the right family there
    u[:, 2] = np.round(np.abs(np.sin(np.arange(n_t) / 300.0)), 2)
    p = np.empty((n_t, 3))
    p[:, 0] = np.where(u[:, 0] > 0.05, 290.0, 35.0)
    p[:, 1] = gp.saturating_power_w(u[:, 1], 50.0, 420.0, 0.05)
    p[:, 2] = gp.gpu_power_w(u[:, 2], 60.0, 450.0, 1.0)
    p = p * (1 + 0.01 * rng.standard_normal(p.shape))
    f = gp.fit_util_power_curve(u, p, np.array([450.0, 450.0, 450.0]))
    assert f.usable.all(), f.reason
    assert CURVE_KINDS[int(f.kind[0])] in ("two_level", "saturating")
    assert CURVE_KINDS[int(f.kind[2])] == "power_law"
    assert f.holdout_mae_w.shape == (3, 3)
    # the choice is the least held-out error (the power law within min_gain kept)
    for j in range(3):
        k = int(f.kind[j])
        assert f.holdout_mae_w[j, k] == np.nanmin(f.holdout_mae_w[j]) or k == gp.POWER_LAW
    # its prediction from the returned parameters follows the data
    pred = gp.curve_power_w(f.kind, u, f.idle_w, f.limit_w, f.shape, 450.0)
    err = np.nanmean(np.abs(pred - p), axis=0) / np.nanmean(p, axis=0)
    assert (err < 0.03).all(), err


def test_a_gpu_never_busy_is_refused_with_every_familys_reason() -> None:
    rng = np.random.default_rng(6)
    u = np.round(rng.uniform(0.0, 0.02, (1000, 1)), 2)
    p = 30.0 + rng.normal(0, 0.5, u.shape)
    f = gp.fit_util_power_curve(u, p, 450.0)
    assert not f.usable[0]
    assert f.kind[0] == gp.POWER_LAW and np.isnan(f.idle_w[0])
    for name in CURVE_KINDS:
        assert f"{name}:" in f.reason[0]
    assert "busy samples" in f.reason[0]
    with pytest.raises(ValueError, match="holdout_frac"):
        gp.fit_util_power_curve(u, p, holdout_frac=1.0)


def test_curve_power_w_is_the_power_law_where_the_kind_says_so() -> None:
    a = np.linspace(0.0, 1.0, 11)[:, None]
    ref = gp.gpu_power_w(a, 70.0, 700.0, 0.8, 600.0)
    np.testing.assert_array_equal(gp.curve_power_w(0, a, 70.0, 700.0, 0.8, 600.0), ref)
    two = gp.curve_power_w([1], a, 70.0, 300.0, [0.05])
    assert two[0, 0] == 70.0 and (two[1:, 0] == 300.0).all()
    assert np.isnan(gp.curve_power_w([1], [np.nan], 70.0, 300.0, [0.05])).all()


def _log() -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    df = pd.read_csv(RTX4090_LOG, skipinitialspace=True)
    df.columns = [c.strip() for c in df.columns]
    util = df["utilization.gpu [%]"].str.rstrip(" %").astype(float).to_numpy() / 100.0
    power = df["power.draw [W]"].str.rstrip(" W").astype(float).to_numpy()
    return util, power


@pytest.mark.skipif(not RTX4090_LOG.is_file(), reason=f"reference log {RTX4090_LOG} not here")
def test_real_rtx4090_log_gets_a_util_curve_with_the_measured_idle() -> None:
    """Issue 29: the idle power comes from samples idle by GPU-Util and by power (lag-aware),
    not from 0 % samples in the middle of the load or power still decaying after it. On the
    whole log the curve's idle is within 10 % of the measured ~34 W (it was 91.4 W) and its
    blocked cross-validated error beats the straight line; on its first 75 % (no idle minute
    at all) every family is refused and the straight line is published, marked as such."""
    util, power = _log()
    busy = util > 0.05
    settled = [i for i in range(10, len(util)) if not busy[i - 10 : i + 1].any()]
    measured = float(np.median(power[settled]))
    assert 33.0 < measured < 36.0
    f = gp.fit_util_power_curve(util, power, 450.0)
    assert f.usable[0], f.reason
    assert CURVE_KINDS[int(f.kind[0])] != "power_law"
    assert f.idle_w[0] == pytest.approx(measured, rel=0.10)
    assert np.nanmin(f.holdout_mae_w[0]) < LINEAR_HOLDOUT_MAE_W
    # the samples left out of the fit: 0 % or just-after-load GPU-Util at more than idle power
    bad = gp.idle_inconsistent(util, power)[:, 0]
    assert bad.sum() > 0 and (power[bad] > 1.2 * measured).all()
    split = int(0.75 * len(util))
    early = gp.fit_util_power_curve(util[:split], power[:split], 450.0)
    # every family refused there; the straight line in GPU-Util has an identifiable slope and
    # a cross-validated error, so it is what is published, marked as such (issue 29)
    assert early.usable[0] and early.linear is not None and early.linear[0]
    assert early.note is not None and early.note[0].startswith("linear in GPU-Util")
    assert "the curve was refused: power_law: " in early.note[0]
    assert early.shape[0] == 1.0 and np.isfinite(early.holdout_mae_w[0, gp.POWER_LAW])
