"""Self-contained HTML reports with plotly charts (plotly.js embedded once: no network to view)."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app import labels

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"), ("queue_s", "queueing delay"))


CDF_POINTS = 2000  # points drawn per CDF: finer than a chart shows; a long trace's CDF stays light


def cdf_points(sorted_values: np.ndarray, most: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Points of the empirical CDF of sorted values: every one when there are few, else `most` of
    them at evenly spaced ranks (the first and the last included), each exactly on the CDF."""
    n = len(sorted_values)
    ranks = np.arange(n) if n <= most else np.unique(np.linspace(0, n - 1, most).round().astype(np.int64))
    return sorted_values[ranks], (ranks + 1) / n


def latency_cdfs(requests: pd.DataFrame, label: str = "") -> go.Figure:
    fig = make_subplots(rows=1, cols=len(LATENCIES), subplot_titles=[name for _, name in LATENCIES])
    for i, (column, name) in enumerate(LATENCIES, start=1):
        values = np.sort(requests[column].dropna().to_numpy(dtype=float))
        if len(values):
            x, y = cdf_points(values)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{name} {label}".strip(), showlegend=False,
                                     hovertemplate="%{fullData.name}: %{y:.1%} of requests within %{x:,.3f} s"
                                                   "<extra></extra>"), row=1, col=i)
        fig.update_xaxes(title_text="seconds", row=1, col=i)
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    fig.update_layout(title="Latency CDFs", height=360)
    return fig


def timeseries_figure(timeseries: pd.DataFrame) -> go.Figure:
    panels = (("waiting", "queue length"), ("running", "running batch"), ("tokens_in_flight", "tokens in flight"),
              ("kv_utilization", "KV-cache utilization"), ("throughput", "output tokens/s"))
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=[t for _, t in panels])
    several = timeseries["replica"].nunique() > 1 if len(timeseries) else False
    for replica, ts in timeseries.groupby("replica"):
        ts = ts.sort_values("time_s")
        dt = ts["time_s"].diff()
        ts = ts.assign(throughput=(ts["output_tokens"].diff() / dt).where(dt > 0))
        for row, (column, title) in enumerate(panels, start=1):
            # One legend entry per replica (its five panels toggle together); none for a lone replica.
            fig.add_trace(go.Scatter(x=ts["time_s"], y=ts[column], mode="lines", name=f"replica {replica}",
                                     legendgroup=str(replica), showlegend=several and row == 1,
                                     hovertemplate=f"replica {replica}, {title} at %{{x:,.1f}} s: "
                                                   "%{y:,.3g}<extra></extra>"),
                          row=row, col=1)
        for row, (_, title) in enumerate(panels, start=1):
            fig.update_yaxes(title_text=title, row=row, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=len(panels), col=1)
    fig.update_layout(title="Over time" + (" (one line per replica)" if several else ""), height=1000,
                      showlegend=several)
    return fig


