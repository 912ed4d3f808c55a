"""Shared pieces of the console's pages: the API client, error boxes, units, refresh."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from typing import Any

import streamlit as st

from dashboards.client import Api, ApiError

#: Seconds between a page's automatic refreshes (``DCTWIN_CONSOLE_REFRESH_S``).
REFRESH_S = float(os.environ.get("DCTWIN_CONSOLE_REFRESH_S", "15"))

#: Unit of a field, from its name's suffix (every quantity carries its unit in its name). The
#: owner is the wire contract's ``collectors.contract.SUFFIX_UNITS``; the console imports
#: nothing of collectors/ or twin/, so this is a copy that tests/test_contract.py holds equal.
SUFFIX_UNITS = {
    "_kw": "kW",
    "_w": "W",
    "_c": "°C",
    "_k": "K",
    "_a": "A",
    "_v": "V",
    "_pct": "%",
    "_lpm": "L/min",
    "_gbps": "Gb/s",
    "_bps": "bit/s",
    "_kpa": "kPa",
    "_s": "s",
    "_mhz": "MHz",
    "_mib": "MiB",
    "_j": "J",
    "_kwh": "kWh",
    "_va": "VA",
    "_hz": "Hz",
}


def unit_of(name: str) -> str:
    for suffix, unit in sorted(SUFFIX_UNITS.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return unit
    return ""


def api() -> Api:
    return Api()


def page(title: str, icon: str = "") -> None:
    """Page config, title and the sidebar's connection line."""
    st.set_page_config(page_title=f"dctwin · {title}", page_icon=icon or None, layout="wide")
    st.title(title)
    a = api()
    st.sidebar.caption(f"API: {a.base_url}")
    st.sidebar.caption(f"refresh every {REFRESH_S:g} s")
    if not a.token:
        st.sidebar.caption("no DCTWIN_CONSOLE_TOKEN: read-only")


def error_box(e: ApiError) -> None:
    st.error(f"Could not read {e.url}\n\n{e.reason}", icon="⚠️")


def fetch(path: str, **params: Any) -> Any:
    """GET ``path``; on failure show the error box and return None."""
    try:
        return api().get(path, **params)
    except ApiError as e:
        error_box(e)
        return None


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "–"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def ago(ts: str | None) -> str:
    if not ts:
        return "–"
    t = datetime.fromisoformat(ts)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def live(body: Callable[[], None]) -> None:
    """Run ``body`` now and every :data:`REFRESH_S` seconds (a Streamlit fragment)."""
    st.fragment(body, run_every=REFRESH_S if REFRESH_S > 0 else None)()
