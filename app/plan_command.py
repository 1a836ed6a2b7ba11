"""`servecast plan`: the cheapest fleet that meets the SLOs, over every candidate deployment."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from app.common import fail, jsonable, progress_bar, validation_message, wide_console

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_SLO = "ttft_p99=2s,tpot_p99=100ms"


def default_trace() -> str:
    from simulator.workload.requests import BUNDLED_LENGTHS

    return f"synthetic:num=400,lengths={BUNDLED_LENGTHS},rate=8"


def priced_gpus() -> list[str]:
    """Catalog accelerators with a price (what a fleet can be bought of)."""
    from simulator.catalog.hardware import load_hardware

    return [k for k, a in load_hardware().items() if a.price_per_hour_usd is not None and not a.profiled]


def parse_list(text: str, kind, option: str) -> list:
    try:
        values = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} takes a comma-separated list, got {text!r}") from None
    if not values:
        raise ValueError(f"{option} is empty: give at least one value")
    return values


def parse_speculation(text: str) -> dict:
    """'none' | 'ngram:G:A' | 'draft:G:A:MODEL' -> Candidate fields."""
    if text == "none":
        return {}
    parts = text.split(":")
    try:
        if parts[0] == "ngram" and len(parts) == 3:
            return dict(speculative="ngram", num_speculative_tokens=int(parts[1]), acceptance=float(parts[2]))
        if parts[0] == "draft" and len(parts) == 4:
            return dict(speculative="draft", num_speculative_tokens=int(parts[1]), acceptance=float(parts[2]),
                        draft_model=parts[3])
    except ValueError:
        pass
    raise ValueError(f"--speculation {text!r}: write none, ngram:G:A (e.g. ngram:4:0.6) or draft:G:A:MODEL "
                     "(e.g. draft:4:0.7:llama-2-7b)")


def plan_command(
    model: str = typer.Option(DEFAULT_MODEL, help="catalog model id or an HF config.json path"),
    trace: Optional[str] = typer.Option(None, help="trace (as in simulate); default: 400 requests of the bundled "
                                                   "ShareGPT lengths at 8 req/s"),
    slo: str = typer.Option(DEFAULT_SLO, help="SLOs every fleet must meet, e.g. ttft_p99=2s,tpot_p99=100ms"),
    hardware: Optional[str] = typer.Option(None, help="candidate accelerators, comma-separated (default: every "
                                                      "priced catalog GPU)"),
    quant: str = typer.Option("bf16,fp8", help="candidate weight precisions"),
    tp: str = typer.Option("1,2,4,8", help="candidate tensor-parallel sizes"),
    pp: str = typer.Option("1", help="candidate pipeline-parallel sizes"),
    speculation: str = typer.Option("none", help="candidate speculative decoding: none, ngram:G:A (G draft tokens, "
                                                 "acceptance rate A) or draft:G:A:MODEL, comma-separated"),
    expert_parallel: str = typer.Option("off", "--expert-parallel", help="MoE models: candidate expert "
                                        "placements under TP: off (a slice of every expert), on (whole experts "
                                        "per rank, all-to-all) or off,on"),
    routing_skew: float = typer.Option(0.0, help="MoE router imbalance: 0 uniform, s > 0 Zipf shares 1/(e+1)^s"),
    engine: Optional[str] = typer.Option(None, help="serving engine: vllm-v0.15 (default on catalog GPUs) or servecast"),
    engine_file: Optional[Path] = typer.Option(None, help="an engine profile fitted on your own runs"),
    growth: str = typer.Option("1", help="traffic growth factors to plan for, e.g. 1,2,4"),
    max_replicas: int = typer.Option(256, help="give up on a candidate beyond this many replicas"),
    workers: int = typer.Option(max(1, (os.cpu_count() or 1)), help="local processes (0: in this process)"),
    executor: str = typer.Option("local", help="local (processes on this machine) or ray"),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (--executor ray; default: a local "
                                                     "Ray instance of --workers CPUs)"),
    study: Optional[Path] = typer.Option(None, help="SQLite file of finished points: a rerun resumes from it"),
    seed: int = typer.Option(0),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write plan.json, candidates.csv and report.html here"),
) -> None:
    """Find the cheapest fleet that meets the SLOs: the fewest replicas of every candidate deployment."""
    from simulator.catalog.hardware import get_accelerator
    from simulator.plan.executors import run_plan
    from simulator.plan.capacity import PlanSpec
    from simulator.fleet.sim_config import parse_slos
    from simulator.plan.grid import candidate_grid
    from simulator.plan.study import Study
    from simulator.workload.load import load_workload

    try:
        slos = parse_slos(slo)
        if not slos:
            raise ValueError("--slo is empty: give at least one, e.g. ttft_p99=2s")
        hardware_ids = parse_list(hardware, str, "--hardware") if hardware else priced_gpus()
        for h in hardware_ids:
            get_accelerator(h)  # an unknown id is bad input, not an infeasible candidate
        options = [parse_speculation(x) for x in parse_list(speculation, str, "--speculation")]
        placements = parse_list(expert_parallel, str, "--expert-parallel")
        if any(x not in ("off", "on") for x in placements):
            raise ValueError(f"--expert-parallel takes off, on or off,on, got {expert_parallel!r}")
        candidates = candidate_grid(hardware_ids, parse_list(quant, str, "--quant"), parse_list(tp, int, "--tp"),
                                    parse_list(pp, int, "--pp"), options, [e == "on" for e in placements])
        factors = parse_list(growth, float, "--growth")
        if any(g <= 0 for g in factors):
            raise ValueError("--growth factors must be positive")
        workload = load_workload(trace or default_trace(), seed=seed)
        knobs = {"routing_skew": routing_skew} if routing_skew else {}
        if engine is not None or engine_file is not None:
            knobs.update(engine=engine, engine_file=str(engine_file) if engine_file else None)
        spec = PlanSpec(model, workload, slos, max_replicas=max_replicas, seed=seed, knobs=knobs)
        for c in candidates:  # bad ids and values fail here, in one line, before any simulation
            try:
                spec.config(c, 1).engine_profile()
            except ValidationError as exc:
                raise ValueError(f"{c.label}: {validation_message(exc)}") from None
        if executor not in ("local", "ray"):
            raise ValueError(f"--executor {executor!r} is not supported; use local or ray")
        store = Study(study) if study is not None else None
        with progress_bar("planning", transient=as_json, remaining=True) as progress:
            task = progress.add_task("plan", total=len(candidates) * len(factors))
            result = run_plan(spec, candidates, factors, workers, store,
                              progress=lambda done, total: progress.update(task, completed=done),
                              executor=executor, address=address)
    except ValueError as exc:
        fail(str(exc))
    document = {"model": model, "trace": trace or default_trace(), "slo": slos, "growth": factors,
                "reused_points": result.reused,
                "recommendation": {str(g): (r.row() if (r := result.recommendation(g)) else None) for g in factors},
                "pareto": {str(g): [r.candidate.label for r in result.pareto(g)] for g in factors},
                "candidates": [r.row() for r in result.results]}
    if out is not None:
        import pandas as pd

        out.mkdir(parents=True, exist_ok=True)
        from app.html_report import plan_report

        (out / "plan.json").write_text(json.dumps(jsonable(document), indent=2))
        pd.DataFrame(document["candidates"]).to_csv(out / "candidates.csv", index=False)
        plan_report(out / "report.html", jsonable(document))
    if as_json:
        typer.echo(json.dumps(jsonable(document), indent=2))
        return
    print_plan(result, factors)


def print_plan(result, factors: list[float]) -> None:
    out = wide_console(110)
    for g in factors:
        rows = sorted(result.at(g), key=lambda r: (not r.feasible, r.usd_per_hour or float("inf")))
        table = Table(title=f"traffic x{g:g}: fewest replicas meeting the SLOs")
        for name in ("candidate", "replicas", "slow end", "GPUs", "$/hour", "$/M out tok", "TTFT p99 ms",
                     "TPOT p99 ms", "headroom"):
            table.add_column(name, justify="left" if name == "candidate" else "right")
        for r in rows:
            if r.feasible:
                slow = "-" if r.replicas_slow_end is None else str(r.replicas_slow_end)
                table.add_row(r.candidate.label, str(r.replicas), slow, str(r.gpus), _money(r.usd_per_hour),
                              _money(r.usd_per_million_output_tokens), f"{r.ttft_p99_s * 1e3:,.0f}",
                              f"{r.tpot_p99_s * 1e3:,.1f}", f"x{r.headroom:.2f}" if r.headroom else "-")
        out.print(table)
        best = result.recommendation(g)
        if best is not None:
            headroom = f", headroom x{best.headroom:.2f}" if best.headroom else ""
            if best.replicas_slow_end is not None:
                headroom += (f"; {best.replicas_slow_end} replicas if serving runs at the slow end of the "
                             "80 % interval")
            out.print(f"recommended at x{g:g}: {best.replicas} x {best.candidate.label} "
                      f"({_money(best.usd_per_hour)}/hour, {_money(best.usd_per_million_output_tokens)} per million "
                      f"output tokens{headroom})")
        for r in rows:
            if not r.feasible:
                out.print(f"infeasible: {r.candidate.label}: {r.reason}")


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"
