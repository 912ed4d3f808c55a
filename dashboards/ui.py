"""Shared pieces of the console's pages: the API client, error boxes, units, refresh."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitAPIException

from dashboards.client import Api, ApiError
from twin.bands import BAND_HEX, Band, bands

#: Seconds between a page's automatic refreshes (``DCTWIN_CONSOLE_REFRESH_S``).
REFRESH_S = float(os.environ.get("DCTWIN_CONSOLE_REFRESH_S", "15"))

#: Data older than this many seconds is stale: the page says so in amber
#: (``DCTWIN_CONSOLE_STALE_S``; the collectors publish every 1-10 s, detection runs every 60 s).
STALE_S = 120.0


def stale_s() -> float:
    """:data:`STALE_S`, or ``DCTWIN_CONSOLE_STALE_S`` when set (read on every page run)."""
    return float(os.environ.get("DCTWIN_CONSOLE_STALE_S", STALE_S))


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


#: Seconds a GET's answer is shared between page runs and sessions (``DCTWIN_CONSOLE_CACHE_S``;
#: 0 turns it off): an operator opening three pages, or three operators, ask the API once. Well
#: under :data:`REFRESH_S`, and every write (acknowledge, silence, what-if) clears it.
CACHE_S = float(os.environ.get("DCTWIN_CONSOLE_CACHE_S", "5"))


class ConsoleApi(Api):
    """The API client whose writes forget every cached answer (the next read sees them)."""

    def post(self, path: str, json: Any = None) -> Any:
        try:
            return super().post(path, json=json)
        finally:
            _cached_get.clear()

    def delete(self, path: str) -> Any:
        try:
            return super().delete(path)
        finally:
            _cached_get.clear()


def api() -> Api:
    return ConsoleApi()


@st.cache_data(ttl=max(CACHE_S, 0.001), show_spinner=False, max_entries=256)
def _cached_get(base_url: str, path: str, params: tuple[tuple[str, Any], ...]) -> Any:
    return Api(base_url).get(path, **dict(params))


def get(path: str, **params: Any) -> Any:
    """GET ``path`` through the short cache (:data:`CACHE_S`); raises :class:`ApiError`."""
    a = api()
    if CACHE_S <= 0:
        return a.get(path, **params)
    return _cached_get(a.base_url, path, tuple(sorted(params.items())))


def page(title: str, icon: str = "") -> None:
    """Page config, title and the sidebar's connection line."""
    st.set_page_config(page_title=f"dctwin · {title}", page_icon=icon or None, layout="wide")
    st.title(title)
    a = api()
    site = _site_name(a.base_url)
    if site:
        st.sidebar.markdown(f"### {site}")
    st.sidebar.caption(f"API: {a.base_url}")
    st.sidebar.caption(f"refresh every {REFRESH_S:g} s")
    if not a.token:
        st.sidebar.caption("no DCTWIN_CONSOLE_TOKEN: read-only")
    st.session_state[_WARNED] = set()


@st.cache_data(ttl=300, show_spinner=False)
def _site_name(base_url: str) -> str | None:
    """The site's name for the sidebar title (None while the API cannot be reached)."""
    try:
        return Api(base_url).get("/api/v1").get("site")
    except ApiError:
        return None


def error_box(e: ApiError) -> None:
    st.error(f"Could not read {e.url}\n\n{e.reason}", icon="⚠️")


#: Session key of the stale shards already shown on this page run.
_WARNED = "_stale_shards_shown"


def shard_warnings(data: Any) -> list[str]:
    """One line per stale shard of an answer from ``dctwin site-view`` (its ``shards``
    section); nothing for one service's answers, which have none."""
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        return []
    out = []
    for s in data["shards"]:
        if s.get("status") != "stale":
            continue
        age = s.get("age_s")
        since = "never answered" if age is None else f"no answer for {fmt(age, 's', 0)}"
        out.append(
            f"Shard **{s.get('name')}** is stale ({since}: {s.get('error') or 'no reason given'})."
            " The figures on this page leave it out."
        )
    return out


def fetch(path: str, **params: Any) -> Any:
    """GET ``path``; on failure show the error box and return None. An answer of the site
    view that names stale shards shows each once per page run, in amber."""
    try:
        data = get(path, **params)
    except ApiError as e:
        error_box(e)
        return None
    shown = st.session_state.setdefault(_WARNED, set())
    for line in shard_warnings(data):
        if line.split(" (", 1)[0] not in shown:
            shown.add(line.split(" (", 1)[0])
            st.warning(line, icon="⏳")
    return data


#: Shown for a value that is missing (never "None" or "nan").
MISSING = "–"


