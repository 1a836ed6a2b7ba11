"""What `servecast plan` hands over: the plan document (plan.json, and what the report is drawn
from), the terminal's answer, and the command that reproduces the plan."""

from __future__ import annotations

import shlex
from importlib.metadata import PackageNotFoundError, version

from rich.table import Table

from app import labels, plan_words
from app.common import wide_console
from simulator.fleet.costs import KERNELS_FITTED, VALIDATED, cost_basis

# Exit status when the plan has no answer (no candidate meets the SLOs at some traffic asked about):
# distinct from 0 (answered) and 2 (bad input).
NO_ANSWER = 3
BOUNDED_NAMED = 12  # bounded-out candidates named in the terminal's line (plan.json and candidates.csv: all)
TABLE_FIELDS = ("candidate", "replicas", "replicas_slow_end", "gpus", "usd_per_hour", "usd_per_million_output_tokens",
                "ttft_p99_s", "tpot_p99_s", "headroom")


def reproduce_command(**options) -> str:
    """`servecast plan` with every option that shaped the answer, defaults included."""
    words = ["servecast", "plan"]
    for name, value in options.items():
        if value is None or (name == "routing_skew" and not value):
            continue
        flag = name.replace("_", "-")
        words += [f"--{flag}"] if value is True else [f"--no-{flag}"] if value is False else [f"--{flag}", str(value)]
    return shlex.join(words)


def closest_miss(rows: list[dict]) -> str:
    """One line on the infeasible candidate nearest to qualifying: the smallest SLO miss, else the
    most common reason."""
    unpriced = [r for r in rows if r["feasible"]]
    if unpriced:
        return (f"{len(unpriced)} deployments meet the SLOs but none has a price: add price_per_hour_usd for "
                "their accelerators in a --hardware-file")
    missed = [r for r in rows if r.get("slo_miss") is not None]
    if missed:
        r = min(missed, key=lambda r: r["slo_miss"])
        return f"closest miss: {r['candidate']} ({r['reason']})"
    groups = plan_words.reason_groups(rows)
    return f"every candidate failed; most often: {groups[0][0]} ({len(groups[0][1])})" if groups else ""


def software_version() -> str:
    try:
        return version("servecast")
    except PackageNotFoundError:
        return "unknown (not installed)"


def about(spec, engines: dict, candidates, command: str, trace_name: str, growth=(1.0,),
          exhaustive: bool = False, trace_spec: str = "") -> dict:
    """The question in words and the footnotes: how the numbers were made."""
    import json

    from simulator.catalog.hardware import get_accelerator
    from simulator.cost.model import PARAMS_FILE

    hardware = list(dict.fromkeys(c.hardware for c in candidates))
    trace = plan_words.trace_words(spec.workload, trace_name, plan_words.nominal_rate(trace_spec))
    question = plan_words.question(spec.model, trace, hardware, sorted({c.quant for c in candidates}),
                                   sorted({c.tp for c in candidates}), spec.slo, growth,
                                   sorted({c.cp for c in candidates}))
    names = sorted({e.id for e in engines.values()})
    flags = {}
    for c in candidates:
        basis = cost_basis(spec.config(c, 1))
        if basis != VALIDATED:
            flags[c.label] = basis_words(c.hardware, basis)
    footnotes = [f"Kernel costs: roofline x efficiency curves fitted on "
                 f"{json.loads(PARAMS_FILE.read_text()).get('fitted_on', 'measured kernels')}; an accelerator "
                 "without a profile of its own runs them at its catalog peak FLOPS and bandwidth (extrapolated)."]
    for engine in {e.id: e for e in engines.values()}.values():
        errors = engine.errors.get("leave_one_run_out", {})
        cv = (" Cross-validated median absolute error (leave one run out): E2E mean / p99 "
              f"{errors.get('e2e_mean_mdape')} / {errors.get('e2e_p99_mdape')} %, TTFT mean / p99 "
              f"{errors.get('ttft_mean_mdape')} / {errors.get('ttft_p99_mdape')} %, TPOT "
              f"{errors.get('tpot_mdape')} %.") if errors else ""
        footnotes.append(f"Serving engine {engine.id}: {engine.description or 'kernel time alone'}."
                         + (f" Fitted on {engine.fitted_on}." if engine.fitted_on else "") + cv)
    footnotes += [
        "80 % intervals: the 10th to 90th percentiles of the engine profile's held-out errors on real runs "
        "(TPOT p99's from the mean TPOT's: the runs have no TPOT percentiles). The slow end's replica count is the "
        "same search with step times at the interval's upper end.",
        probed(spec) + " The fewest replicas are found by doubling then bisection, headroom by bisection to 5 %."
        + ("" if exhaustive else " Candidates were searched best decode throughput per dollar first; one that "
           "could not beat the cheapest fleet found, even at the fewest replicas it could need, is bounded out "
           "(--exhaustive simulates every candidate), and headroom and the slow end were found for the "
           "recommended fleet and the Pareto front."),
        "Prices: the hardware catalog's on-demand prices per accelerator-hour (simulator/catalog/hardware.yaml, "
        "with their sources).",
        f"servecast {software_version()}; reproduce with: {command}"]
    return {"question": question, "trace": trace, "lengths": plan_words.length_percentiles(spec.workload),
            "engine": plan_words.either(names), "flags": flags, "footnotes": footnotes,
            "grid": f"{len(candidates)} deployments: {plan_words.either(hardware)} x "
                    f"{plan_words.either(sorted({c.quant for c in candidates}))} x TP "
                    f"{plan_words.either(sorted({c.tp for c in candidates}))}"
                    + (f" x PP {plan_words.either(sorted({c.pp for c in candidates}))}"
                       if any(c.pp > 1 for c in candidates) else "")
                    + (f" x CP {plan_words.either(sorted({c.cp for c in candidates}))}"
                       if any(c.cp > 1 for c in candidates) else "")}


