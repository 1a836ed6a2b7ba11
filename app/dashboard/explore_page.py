"""Explore page: one fleet on one trace -- latency CDFs, time series, per-request scatter, where time goes."""

from __future__ import annotations

import streamlit as st

from app.common import dumps
from app import html_report, labels
from app.dashboard.widgets import fleet_input, simulate_fleet, trace_input


def main() -> None:
    st.title("Explore one fleet")
    fields = fleet_input("explore")
    workload, trace_key = trace_input("explore")
    if workload is None:
        return
    result = simulate_fleet(fields, workload, trace_key)
    if result is None:
        return
    s = result.summary
    c1, c2, c3, c4, c5 = st.columns(5)
    c1.metric("output tokens/s", f"{s.throughput.output_tokens_per_s:,.0f}")
    c2.metric("TTFT p99", f"{s.ttft_s.p99 * 1e3:,.0f} ms")
    c3.metric("TPOT p99", f"{s.tpot_s.p99 * 1e3:,.1f} ms")
    c4.metric("E2E p99", f"{s.e2e_s.p99:,.2f} s")
    cost = s.cost.usd_per_million_output_tokens
    c5.metric("$ / M output tokens", "-" if cost is None else f"${cost:,.2f}")
    st.caption(labels.cache_words(s))
    if s.disaggregation is not None:
        st.caption(labels.pool_words(s))
    if labels.context_parallel_words(s):
        st.caption(labels.context_parallel_words(s))
    intervals = html_report.intervals_figure(s)
    if intervals is not None:
        st.plotly_chart(intervals, key="intervals")
    st.plotly_chart(html_report.latency_cdfs(result.requests), key="cdfs")
    st.plotly_chart(html_report.time_split_figure(s), key="split")
    st.plotly_chart(html_report.ttft_vs_prompt(result.requests), key="scatter")
    st.plotly_chart(html_report.timeseries_figure(result.timeseries), key="timeseries")
    # Written when asked for: a per-request CSV takes longer than the charts to make.
    st.download_button("requests (CSV)", lambda: result.requests.to_csv(index=False), "requests.csv", "text/csv")
    st.download_button("summary (JSON)", dumps(s), "summary.json", "application/json")


main()