def _digits(value: float) -> int:
    """Sensible precision: three significant figures, at most two decimals."""
    a = abs(value)
    return 0 if a >= 100 or a == 0 else 1 if a >= 10 else 2


def fmt(value: Any, unit: str = "", digits: int | None = None) -> str:
    """One number formatter for the whole console: thousands separators, sensible precision
    (``digits`` to fix it), the unit after a space, and a dash for a missing value (None,
    NaN, inf or not a number)."""
    if isinstance(value, bool) or value is None:
        return MISSING if value is None else str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return MISSING
    if not math.isfinite(v):
        return MISSING
    d = _digits(v) if digits is None else digits
    text = f"{v:,.{d}f}"
    if text.startswith("-") and float(text.replace(",", "")) == 0:
        text = text[1:]  # no "-0.0"
    return f"{text} {unit}".strip()


def _missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return isinstance(v, float) and not math.isfinite(v)
    except TypeError:
        return False


def _cell(v: Any) -> str:
    if _missing(v):
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list | tuple):
        return ", ".join(str(x) for x in v) or MISSING
    if isinstance(v, float | int):
        return fmt(v)
    return str(v)


#: Rows a table shows; past them a line says how many more there are (every row of a static
#: table is drawn at once, and an operator reads the first screens of one sorted by urgency).
TABLE_ROWS = 500
#: Height past which a table scrolls inside its box, its header kept in view [px].
TABLE_MAX_PX = 440
#: The tables' look: thin grey rules (readable on the light and the dark theme), the header
#: kept in view while the rows scroll.
TABLE_CSS = (
    ".dctwin-table table{width:100%;border-collapse:collapse;font-size:0.875rem}"
    ".dctwin-table th,.dctwin-table td{padding:0.25rem 0.5rem;"
    "border-bottom:1px solid rgba(128,128,128,0.25);text-align:left}"
    ".dctwin-table thead{position:sticky;top:0}"
    ".dctwin-table th{font-weight:600;opacity:0.8}"
)
#: Fill of a bar drawn in a cell that is not a share of a limit (Streamlit's primary red).
BAR_FILL = "rgba(255, 75, 75, 0.35)"
#: Opacity of a band's colour as a bar's fill behind a figure (the figure stays readable).
BAND_ALPHA = 0.45


def used_pct(value: Any, limit: Any, unit: str) -> float | None:
    """Share of a limit used [%], as the bands define it (``twin.bands``: a temperature above
    its reference, anything else against zero); None where it cannot be had."""
    try:
        v, lim = float(value), float(limit)
    except (TypeError, ValueError):
        return None
    return bands().used_pct(v, lim, unit)


def band_of(pct: Any) -> str | None:
    """The band ("neutral", "amber", "red") of a share of a limit used [%]; None if missing."""
    try:
        b = bands().band(None if pct is None else float(pct))
    except (TypeError, ValueError):
        return None
    return None if b is None else b.value


def band_hex(band: str | None) -> str | None:
    return None if band is None else BAND_HEX[Band(band)]