def basis_words(hardware: str, basis: str) -> str:
    """Why a candidate's costs are not validated, in words (simulator/fleet/costs.py cost_basis)."""
    if basis == KERNELS_FITTED:
        return f"{hardware}: kernel costs fitted on its own kernel profiles; serving on it not validated on real runs"
    return f"{hardware}: kernel costs extrapolated from another device's curves; never profiled or validated here"


def trace_name(trace: str) -> str:
    from simulator.workload.requests import BUNDLED_LENGTHS

    return "the bundled ShareGPT lengths" if str(BUNDLED_LENGTHS) in trace else trace


def probed(spec) -> str:
    """What every traffic level was simulated on, in words (PlanSpec.probe)."""
    clients = spec.workload.clients
    if clients is not None:
        think = f", each pausing {clients.think_s:g} s between requests" if clients.think_s else ""
        return (f"Closed-loop clients: {clients.concurrency} at x1{think}, each sending its next request when its "
                f"last finishes; traffic x g is g times the clients, over {len(spec.probe(1.0)):,} requests.")
    if spec.workload.duration_s <= 0:
        return "The trace arrives all at once: traffic x g is g times its requests, all at once."
    probe = spec.probe(1.0)
    return (f"Each traffic level was simulated over {probe.duration_s:,.0f} s of arrivals ({len(probe):,} requests "
            "at x1), the trace played again where shorter, so its p99s are of the steady state.")


def plan_document(spec, result, factors, engines: dict, candidates, command: str, trace: str,
                  exhaustive: bool = False) -> dict:
    rows = [r.row() for r in result.results]
    return {"model": spec.model, "trace": trace, "slo": spec.slo, "growth": factors, "reused_points": result.reused,
            "about": about(spec, engines, candidates, command, trace_name(trace), factors, exhaustive, trace),
            "recommendation": {str(g): (r.row() if (r := result.recommendation(g)) else None) for g in factors},
            # The cheapest fleet on costs validated on real runs (the recommendation itself where it is one).
            "validated_recommendation": {str(g): (r.row() if (r := result.validated_recommendation(g)) else None)
                                         for g in factors},
            "closest_miss": {str(g): closest_miss([x for x in rows if x["rate_scale"] == g]) for g in factors
                             if result.recommendation(g) is None},
            "pareto": {str(g): [r.candidate.label for r in result.pareto(g)] for g in factors},
            "candidates": rows}


def simulate_recommended(spec, result, growth: float):
    """The recommended fleet at this traffic simulated in full (the report's charts); None without one."""
    from simulator.fleet.run import simulate

    best = result.recommendation(growth)
    if best is None:
        return None
    return simulate(spec.config(best.candidate, best.replicas), spec.probe(growth))


