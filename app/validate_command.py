"""`servecast validate`: the simulator against the real engine on this device, at three load levels."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from app.common import dumps, fail, progress_bar, wide_console
from app.knob_options import Knobs, Options, takes
from app.measured_runs import HARDWARE_HELP, RUNS_HELP
from simulator.fleet.knobs import EngineChoice, KVCache, SchedulerLimits


def validation_report(path: Path, results, info: dict, table) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from app.html_report import write_report

    figures = []
    for column, name in (("ttft_s", "TTFT"), ("e2e_s", "E2E"), ("tpot_s", "TPOT")):
        fig = make_subplots(rows=1, cols=len(results), subplot_titles=[r.level for r in results])
        for i, r in enumerate(results, start=1):
            m, p = r.measured_requests, r.predicted_requests.set_index("request_id")
            fig.add_trace(go.Scatter(x=m[column], y=p.loc[m["request_id"], column], mode="markers",
                                     marker=dict(size=4), name=r.level, showlegend=False), row=1, col=i)
            top = float(max(m[column].max(), p[column].max()))
            fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", line=dict(dash="dot", color="grey"),
                                     showlegend=False), row=1, col=i)
            fig.update_xaxes(title_text="measured (s)", row=1, col=i)
        fig.update_yaxes(title_text="predicted (s)", row=1, col=1)
        fig.update_layout(title=f"{name} per request: predicted vs measured", height=360)
        figures.append(fig)
    summary = {"info": info, "errors": table.to_dict(orient="records"),
               "step_time": {r.level: r.steps for r in results}}
    write_report(path, "servecast validate: simulator vs real engine", summary, figures,
                 notes="Each point is one request, served by the real engine (x) and simulated (y).")


def _brackets(steps: dict) -> str:
    if "calibration_before_total_ratio" not in steps:
        return ""
    return (f" (calibration {steps['calibration_before_total_ratio']:.2f} before, "
            f"{steps['calibration_after_total_ratio']:.2f} after)")


def _verdict(table) -> str:
    """How many level-metric errors meet their target and, of the misses, how many are no larger
    than the engine's own spread over the repeats (the machine's noise could account for those)."""
    misses = table[~table["within_target"]]
    line = f"{len(table) - len(misses)} of {len(table)} errors within target"
    if len(misses):
        noise = int(misses["within_engine_spread"].sum())
        line += (f"; of the {len(misses)} miss{'' if len(misses) == 1 else 'es'}, {noise} "
                 f"{'is' if noise == 1 else 'are'} no larger than the engine's own spread over the repeats")
    return line


# The engine's limits and KV pool, as the simulator names them (the engine's num_blocks: num_gpu_blocks),
# small for this device; and, for --runs, the engine profile to predict with.
KNOBS = (Options(KVCache, only=("block_size", "num_gpu_blocks"), defaults={"num_gpu_blocks": 512},
                 names={"num_gpu_blocks": "num-blocks"}),
         Options(SchedulerLimits, only=("max_num_seqs", "max_num_batched_tokens"),
                 defaults={"max_num_seqs": 32, "max_num_batched_tokens": 256}),
         Options(EngineChoice, notes={"engine": "with --runs", "engine_file": "with --runs"}))


@takes(*KNOBS)
def validate_command(
    model: Optional[str] = typer.Option(None, help="HF config.json of the model to serve (random weights); "
                                                   "default: the bundled small Llama"),
    num_requests: int = typer.Option(120, help="requests per load level"),
    lengths: Optional[Path] = typer.Option(None, help="CSV of prompt/output lengths (default: bundled ShareGPT sample)"),
    length_scale: float = typer.Option(1 / 8, help="multiply trace lengths by this"),
    max_total_tokens: int = typer.Option(512, help="cap prompt+output per request (also max_model_len)"),
    knobs: Knobs = None,
    profile: Optional[Path] = typer.Option(None, help="profile of this device for the model (default: profile now)"),
    device: str = typer.Option("cpu"), dtype: str = typer.Option("float32"), seed: int = typer.Option(0),
    threads: int = typer.Option(1, help="torch CPU threads for the profile and the engine (0: torch's choice)"),
    calibration_requests: int = typer.Option(192, help="engine steps of this many *other* requests, replayed just "
                                                      "before and after each level, calibrate the framework "
                                                      "overhead (0: profile only)"),
    repeats: int = typer.Option(3, help="independent measurements per level; errors are their median"),
    speed_probe: bool = typer.Option(True, help="time a small fixed piece of work before every engine step and "
                                               "simulate each level at the machine speed it shows (off: at the "
                                               "calibration's average speed)"),
    as_json: bool = typer.Option(False, "--json", help="print the error table as JSON on stdout"),
    out: Optional[Path] = typer.Option(None, help="write errors.csv, per-level request tables and report.html"),
    runs: Optional[List[Path]] = typer.Option(None, help="instead: measured runs to replay through the simulator "
                                              f"(--profile: a profiled device's profile): {RUNS_HELP}"),
    hardware: Optional[str] = typer.Option(None, help=HARDWARE_HELP),
    time_scale: float = typer.Option(1.0, help="--runs: shorten every table run's stages this much (1: as run; "
                                     "replays: whole)"),
) -> None:
    """Replay one workload through the real engine and the simulator at three loads; print the errors.
    With --runs: replay measured serving runs through the simulator instead."""
    if runs:
        from app.measured_runs import validate_runs

        # A run without an mbt column ran vLLM's online-serving default, 2048 (the campaign's D1 runs).
        validate_runs(runs, knobs["engine"], knobs["engine_file"], hardware, 2048, time_scale, as_json, profile)
        return
    from app.demo import DEMO_MODEL
    from calibrate.validation.fidelity import run_validation
    from calibrate.validation.results import error_table
    from calibrate.validation.settings import ValidationSetup

    try:
        if num_requests < 2:
            raise ValueError("--num-requests must be at least 2")
        setup = ValidationSetup(model=model or DEMO_MODEL, num_requests=num_requests,
                                lengths_file=str(lengths) if lengths else None, length_scale=length_scale,
                                max_total_tokens=max_total_tokens, num_blocks=knobs["num_gpu_blocks"],
                                max_num_seqs=knobs["max_num_seqs"],
                                max_num_batched_tokens=knobs["max_num_batched_tokens"],
                                block_size=knobs["block_size"], device=device,
                                dtype=dtype, seed=seed, threads=threads or None,
                                calibration_requests=calibration_requests, repeats=repeats, speed_probe=speed_probe)
        setup.check()  # bad settings fail here, before any profiling
        # Redrawn only from the callbacks, which come between replays: a refresh thread drawing
        # during a replay would take CPU time that lands in the engine's measured latencies.
        with progress_bar("{task.description}", transient=as_json, auto_refresh=False) as progress:
            tasks: dict[str, int] = {}
            measurements = len(setup.levels) * setup.repeats

            def on_progress(stage: str, done: int, total: int) -> None:
                if stage == "profile":
                    if stage not in tasks:
                        tasks[stage] = progress.add_task("profile", total=total)
                    progress.update(tasks[stage], completed=done)
                else:  # a level's measurement starts (done 0) or ends (done 1)
                    if "levels" not in tasks:
                        tasks["levels"] = progress.add_task("engine replays + simulation", total=measurements)
                    progress.update(tasks["levels"], advance=done,
                                    description=f"engine replays + simulation: {stage}")
                progress.refresh()

            results, info = run_validation(setup, out, str(profile) if profile else None, on_progress)
    except ValueError as exc:
        fail(str(exc))
    table = error_table(results)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "errors.csv", index=False)
        for r in results:
            slug = r.level.replace(" ", "-")
            r.measured_requests.to_csv(out / f"measured-{slug}.csv", index=False)
            r.predicted_requests.to_csv(out / f"predicted-{slug}.csv", index=False)
        validation_report(out / "report.html", results, info, table)
    if as_json:
        typer.echo(dumps({"info": info, "errors": table.to_dict(orient="records"),
                          "step_time": {r.level: r.steps for r in results},
                          "repeats": {r.level: [{"errors": m.errors, "step_time": m.steps} for m in r.repeats]
                                      for r in results}}))
        return
    show = Table(title=f"simulator vs engine ({info['num_requests']} requests per level; capacity "
                       f"{info['capacity_requests_per_s']:.2f} req/s predicted; median error over "
                       f"{info['repeats']} repeats (range; engine: how far its own farthest repeat of the "
                       f"same requests lies from their median))")
    show.add_column("metric")
    for r in results:
        show.add_column(f"{r.level} ({r.rate_per_s:.2f} req/s)", justify="right")
    show.add_column("target", justify="right")
    within_target = table.set_index(["level", "metric"])["within_target"]
    for metric in results[0].errors:
        cells = []
        for r in results:
            e, (low, high) = r.errors[metric], r.error_range[metric]
            ok = within_target[(r.level, metric)]
            spread = (f" [dim]({low:+.0%}..{high:+.0%}; engine ±{r.engine_spread[metric]:.0%})[/]"
                      if len(r.repeats) > 1 else "")
            cells.append(f"[{'green' if ok else 'red'}]{e:+.1%}[/]{spread}")
        show.add_row(metric, *cells, f"±{table[table.metric == metric].iloc[0]['target']:.0%}")
    wide_console(110).print(show)
    Console().print(_verdict(table))
    Console().print("step time, predicted / measured over the engine's own steps (and over the calibration "
                    "steps just before and after, which the fit saw): " + "; ".join(
        f"{r.level}: total {r.steps['total_ratio']:.2f}, median {r.steps['median_ratio']:.2f}" + _brackets(r.steps)
        for r in results))
    Console().print("machine speed drift since profiling (forward re-measured before each level; >1 = slower now): "
                    + ", ".join(f"{r.level} {r.steps['machine_drift']:.2f}" for r in results))
    if "level_slowdown" in results[0].steps:
        Console().print("machine speed during each level, from the probe before every step (step times the "
                        "simulator was given, relative to the calibration around it; >1 = slower): "
                        + ", ".join(f"{r.level} {r.steps['level_slowdown']:.2f}" for r in results))
    if out is not None:
        Console().print(f"wrote {out}/errors.csv, measured-*.csv, predicted-*.csv, report.html")
