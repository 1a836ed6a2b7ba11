"""The plan as a page for whoever signs the purchase order (`servecast plan --out DIR` -> report.html):
the question in words, the answer first, a sortable candidate table, charts that name every point,
and how the numbers were made. Self-contained (plotly.js embedded once), no raw JSON (plan.json)."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app import labels, plan_words
from app.ablate_command import ABLATION_FIELDS
from app.html_report import intervals_figure, latency_cdfs, time_split_figure, timeseries_figure
from app.plan_output import basis_caveat
from simulator.fleet.sim_config import parse_pools

FEASIBLE_FIELDS = ("candidate", "replicas", "gpus", "usd_per_hour", "usd_per_million_output_tokens", "ttft_p99_s",
                   "tpot_p99_s", "e2e_p99_s", "headroom", "replicas_slow_end")
SLO_FIELDS = {"ttft_p99": "ttft_p99_s", "tpot_p99": "tpot_p99_s", "e2e_p99": "e2e_p99_s"}
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em} .question{font-size:1.1em;color:#444} .answer{background:#eef6ee;border:1px solid #9c9;
padding:.8em 1.2em;border-radius:6px;margin:1em 0} .none{background:#fbeeee;border-color:#c99}
table{border-collapse:collapse;margin:.5em 0 1.5em} th,td{padding:.25em .7em;border-bottom:1px solid #ddd;
text-align:right} th{cursor:pointer;background:#f4f4f4} td:first-child,th:first-child{text-align:left}
.note{color:#666;font-size:.9em} .flag{color:#a60}
"""
# Click a header to sort its column (by each cell's data-v, numbers as numbers); again to reverse.
SORT_JS = """
document.querySelectorAll('table.sortable th').forEach((th, col) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], rows = [...body.rows];
  const dir = th.dataset.dir === 'up' ? -1 : 1; th.dataset.dir = dir === 1 ? 'up' : 'down';
  const key = r => { const v = r.cells[col].dataset.v; const n = parseFloat(v); return isNaN(n) ? v : n; };
  rows.sort((a, b) => { const x = key(a), y = key(b); return (x > y ? 1 : x < y ? -1 : 0) * dir; });
  rows.forEach(r => body.appendChild(r));
}));
"""


def esc(text) -> str:
    return html.escape(str(text))


def fleet_words(row: dict) -> str:
    """'2 x h100-sxm (bf16, TP 1)', '1 x h100-sxm (bf16, TP 1, CP 2)'; disaggregated: '2 prefill + 6
    decode x h100-sxm (...)'."""
    c = row
    count = f"{c['replicas']} x"
    if c.get("disaggregate"):
        prefill, decode = (n * c["replicas"] for n in parse_pools(c["disaggregate"]))
        count = f"{prefill} prefill + {decode} decode x"
    extra = [f"TP {c['tp']}"] + ([f"PP {c['pp']}"] if c.get("pp", 1) > 1 else []) + \
        ([f"CP {c['cp']}"] if c.get("cp", 1) > 1 else []) + \
        (["EP"] if c.get("expert_parallel") else []) + \
        ([f"{c['speculative']} speculation x{c['num_speculative_tokens']}"] if c.get("speculative") else []) + \
        ([f"{c['kv_offload_gb']:g} GB CPU KV tier"] if c.get("kv_offload_gb") else [])
    return f"{count} {c['hardware']} ({c['quant']}, {', '.join(extra)})"


def sortable_table(rows: list[dict], fields, flags: dict[str, str] | None = None) -> str:
    head = "".join(f"<th>{esc(labels.label(f))}</th>" for f in fields)
    body = []
    for r in rows:
        cells = []
        for f in fields:
            v, shown = labels.value(f, r.get(f)), esc(labels.text(f, r.get(f)))
            if f == "candidate" and flags and flags.get(r["candidate"]):
                shown += f" <span class='flag' title='{esc(flags[r['candidate']])}'>⚠</span>"
            cells.append(f"<td data-v='{esc('' if v is None else v)}'>{shown}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table class='sortable'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def answer_html(best: dict | None, growth: float, slos: dict, closest: str | None, validated: dict | None = None) -> str:
    if best is None:
        return (f"<div class='answer none'><b>At traffic x{growth:g} no candidate meets "
                f"{esc(plan_words.slo_words(slos))}.</b> {esc(closest or '')}</div>")
    rows = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row.values()) + "</tr>"
                   for row in plan_words.slo_rows(best, slos))
    slow = best.get("replicas_slow_end")
    lines = [f"<h2 style='margin-top:0'>Buy {esc(fleet_words(best))}</h2>",
             f"<p>{esc(labels.text('usd_per_hour', best['usd_per_hour']))} per hour, "
             f"{esc(labels.text('usd_per_million_output_tokens', best['usd_per_million_output_tokens']))} per "
             f"million output tokens; headroom {esc(labels.text('headroom', best.get('headroom')))} this traffic "
             f"before an SLO is missed.</p>",
             "<table><thead><tr><th>SLO metric</th><th>predicted</th><th>80 % interval</th><th>limit</th>"
             "<th>met</th></tr></thead><tbody>" + rows + "</tbody></table>"]
    caveat = basis_caveat(best, validated)
    if caveat:
        lines.insert(1, f"<p class='caveat'><span class='flag'>⚠</span> {esc(caveat[0].upper() + caveat[1:])}.</p>")
    if slow is not None:
        lines.append(f"<p>If serving runs at the slow end of the 80 % interval, {slow} replica"
                     f"{'s' if slow != 1 else ''} would be needed ({slow - best['replicas']:+d}).</p>")
    if best.get("requests"):
        lines.append(f"<p class='note'>Each p99 rests on {best['requests']:,} simulated requests "
                     f"({best['requests'] // 100:,} past the percentile).</p>")
    return f"<div class='answer'>{''.join(lines)}</div>"


