"""Compare page: two fleets side by side on the same trace."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.dashboard.widgets import fleet_input, simulate_fleet, trace_input
from app.labels import MISSING

# (summary part, figure, label with unit, multiplier to that unit, format)
METRICS = [("throughput", "output_tokens_per_s", "Output tokens/s", 1.0, "{:,.0f}"),
           ("ttft_s", "p50", "TTFT p50 (ms)", 1e3, "{:,.0f}"), ("ttft_s", "p99", "TTFT p99 (ms)", 1e3, "{:,.0f}"),
           ("tpot_s", "p50", "TPOT p50 (ms)", 1e3, "{:,.1f}"), ("tpot_s", "p99", "TPOT p99 (ms)", 1e3, "{:,.1f}"),
           ("e2e_s", "p99", "E2E p99 (s)", 1.0, "{:,.2f}"), ("cost", "usd_per_hour", "$ / hour", 1.0, "${:,.2f}"),
           ("cost", "usd_per_million_output_tokens", "$ / M output tokens", 1.0, "${:,.3f}")]


def main() -> None:
    st.title("Compare fleets")
    st.caption("Fleet A")
    a = fleet_input("a")
    st.caption("Fleet B")
    b = fleet_input("b", {"hardware": "a100-80gb", "replicas": 2})
    workload, trace_key = trace_input("compare")
    if workload is None:
        return
    results = {"A": simulate_fleet(a, workload, trace_key), "B": simulate_fleet(b, workload, trace_key)}
    if any(r is None for r in results.values()):
        return
    rows = []
    for group, key, label, scale, fmt in METRICS:  # the figures in their units, as text: a dash where none
        values = {f"Fleet {name}": getattr(getattr(r.summary, group), key) for name, r in results.items()}
        rows.append({"Figure": label,
                     **{n: MISSING if v is None else fmt.format(v * scale) for n, v in values.items()}})
    rows.append({"Figure": "Prefix-cache hits (% of prompt tokens)",
                 **{f"Fleet {n}": f"{r.summary.prefix_cache_hit_rate:.1%}" for n, r in results.items()}})
    rows.append({"Figure": "... of them from the CPU KV tier",
                 **{f"Fleet {n}": MISSING if r.summary.kv_offload is None else
                    f"{r.summary.kv_offload.hit_rate:.1%}" for n, r in results.items()}})
    rows.append({"Figure": "Context parallelism (ranks per replica)",
                 **{f"Fleet {n}": f"{r.summary.cp:d}" for n, r in results.items()}})
    rows.append({"Figure": "KV tokens per replica",
                 **{f"Fleet {n}": f"{r.summary.memory.kv_tokens:,}" for n, r in results.items()}})
    table = pd.DataFrame(rows)
    st.dataframe(table, hide_index=True)
    fig = go.Figure()
    for name, r in results.items():
        finished = r.requests[r.requests["status"] == "finished"]
        values = finished["e2e_s"].sort_values().to_numpy()
        fig.add_trace(go.Scatter(x=values, y=[(i + 1) / len(values) for i in range(len(values))], mode="lines",
                                 name=f"{name}: {r.summary.replicas} x {r.summary.hardware}",
                                 hovertemplate="%{fullData.name}: %{y:.1%} of requests within %{x:,.2f} s"
                                               "<extra></extra>"))
    fig.update_layout(title="E2E latency CDF", xaxis_title="seconds", yaxis_title="fraction of requests", height=360)
    st.plotly_chart(fig, key="cdf")
    st.download_button("comparison (CSV)", table.to_csv(index=False), "compare.csv", "text/csv")


main()
