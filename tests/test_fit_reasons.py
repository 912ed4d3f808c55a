"""Refusals that say what the data were (issue 29, item 4): a failed RC fit names the power
range, the samples and the residual; a sample threshold is reported in the time it is stated
in."""

from __future__ import annotations

import re

import numpy as np

from models import fit_quality as fq
from models import gpu_thermal as gt


def test_a_failed_rc_fit_names_the_data_facts():
    # temperature falling as power rises: no positive R explains it
    rng = np.random.default_rng(0)
    n_t = 2000
    p = np.repeat(rng.uniform(100, 300, n_t // 100), 100)[:, None] + rng.normal(0, 2, (n_t, 1))
    ref = np.full((n_t, 1), 30.0) + 0.01 * rng.standard_normal((n_t, 1))
    temp = 60 - 0.2 * (p - 200) + 0.05 * rng.standard_normal((n_t, 1))
    f = gt.fit_rc(temp, ref, p, 1.0)
    assert not f.usable[0]
    why = f.reason[0]
    m = re.search(
        r"fit failed \(.*data: power (\d+)-(\d+) W, (\d+) temperature samples, power std"
        r" [\d.]+ W, residual std [\d.]+ K",
        why,
    )
    assert m, why
    lo, hi, n = (int(g) for g in m.groups())
    assert abs(lo - np.nanmin(p)) <= 1 and abs(hi - np.nanmax(p)) <= 1 and n == n_t


def test_too_few_samples_is_said_in_time_at_any_step():
    short = np.full((30, 1), np.nan)
    short[:12, 0] = np.arange(12.0)
    (why,) = fq.data_problems(short, min_samples=30, dt_s=10.0, flat_std=0)
    # 12 readings at 10 s against the 300 s (30 readings) a fit needs
    assert why.startswith("too few samples (2 min of readings < the 5 min a fit needs;"), why
    assert "12 < 30 at 10 s" in why
