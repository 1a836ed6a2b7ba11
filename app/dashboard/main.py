"""servecast app: `servecast app` (streamlit run app/dashboard/main.py)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

here = Path(__file__).parent
st.set_page_config(page_title="servecast", layout="wide")
st.navigation([st.Page(here / "plan_page.py", title="Plan"), st.Page(here / "explore_page.py", title="Explore"),
               st.Page(here / "compare_page.py", title="Compare"), st.Page(here / "ablate_page.py", title="Ablate"),
               st.Page(here / "trace_page.py", title="Trace"),
               st.Page(here / "calibration_page.py", title="Calibration"),
               st.Page(here / "catalog_page.py", title="Catalog")]).run()
