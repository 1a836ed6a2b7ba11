"""Input widgets the pages share."""

from __future__ import annotations

import streamlit as st

from app.dashboard.inputs import bundled_spec, workload_from_spec, workload_from_upload
from simulator.workload import WorkloadError


def trace_input(key: str):
    """The workload chosen on the page (bundled, a spec, or an upload) and a key for caching, or
    (None, None) after showing what is wrong with it."""
    source = st.radio("Trace", ["bundled ShareGPT lengths", "trace spec", "upload"], horizontal=True, key=f"{key}_src")
    try:
        if source == "bundled ShareGPT lengths":
            num = st.number_input("requests", 20, 5000, 200, step=20, key=f"{key}_num")
            rate = st.number_input("arrival rate (req/s)", 0.1, 1000.0, 8.0, key=f"{key}_rate")
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
