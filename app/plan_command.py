"""`servecast plan`: the cheapest fleet that meets the SLOs, over every candidate deployment."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from app.common import fail, jsonable, progress_bar, validation_message
from app.knob_options import Knobs, Options, takes
from simulator.fleet.knobs import EngineChoice, Fleet, KVCache, Parallelism, SchedulerLimits

from app import plan_defaults
from app.plan_output import (NO_ANSWER, candidates_frame, plan_document, print_plan, reproduce_command,
                             simulate_recommended)

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


# Knobs every candidate shares (the grid's own axes are the options above and below).
KNOBS = (Options(Parallelism, only=("routing_skew",)), Options(EngineChoice), Options(Fleet, only=("router",)),
         Options(SchedulerLimits), Options(KVCache))


def ablation(spec, hardware: str, workers: int) -> dict:
    """servecast ablate's ladder on this accelerator, for the plan's trace and SLOs."""
    from simulator.plan.ablate import ablate, ladder_for

    rungs = ladder_for(spec, hardware)
    with progress_bar(f"ablating on {hardware}", transient=True) as bar:
        task = bar.add_task("ablate", total=len(rungs))
        results = ablate(spec, rungs, lambda done, total: bar.update(task, completed=done), max(1, workers))
    return {"hardware": hardware, "max_model_len": rungs[0].knobs["max_model_len"], "rows": [r.row() for r in results]}


@takes(*KNOBS)
def plan_command(
    model: str = typer.Option(plan_defaults.MODEL, help="catalog model id or an HF config.json path"),
    trace: Optional[str] = typer.Option(None, help="trace (as in simulate); default: 400 requests of the bundled "
                                                   "ShareGPT lengths at 8 req/s"),
    slo: str = typer.Option(plan_defaults.SLO, help="SLOs every fleet must meet, e.g. ttft_p99=2s,tpot_p99=100ms"),
    hardware: Optional[str] = typer.Option(None, help="candidate accelerators, comma-separated (default: every "
                                                      "priced catalog GPU)"),
    quant: str = typer.Option(",".join(plan_defaults.QUANT), help="candidate weight precisions"),
    tp: str = typer.Option(",".join(map(str, plan_defaults.TP)), help="candidate tensor-parallel sizes"),
    pp: str = typer.Option(",".join(map(str, plan_defaults.PP)), help="candidate pipeline-parallel sizes"),
    cp: str = typer.Option(",".join(map(str, plan_defaults.CP)), help="candidate context-parallel sizes (ranks per "
                           "replica that split each sequence's KV, e.g. 1,2,4: worth it for long prompts under a "
                           "tight TTFT; not combined with pp > 1)"),
    speculation: str = typer.Option("none", help="candidate speculative decoding: none, ngram:G:A (G draft tokens, "
                                                 "acceptance rate A) or draft:G:A:MODEL, comma-separated"),
    expert_parallel: str = typer.Option("off", "--expert-parallel", help="MoE models: candidate expert "
                                        "placements under TP: off (a slice of every expert), on (whole experts "
                                        "per rank, all-to-all) or off,on"),
    kv_offload_gb: str = typer.Option("0", help="candidate host-memory tiers for the prefix cache, GB per replica "
                                      "(0: none), e.g. 0,256: worth it where prompts share long prefixes"),
    disaggregate: str = typer.Option("none", help="candidate prefill/decode splits: none (co-located) or P:D ratios, "
                                     "e.g. none,1:1,1:3 (a fleet of n is n x P prefill and n x D decode replicas)"),
    knobs: Knobs = None,
    growth: str = typer.Option(",".join(f"{g:g}" for g in plan_defaults.GROWTH),
                               help="traffic growth factors to plan for, e.g. 1,2,4"),
    max_replicas: int = typer.Option(256, help="give up on a candidate beyond this many replicas"),
    workers: int = typer.Option(max(1, (os.cpu_count() or 1)), help="local processes (0: in this process)"),
    executor: str = typer.Option("local", help="local (processes on this machine) or ray"),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (--executor ray; default: a local "
                                                     "Ray instance of --workers CPUs)"),
    study: Optional[Path] = typer.Option(None, help="SQLite file of finished points: a rerun resumes from it"),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="simulate every candidate to the end, with its "
                                    "headroom and slow end (default: candidates that cannot beat the cheapest fleet "
                                    "found are bounded out, and headroom and slow end are found for the recommended "
                                    "fleet and the Pareto front)"),
    ablate: bool = typer.Option(False, "--ablate", help="also stack the techniques one on another on the "
                                "recommended accelerator (servecast ablate): in the JSON and the report"),
    seed: int = typer.Option(0),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON on stdout, nothing else"),
    out: Optional[Path] = typer.Option(None, help="write plan.json, candidates.csv and report.html here"),
) -> None:
    """Find the cheapest fleet that meets the SLOs: the fewest replicas of every candidate deployment."""
    from simulator.catalog.hardware import get_accelerator
    from simulator.catalog.models import load_model
    from simulator.fleet.sim_config import SimConfig
    from simulator.plan.executors import run_plan
    from simulator.plan.capacity import PlanSpec
    from simulator.fleet.sim_config import parse_pools, parse_slos
    from simulator.plan.grid import candidate_grid
    from simulator.plan.study import Study
    from simulator.workload.load import load_workload

    try:
        slos = parse_slos(slo)
        if not slos:
            raise ValueError("--slo is empty: give at least one, e.g. ttft_p99=2s")
        hardware_ids = parse_list(hardware, str, "--hardware") if hardware else plan_defaults.priced_gpus()
        for h in hardware_ids:
            get_accelerator(h)  # an unknown id is bad input, not an infeasible candidate
        options = [parse_speculation(x) for x in parse_list(speculation, str, "--speculation")]
        placements = parse_list(expert_parallel, str, "--expert-parallel")
        if any(x not in ("off", "on") for x in placements):
            raise ValueError(f"--expert-parallel takes off, on or off,on, got {expert_parallel!r}")
        tiers = parse_list(kv_offload_gb, float, "--kv-offload-gb")
        if any(g < 0 for g in tiers):
            raise ValueError(f"--kv-offload-gb sizes must be 0 or more GB, got {kv_offload_gb!r}")
        splits = [None if x == "none" else x for x in parse_list(disaggregate, str, "--disaggregate")]
        for split in splits:
            if split is not None:
                parse_pools(split)  # each P:D well formed
        sizes = parse_list(cp, int, "--cp")
        if any(c < 1 for c in sizes):
            raise ValueError(f"--cp sizes must be at least 1 (1: no context parallelism), got {cp!r}")
        candidates = candidate_grid(hardware_ids, parse_list(quant, str, "--quant"), parse_list(tp, int, "--tp"),
                                    parse_list(pp, int, "--pp"), options, [e == "on" for e in placements], tiers,
                                    splits, sizes)
        if not candidates:
            raise ValueError("no candidate: context parallelism is not combined with pipeline parallelism, so give "
                             "--cp 1 or --pp 1 among the sizes")
        factors = parse_list(growth, float, "--growth")
        if any(g <= 0 for g in factors):
            raise ValueError("--growth factors must be positive")
        workload = load_workload(trace or plan_defaults.trace(), seed=seed)
        for options in KNOBS:
            knobs.of(options.group)  # a bad value fails here, named by its flag
        shared = knobs.changed()  # only what differs from SimConfig's defaults: a plan's digest as before
        if shared.keys() & EngineChoice.model_fields.keys():  # an engine choice travels whole
            shared.update({name: knobs[name] for name in EngineChoice.model_fields})
        spec = PlanSpec(model, workload, slos, max_replicas=max_replicas, seed=seed, knobs=shared)
        load_model(model)  # an unknown model is bad input, not a plan where nothing fits
        try:  # the options every candidate shares, checked once: their errors name no candidate
            SimConfig(model=model, hardware=candidates[0].hardware, slo=slos, **shared)
        except ValidationError as exc:
            raise ValueError(validation_message(exc)) from None
        engines = {}
        for c in candidates:  # bad ids and values fail here, in one line, before any simulation
            try:
                engines[c.label] = spec.config(c, 1).engine_profile()
            except ValidationError as exc:
                raise ValueError(f"{c.label}: {validation_message(exc)}") from None
        if executor not in ("local", "ray"):
            raise ValueError(f"--executor {executor!r} is not supported; use local or ray")
        store = Study(study) if study is not None else None
        with progress_bar("planning", transient=as_json, remaining=True) as progress:
            task = progress.add_task("plan", total=len(candidates) * len(factors))
            result = run_plan(spec, candidates, factors, workers, store,
                              progress=lambda done, total: progress.update(task, completed=done),
                              executor=executor, address=address, exhaustive=exhaustive)
    except ValidationError as exc:
        fail(validation_message(exc))
    except ValueError as exc:
        fail(str(exc))
    command = reproduce_command(model=model, trace=trace or plan_defaults.trace(), slo=slo, hardware=",".join(hardware_ids),
                                quant=quant, tp=tp, pp=pp, cp=cp, speculation=speculation,
                                expert_parallel=expert_parallel,
                                kv_offload_gb=kv_offload_gb, disaggregate=disaggregate,
                                **{knobs.params[name]: value for name, value in knobs.changed().items()},
                                growth=growth,
                                max_replicas=max_replicas, exhaustive=exhaustive or None, seed=seed)
    document = plan_document(spec, result, factors, engines, candidates, command, trace or plan_defaults.trace(),
                             exhaustive)
    best = document["recommendation"][str(factors[0])]
    if ablate and best is not None:
        try:
            document["ablation"] = ablation(spec, best["hardware"], workers)
        except ValueError as exc:  # the plan stands; the ladder says why it could not be run
            document["ablation"] = {"hardware": best["hardware"], "error": str(exc), "rows": []}
    if out is not None:
        from app.plan_report import plan_report

        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(jsonable(document), indent=2))
        candidates_frame(document["candidates"]).to_csv(out / "candidates.csv", index=False)
        plan_report(out / "report.html", jsonable(document), simulate_recommended(spec, result, factors[0]))
    if as_json:
        typer.echo(json.dumps(jsonable(document), indent=2))
    else:
        print_plan(document)
    if any(document["recommendation"][str(g)] is None for g in factors):
        raise typer.Exit(NO_ANSWER)
