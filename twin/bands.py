"""Bands of limit used: the one definition of "how bad" that the console, the floor map and the
CLI colour by.

A limit's *share used* is ``value / limit`` for a quantity with a true zero (A, kW, L/min,
Gb/s). For a temperature a share of a Celsius value means nothing (0 °C is not "no load"), so a
temperature's share is measured above a reference: ``(value - ref) / (limit - ref)``, with
``ref`` the temperature a component sits at with no load to speak of (``temp_ref_c``). Where
the quantity's headroom counts the other way (a CDU's present flow against the flow its load
needs, ``value`` the needed flow and ``limit`` the present one) the same ``value / limit`` holds.

The bands (``< amber_pct`` neutral, ``amber_pct``..``red_pct`` amber, ``> red_pct`` red, a
share past 100 % is past the limit and red too) are fixed, not scaled to what the site shows
now; they are configurable through the environment::

    DCTWIN_BAND_AMBER_PCT=70  DCTWIN_BAND_RED_PCT=90  DCTWIN_BAND_TEMP_REF_C=25

Pure Python (pydantic only), so that the console, which does not install the service's
libraries, imports it as well.
"""

from __future__ import annotations

import math
from enum import StrEnum
from functools import lru_cache

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Band(StrEnum):
    neutral = "neutral"
    amber = "amber"
    red = "red"


#: Hex colours per band, from the Okabe-Ito palette (colour-blind safe; Okabe & Ito 2008,
#: "Color Universal Design"): grey, orange, vermillion.
BAND_HEX: dict[Band, str] = {
    Band.neutral: "#999999",
    Band.amber: "#E69F00",
    Band.red: "#D55E00",
}

#: Rich styles per band, for the terminal (the CLI's tables).
BAND_STYLE: dict[Band, str] = {Band.neutral: "", Band.amber: "yellow", Band.red: "bold red"}

#: Units whose headroom is a temperature difference: their share used is measured above
#: ``temp_ref_c`` (the headroom rows carry "K", a limit in °C).
TEMPERATURE_UNITS = frozenset({"K", "°C", "degC", "C"})


class LimitBands(BaseSettings):
    """Where the bands start, in percent of the limit used (environment ``DCTWIN_BAND_*``)."""

    model_config = SettingsConfigDict(env_prefix="DCTWIN_BAND_", frozen=True)

    amber_pct: float = Field(70.0, gt=0, description="share used [%] from which a limit is amber")
    red_pct: float = Field(90.0, gt=0, description="share used [%] above which a limit is red")
    # ASHRAE TC 9.9 (2021) recommends 18-27 °C air inlet; 25 °C is inside that range and below
    # the W27-W45 liquid classes' supply, so an idle component sits near 0 % used.
    temp_ref_c: float = Field(
        25.0, description="temperature [°C] counted as 0 % used by a temperature limit"
    )

    @model_validator(mode="after")
    def _ordered(self) -> LimitBands:
        if not self.amber_pct < self.red_pct:
            raise ValueError(
                f"DCTWIN_BAND_AMBER_PCT ({self.amber_pct:g}) must be below"
                f" DCTWIN_BAND_RED_PCT ({self.red_pct:g})"
            )
        return self

    def band(self, used_pct: float | None) -> Band | None:
        """The band of a share used [%]; None for a missing or non-finite share."""
        if used_pct is None or not math.isfinite(used_pct):
            return None
        if used_pct > self.red_pct:
            return Band.red
        if used_pct >= self.amber_pct:
            return Band.amber
        return Band.neutral

    def used_pct(self, value: float | None, limit: float | None, unit: str) -> float | None:
        """Share of the limit used [%] (module docstring); None where it cannot be had."""
        if value is None or limit is None or not (math.isfinite(value) and math.isfinite(limit)):
            return None
        if unit in TEMPERATURE_UNITS:
            span = limit - self.temp_ref_c
            if span <= 0:
                return None
            return 100.0 * (value - self.temp_ref_c) / span
        if limit == 0:
            return None
        return 100.0 * value / abs(limit)


@lru_cache(maxsize=1)
def bands() -> LimitBands:
    """The bands configured for this process (read from the environment once)."""
    return LimitBands()
