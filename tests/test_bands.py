"""The bands of limit used (twin/bands.py), shared by the console and the CLI."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from twin.bands import Band, LimitBands


def test_default_bands_edges() -> None:
    b = LimitBands()
    assert [b.band(p) for p in (0.0, 69.9, 70.0, 90.0, 90.1, 150.0)] == [
        Band.neutral,
        Band.neutral,
        Band.amber,
        Band.amber,
        Band.red,
        Band.red,
    ]
    assert b.band(None) is None and b.band(float("nan")) is None


def test_share_used_per_unit() -> None:
    b = LimitBands()
    assert b.used_pct(40.0, 50.0, "A") == pytest.approx(80.0)
    # a temperature is measured above the reference (25 °C): 56 °C of an 87 °C limit is 50 %
    assert b.used_pct(56.0, 87.0, "K") == pytest.approx(50.0)
    assert b.used_pct(None, 50.0, "kW") is None and b.used_pct(1.0, 0.0, "kW") is None


def test_bands_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DCTWIN_BAND_AMBER_PCT", "50")
    monkeypatch.setenv("DCTWIN_BAND_RED_PCT", "80")
    b = LimitBands()
    assert (b.band(49), b.band(60), b.band(81)) == (Band.neutral, Band.amber, Band.red)
    monkeypatch.setenv("DCTWIN_BAND_AMBER_PCT", "95")
    with pytest.raises(ValidationError, match="DCTWIN_BAND_AMBER_PCT"):
        LimitBands()
