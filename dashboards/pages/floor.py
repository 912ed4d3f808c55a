"""Floor: the hall's racks on their grid, coloured by a chosen metric or headroom (an SVG map:
each tile links to its rack)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui
from twin.bands import bands

ui.page("Floor", "🗺️")

#: What a tile shows: label, unit and which share of a limit colours it ("worst": the largest
#: of the rack's GPUs, PDU phases and feeds). Colour always means limit used, in the fixed
#: bands of twin.bands, never the spread of today's values. The first is the default: an
#: operator opens the floor on the worst headroom.
METRICS = {
    "limit_used_max_pct": ("Worst limit used (GPU, PDU phase, feeds)", "%", "worst"),
    "power_used_pct": ("Feeds' power limit used", "%", "rack"),
    "gpu_used_pct": ("GPU temperature limit used", "%", "gpu"),
    "pdu_used_pct": ("PDU phase limit used", "%", "pdu_phase"),
    "headroom_kw": ("Power headroom (feeds together)", "kW", "rack"),
    "gpu_headroom_min_k": ("GPU headroom to slowdown", "K", "gpu"),
    "pdu_headroom_min_a": ("PDU phase headroom", "A", "pdu_phase"),
    "power_kw": ("IT power", "kW", "worst"),
    "gpu_temp_max_c": ("Hottest GPU", "°C", "gpu"),
    "inlet_temp_c": ("Inlet air", "°C", "worst"),
    "gpu_util_mean_pct": ("GPU utilization (mean)", "%", "worst"),
    "alerts": ("Active alerts", "", "worst"),
}
#: The band of each limit-used column the tiles can be coloured by.
USED = {
    "worst": "limit_used_max_pct",
    "rack": "power_used_pct",
    "gpu": "gpu_used_pct",
    "pdu_phase": "pdu_used_pct",
}


def metric_label(k: str) -> str:
    return f"{METRICS[k][0]} [{METRICS[k][1]}]" if METRICS[k][1] else METRICS[k][0]


# the choice in a popover whose button names it: a select box's code (21 files for the
# browser) loads when it opens, not with the page
shown_metric = st.session_state.get("floor_metric", next(iter(METRICS)))
with st.popover(f"Tiles: {metric_label(shown_metric)}"):
    metric = st.selectbox(
        "Show on the tiles", list(METRICS), format_func=metric_label, key="floor_metric"
    )


def with_shares(df: pd.DataFrame) -> pd.DataFrame:
    """The racks with each kind's largest share of a limit used as a column of its own."""
    per = df["limit_used_pct"] if "limit_used_pct" in df else pd.Series([{}] * len(df))
    df = df.copy()
    for kind, col in (("rack", "power_used_pct"), ("gpu", "gpu_used_pct")):
        df[col] = [d.get(kind) if isinstance(d, dict) else None for d in per]
    df["pdu_used_pct"] = [d.get("pdu_phase") if isinstance(d, dict) else None for d in per]
    return df


def floor_map(df: pd.DataFrame, hall: str) -> str:
    """One hall's racks as an SVG grid: the chosen figure on each tile, coloured by the band
    of the limit it concerns (grey: no headroom report for it)."""
    _, unit, kind = METRICS[metric]
    values = [None if pd.isna(v) else float(v) for v in df[metric]]
    digits = 0 if metric == "alerts" or unit == "%" else 1
    shares = [None if pd.isna(v) else float(v) for v in df[USED[kind]]]
    tile_bands = [ui.band_of(p) for p in shares]
    fills = [ui.band_hex(b) for b in tile_bands]
    b = bands()
    legend_items = [
        (f"< {b.amber_pct:g} % used", ui.band_hex("neutral")),
        (f"{b.amber_pct:g}–{b.red_pct:g} %", ui.band_hex("amber")),
        (f"> {b.red_pct:g} %", ui.band_hex("red")),
        ("no figure", charts.MISSING_FILL),
    ]
    what = METRICS[USED[kind]][0]
    return charts.floor_svg(
        list(df["name"]),
        [int(c) for c in df["grid_col"]],
        [int(r) for r in df["grid_row"]],
        values,
        [ui.fmt(v, unit, digits) for v in values],
        "YlOrRd",
        f"colour: {what.lower()}",
        "",
        "",
        fills=fills,
        legend_items=[(t, c or charts.MISSING_FILL) for t, c in legend_items],
        tile_bands=tile_bands,
    )


def body() -> None:
    data = ui.fetch("/api/v1/racks")
    if data is None:
        return
    df = pd.DataFrame(data["racks"])
    if df.empty:
        st.info("The site has no racks.")
        return
    df = with_shares(df)
    ui.freshness(data["data_until"])
    for hall, part in df.groupby("hall", sort=False):
        label = METRICS[metric][0]
        st.markdown(f"**{hall}: {label}**")
        st.markdown(floor_map(part, str(hall)), unsafe_allow_html=True)
    st.caption(ui.bands_caption())
    with st.expander("All racks as a table (worst first)"):
        worst = df.sort_values("limit_used_max_pct", ascending=False, na_position="last")
        ui.table(
            worst[
                [
                    "name",
                    "limit_used_max_pct",
                    "limit_used_max_of",
                    "hall",
                    "row",
                    "fleet",
                    "power_kw",
                    "headroom_kw",
                    "gpu_temp_max_c",
                    "gpu_headroom_min_k",
                    "pdu_headroom_min_a",
                    "inlet_temp_c",
                    "alerts",
                ]
            ],
            {
                "limit_used_max_pct": "worst limit used [%]",
                "limit_used_max_of": "whose",
                "power_kw": "power [kW]",
                "headroom_kw": "headroom [kW]",
                "gpu_temp_max_c": "hottest GPU [°C]",
                "gpu_headroom_min_k": "GPU headroom [K]",
                "pdu_headroom_min_a": "PDU headroom [A]",
                "inlet_temp_c": "inlet [°C]",
            },
            missing_why="no reading or no headroom report for this rack yet",
            bars=("limit_used_max_pct",),
            sort_key="floor_sort",
        )
    st.session_state["floor_racks"] = list(worst["name"])


ui.live(body)

racks = st.session_state.get("floor_racks", [])
if racks:
    with st.popover("Open a rack"):
        chosen = st.selectbox("Rack", racks, key="floor_rack")
        if st.button("Open rack", key="open_rack"):
            st.session_state["rack"] = chosen
            st.switch_page("pages/rack.py", query_params={"rack": chosen})
