"""Plan page: the cheapest fleet that meets the SLOs for a trace, with the cost/latency trade-off.
Its defaults are the plan question of `servecast plan` (app/plan_defaults.py): the same answer."""

from __future__ import annotations

import json
import os

import pandas as pd
import streamlit as st

from app import html_report, labels, plan_defaults, plan_words
from app.dashboard import tables
from app.plan_output import basis_caveat
from app.plan_report import FEASIBLE_FIELDS
from app.dashboard.widgets import CP_SIZES, SPLITS, trace_input, trace_words
from simulator.catalog.models import catalog_model_ids, load_model
from simulator.plan.executors import run_plan
from simulator.plan.capacity import (Candidate, CandidateResult, PlanSpec, pareto_front, recommend,
                                     recommend_validated)
from simulator.plan.grid import candidate_grid

QUANTS, TPS, GROWTHS = ["bf16", "fp8", "int8", "int4"], [1, 2, 4, 8], [1.0, 2.0, 4.0]
OFFLOAD_GB = [0, 64, 256, 1024]


@st.cache_data(show_spinner=False, max_entries=64)
def cached_plan(model: str, trace_key: str, _workload, slo: tuple, candidates: tuple, growth: tuple,
                workers: int, exhaustive: bool = False) -> list[dict]:
    """Rows of a plan; a repeated question (same inputs) is answered from the cache at once."""
    spec = PlanSpec(model, _workload, dict(slo))
    result = run_plan(spec, list(candidates), growth, workers=workers, exhaustive=exhaustive)
    return [r.row() for r in result.results]


@st.cache_data(show_spinner=False, max_entries=32)
def fleet_summary(model: str, trace_key: str, _workload, slo: tuple, candidate: tuple, replicas: int,
                  rate_scale: float):
    """The summary of one planned fleet, simulated as the planner simulated it (its probe traffic,
    its config): the same latencies as its plan row, with the engine profile's 80 % intervals. A
    RunSummary (st.cache_data keeps it pickled)."""
    from simulator.fleet.run import simulate

    spec = PlanSpec(model, _workload, dict(slo))
    return simulate(spec.config(Candidate(**dict(candidate)), replicas), spec.probe(rate_scale)).summary


def markdown_text(text: str) -> str:
    """Text shown literally by st.markdown ($ would start LaTeX, _ and * emphasis)."""
    return "".join("\\" + c if c in "\\`*_[]<>$~|#" else c for c in text)


