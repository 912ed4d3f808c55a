"""Cooling changes: a GPU's temperature stepping down while its power stays flat.

A first-order RC GPU (:mod:`models.gpu_thermal`) at flat power only relaxes towards
``T_ref + R P``; once the power has been flat for a few time constants its temperature can
fall by several kelvin only if ``T_ref`` or ``R`` fell: more airflow (a host fan step), colder
inlet or coolant, more flow. A model with a fixed R would absorb such a step into a wrong R
or show it as a residual; this detector names it.

Notes
-----
For every candidate time :math:`t` on a regular grid, with 30 s means :math:`\\bar T` and
:math:`\\bar P`, the step of the residual of the steady-state model is

.. math::

    s(t) = \\left[\\bar T_{after} - \\bar T_{before}\\right]
         - R\\,\\left[\\bar P_{after} - \\bar P_{before}\\right]

where *before* is the 30 s up to :math:`t` and *after* the 60 s that start ``GAP_S`` later.
A candidate counts when the power's 30 s means stay within ``FLAT_FRACTION`` of their median
from ``PRE_S`` before :math:`t` to the end of *after* (flat load: a temperature that follows a
power drop is not a cooling change) and :math:`s(t) \\le -\\,` ``min_step_k``. R is the GPU's
calibrated resistance or the catalog's; at flat power its error moves :math:`s` by
:math:`\\Delta R\\,\\Delta P`, a fraction of a kelvin.

References
----------
docs/physics.md §2.3 (the RC model) and §2.6 (hot-spot detectors); the case is the A100
recordings of ``reference/real_traces`` (a 10-15 K fall 2-3 min into a flat 165-190 W load).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: Width of the means compared. [s]
MEAN_S = 30.0
#: Time the fall may take between the *before* and the *after* means. [s]
GAP_S = 30.0
#: Length of the *after* mean: the new level must hold this long. [s]
AFTER_S = 60.0
#: Power flat for this long before the candidate: 1.5 air-cooled time constants (§9.2, 60 s),
#: so what is left of an earlier power step is under a quarter of it. [s]
PRE_S = 90.0
#: Largest deviation of a 30 s power mean from the window's median that counts as flat. [1]
FLAT_FRACTION = 0.12
#: Smallest fall that is a cooling change: five steps of a 1 °C sensor (assumption, L). [K]
MIN_STEP_K = 5.0


@dataclass(frozen=True)
class CoolingSteps:
    """Per GPU: the largest fall of the residual at flat power in the window.

    ``step_k`` (negative: colder than the model; NaN where no candidate was judged),
    ``index`` (grid index where the fall starts, -1 where none), ``temp_before_c``,
    ``temp_after_c``, ``power_before_w``, ``power_after_w``, and ``flagged``
    (``step_k <= -min_step_k``)."""

    step_k: NDArray[np.float64]
    index: NDArray[np.int64]
    temp_before_c: NDArray[np.float64]
    temp_after_c: NDArray[np.float64]
    power_before_w: NDArray[np.float64]
    power_after_w: NDArray[np.float64]
    flagged: NDArray[np.bool_]


class _Prefix:
    """Prefix sums of one (T, N) series' finite values and their counts along axis 0, so that
    the mean of any ``n`` samples ending at any row is a difference of two rows (NaN-aware)."""

    def __init__(self, a: NDArray[np.float64]) -> None:
        ok = np.isfinite(a)
        self.s = np.zeros((a.shape[0] + 1, a.shape[1]))
        np.cumsum(np.where(ok, a, 0.0), axis=0, out=self.s[1:])
        self.c = np.zeros((a.shape[0] + 1, a.shape[1]), dtype=np.int64)
        np.cumsum(ok, axis=0, out=self.c[1:])

    def mean(self, lo: int, hi: int, n: int) -> NDArray[np.float64]:
        """Mean of the ``n`` samples ending at each row ``lo .. hi - 1`` (``lo >= n - 1``), as
        ``(hi - lo, N)``; NaN with no valid sample. Slices, not gathers: no index copies."""
        cnt = self.c[lo + 1 : hi + 1] - self.c[lo + 1 - n : hi + 1 - n]
        total = self.s[lo + 1 : hi + 1] - self.s[lo + 1 - n : hi + 1 - n]
        with np.errstate(invalid="ignore", divide="ignore"):
            total /= np.maximum(cnt, 1)
        total[cnt == 0] = np.nan
        return total


def cooling_steps(
    temp_c: NDArray[np.float64],
    power_w: NDArray[np.float64],
    r_k_per_w: NDArray[np.float64],
    step_s: float = 1.0,
    *,
    min_step_k: float = MIN_STEP_K,
) -> CoolingSteps:
    """The largest fall of each GPU's temperature at flat power, over the steady-state model.

    Parameters
    ----------
    temp_c : numpy.ndarray
        Measured GPU temperature on a regular grid, shape ``(T, N)``; NaN missing. [°C]
    power_w : numpy.ndarray
        Measured board power, shape ``(T, N)``; NaN missing. [W]
    r_k_per_w : numpy.ndarray
        Thermal resistance per GPU (calibrated, else catalog), shape ``(N,)``. [K/W]
    step_s : float, default 1.0
        Grid step. [s]
    min_step_k : float, default MIN_STEP_K
        Smallest fall flagged. [K]

    Returns
    -------
    CoolingSteps

    Examples
    --------
    >>> t = np.r_[np.full(300, 60.0), np.full(200, 48.0)][:, None]
    >>> p = np.full((500, 1), 175.0)
    >>> s = cooling_steps(t, p, np.array([0.07]))
    >>> bool(s.flagged[0]), round(float(s.step_k[0]))
    (True, -12)
    """
    if not step_s > 0:
        raise ValueError(f"step_s {step_s!r} must be > 0")
    n_t, n_g = temp_c.shape
    w = max(round(MEAN_S / step_s), 1)
    gap = round(GAP_S / step_s)
    after = max(round(AFTER_S / step_s), 1)
    pre = round(PRE_S / step_s)
    # candidate k: before = mean of [k - w, k), after = mean of [k + gap, k + gap + after)
    k0 = pre + w
    k1 = n_t - gap - after  # exclusive
    empty = CoolingSteps(
        step_k=np.full(n_g, np.nan),
        index=np.full(n_g, -1, dtype=np.int64),
        temp_before_c=np.full(n_g, np.nan),
        temp_after_c=np.full(n_g, np.nan),
        power_before_w=np.full(n_g, np.nan),
        power_after_w=np.full(n_g, np.nan),
        flagged=np.zeros(n_g, dtype=bool),
    )
    if k1 <= k0 or n_g == 0:
        return empty
    # one pass of prefix sums per series; each mean is then read only where it is used
    temp, power = _Prefix(temp_c), _Prefix(power_w)
    ks = np.arange(k0, k1)
    p_w = np.full((n_t, n_g), np.nan)  # every 30 s power mean: the flatness test's input
    p_w[w - 1 :] = power.mean(w - 1, n_t, w)
    tb, pb = temp.mean(k0 - 1, k1 - 1, w), p_w[k0 - 1 : k1 - 1]
    end0 = k0 + gap + after - 1  # the after mean of candidate k ends at k + gap + after - 1
    ta, pa = temp.mean(end0, end0 + len(ks), after), power.mean(end0, end0 + len(ks), after)
    step = (ta - tb) - r_k_per_w[None, :] * (pa - pb)
    # flat power from k - pre to the end of the after mean: the 30 s means' range within
    # 2 FLAT_FRACTION of its middle; a missing mean (a gap) is not flat
    first = ks - pre + w - 1  # the first mean that lies wholly after k - pre
    length = pre - w + 1 + gap + after
    from scipy.ndimage import maximum_filter1d, minimum_filter1d  # when needed (~0.5 s)

    centre = first + length // 2  # maximum_filter1d's window at i: [i - L//2, i - L//2 + L)
    p_max = maximum_filter1d(np.where(np.isnan(p_w), np.inf, p_w), length, axis=0)[centre]
    p_min = minimum_filter1d(np.where(np.isnan(p_w), -np.inf, p_w), length, axis=0)[centre]
    with np.errstate(invalid="ignore"):
        flat = (p_max - p_min) <= FLAT_FRACTION * (p_max + p_min)
    judged = flat & np.isfinite(step)
    masked = np.where(judged, step, np.inf)
    best = np.argmin(masked, axis=0)
    cols = np.arange(n_g)
    has = judged.any(axis=0)
    step_k = np.where(has, masked[best, cols], np.nan)
    return CoolingSteps(
        step_k=step_k,
        index=np.where(has, ks[best], -1).astype(np.int64),
        temp_before_c=np.where(has, tb[best, cols], np.nan),
        temp_after_c=np.where(has, ta[best, cols], np.nan),
        power_before_w=np.where(has, pb[best, cols], np.nan),
        power_after_w=np.where(has, pa[best, cols], np.nan),
        flagged=has & (step_k <= -min_step_k),
    )
