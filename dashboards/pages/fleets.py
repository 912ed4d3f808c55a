"""Fleets: utilization, underused inference fleets with reclaimable GPUs and kW, forecasts."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, ui

ui.page("Fleets", "📦")


def body() -> None:
    data = ui.fetch("/api/v1/fleets")
    if data is None:
        return
    df = pd.DataFrame(data["fleets"])
    # the window the figures really had: a fleet seen for 1 minute is judged on 1 minute
    # shortest and longest span by seconds (the texts, "20 min" and "3 h", do not sort)
    spans = sorted({(f["covered_s"], f["covered"]) for f in data["fleets"] if f.get("covered")})
    seen = [t for _, t in dict.fromkeys([spans[0], spans[-1]])] if spans else []
    window_h = f"{data['window_s'] / 3600:g} h"
    over = f"over {' to '.join(seen)} of data" if seen else "over no data"
    if seen and seen != [window_h]:
        over += f" (of a {window_h} window)"
    st.caption(
        f"inference fleets {over}, to {ui.md_time(data['window_end'])};"
        f" flagged when mean SM activity < {data['threshold']:.0%} and a GPU can be given back"
        f" with the rest at {data['target_util']:.0%} of the p95 load; a fleet with too little"
        " data is not judged"
    )
    if df.empty:
        st.info("The site has no inference fleets.")
    else:
        # the table's order: underused fleets first, then the most GPUs to reclaim
        df = df.sort_values(
            ["flagged", "gpus_to_reclaim"], ascending=[False, False], na_position="last"
        )
        flagged = df[df["flagged"]]
        reclaim = int(df["gpus_to_reclaim"].fillna(0).sum())
        freed = float(df["kw_freed"].fillna(0).sum())
        c = st.columns(3)
        ui.metric(c[0], "Underused fleets", f"{len(flagged)} / {len(df)}")
        # the headline is the table's column summed: the same fleets, the same figures
        ui.stat(
            c[1],
            "GPUs to reclaim",
            f"{reclaim:,}",
            f"all {ui.plural(len(df), 'inference fleet')} in the table; in underused ones:"
            f" {int(flagged['gpus_to_reclaim'].fillna(0).sum()):,}",
        )
        ui.stat(
            c[2],
            "Power freed",
            ui.fmt(freed, "kW"),
            "the power of those GPUs, summed over the table",
        )
        df["activity p50 [%]"] = 100 * df["activity_p50"]
        df["activity p95 [%]"] = 100 * df["activity_p95"]
        act = df.melt(
            id_vars=["fleet"],
            value_vars=["activity p50 [%]", "activity p95 [%]"],
            var_name="statistic",
            value_name="value",
        )
        act["statistic"] = act["statistic"].str.replace(" [%]", "", regex=False)
        st.markdown("**Fleet activity** (dashed: the underuse threshold)")
        spec = charts.bar_spec(
            "fleet",
            "value",
            "SM activity [%]",
            color="statistic",
            offset="statistic",
            limit=100 * data["threshold"],
            limit_label="underuse threshold",
            height=300,
        )
        charts.draw(act, spec, "fleet_activity")
        ui.table(
            df[
                [
                    "fleet",
                    "gpus",
                    "gpus_reporting",
                    "activity p50 [%]",
                    "activity p95 [%]",
                    "gpus_needed",
                    "gpus_to_reclaim",
                    "gpu_hours_to_reclaim",
                    "gpu_power_mean_w",
                    "kw_freed",
                    "judged",
                    "flagged",
                    "reason",
                ]
            ],
            {
                "gpu_power_mean_w": "GPU power mean [W]",
                "kw_freed": "freed [kW]",
                "gpu_hours_to_reclaim": "GPU-hours",
            },
            missing_why="not computed: no data for this fleet, or not flagged",
            sort_key="fleets_sort",
        )
    fc = ui.fetch("/api/v1/forecast")
    if fc is None:
        return
    fleets = [e for e in fc["entities"] if e["entity"] == "fleet"]
    rows = [
        {"t": t, "value": None if v is None else v / 1000, "fleet": e["id"], "band": band}
        for e in fleets
        for band, key in (("p50", "p50_w"), ("p90", "p90_w"))
        for t, v in zip(e["t"], e[key], strict=True)
    ]
    if rows:
        fdf = pd.DataFrame(rows)
        fdf["t"] = pd.to_datetime(fdf["t"], utc=True)
        st.markdown("**Load forecast per fleet** (solid p50, dashed p90)")
        spec = charts.line_spec(
            "fleet power [kW]",
            fdf["t"],
            color="fleet",
            color_title="fleet",
            dash="band",
            height=320,
        )
        charts.draw(fdf, spec, "fleet_forecast")
        # what each forecast is and how it scored on the fleet's own history
        ui.table(
            pd.DataFrame(
                [
                    {
                        "fleet": e["id"],
                        "model": e["model"],
                        "skill by lead": "; ".join(
                            f"{h['horizon_s'] / 3600:g} h {h['model']}"
                            + ("" if h["skill"] is None else f" {h['skill']:+.2f}")
                            for h in e["skill"]
                        ),
                        "origins scored": e["origins_scored"],
                        "interval from": e["interval"]["basis"],
                        "p05-p95 held": e["interval"]["checked_coverage"],
                        "why": e["note"],
                    }
                    for e in fleets
                ]
            ),
            missing_why="too few scoring origins to check",
        )


ui.live(body)
