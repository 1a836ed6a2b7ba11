"""Input widgets the pages share."""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import streamlit as st

from app.dashboard.inputs import workload_from_spec, workload_from_upload
from app import plan_words
from app.plan_defaults import trace as bundled_spec
from simulator.workload.requests import WorkloadError
from simulator.fleet.sim_config import parse_pools


BUNDLED = "bundled ShareGPT lengths"
OPEN_LOOP, CLOSED_LOOP = "arrival rate", "concurrent clients"


def trace_input(key: str, num: int = 200, rate: float = 8.0):
    """The workload chosen on the page (bundled, a spec, or an upload) and a key for caching, or
    (None, None) after showing what is wrong with it. num, rate: the bundled trace's defaults."""
    source = st.radio("Trace", [BUNDLED, "trace spec", "upload"], horizontal=True, key=f"{key}_src")
    try:
        if source == BUNDLED:
            num = st.number_input("requests", 20, 200_000, num, step=20, key=f"{key}_num")
            load = st.radio("load", [OPEN_LOOP, CLOSED_LOOP], horizontal=True, key=f"{key}_load",
                            help="a benchmark's clients: each sends its next request when its last one finishes "
                                 "(vllm bench serve --max-concurrency)")
            if load == CLOSED_LOOP:
                clients = st.number_input("concurrent clients", 1, 4096, 16, key=f"{key}_clients")
                spec = bundled_spec(int(num), math.inf) + f",concurrency={int(clients)}"
            else:
                rate = st.number_input("arrival rate (req/s)", 0.1, 1000.0, float(rate), key=f"{key}_rate")
                spec = bundled_spec(int(num), float(rate))
            return workload_from_spec(spec), spec
        if source == "trace spec":
            spec = st.text_input("--trace spec", "synthetic:num=200,input=512,output=128,rate=6", key=f"{key}_spec")
            return workload_from_spec(spec), spec
        upload = st.file_uploader("trace file (.csv or .jsonl, at most 20 MB)", type=["csv", "jsonl"],
                                  key=f"{key}_upload")
        rate = st.number_input("arrival rate for a lengths-only file (req/s)", 0.1, 1000.0, 8.0, key=f"{key}_urate")
        if upload is None:
            st.info("Upload a trace to plan for it.")
            return None, None
        data = upload.getvalue()
        return workload_from_upload(upload.name, data, float(rate)), f"upload:{upload.name}:{hash(data)}:{rate}"
    except WorkloadError as exc:
        st.error(str(exc))
        return None, None


def trace_words(key: str, workload) -> str:
    """The trace chosen by trace_input(key) in words, e.g. "400 requests at 8 req/s (ShareGPT lengths)"."""
    state = st.session_state
    if state.get(f"{key}_src", BUNDLED) == BUNDLED:
        if f"{key}_num" not in state:  # no widget ran (a bare run of the page): the trace's own figures
            return plan_words.trace_words(workload, "ShareGPT lengths")
        if state.get(f"{key}_load") == CLOSED_LOOP:
            return (f"{int(state[f'{key}_num']):,} requests from {int(state[f'{key}_clients'])} closed-loop clients "
                    "(ShareGPT lengths)")
        return f"{int(state[f'{key}_num']):,} requests at {float(state[f'{key}_rate']):g} req/s (ShareGPT lengths)"
    name = state.get(f"{key}_spec") if state.get(f"{key}_src") == "trace spec" else \
        getattr(state.get(f"{key}_upload"), "name", "the upload")
    return plan_words.trace_words(workload, name)


SPLITS = ["co-located", "1:1", "1:2", "1:3", "2:1"]
CP_SIZES = [1, 2, 4, 8]


