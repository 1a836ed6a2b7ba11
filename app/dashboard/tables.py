"""Tables as the app shows them: columns named by app/labels.py (with units), numbers in those units
and still numbers (a column sorts by value), and no empty cell: Streamlit shows a missing value as
the word None, so a missing value is written as the labels' dash instead."""

from __future__ import annotations

import re

import pandas as pd
import streamlit as st

from app import labels


def printf(field: str) -> str | None:
    """The label's Python format as the printf format Streamlit's number columns take (no thousands
    separator there); None for a field shown as text."""
    fmt = labels.FIELDS.get(field, ("", 1.0, "{}"))[2]
    if "{}" in fmt:
        return None
    return re.sub(r"\{:,?([^}]*)\}", lambda m: "%" + m.group(1), fmt)


def frame(rows: list[dict], fields: list[str]) -> tuple[pd.DataFrame, dict]:
    """The rows' fields under their labels, and the column_config that formats them. A field no row
    has a value for is left out; one missing somewhere is text (a dash where missing); a complete
    numeric field stays numbers in the label's unit."""
    columns, config = {}, {}
    for field in fields:
        raw = [r.get(field) for r in rows]
        values = [labels.value(field, v) for v in raw]
        if rows and all(v is None for v in values):
            continue
        name = labels.label(field)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and rows:
            columns[name] = values
            if printf(field) is not None:
                config[name] = st.column_config.NumberColumn(format=printf(field))
        else:
            columns[name] = [labels.text(field, v) for v in raw]
    return pd.DataFrame(columns), config


def readable(table: pd.DataFrame) -> pd.DataFrame:
    """Any frame as shown: its columns named by their labels, missing cells a dash (such a column
    becomes text, numbers to four figures; a complete one keeps its type)."""
    out = table.rename(columns={c: labels.label(str(c)) for c in table.columns})
    for column in out.columns:
        missing = out[column].isna()
        if missing.any():
            out[column] = [labels.MISSING if m else f"{v:.4g}" if isinstance(v, float) else str(v)
                           for v, m in zip(out[column], missing)]
    return out


def show(table: pd.DataFrame, config: dict | None = None) -> None:
    st.dataframe(table, hide_index=True, column_config=config or None)