def time_split_figure(summary) -> go.Figure:
    """Where the fleet's time went: busy time by phase (summed over replicas), and queueing."""
    split = summary.time_split_s
    parts = {"prefill": split.prefill, "decode": split.decode, "communication": split.communication,
             "host overhead": split.overhead}
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "domain"}, {"type": "xy"}]],
                        subplot_titles=["busy time by phase", "mean latency by part (s)"])
    fig.add_trace(go.Pie(labels=list(parts), values=list(parts.values()), hole=0.4, name="busy time",
                         hovertemplate="%{label}: %{value:,.2f} s busy (%{percent})<extra></extra>"), row=1, col=1)
    queue, ttft, e2e = summary.queue_s.mean, summary.ttft_s.mean, summary.e2e_s.mean
    latency = {"queueing": queue, "prefill (TTFT - queueing)": ttft - queue, "decode (E2E - TTFT)": e2e - ttft}
    fig.add_trace(go.Bar(x=list(latency), y=list(latency.values()), showlegend=False, name="mean latency",
                         hovertemplate="%{x}: %{y:,.3f} s of the mean latency<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text="part of a request's latency", row=1, col=2)
    fig.update_yaxes(title_text="mean seconds", row=1, col=2)
    fig.update_layout(title="Where time goes", height=380)
    return fig


def ttft_vs_prompt(requests: pd.DataFrame) -> go.Figure:
    finished = requests[requests["status"] == "finished"]
    fig = go.Figure(go.Scattergl(x=finished["prompt_tokens"], y=finished["ttft_s"], mode="markers",
                                 marker=dict(size=4, opacity=0.5), name="requests",
                                 hovertemplate="a request of %{x:,} prompt tokens: TTFT %{y:,.3f} s<extra></extra>"))
    fig.update_layout(title="TTFT vs prompt length", xaxis_title="prompt tokens", yaxis_title="TTFT (s)", height=380)
    return fig


def intervals_figure(summary) -> go.Figure | None:
    """The predicted latency figures with their 80 % intervals as error bars (the engine profile's
    cross-validated errors on real runs); None without intervals."""
    if not summary.intervals:
        return None
    names, values, low, high = [], [], [], []
    for key, (lo, hi) in summary.intervals.items():
        name, stat = key.split(".")
        value = getattr(getattr(summary, name), stat)
        names.append(f"{name.removesuffix('_s').upper()} {stat}")
        values.append(value * 1e3)
        low.append(max(0.0, value - lo) * 1e3)
        high.append(max(0.0, hi - value) * 1e3)
    fig = go.Figure(go.Bar(x=names, y=values, error_y=dict(type="data", array=high, arrayminus=low, visible=True),
                           name="predicted", customdata=[[v - lo_, v + hi_] for v, lo_, hi_ in zip(values, low, high)],
                           hovertemplate="%{x}: %{y:,.1f} ms predicted<br>80 % interval %{customdata[0]:,.1f}-"
                                         "%{customdata[1]:,.1f} ms<extra></extra>"))
    engine = summary.cost_model.engine or ""
    fig.update_layout(title=f"Predicted latencies with 80 % intervals ({engine}, from its cross-validated "
                            "errors on real runs)", yaxis_title="ms", yaxis_type="log", height=380)
    return fig


def summary_rows(s) -> list[tuple[str, str]]:
    """A simulation's summary as (what, value) rows in words and units (the report's table; the whole
    of it is summary.json)."""
    ms = lambda v: "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:,.1f} ms"  # noqa: E731
    rows = [("requests", f"{s.num_finished:,} of {s.num_requests:,} finished ({s.num_rejected:,} rejected) over "
                         f"{s.duration_s:,.1f} simulated s"),
            ("throughput", f"{s.throughput.requests_per_s:,.2f} req/s, {s.throughput.output_tokens_per_s:,.0f} output "
                           f"tok/s, {s.throughput.total_tokens_per_s:,.0f} total tok/s")]
    for name, d in (("TTFT", s.ttft_s), ("TPOT", s.tpot_s), ("E2E", s.e2e_s), ("queueing", s.queue_s)):
        rows.append((name, f"mean {ms(d.mean)}, p50 {ms(d.p50)}, p90 {ms(d.p90)}, p99 {ms(d.p99)} (simulated)"))
    for key, value in s.predicted.items():
        lo, hi = s.intervals[key]
        rows.append((f"{key.replace('_s.', ' ').upper().replace('MEAN', 'mean').replace('P9', 'p9')} predicted",
                     f"{ms(value)} (80 % interval {ms(lo)} – {ms(hi)})"))
    if s.slo.targets:
        rows.append(("SLOs", "; ".join(f"{k} {ms(s.slo.measured.get(k))} (limit {ms(v)}): "
                                       f"{'met' if s.slo.met.get(k) else 'missed'}" for k, v in s.slo.targets.items())))
    if s.cost is not None and s.cost.usd_per_hour is not None:
        per_million = s.cost.usd_per_million_output_tokens
        rows.append(("cost", f"${s.cost.usd_per_hour:,.2f}/hour"
                             + (f", ${per_million:,.3f} per million output tokens" if per_million else "")))
    rows += [("KV cache", f"mean {s.kv_utilization.mean:.0%}, max {s.kv_utilization.max:.0%}; "
                          f"{s.preemptions} preemptions; prefix-cache hit rate {s.prefix_cache_hit_rate:.1%}"),
             ("utilization", f"MFU {s.utilization.mfu:.1%}, MBU {s.utilization.mbu:.1%}, "
                             f"busy {s.utilization.busy_fraction:.0%}")]
    return rows


def write_report(path: Path, title: str, summary, figures: list[go.Figure], notes: str = "") -> None:
    """figures, then the summary (a RunSummary: a table in words; a dict: as JSON)."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if notes:
        parts.append(f"<p>{html.escape(notes)}</p>")
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    if isinstance(summary, dict):
        parts.append("<h2>Summary</h2><pre>" + html.escape(json.dumps(summary, indent=2, default=str)) + "</pre>")
    else:
        parts.append("<h2>Summary</h2><table>" + "".join(f"<tr><th style='text-align:left;padding-right:1em'>"
                                                          f"{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                                          for k, v in summary_rows(summary))
                     + "</table><p>Every figure, by name: <code>summary.json</code> beside this report.</p>")
    path.write_text("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) +
                    "</title></head><body style='font-family:sans-serif;max-width:1200px;margin:auto'>" +
                    "\n".join(parts) + "</body></html>")


def simulation_report(path: Path, result) -> None:
    s = result.summary
    title = (f"servecast simulate: {s.model} on {s.replicas} x {s.hardware} ({labels.parallelism(s)}, "
             f"{s.quant})")
    figures = [latency_cdfs(result.requests), intervals_figure(s), time_split_figure(s),
               timeseries_figure(result.timeseries), ttft_vs_prompt(result.requests)]
    notes = " ".join(filter(None, [labels.cache_words(s), labels.pool_words(s) if s.disaggregation is not None
                                   else None, labels.context_parallel_words(s)]))
    write_report(path, title, s, [f for f in figures if f is not None], notes)


def pareto_figure(rows: list[dict], front: list[str], growth: float) -> go.Figure:
    """$/hour against E2E p99 of every feasible fleet at one traffic growth, the Pareto front joined."""
    feasible = [r for r in rows if r["feasible"] and r["usd_per_hour"] is not None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[r["usd_per_hour"] for r in feasible], y=[r["e2e_p99_s"] for r in feasible],
                             mode="markers", name="fleets", text=[f"{r['replicas']} x {r['candidate']}" for r in feasible],
                             hovertemplate="%{text}<br>$%{x:.2f}/hour<br>E2E p99 %{y:.2f} s<extra></extra>"))
    on_front = sorted((r for r in feasible if r["candidate"] in front), key=lambda r: r["usd_per_hour"])
    fig.add_trace(go.Scatter(x=[r["usd_per_hour"] for r in on_front], y=[r["e2e_p99_s"] for r in on_front],
                             mode="lines+markers", name="Pareto front", text=[r["candidate"] for r in on_front]))
    fig.update_layout(title=f"Cost vs latency at traffic x{growth:g}", xaxis_title="$ per hour",
                      yaxis_title="E2E p99 (s)", height=420)
    return fig