def fleet_input(key: str, defaults: dict | None = None) -> dict:
    """One fleet configuration (SimConfig fields) chosen on the page."""
    from app.plan_defaults import priced_gpus
    from simulator.catalog.models import catalog_model_ids

    from simulator.catalog.engines import DEFAULT_GPU_ENGINE, engine_ids

    from app.knob_options import declared

    # The knobs' defaults and help as SimConfig declares them (simulator/fleet/knobs.py).
    d = {"hardware": "h100-sxm", **{k: declared(k).default for k in ("quant", "tp", "cp", "replicas")},
         **(defaults or {})}
    words = {k: declared(k).description for k in ("model", "hardware", "quant", "tp", "cp", "replicas", "engine",
                                                  "expert_parallel", "kv_offload_gb")}
    gpus, models, engines = priced_gpus(), catalog_model_ids(), engine_ids()
    c1, c2, c3, c4, c10, c5, c6, c7, c8, c9 = st.columns(10)
    fields = {"model": c1.selectbox("Model", models, index=models.index("llama-3.1-8b"), key=f"{key}_model",
                                    help=words["model"]),
            "hardware": c2.selectbox("Hardware", gpus, index=gpus.index(d["hardware"]), key=f"{key}_hw",
                                     help=words["hardware"]),
            "quant": c3.selectbox("Precision", ["bf16", "fp8", "int8", "int4"],
                                  index=["bf16", "fp8", "int8", "int4"].index(d["quant"]), key=f"{key}_quant",
                                  help=words["quant"]),
            "tp": c4.selectbox("TP", [1, 2, 4, 8], index=[1, 2, 4, 8].index(d["tp"]), key=f"{key}_tp",
                               help=words["tp"]),
            "cp": c10.selectbox("CP", CP_SIZES, index=CP_SIZES.index(d["cp"]), key=f"{key}_cp", help=words["cp"]),
            "replicas": int(c5.number_input("Replicas", 1, 512, d["replicas"], key=f"{key}_replicas",
                                            help=words["replicas"])),
            "engine": c6.selectbox("Engine", engines, index=engines.index(DEFAULT_GPU_ENGINE), key=f"{key}_engine",
                                   help=words["engine"] + " (vllm-v0.15 is fitted on real vLLM runs and gives 80 % "
                                                          "intervals)"),
            "expert_parallel": c7.checkbox("EP", declared("expert_parallel").default, key=f"{key}_ep",
                                           help=words["expert_parallel"]),
            "kv_offload_gb": float(c8.number_input("CPU KV (GB)", 0, 100_000,
                                                   int(d.get("kv_offload_gb", declared("kv_offload_gb").default)),
                                                   step=64, key=f"{key}_offload", help=words["kv_offload_gb"]))}
    split = c9.selectbox("P:D", SPLITS, key=f"{key}_split",
                         help="prefill/decode disaggregation: per replica count above, P prefill and D decode "
                              "replicas, each prompt's KV sent from one to the other")
    if split != SPLITS[0]:
        prefill, decode = (n * fields["replicas"] for n in parse_pools(split))
        fields.update(disaggregate=f"{prefill}:{decode}", replicas=1)
    return fields


SIMULATIONS_KEPT = 32  # answers remembered across sessions, least recently asked dropped first


@st.cache_resource(show_spinner=False)
def simulation_store() -> OrderedDict:
    """Answers so far, (SimConfig fields, trace key) -> SimResult: a repeated question is instant.
    A plain store rather than st.cache_data, so that the progress bar can live outside it."""
    return OrderedDict()


def simulate_fleet(fields: dict, workload, trace_key: str):
    """The simulation (with a progress bar while it runs), or None after showing why the
    configuration cannot run. Callers only read the result: it is shared with later askers."""
    from pydantic import ValidationError

    from app.common import validation_message
    from calibrate.fitting.device import cost_models_for
    from simulator.fleet.run import simulate
    from simulator.fleet.sim_config import SimConfig

    try:
        config = SimConfig(**fields)
        config.check()
    except ValidationError as exc:
        st.error(validation_message(exc))
        return None
    except ValueError as exc:
        st.error(str(exc))
        return None
    store, key = simulation_store(), (tuple(sorted(fields.items())), trace_key)
    if key in store:
        store.move_to_end(key)
        return store[key]
    try:  # built only for a new question: a profiled device's fit takes seconds
        cost_model, draft_cost_model = cost_models_for(config)
    except ValueError as exc:
        st.error(str(exc))
        return None
    bar = st.progress(0.0, text=f"simulating {len(workload):,} requests")

    def progress(done: int, total: int) -> None:
        bar.progress(done / total, text=f"simulating: {done:,} of {total:,} requests finished")
    try:
        result = simulate(config, workload, cost_model, progress=progress, workers=os.cpu_count() or 1,
                          draft_cost_model=draft_cost_model)
    finally:
        bar.empty()
    store[key] = result
    while len(store) > SIMULATIONS_KEPT:
        store.popitem(last=False)
    return result