def main() -> None:
    st.title("Plan: the cheapest fleet that meets the SLOs")
    models = catalog_model_ids()
    default_model = models.index(plan_defaults.MODEL) if plan_defaults.MODEL in models else 0
    model = st.selectbox("Model", models, index=default_model)
    workload, trace_key = trace_input("plan", plan_defaults.NUM_REQUESTS, plan_defaults.RATE)
    gpus = plan_defaults.priced_gpus()
    slo_defaults = plan_defaults.slo_values()
    with st.form("plan_form"):
        col1, col2 = st.columns(2)
        ttft = col1.number_input("TTFT p99 SLO (s)", 0.01, 120.0, float(slo_defaults["ttft_p99"]), key="ttft")
        tpot = col2.number_input("TPOT p99 SLO (ms)", 1.0, 10000.0, float(slo_defaults["tpot_p99"]) * 1e3, key="tpot")
        hardware = st.multiselect("Hardware", gpus, default=gpus, key="hardware")
        quant = st.multiselect("Weight precision", QUANTS, default=list(plan_defaults.QUANT), key="quant")
        tp = st.multiselect("Tensor parallelism", TPS, default=list(plan_defaults.TP), key="tp")
        cp = st.multiselect("Context parallelism", CP_SIZES, default=list(plan_defaults.CP), key="cp",
                            help="ranks per replica that split every sequence's KV by position (ring attention "
                                 "for prefills): worth it for long prompts under a tight TTFT")
        placements = st.multiselect("Experts under TP (mixture-of-experts models)",
                                    ["sliced (TP)", "whole per rank (EP)"], default=["sliced (TP)"], key="ep",
                                    help="EP: each rank holds whole experts and tokens travel to them (all-to-all)")
        tiers = st.multiselect("CPU KV tier (GB of host memory per replica)", OFFLOAD_GB, default=[0], key="offload",
                               help="evicted prefix-cache blocks kept in host memory and loaded back over PCIe: "
                                    "worth it where prompts share long prefixes (multi-turn chat, agents)")
        splits = st.multiselect("Prefill/decode disaggregation (P:D)", SPLITS, default=[SPLITS[0]], key="split",
                                help="a pool of prefill replicas and one of decode replicas, each prompt's KV sent "
                                     "between them; a fleet of n is n x P prefill and n x D decode replicas")
        growth = st.multiselect("Traffic growth", GROWTHS, default=list(plan_defaults.GROWTH), key="growth")
        slo_sensitivity = st.checkbox("Sensitivity to SLO tightness (also plan at 0.5x and 2x the SLOs)",
                                      key="slo_sensitivity")
        exhaustive = st.checkbox("Simulate every candidate (slower)", key="exhaustive",
                                 help="by default a candidate that cannot beat the cheapest fleet found, even at "
                                      "the fewest replicas it could need, is bounded out unsimulated, and headroom "
                                      "and the slow end are found for the recommended fleet and the Pareto front "
                                      "only (`servecast plan --exhaustive`)")
        submitted = st.form_submit_button("Plan")
    if workload is None:
        return
    asked = plan_words.question(model, trace_words("plan", workload), hardware, quant, tp,
                                {"ttft_p99": float(ttft), "tpot_p99": float(tpot) / 1e3}, growth, cp or [1])
    st.markdown("**The question:** " + markdown_text(asked))
    if submitted:
        if not (hardware and quant and tp and growth):
            st.warning("Choose at least one hardware, precision, TP size and growth factor.")
            return
        moe = load_model(model).is_moe
        modes = [False] if not moe else [p.endswith("(EP)") for p in placements] or [False]
        candidates = tuple(candidate_grid(hardware, quant, tp, plan_defaults.PP, expert_parallel=modes,
                                          kv_offload_gb=[float(g) for g in tiers] or [0.0],
                                          disaggregate=[None if x == SPLITS[0] else x for x in splits] or [None],
                                          cp=cp or [1]))
        if not candidates:
            st.warning("Expert parallelism needs TP > 1: add a TP size above 1 or choose sliced experts.")
            return
        slo = (("ttft_p99", float(ttft)), ("tpot_p99", float(tpot) / 1e3))
        factors = (1.0, 0.5, 2.0) if slo_sensitivity else (1.0,)
        points = len(candidates) * len(growth)
        workers = min(os.cpu_count() or 1, points) if points > 1 else 0  # processes as `servecast plan` runs
        by_slo = {}
        with st.spinner(f"planning {points * len(factors)} points"):
            for f in factors:
                scaled = tuple((k, v * f) for k, v in slo)
                by_slo[f] = cached_plan(model, trace_key, workload, scaled, candidates, tuple(sorted(growth)), workers,
                                        exhaustive)
        st.session_state["plan"] = {"question": asked, "rows": by_slo[1.0], "growth": sorted(growth),
                                    "by_slo": by_slo, "ask": (model, trace_key, workload, slo)}
    if "plan" in st.session_state:
        plan = st.session_state["plan"]
        if plan["question"] != asked:
            st.info("The plan below answers an earlier question: " + markdown_text(plan["question"])
                    + ". Press Plan to answer this one.")
        show(plan["rows"], plan["growth"], plan["by_slo"], plan["ask"])
    else:
        st.info("Set the SLOs and candidates, then press Plan.")


def cheapest(rows: list[dict]) -> dict | None:
    """The planner's recommendation (simulator.plan.capacity.recommend) among these rows."""
    best = recommend([CandidateResult.from_row(r) for r in rows])
    return best.row() if best is not None else None


def fleet_name(row: dict | None) -> str:
    return f"{row['replicas']} x {row['candidate']}" if row else "no fleet meets the SLOs"


def sensitivity(by_growth: dict[float, dict | None], by_slo: dict[float, dict | None]) -> None:
    """The recommended fleet's $/hour as traffic grows and as the SLOs tighten or loosen."""
    import plotly.graph_objects as go

    for title, axis, points in (("Sensitivity to traffic growth", "traffic x", by_growth),
                                ("Sensitivity to SLO tightness", "SLOs x", by_slo)):
        if len(points) < 2:
            continue
        xs = sorted(points)
        fig = go.Figure(go.Scatter(x=xs, y=[points[x]["usd_per_hour"] if points[x] else None for x in xs],
                                   text=[fleet_name(points[x]) for x in xs], mode="lines+markers",
                                   name="recommended fleet",
                                   hovertemplate=f"{axis}%{{x:g}}: %{{text}}<br>$%{{y:.2f}} / hour<extra></extra>"))
        fig.update_layout(title=title, xaxis_title=axis, yaxis_title="recommended $ / hour", height=320)
        st.plotly_chart(fig, key=title)


