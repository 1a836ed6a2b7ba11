"""Plan page: the cheapest fleet that meets the SLOs for a trace, with the cost/latency trade-off."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from app.dashboard.widgets import trace_input
from app.html_report import pareto_figure
from app.plan_command import priced_gpus
from simulator.catalog.models import catalog_model_ids, load_model
from simulator.plan.executors import run_plan
from simulator.plan.capacity import CandidateResult, PlanSpec, pareto_front, recommend
from simulator.plan.grid import candidate_grid


@st.cache_data(show_spinner=False, max_entries=64)
def cached_plan(model: str, trace_key: str, _workload, slo: tuple, candidates: tuple, growth: tuple,
                workers: int) -> list[dict]:
    """Rows of a plan; a repeated question (same inputs) is answered from the cache at once."""
    spec = PlanSpec(model, _workload, dict(slo))
    result = run_plan(spec, list(candidates), growth, workers=workers)
    return [r.row() for r in result.results]


def main() -> None:
    st.title("Plan: the cheapest fleet that meets the SLOs")
    models = catalog_model_ids()
    model = st.selectbox("Model", models, index=models.index("llama-3.1-8b") if "llama-3.1-8b" in models else 0)
    workload, trace_key = trace_input("plan")
    gpus = priced_gpus()
    with st.form("plan_form"):
        col1, col2 = st.columns(2)
        ttft = col1.number_input("TTFT p99 SLO (s)", 0.01, 120.0, 2.0, key="ttft")
        tpot = col2.number_input("TPOT p99 SLO (ms)", 1.0, 10000.0, 100.0, key="tpot")
        hardware = st.multiselect("Hardware", gpus, default=[g for g in ("h100-sxm", "a100-80gb", "l40s") if g in gpus],
                                  key="hardware")
        quant = st.multiselect("Weight precision", ["bf16", "fp8", "int8", "int4"], default=["bf16", "fp8"],
                               key="quant")
        tp = st.multiselect("Tensor parallelism", [1, 2, 4, 8], default=[1, 2], key="tp")
        placements = st.multiselect("Experts under TP (mixture-of-experts models)",
                                    ["sliced (TP)", "whole per rank (EP)"], default=["sliced (TP)"], key="ep",
                                    help="EP: each rank holds whole experts and tokens travel to them (all-to-all)")
        growth = st.multiselect("Traffic growth", [1.0, 2.0, 4.0], default=[1.0], key="growth")
        slo_sensitivity = st.checkbox("Sensitivity to SLO tightness (also plan at 0.5x and 2x the SLOs)",
                                      key="slo_sensitivity")
        submitted = st.form_submit_button("Plan")
    if workload is None:
        return
    if submitted:
        if not (hardware and quant and tp and growth):
            st.warning("Choose at least one hardware, precision, TP size and growth factor.")
            return
        moe = load_model(model).is_moe
        modes = [False] if not moe else [p.endswith("(EP)") for p in placements] or [False]
        candidates = tuple(candidate_grid(hardware, quant, tp, expert_parallel=modes))
        if not candidates:
            st.warning("Expert parallelism needs TP > 1: add a TP size above 1 or choose sliced experts.")
            return
        slo = (("ttft_p99", float(ttft)), ("tpot_p99", float(tpot) / 1e3))
        factors = (1.0, 0.5, 2.0) if slo_sensitivity else (1.0,)
        by_slo = {}
        with st.spinner(f"planning {len(candidates) * len(growth) * len(factors)} points"):
            for f in factors:
                scaled = tuple((k, v * f) for k, v in slo)
                by_slo[f] = cached_plan(model, trace_key, workload, scaled, candidates, tuple(sorted(growth)), 0)
        st.session_state["plan"] = (by_slo[1.0], sorted(growth), by_slo)
    if "plan" in st.session_state:
        show(*st.session_state["plan"])
    else:
        st.info("Set the SLOs and candidates, then press Plan.")


def cheapest(rows: list[dict]) -> dict | None:
    """The planner's recommendation (simulator.plan.capacity.recommend) among these rows."""
    best = recommend([CandidateResult.from_row(r) for r in rows])
    return best.row() if best is not None else None


def sensitivity(by_growth: dict[float, dict | None], by_slo: dict[float, dict | None]) -> None:
    """The recommended fleet's $/hour as traffic grows and as the SLOs tighten or loosen."""
    import plotly.graph_objects as go

    for title, axis, points in (("Sensitivity to traffic growth", "traffic x", by_growth),
                                ("Sensitivity to SLO tightness", "SLOs x", by_slo)):
        if len(points) < 2:
            continue
        xs = sorted(points)
        fig = go.Figure(go.Scatter(x=xs, y=[points[x]["usd_per_hour"] if points[x] else None for x in xs],
                                   text=[f"{points[x]['replicas']} x {points[x]['candidate']}" if points[x]
                                         else "no fleet meets the SLOs" for x in xs], mode="lines+markers"))
        fig.update_layout(title=title, xaxis_title=axis, yaxis_title="recommended $ / hour", height=320)
        st.plotly_chart(fig, key=title)


def show(rows: list[dict], growth: list[float], by_slo: dict[float, list[dict]] | None = None) -> None:
    sensitivity({g: cheapest([r for r in rows if r["rate_scale"] == g]) for g in growth},
                {f: cheapest([r for r in slo_rows if r["rate_scale"] == growth[0]])
                 for f, slo_rows in (by_slo or {}).items()})
    for g in growth:
        at = [r for r in rows if r["rate_scale"] == g]
        st.subheader(f"Traffic x{g:g}")
        best = cheapest(at)
        if best is None:
            st.error("No candidate meets the SLOs at this traffic; see the reasons below.")
        else:
            st.success(f"Recommended: {best['replicas']} x {best['candidate']} -- ${best['usd_per_hour']:.2f}/hour, "
                       f"${best['usd_per_million_output_tokens']:.2f} per million output tokens")
            front = [r.candidate.label for r in pareto_front([CandidateResult.from_row(r) for r in at])]
            st.plotly_chart(pareto_figure(at, front, g), key=f"pareto_{g}")
        table = pd.DataFrame(at)[["candidate", "feasible", "replicas", "gpus", "usd_per_hour",
                                  "usd_per_million_output_tokens", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s",
                                  "headroom", "reason"]]
        st.dataframe(table, hide_index=True)
        st.download_button("candidates (CSV)", table.to_csv(index=False), f"plan_x{g:g}.csv", "text/csv",
                           key=f"csv_{g}")
    st.download_button("whole plan (JSON)", json.dumps(rows, indent=2, default=str), "plan.json", "application/json",
                       key="json_all")


main()