def cost_latency_figure(rows: list[dict], front: list[str], slos: dict, growth: float) -> go.Figure:
    """$/hour against each SLO'd p99 (TTFT, TPOT) of every feasible fleet, hover naming it, error
    bars from its 80 % interval, the Pareto front joined and the SLO limit drawn."""
    feasible = sorted((r for r in rows if r["feasible"] and r["usd_per_hour"] is not None),
                      key=lambda r: r["usd_per_hour"])
    panels = [(k, f) for k, f in SLO_FIELDS.items() if k in slos] or [("e2e_p99", "e2e_p99_s")]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[plan_words.slo_metric(k) for k, _ in panels])
    for col, (key, field) in enumerate(panels, start=1):
        scale = labels.value(field, 1.0)
        ys = [r[field] * scale for r in feasible]
        lo = [max(0.0, r[field] - r["intervals"][key][0]) * scale if (r.get("intervals") or {}).get(key)
              else 0.0 for r in feasible]
        hi = [max(0.0, r["intervals"][key][1] - r[field]) * scale if (r.get("intervals") or {}).get(key)
              else 0.0 for r in feasible]
        names = [fleet_words(r) for r in feasible]
        fig.add_trace(go.Scatter(
            x=[r["usd_per_hour"] for r in feasible], y=ys, mode="markers", name="fleets meeting the SLOs",
            text=names, error_y=dict(type="data", array=hi, arrayminus=lo, visible=True, thickness=1),
            showlegend=col == 1, legendgroup="fleets",
            hovertemplate="%{text}<br>$%{x:,.2f}/hour<br>" + labels.label(field) + " %{y:,.1f}<extra></extra>"),
            row=1, col=col)
        # The front is of cost against E2E p99, not of this panel's metric: its fleets are marked,
        # not joined by a line that would read as this panel's trade-off.
        on_front = [r for r in feasible if r["candidate"] in front]
        fig.add_trace(go.Scatter(x=[r["usd_per_hour"] for r in on_front], y=[r[field] * scale for r in on_front],
                                 mode="markers", name="on the Pareto front of cost vs E2E p99", legendgroup="front",
                                 showlegend=col == 1, hoverinfo="skip",
                                 marker=dict(symbol="star-open", size=14)), row=1, col=col)
        if key in slos:
            fig.add_hline(y=slos[key] * scale, line=dict(color="firebrick", dash="dash"), row=1, col=col,
                          annotation_text=f"SLO {plan_words.slo_value(key, slos[key])}")
        fig.update_yaxes(title_text=labels.label(field), row=1, col=col)
        fig.update_xaxes(title_text="$ per hour", row=1, col=col)
    fig.update_layout(title=f"Cost vs latency at traffic x{growth:g} (error bars: 80 % intervals)", height=430)
    return fig


def growth_figure(document: dict) -> go.Figure | None:
    """The recommended fleet's $/hour and replicas as traffic grows (only with several factors)."""
    points = [(g, document["recommendation"].get(str(g))) for g in document["growth"]]
    if len(points) < 2:
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    text = [fleet_words(b) if b else "no fleet meets the SLOs" for _, b in points]
    fig.add_trace(go.Scatter(x=[g for g, _ in points], y=[b["usd_per_hour"] if b else None for _, b in points],
                             mode="lines+markers", name="$ / hour", text=text,
                             hovertemplate="traffic x%{x:g}: %{text}<br>$%{y:,.2f}/hour<extra></extra>"))
    fig.add_trace(go.Bar(x=[g for g, _ in points], y=[b["gpus"] if b else None for _, b in points], name="GPUs",
                         opacity=0.3, text=text, hovertemplate="traffic x%{x:g}: %{y} GPUs<extra></extra>"),
                  secondary_y=True)
    fig.update_layout(title="Sensitivity to traffic growth: the recommended fleet", xaxis_title="traffic x",
                      height=360)
    fig.update_yaxes(title_text="$ per hour", secondary_y=False)
    fig.update_yaxes(title_text="GPUs", secondary_y=True)
    return fig