def recommended(best: dict, ask: tuple, growth: float, validated: dict | None = None) -> None:
    """The recommended fleet: its cost, its latencies against the SLOs with their 80 % intervals,
    and the replicas it needs if serving runs at the slow end of those intervals; beside it, where
    its costs are not validated on real runs, why, and the cheapest fleet whose costs are."""
    model, trace_key, workload, slo = ask
    st.success(f"Recommended: {fleet_name(best)} -- {labels.text('usd_per_hour', best['usd_per_hour'])} / hour, "
               f"{labels.text('usd_per_million_output_tokens', best['usd_per_million_output_tokens'])} "
               "per million output tokens")
    caveat = basis_caveat(best, validated)
    if caveat:
        st.warning(markdown_text(caveat[0].upper() + caveat[1:]) + ".")
    candidate = tuple((k, best[k]) for k in Candidate.__dataclass_fields__)
    with st.spinner("simulating the recommended fleet for its intervals"):
        summary = fleet_summary(model, trace_key, workload, slo, candidate, best["replicas"], growth)
    intervals = summary.intervals
    tables.show(pd.DataFrame(plan_words.slo_rows(best, dict(slo))))
    if intervals:
        slow = best.get("replicas_slow_end")
        needs = (f"{slow} replica{'s' if slow != 1 else ''} if serving runs" if slow is not None
                 else "No fleet of this deployment meets the SLOs if serving runs")
        st.caption(f"{needs} at the slow end of the 80 % interval (the engine profile's cross-validated errors "
                   "on real runs).")
        st.plotly_chart(html_report.intervals_figure(summary), key=f"intervals_{growth}")
    else:
        st.caption("This engine has no 80 % intervals (an engine profile fitted on real runs gives them).")


def infeasible(rows: list[dict]) -> pd.DataFrame:
    """The candidates that meet the SLOs with no fleet, one row per reason (plan_words.reason_groups)."""
    return pd.DataFrame([{labels.label("reason"): reason, "How many": len(which), "Deployments": ", ".join(which)}
                         for reason, which in plan_words.reason_groups(rows)])


def show(rows: list[dict], growth: list[float], by_slo: dict[float, list[dict]], ask: tuple) -> None:
    sensitivity({g: cheapest([r for r in rows if r["rate_scale"] == g]) for g in growth},
                {f: cheapest([r for r in slo_rows if r["rate_scale"] == growth[0]]) for f, slo_rows in by_slo.items()})
    for g in growth:
        at = [r for r in rows if r["rate_scale"] == g]
        st.subheader(f"Traffic x{g:g}")
        best = cheapest(at)
        if best is None:
            st.error("No candidate meets the SLOs at this traffic; see the reasons below.")
        else:
            validated = recommend_validated([CandidateResult.from_row(r) for r in at])
            recommended(best, ask, g, validated.row() if validated is not None else None)
            front = [r.candidate.label for r in pareto_front([CandidateResult.from_row(r) for r in at])]
            st.plotly_chart(html_report.pareto_figure(at, front, g), key=f"pareto_{g}")
        feasible = plan_words.cheapest_first(at)
        if feasible:
            st.markdown(f"**Fleets that meet the SLOs**, cheapest first ({len(feasible)})")
            tables.show(*tables.frame(feasible, list(FEASIBLE_FIELDS)))
        bounded = [r for r in at if r.get("replicas_at_least") is not None]
        if bounded:
            st.markdown(f"**Bounded out** ({len(bounded)}): dearer than the cheapest fleet found even at the fewest "
                        "replicas they could need; tick *Simulate every candidate* to search them to the end")
            tables.show(pd.DataFrame({labels.label("candidate"): [r["candidate"] for r in bounded],
                                      "Needs at least (replicas)": [r["replicas_at_least"] for r in bounded]}))
        failed = [r for r in at if not r["feasible"] and r.get("replicas_at_least") is None]
        if failed:
            st.markdown(f"**Deployments with no fleet that meets the SLOs** ({len(failed)}), by reason")
            tables.show(infeasible(failed))
        everything = pd.DataFrame({labels.label(f): [labels.value(f, r.get(f)) for r in at]
                                   for f in list(FEASIBLE_FIELDS)[:1] + ["feasible"] + list(FEASIBLE_FIELDS)[1:] + ["reason"]})
        st.download_button("candidates (CSV)", everything.to_csv(index=False), f"plan_x{g:g}.csv", "text/csv",
                           key=f"csv_{g}")
    st.download_button("whole plan (JSON)", json.dumps(rows, indent=2, default=str), "plan.json", "application/json",
                       key="json_all")


main()