def print_plan(document: dict) -> None:
    """The answer first, then the fleets that meet the SLOs, then the others by reason (a line each)."""
    out = wide_console(110)
    slos = document["slo"]
    out.print(document["about"]["question"] + ".", highlight=False)
    for g in document["growth"]:
        rows = [r for r in document["candidates"] if r["rate_scale"] == g]
        best = document["recommendation"][str(g)]
        if best is None:
            out.print(f"[bold red]x{g:g}: no candidate meets {plan_words.slo_words(slos)}[/]; "
                      f"{document['closest_miss'][str(g)]}", highlight=False)
        else:
            metrics = ", ".join(f"{row['SLO metric']} {row['predicted']} ({row['80 % interval']}; limit {row['limit']})"
                                for row in plan_words.slo_rows(best, slos))
            slow = best.get("replicas_slow_end")
            out.print(f"[bold green]recommended at x{g:g}:[/] {best['replicas']} x {best['candidate']}: "
                      f"{labels.text('usd_per_hour', best['usd_per_hour'])}/hour, "
                      f"{labels.text('usd_per_million_output_tokens', best['usd_per_million_output_tokens'])} per "
                      f"million output tokens; {metrics}; headroom {labels.text('headroom', best.get('headroom'))}"
                      + (f"; {slow} replica{'s' if slow != 1 else ''} at the slow end of the 80 % interval"
                         if slow is not None else ""),
                      highlight=False)
            caveat = basis_caveat(best, document["validated_recommendation"][str(g)])
            if caveat:
                out.print(f"[bold yellow]⚠ {caveat}[/]", highlight=False)
            if best.get("extrapolated_across"):
                out.print(f"intervals widened: extrapolated across {best['extrapolated_across']}", highlight=False)
        feasible = plan_words.cheapest_first(rows)
        if feasible:
            table = Table(title=f"traffic x{g:g}: fewest replicas meeting the SLOs, cheapest first")
            for f in TABLE_FIELDS:
                table.add_column(labels.label(f), justify="left" if f == "candidate" else "right",
                                 no_wrap=f == "candidate")
            for r in feasible:
                table.add_row(*(labels.text(f, r.get(f)) for f in TABLE_FIELDS))
            out.print(table)
        bounded = [r for r in rows if r.get("replicas_at_least") is not None]
        if bounded:
            named = [plan_words.bounded_name(r) for r in bounded[:BOUNDED_NAMED]]
            more = f" and {len(bounded) - BOUNDED_NAMED} more (the candidates table has them all)" \
                if len(bounded) > BOUNDED_NAMED else ""
            out.print(f"bounded out ({len(bounded)}): dearer than the cheapest fleet found even at the fewest "
                      "replicas they could need (one, unless shown; --exhaustive simulates them): "
                      + ", ".join(named) + more, highlight=False)
        for reason, which in plan_words.reason_groups([r for r in rows if not r["feasible"]
                                                       and r.get("replicas_at_least") is None]):
            out.print(f"cannot meet them ({len(which)}): {reason}: {', '.join(which)}", highlight=False)
        for words in plan_words.choice_words(rows):
            out.print(words, highlight=False)


# Integer fields of a plan row: written as integers in candidates.csv even where some rows have none.
INTEGER_FIELDS = ("tp", "pp", "cp", "num_speculative_tokens", "replicas", "gpus", "requests", "replicas_slow_end",
                  "replicas_at_least", "simulations")


def candidates_frame(rows: list[dict]):
    """candidates.csv: one column per value -- each SLO's measured value (slo_<metric>_s) and each
    interval's ends (interval_<metric>_lo_s / _hi_s) -- integers as integers."""
    import pandas as pd

    flat = []
    for row in rows:
        out = {k: v for k, v in row.items() if k not in ("slo_measured", "intervals")}
        for metric, value in (row.get("slo_measured") or {}).items():
            out[f"slo_{metric}_s"] = value
        for metric, (lo, hi) in (row.get("intervals") or {}).items():
            out[f"interval_{metric}_lo_s"], out[f"interval_{metric}_hi_s"] = lo, hi
        flat.append(out)
    frame = pd.DataFrame(flat)
    for name in INTEGER_FIELDS:
        if name in frame:
            frame[name] = frame[name].astype("Int64")
    return frame


def basis_caveat(best: dict, validated: dict | None) -> str | None:
    """Beside a recommendation whose costs are not validated: why, and the cheapest fleet that is
    (plan rows); None when the recommendation is validated itself."""
    if best.get("cost_basis") in (None, VALIDATED):
        return None
    other = (f"the cheapest on validated costs: {validated['replicas']} x {validated['candidate']} at "
             f"{labels.text('usd_per_hour', validated['usd_per_hour'])}/hour") if validated else \
        "no candidate on validated costs meets the SLOs"
    return f"rests on unvalidated costs ({basis_words(best['hardware'], best['cost_basis'])}); {other}"

