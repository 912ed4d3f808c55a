"""GPU temperature through the calibrated RC model, with the GPU's thermal controller.

Vectorized over GPUs, stepped over time: the recurrence and the hold power are
``models.gpu_thermal``'s (``rc_recurrence``, ``hold_power_at_decay_w``; a loop's changing flow
makes R vary in time). Two uses:

- **model paths** (live headroom): the temperature from the present one, under a power path;
- **measured + change** (what-if): the recorded temperature plus the model's change between
  the scenario and the recording, ``T = T_meas + (x_scenario - x_baseline)``, so the model's
  residual error cancels and a neutral scenario reproduces the recording exactly.

The controller (docs/physics.md §2.4, §2.5): where a step would take a GPU past its max operating
temperature, its power falls to what holds it there (``models.gpu_thermal.hold_power_w``), but
not below idle. A GPU that idle power cannot hold (its loop has no flow) runs hotter, and that
is a breach. The power not drawn is work not done; it is reported as energy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.gpu_thermal import hold_power_at_decay_w, rc_recurrence

#: The controller acts on a rise beyond this (float32 recordings round at ~1e-5 K) ...
HOLD_TOL_K = 0.01
#: ... and a GPU counts as held when it sheds more than this. [W]
HOLD_TOL_W = 0.5
#: Steps whose path-independent terms are computed together (bounds the memory they take).
STEP_BLOCK = 512


@dataclass
class ThermalResult:
    temp_c: np.ndarray  # (T, G)
    power_w: np.ndarray  # (T, G) the power drawn: the demand, less what the controller shed
    throttled_s: np.ndarray  # (G,) seconds each GPU was held by the controller
    undelivered_j: np.ndarray  # (G,) energy the controller did not let it draw
    held: np.ndarray  # (T, G) bool: held by the controller at that step


def gpu_temperatures(
    temp0_c: np.ndarray,
    ref_c: np.ndarray,
    power_w: np.ndarray,
    r_k_per_w: np.ndarray,
    c_j_per_k: np.ndarray,
    dt_s: float,
    *,
    idle_w: np.ndarray,
    max_temp_c: np.ndarray,
    measured_c: np.ndarray | None = None,
    baseline_model_c: np.ndarray | None = None,
) -> ThermalResult:
    """Temperatures and drawn power of GPUs under the thermal controller.

    Parameters
    ----------
    temp0_c : (G,) start temperature of the model. [°C]
    ref_c : (T, G) coolant supply (liquid) or inlet air, plus the GPU's offset. [°C]
    power_w : (T, G) power the GPU's work asks for. [W]
    r_k_per_w : (T, G) thermal resistance at the flow of each step. [K/W]
    c_j_per_k : (G,) heat capacity. [J/K]
    idle_w, max_temp_c : (G,) the controller's power floor and the temperature it holds.
    measured_c, baseline_model_c : (T, G), both or neither. With them the result is
        ``measured + (model - baseline_model)`` and the controller holds
        ``max(max_temp_c, measured)``: what the recording itself did is never throttled again.
    """
    n, g = power_w.shape
    delta = measured_c is not None
    if delta:
        assert baseline_model_c is not None
        meas = np.where(np.isfinite(measured_c), measured_c, baseline_model_c)
        bias = meas - baseline_model_c  # (T, G): what the model does not explain
        target = np.maximum(max_temp_c[None, :], meas) - bias
    else:
        target = np.broadcast_to(max_temp_c[None, :], (n, g))
    p = power_w.copy()
    held = np.zeros((n, g), dtype=bool)
    out = np.empty((n, g), dtype=power_w.dtype)
    x = np.asarray(temp0_c, dtype=float).copy()
    out[0] = x
    decay = np.exp(-dt_s / (r_k_per_w * c_j_per_k[None, :]))
    d = np.empty_like(x)
    hot = np.empty(g, dtype=bool)
    xs = np.empty((min(STEP_BLOCK, n) + 1, g))  # a block's free path (float64, as x)
    was_hot = False
    for k0 in range(0, n, STEP_BLOCK):
        # what does not depend on the path, for a block of steps at once (the same arithmetic
        # as step by step): the steady state at the asked power and the controller's trigger
        rows = slice(k0, min(k0 + STEP_BLOCK, n))
        e_b, ref_b, r_b = decay[rows], ref_c[rows], r_k_per_w[rows]
        steady = ref_b + p[rows] * r_b
        goal_b = target[k0 + 1 : rows.stop + 1]
        if len(goal_b) < len(e_b):  # the last step's goal is its own target
            goal_b = np.concatenate([goal_b, target[-1:]])
        trigger = goal_b + HOLD_TOL_K
        b, start = len(e_b), 0
        if not was_hot:
            # the block without the controller (models.gpu_thermal's recurrence), checked once at
            # its end: up to the first step that trips it, that is the path (the same arithmetic
            # as the loop below)
            rc_recurrence(x, steady, e_b, xs[: b + 1])
            tripped = (xs[1 : b + 1] > trigger).any(axis=1)
            start = int(np.argmax(tripped)) if tripped.any() else b
            last = min(k0 + start, n - 1)  # out rows k0 + 1 .. last are done
            out[k0 + 1 : last + 1] = xs[1 : last - k0 + 1]
            x = xs[start].copy()
        was_hot = start < b
        for i in range(start, b):  # the last row's power holds past the window: held the same
            k = k0 + i
            e, ss = e_b[i], steady[i]
            np.subtract(x, ss, out=d)  # nxt = ss + (x - ss) * e
            d *= e
            nxt = ss + d
            np.greater(nxt, trigger[i], out=hot)
            if hot.any():
                pk = p[k]
                hold = hold_power_at_decay_w(x, goal_b[i], ref_b[i], r_b[i], e)
                cut = np.where(hot, np.maximum(np.minimum(pk, hold), idle_w), pk)
                held[k] = hot & (cut < pk - HOLD_TOL_W)
                pk[:] = cut
                ss = ref_b[i] + pk * r_b[i]
                nxt = ss + (x - ss) * e
            x = nxt
            if k + 1 < n:
                out[k + 1] = x
    if delta:
        out = out + bias
    shed = power_w - p
    return ThermalResult(
        temp_c=out,
        power_w=p,
        throttled_s=held.sum(axis=0) * dt_s,
        undelivered_j=np.maximum(shed, 0.0).sum(axis=0, dtype=float) * dt_s,
        held=held,
    )
