"""Trace page: what the traffic looks like -- arrivals over time, prompt and output lengths, prefix reuse."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.dashboard.widgets import trace_input


def main() -> None:
    st.title("Trace")
    workload, _ = trace_input("trace")
    if workload is None:
        return
    frame = pd.DataFrame({"arrival_s": [r.arrival_s for r in workload.requests],
                          "prompt_tokens": [r.prompt_tokens for r in workload.requests],
                          "output_tokens": [r.output_tokens for r in workload.requests],
                          "shared_segments": [len(r.segments) for r in workload.requests]})
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("requests", f"{len(frame):,}")
    clients = workload.clients
    c2.metric("mean rate (req/s)", f"{workload.rate_per_s:.2f}" if np.isfinite(workload.rate_per_s) else
              f"{clients.concurrency} clients" if clients is not None else "all at once")
    if clients is not None:
        st.caption(f"Sent by {clients.concurrency} closed-loop clients, each sending its next request when its last "
                   "finishes" + (f" and {clients.think_s:g} s have passed" if clients.think_s else "")
                   + ": when they arrive depends on the fleet serving them (Explore simulates it).")
    c3.metric("mean prompt", f"{frame['prompt_tokens'].mean():,.0f} tokens")
    c4.metric("mean output", f"{frame['output_tokens'].mean():,.0f} tokens")
    start = frame["arrival_s"].min()
    span = max(frame["arrival_s"].max() - start, 1e-9)
    bins = max(1, min(100, len(frame) // 10))
    counts, edges = np.histogram(frame["arrival_s"] - start, bins=bins, range=(0, span))
    arrivals = go.Figure(go.Bar(x=edges[:-1], y=counts / (span / bins), name="arrival rate",
                                hovertemplate="from %{x:,.1f} s: %{y:,.2f} requests/s<extra></extra>"))
    arrivals.update_layout(title="Arrival rate over time", xaxis_title="seconds", yaxis_title="requests/s", height=320)
    st.plotly_chart(arrivals, key="arrivals")
    lengths = go.Figure()
    for column in ("prompt_tokens", "output_tokens"):
        name = column.replace("_", " ")
        lengths.add_trace(go.Histogram(x=frame[column], name=name, opacity=0.6,
                                       hovertemplate=f"%{{y:,}} requests of %{{x}} {name}<extra></extra>"))
    lengths.update_layout(title="Lengths", barmode="overlay", xaxis_title="tokens", yaxis_title="requests", height=320)
    st.plotly_chart(lengths, key="lengths")
    shared = (frame["shared_segments"] > 0).mean()
    st.caption(f"{shared:.0%} of requests share prompt segments with others (prefix reuse)")
    st.download_button("requests (CSV)", lambda: frame.to_csv(index=False), "trace.csv", "text/csv")  # made when asked


main()
