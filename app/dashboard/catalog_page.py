"""Catalog page: the models, accelerators and engine profiles a plan can use (`servecast catalog`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.catalog_tables import TITLES, catalog, label
from app.dashboard import tables


@st.cache_data(show_spinner=False)
def cached_catalog() -> dict[str, list[dict]]:
    return catalog()


def main() -> None:
    st.title("Catalog: what a plan can use")
    for name, rows in cached_catalog().items():
        st.subheader(TITLES[name])
        frame = pd.DataFrame([{label(k): (", ".join(v) if isinstance(v, list) else v) for k, v in row.items()}
                              for row in rows])
        tables.show(frame.astype(object).where(frame.notna(), "–"))


main()