def plan_report(path: Path, document: dict, recommended=None) -> None:
    """document: what plan.json holds (with its 'about'); recommended: the simulation (SimResult)
    of the first growth factor's recommended fleet, whose charts close the answer."""
    about, slos = document["about"], document["slo"]
    parts = [f"<h1>Fleet plan: {esc(document['model'])}</h1>",
             f"<p class='question'>{esc(about['question'])}.</p>",
             f"<p class='note'>Trace: {esc(about['trace'])}; {esc(about['lengths'])}. Engine profile predicted "
             f"for: {esc(about['engine'])}. Candidates: {esc(about['grid'])}.</p>"]
    figures = []
    for g in document["growth"]:
        rows = [r for r in document["candidates"] if r["rate_scale"] == g]
        best = document["recommendation"].get(str(g))
        if len(document["growth"]) > 1:
            parts.append(f"<h2>Traffic x{g:g}</h2>")
        parts.append(answer_html(best, g, slos, document.get("closest_miss", {}).get(str(g)),
                                 document.get("validated_recommendation", {}).get(str(g))))
        feasible = plan_words.cheapest_first(rows)
        if feasible:
            parts.append(f"<h3>Deployments that meet the SLOs ({len(feasible)}), cheapest first</h3>")
            parts.append(sortable_table(feasible, FEASIBLE_FIELDS, about.get("flags")))
            if any(about.get("flags", {}).get(r["candidate"]) for r in feasible):
                parts.append("<p class='note'><span class='flag'>⚠</span> rests on extrapolated costs: the "
                             "accelerator was neither profiled nor fitted on real runs.</p>")
            figures.append((len(parts), cost_latency_figure(rows, document["pareto"][str(g)], slos, g)))
            parts.append("")  # the chart's place
        for words in plan_words.choice_words(rows):
            parts.append(f"<p>{esc(words)}</p>")
        bounded = [r for r in rows if r.get("replicas_at_least") is not None]
        if bounded:
            parts.append(f"<h3>Bounded out ({len(bounded)})</h3><p class='note'>Dearer than the cheapest fleet found "
                         "even at the fewest replicas they could need (at least one; more where shown); "
                         "<code>--exhaustive</code> simulates them.</p><p>" +
                         esc(", ".join(map(plan_words.bounded_name, bounded))) + "</p>")
        failed = [r for r in rows if not r["feasible"] and r.get("replicas_at_least") is None]
        if failed:
            parts.append(f"<h3>Deployments that cannot meet them ({len(failed)}), by reason</h3><table><thead><tr>"
                         "<th>Why not</th><th>How many</th><th>Deployments</th></tr></thead><tbody>" +
                         "".join(f"<tr><td>{esc(reason)}</td><td>{len(which)}</td><td>{esc(', '.join(which))}</td>"
                                 "</tr>" for reason, which in plan_words.reason_groups(failed)) +
                         "</tbody></table>")
    growth = growth_figure(document)
    if growth is not None:
        figures.append((len(parts), growth))
        parts.append("")
    if recommended is not None:
        parts.append(f"<h2>The recommended fleet, simulated</h2><p class='note'>"
                     f"{esc(fleet_words(document['recommendation'][str(document['growth'][0])]))} at traffic "
                     f"x{document['growth'][0]:g}.</p>")
        for fig in (intervals_figure(recommended.summary), latency_cdfs(recommended.requests),
                    time_split_figure(recommended.summary), timeseries_figure(recommended.timeseries)):
            if fig is not None:
                figures.append((len(parts), fig))
                parts.append("")
    ablation = document.get("ablation")
    if ablation:
        parts.append(f"<h2>What each technique buys on {esc(ablation['hardware'])}</h2>")
        if ablation.get("error"):
            parts.append(f"<p class='note'>Not run: {esc(ablation['error'])}</p>")
        else:
            parts.append("<p class='note'>Each row is the one above plus one technique, planned for the same SLOs "
                         "on the same trace (<code>servecast ablate</code>; max_model_len "
                         f"{ablation['max_model_len']}).</p>" + sortable_table(ablation["rows"], ABLATION_FIELDS))
    parts.append("<h2>How these numbers were made</h2><ol class='note'>" +
                 "".join(f"<li>{esc(line)}</li>" for line in about["footnotes"]) + "</ol>")
    for k, (at, fig) in enumerate(figures):
        parts[at] = fig.to_html(full_html=False, include_plotlyjs=(k == 0))
    path.write_text("<!doctype html><html><head><meta charset='utf-8'><title>" + esc(f"Fleet plan: {document['model']}")
                    + f"</title><style>{STYLE}</style></head><body>" + "\n".join(parts) +
                    f"<script>{SORT_JS}</script></body></html>")
