"""The trend of a PDU phase's current that the load of the racks it feeds does not explain.

Load creeping onto a phase (a server moved onto it, a failing PSU shifting its share) raises the
phase's current while the racks' power stays; the live headroom (``twin.analysis.headroom``) and a
replay's forecast (``twin.chain.breach``) both forecast a phase by its present current x the
load ratio plus this trend, fitted here for one phase or for every (minute, phase) pair of a
replay at once. docs/physics.md §11.3 gives the model and the evidence for each term.
"""

from __future__ import annotations

import warnings

import numpy as np

from twin.blocks import in_order

__all__ = ["LEVEL_WINDOW_S", "TREND_COLUMNS", "TREND_WINDOW_S", "unexplained_trend"]

#: Window of the phase-current trend. [s]
TREND_WINDOW_S = 900.0
#: Window before the trend's whose highest current a rising trend must exceed (the rest of the
#: hour the headroom loads). [s]
LEVEL_WINDOW_S = 2700.0
#: Columns (phases, or a replay's minute x phase pairs) fitted per block of the trend fit.
TREND_COLUMNS = 8192


def _inv_sym(a: np.ndarray) -> np.ndarray:
    """Inverses of a batch of small symmetric positive semi-definite matrices (N, k, k) (normal
    equations): Gauss-Jordan elimination without pivoting, vectorized over the batch (stable
    for positive definite matrices; k steps of (k, 2k, N) arithmetic, 2.5-3 times faster than
    numpy's batched determinant and inverse for a replay's million fits, bench/README.md
    bench_whatif), where well conditioned; the pseudo-inverse where (nearly) singular: the
    product of the pivots (the determinant) under 1e-9 of the diagonal's (an SVD per matrix
    costs ~50x more, so only there)."""
    n, k, _ = a.shape
    # (k, 2k, N): each row operation runs over the batch's contiguous last axis
    aug = np.concatenate(
        [a.transpose(1, 2, 0), np.broadcast_to(np.eye(k)[:, :, None], (k, k, n))], axis=1
    )
    det = np.ones(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        for j in range(k):
            piv = aug[j, j].copy()
            det *= piv
            aug[j] /= piv
            for i in range(k):
                if i != j:
                    aug[i] -= aug[i, j] * aug[j]
    diag = np.abs(np.prod(np.diagonal(a, axis1=1, axis2=2), axis=1))
    good = np.abs(det) > 1e-9 * diag  # False where a pivot was 0 (NaN)
    out = np.ascontiguousarray(aug[:, k:].transpose(2, 0, 1))
    if (~good).any():
        out[~good] = np.linalg.pinv(a[~good])
    return out


def _largest_step(y: np.ndarray) -> np.ndarray:
    """(k, N): 1 from the sample after each column's largest one-sample change (between
    finite neighbours), 0 before; all 0 where the column has no such change."""
    d = np.abs(np.diff(y, axis=0))
    d = np.where(np.isfinite(d), d, -1.0)
    if d.shape[0] == 0:
        return np.zeros_like(y)
    at = np.argmax(d, axis=0)  # the change between samples at and at + 1
    has = d[at, np.arange(y.shape[1])] > 0
    rows = np.arange(y.shape[0])[:, None]
    return ((rows > at[None, :]) & has[None, :]).astype(float)


def unexplained_trend(
    cur_hist: np.ndarray,
    load_hist: np.ndarray,
    step_s: float,
    level_before: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Slope (A/s) and its standard error of the current the rack load does not explain.

    Per phase, over the last :data:`TREND_WINDOW_S`: least squares of
    ``I(t) = a + k * load(t) / load_now + b * t + c * step(t)``; ``b`` is the trend.
    ``step`` is 0 up to the window's largest one-sample change of the current and 1 from it:
    a level shift (the other feed's fault starting or ending moves the feeds' shares at once,
    which the load of the racks does not explain) is a step, not a trend, and a creep is a
    trend with or without it. [A; bench/README.md bench_alerts: the 2 untied phase forecasts
    of seed 0 were such steps] A slope whose |t| < 3 is set to zero: no trend is claimed
    from noise. Nor is a rising one while the present
    current (the last sample) is not above ``level_before`` (default: the highest sample of
    ``cur_hist`` before the trend window, :data:`LEVEL_WINDOW_S` of it): a phase climbing back
    to a level it held within the hour (after a dip, or the other feed's fault ending) is
    recovering, not creeping; a creep makes new highs. [A; bench/README.md bench_alerts: the
    8 untied phase forecasts of seeds 0 and 1 were such recoveries]

    Columns are independent and fitted :data:`TREND_COLUMNS` at a time, a block per core
    (:func:`twin.blocks.in_order`): a replay fits every (minute, phase) pair at once, and its
    (window x 10^6) temporaries cost 4x the time of cache-sized blocks (bench/README.md,
    bench_whatif).
    """
    n_col = cur_hist.shape[1]
    if n_col <= TREND_COLUMNS:
        return _unexplained_trend_block(cur_hist, load_hist, step_s, level_before)
    slope, se = np.empty(n_col), np.empty(n_col)

    def fit(cols: slice) -> tuple[np.ndarray, np.ndarray]:
        lvl = None if level_before is None else level_before[cols]
        return _unexplained_trend_block(cur_hist[:, cols], load_hist[:, cols], step_s, lvl)

    blocks = [slice(lo, lo + TREND_COLUMNS) for lo in range(0, n_col, TREND_COLUMNS)]
    for cols, (b, b_se) in zip(blocks, in_order(fit, blocks), strict=True):
        slope[cols], se[cols] = b, b_se
    return slope, se


def _unexplained_trend_block(
    cur_hist: np.ndarray,
    load_hist: np.ndarray,
    step_s: float,
    level_before: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`unexplained_trend` on one block of columns."""
    k = max(3, round(TREND_WINDOW_S / step_s))
    y, x = cur_hist[-k:], load_hist[-k:]
    ok = ~(np.isnan(y) | np.isnan(x))
    w = ok.astype(float)
    y0, x0 = np.where(ok, y, 0.0), np.where(ok, x, 0.0)
    t = (np.arange(y.shape[0], dtype=float) * step_s)[:, None]
    n_ok = w.sum(axis=0)
    tc = np.where(ok, t - (t * w).sum(axis=0) / np.maximum(n_ok, 1), 0.0)  # centred per phase
    h = _largest_step(y) * w
    # the normal equations of y = a + k x + b t + c h, every phase at once: (N, 4, 4), (N, 4)
    cols = [w, x0, tc, h]
    npar = len(cols)
    xtx = np.empty((y.shape[1], npar, npar))
    xty = np.empty((y.shape[1], npar))
    for i in range(npar):
        xty[:, i] = (cols[i] * y0).sum(axis=0)
        for j in range(i, npar):
            xtx[:, i, j] = xtx[:, j, i] = (cols[i] * cols[j]).sum(axis=0)
    inv = _inv_sym(xtx)  # batched; a phase whose load did not move is rank deficient
    coef = np.einsum("nij,nj->ni", inv, xty)
    resid = y0 - sum(coef[:, i] * cols[i] for i in range(npar))
    s2 = (resid**2 * w).sum(axis=0) / np.maximum(n_ok - npar, 1)
    b_se = np.sqrt(np.maximum(s2 * inv[:, 2, 2], 0.0))
    keep = (n_ok >= 7) & (np.abs(coef[:, 2]) > 3 * b_se)
    if level_before is None:
        kb = max(1, round(LEVEL_WINDOW_S / step_s))
        before = cur_hist[-(k + kb) : -k] if cur_hist.shape[0] > k else cur_hist[:0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no history before: no guard
            level_before = (
                np.nanmax(before, axis=0) if before.shape[0] else np.full(y.shape[1], np.nan)
            )
    with np.errstate(invalid="ignore"):
        # NaN (no history before, or no last sample) compares False: the slope is kept
        recovering = (coef[:, 2] > 0) & (y[-1] <= level_before)
    keep &= ~recovering
    slope = np.where(keep, coef[:, 2], 0.0)
    se = np.where(keep, b_se, 0.0)
    return slope, se
