"""Ablate page: what each serving technique buys, one on top of the other (`servecast ablate`)."""

from __future__ import annotations

import os

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import labels
from app.ablate_command import ABLATION_FIELDS, WORKLOAD
from app.plan_defaults import SLO, priced_gpus



@st.cache_data(show_spinner=False, max_entries=16)
def ladder_rows(model: str, hardware: str, workload: str, slo: str, acceptance: float) -> tuple[list[dict], int]:
    """The rungs' rows and the max_model_len they ran at (ValueError: bad input, with its reason)."""
    from simulator.fleet.sim_config import parse_slos
    from simulator.plan.ablate import ablate, ladder_for
    from simulator.plan.capacity import PlanSpec
    from simulator.workload.load import load_workload

    spec = PlanSpec(model, load_workload(workload), parse_slos(slo))
    rungs = ladder_for(spec, hardware, acceptance=acceptance)
    results = ablate(spec, rungs, workers=os.cpu_count() or 1)
    return [r.row() for r in results], rungs[0].knobs["max_model_len"]


def main() -> None:
    from simulator.catalog.models import catalog_model_ids

    st.title("What each technique buys")
    st.caption("Each row is the one above plus one technique, planned for the SLOs on the workload: the GPUs "
               "it needs, their p99s and cost, and one replica's peak throughput with every request at once.")
    models, gpus = catalog_model_ids(), priced_gpus()
    c1, c2, c3 = st.columns(3)
    model = c1.selectbox("Model", models, index=models.index("llama-2-70b"), key="ablate_model")
    hardware = c2.selectbox("Hardware", gpus, index=gpus.index("a100-80gb"), key="ablate_hw")
    acceptance = c3.slider("Speculation: acceptance per draft (assumed)", 0.0, 1.0, 0.6, 0.05, key="ablate_accept")
    workload = st.text_input("Workload", WORKLOAD, key="ablate_workload")
    slo = st.text_input("SLOs", SLO, key="ablate_slo")
    if not st.button("Ablate", key="ablate_go", type="primary"):
        st.info("Choose a model, an accelerator and a workload, then press Ablate (seconds to a minute).")
        return
    try:
        with st.spinner("planning every rung..."):
            rows, max_len = ladder_rows(model, hardware, workload, slo, acceptance)
    except (ValueError, KeyError, OSError) as exc:
        st.error(str(exc).strip("'\""))
        return
    frame = pd.DataFrame({labels.label(f): [labels.value(f, r[f]) for r in rows] for f in ABLATION_FIELDS})
    st.dataframe(frame, hide_index=True)
    st.caption(f"max_model_len {max_len}: the workload's longest request rounded up (what continuous batching "
               "without paging reserves per request).")
    gpus, usd = labels.label("gpus"), labels.label("usd_per_million_output_tokens")
    fig = go.Figure(go.Bar(x=frame[labels.label("technique")], y=frame[gpus], text=frame[usd].map(
        lambda v: "" if pd.isna(v) else f"${v:,.2f}/M"), hovertemplate="%{x}: %{y} GPUs<extra></extra>"))
    fig.update_layout(title="GPUs to meet the SLOs (label: $ per million output tokens)", yaxis_type="log",
                      yaxis_title="GPUs", height=380)
    st.plotly_chart(fig, key="ablate_gpus")
    st.download_button("ladder (CSV)", frame.to_csv(index=False), "ablate.csv", "text/csv")


main()