def band_fill(band: str | None, alpha: float = BAND_ALPHA) -> str:
    """A band's colour, translucent (a bar's fill); a light grey for no band."""
    h = band_hex(band)
    if h is None:
        return "rgba(128, 128, 128, 0.15)"
    r, g, b = (int(h[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def bands_caption() -> str:
    """The bands in words, for a caption under what they colour."""
    b = bands()
    return (
        f"colours: limit used < {b.amber_pct:g} % grey, {b.amber_pct:g}–{b.red_pct:g} % amber,"
        f" > {b.red_pct:g} % red (temperatures counted above {b.temp_ref_c:g} °C;"
        " DCTWIN_BAND_AMBER_PCT, DCTWIN_BAND_RED_PCT)"
    )


#: Units of a headroom that is a temperature difference: its limit is a temperature in °C.
TEMPERATURE_HEADROOM = ("K", "°C")


def limit_unit(unit: str) -> str:
    """The unit of a limit itself: °C for a temperature (its headroom is in K), else ``unit``."""
    return "°C" if unit in TEMPERATURE_HEADROOM else unit


#: Streamlit's default page backgrounds per theme: the fill of a table's header, kept in view
#: over its scrolled rows.
BACKGROUND = {"light": "#ffffff", "dark": "#0e1117"}


def _background() -> str:
    theme = getattr(st.context, "theme", None)
    return BACKGROUND.get(getattr(theme, "type", None) or "light", BACKGROUND["light"])


def _column_digits(s: pd.Series) -> int:
    """One precision per numeric column: none for whole numbers, else :func:`_digits` of the
    column's median magnitude (a column reads at one precision, as a spreadsheet's does)."""
    vals = pd.to_numeric(s, errors="coerce").astype("float64")
    vals = vals[vals.map(math.isfinite)]
    if vals.empty or pd.api.types.is_integer_dtype(s) or bool((vals % 1 == 0).all()):
        return 0
    return _digits(float(vals.abs().median()))


def _td(text: str, why: str | None = None, right: bool = False, bar: float | None = None) -> str:
    """One cell, its text escaped; a dash with ``why`` as its tooltip; a bar behind it when
    ``bar`` is a share of a limit in percent, in its band's colour (``data-band`` names it)."""
    style = []
    band = None
    if right:
        style.append("text-align:right;white-space:nowrap")
    if bar is not None and math.isfinite(bar):
        w = min(max(bar, 0.0), 100.0)
        band = band_of(bar)
        fill = band_fill(band)
        style.append(f"background:linear-gradient(90deg,{fill} {w:.1f}%,transparent {w:.1f}%)")
    attr = f' style="{";".join(style)}"' if style else ""
    if band is not None:
        attr += f' data-band="{band}"'
    if why is not None:
        return f'<td{attr}><span title="{html.escape(why)}">{MISSING}</span></td>'
    return f"<td{attr}>{html.escape(' '.join(text.split()))}</td>"


def table_html(
    df: pd.DataFrame,
    names: dict[str, str] | None = None,
    missing_why: str = "no value: not reported or not applicable",
    max_rows: int = TABLE_ROWS,
    bars: tuple[str, ...] = (),
) -> str:
    """``df`` as a static HTML table (every value escaped): columns renamed by ``names``
    (titles carry the unit: "power [W]"), each numeric column at one :func:`fmt` precision
    and right-aligned, a missing value a dash whose tooltip says why (``missing_why``), the
    columns in ``bars`` (percent, 0..100) with a bar behind their figure, rows in ``df``'s
    order and at most ``max_rows`` of them."""
    names = names or {}
    shown = df.head(max_rows)
    head, cols = [], []
    for col in df.columns:
        s = df[col]
        numeric = pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
        digits = _column_digits(s) if numeric else 0
        title = html.escape(str(names.get(col, col)))
        gaps = bool(s.map(lambda v: _missing(v) or v == MISSING).any())
        tip = f' title="{html.escape(f"{MISSING} {missing_why}")}"' if gaps else ""
        align = ' style="text-align:right"' if numeric else ""
        head.append(f"<th{tip}{align}>{title}</th>")
        cols.append((shown[col].tolist(), numeric, digits, col in bars))
    body = []
    for i in range(len(shown)):
        cells = []
        for values, numeric, digits, bar in cols:
            v = values[i]
            text = "" if _missing(v) or not numeric else fmt(v, "%" if bar else "", digits)
            if _missing(v) or text == MISSING:
                cells.append(_td("", why=missing_why, right=numeric))
            elif numeric:
                cells.append(_td(text, right=True, bar=float(v) if bar else None))
            else:  # text, or a figure formatted beforehand (a dash there is missing too)
                text = _cell(v)
                cells.append(_td(text, why=missing_why if text == MISSING else None))
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = ""
    if len(df) > len(shown):
        more = f"<p><small>{plural(len(df) - len(shown), 'more row')} not shown</small></p>"
    return (
        f"<style>{TABLE_CSS}</style>"
        f'<div class="dctwin-table" style="max-height:{TABLE_MAX_PX}px;overflow:auto">'
        f'<table><thead style="background:{_background()}">'
        f"<tr>{''.join(head)}</tr></thead><tbody>{''.join(body)}</tbody></table></div>{more}"
    )


#: The sort control's first choice: the order the page gave (worst first).
WORST_FIRST = "worst first"


def sort_choices(df: pd.DataFrame, names: dict[str, str] | None = None) -> list[str]:
    """The sort control's choices: worst first, then each column up and down."""
    names = names or {}
    out = [WORST_FIRST]
    for col in df.columns:
        title = str(names.get(col, col))
        out += [f"{title} ↑", f"{title} ↓"]
    return out


def sort_frame(df: pd.DataFrame, choice: str, names: dict[str, str] | None = None) -> pd.DataFrame:
    """``df`` in the order ``choice`` names (:func:`sort_choices`); missing values last."""
    if choice == WORST_FIRST:
        return df
    names = names or {}
    title, arrow = choice.rsplit(" ", 1)
    col = next((c for c in df.columns if str(names.get(c, c)) == title), None)
    if col is None:
        return df
    s = df[col]
    key = pd.to_numeric(s, errors="coerce") if pd.api.types.is_numeric_dtype(s) else s.astype(str)
    order = key.sort_values(ascending=arrow == "↑", na_position="last", kind="stable").index
    return df.loc[order]


def table(
    df: pd.DataFrame,
    names: dict[str, str] | None = None,
    missing_why: str = "no value: not reported or not applicable",
    max_rows: int = TABLE_ROWS,
    bars: tuple[str, ...] = (),
    sort_key: str | None = None,
) -> None:
    """A table with the console's number format, drawn as static HTML (:func:`table_html`):
    Streamlit's interactive grid is the slowest element of a page to load (issue 15). Rows
    come in ``df``'s order (the pages give them worst first); with ``sort_key`` a control
    above the table sorts them by any column, up or down. The control sits in a popover
    whose button names the order: the browser loads a select box's code (21 files) only
    when the popover opens, not with every page."""
    if sort_key is not None and len(df) > 1:
        with st.popover(f"Sort: {st.session_state.get(sort_key, WORST_FIRST)}"):
            choice = st.selectbox(
                "Sort rows by",
                sort_choices(df, names),
                key=sort_key,
                help="rows come worst first; sort by any column instead",
            )
        df = sort_frame(df, choice, names)
    st.html(table_html(df, names, missing_why, max_rows, bars))


def metric_html(label: str, value: Any, delta: str | None = None) -> str:
    """A labelled figure as ``st.metric`` draws it (label, then the value large), as HTML."""
    out = (
        f'<div class="dctwin-stat" data-label="{html.escape(label)}">'
        f'<div class="label" style="font-size:0.875rem">{html.escape(label)}</div>'
        f'<div class="value" style="font-size:2.25rem;line-height:1.4">'
        f"{html.escape(str(value))}</div>"
    )
    if delta is not None:
        out += f'<div class="delta" style="font-size:0.875rem">{html.escape(delta)}</div>'
    return out + "</div>"


def metric(col: Any, label: str, value: Any, delta: str | None = None) -> None:
    """A labelled figure in ``col`` (``st`` or a column), drawn as HTML with the tables'
    code: ``st.metric`` makes the browser fetch nine more files (its number formatting and a
    chart loader) for every page that shows one."""
    col.html(metric_html(label, value, delta))


def stat(col: Any, label: str, value: str, note: str | None = None) -> None:
    """A figure with a line of context under it (not a delta: those are for changes, and a
    limit or a share of capacity is not one)."""
    metric(col, label, value)
    if note:
        col.caption(note)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "member")`` -> "1 member", ``plural(3, "rack")`` -> "3 racks"."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


#: Streamlit's named text colours per severity (critical in red, as in Alertmanager and Grafana).
SEVERITY_COLOUR = {"critical": "red", "warning": "orange", "info": "blue"}


def severity_badge(severity: str) -> str:
    """The severity as a coloured badge (Streamlit markdown)."""
    colour = SEVERITY_COLOUR.get(severity, "gray")
    return f":{colour}-badge[{severity.upper()}]"


def ago(ts: str | None, markdown: bool = False) -> str:
    """A UTC time to the second (``–`` for none). ``markdown``: for a caption or markdown,
    its colons escaped (shown the same): Streamlit's markdown fetches its emoji table (259 kB)
    for any ``:word:`` in a text, and ``02:13:45`` is one."""
    if not ts:
        return "–"
    text = datetime.fromisoformat(ts).strftime("%Y-%m-%d %H:%M:%S UTC")
    return text.replace(":", "\\:") if markdown else text


def md_time(ts: str | None) -> str:
    """:func:`ago` for a caption or markdown."""
    return ago(ts, markdown=True)


def age_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def freshness(ts: str | None, what: str = "data") -> None:
    """How old the page's data is, in a caption; in amber when older than :func:`stale_s`."""
    if not ts:
        st.markdown(f":orange[no {what} yet]")
        return
    t = datetime.fromisoformat(ts)
    age = (datetime.now(UTC) - t).total_seconds()
    text = f"{what} until {md_time(ts)} · {age_text(max(age, 0.0))} old"
    limit = stale_s()
    if age > limit:
        st.markdown(f":orange[:material/schedule: {text}: stale, older than {limit:g} s]")
    else:
        st.caption(text)


def link(page: str, label: str, **query: str) -> None:
    """A link to another page of the console with query parameters (``link("rack", "r01",
    rack="r01")`` opens ``/rack?rack=r01``). Outside the navigation app (a page run on its own)
    it is a plain markdown link to the same URL."""
    try:
        st.page_link(f"pages/{page}.py", label=label, query_params=query or None)
    except StreamlitAPIException:
        qs = "&".join(f"{k}={v}" for k, v in query.items())
        st.markdown(f"[{label}](/{page}{'?' + qs if qs else ''})")


def live(body: Callable[[], None]) -> None:
    """Run ``body`` now and every :data:`REFRESH_S` seconds (a Streamlit fragment)."""
    st.fragment(body, run_every=REFRESH_S if REFRESH_S > 0 else None)()
