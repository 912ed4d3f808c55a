"""The dctwin console: `streamlit run dashboards/app.py` (the pages read only the HTTP API)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
PAGES = [
    ("overview.py", "Overview", "🏠"),
    ("floor.py", "Floor", "🗺️"),
    ("rack.py", "Rack", "🗄️"),
    ("power.py", "Power", "⚡"),
    ("cooling.py", "Cooling", "💧"),
    ("network.py", "Network", "🔗"),
    ("fleets.py", "Fleets", "📦"),
    ("alerts.py", "Alerts", "🚨"),
    ("calibration.py", "Calibration", "📐"),
    ("whatif.py", "What-if", "🧪"),
]

st.set_page_config(page_title="dctwin", layout="wide")
nav = st.navigation(
    [
        st.Page(HERE / "pages" / f, title=t, icon=i, default=(n == 0))
        for n, (f, t, i) in enumerate(PAGES)
    ]
)
nav.run()
