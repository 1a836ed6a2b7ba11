"""Real runs from the command line: `servecast validate --runs PATH...` replays measured runs (rows
of runs tables, replay folders) through the simulator on an engine profile; `servecast calibrate
--runs PATH...` fits an engine profile on them (calibrate/fitting/engine_profile.py) and writes it for
--engine-file."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from app.common import dumps, fail, progress_bar

# What --runs takes, and the defaults of runs that leave things out (validate and calibrate alike).
RUNS_HELP = ("replay folders (servecast replay --out), folders of them, or markdown/CSV tables of runs (the shape "
             "of ../shared/reference/vllm-runs.md); repeat --runs for more")
HARDWARE_HELP = "--runs: the device of runs that name none (a table without a Hardware column: default h100-sxm)"
ENGINE_DEFAULT = "(default: servecast's own for replays on a profiled device, else vllm-v0.15)"


def _read(runs: list[Path], hardware: str | None, max_num_batched_tokens: int, profile: Path | None):
    from calibrate.runs.sources import read_run_sources

    return read_run_sources(runs, hardware, max_num_batched_tokens, str(profile) if profile else None)


def _engine(real, engine: str | None, engine_file: Path | None = None):
    """The named engine profile, else the default of the runs' devices: servecast's own where every
    run was on a profiled device (a replay of servecast serve), vLLM's otherwise."""
    from simulator.catalog.engines import load_engine

    return load_engine(engine, engine_file, profiled=all(run.sim_config().accelerator().profiled for run in real))


def sources_name(runs: list[Path]) -> str:
    return ", ".join(p.name for p in runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")


def metric_words(key: str) -> str:
    """A run metric or error key in words: 'e2e_p99' -> 'E2E p99', 'ttft_mean_mdape' -> 'TTFT mean'."""
    words = key.removesuffix("_mdape").removesuffix("_max_ape").split("_")
    return " ".join([words[0].upper(), *words[1:]])


def error_words(errors: dict) -> str:
    """summary_errors in words: median absolute errors per metric, the worst E2E one, the saturated runs."""
    parts = [f"{metric_words(k)} {v:.1f}\u00a0%" for k, v in errors.items() if k.endswith("_mdape") and v is not None]
    if errors.get("e2e_mean_max_ape") is not None:
        parts.append(f"worst E2E mean {errors['e2e_mean_max_ape']:.1f}\u00a0%")
    if "saturated_predicted" in errors:
        parts.append(f"saturated runs predicted saturated {errors['saturated_predicted']}")
    if "runs" in errors:
        parts.append(f"over {errors['runs']} unsaturated runs")
    return ", ".join(parts)


def runs_table(title: str, replayed) -> Table:
    """Each run's error per metric (predicted vs measured; --json has both values): narrow enough
    for a terminal, which wraps the rest."""
    from calibrate.runs.tables import METRICS

    table = Table(title=title)
    table.add_column("run", overflow="fold")
    table.add_column("model")
    table.add_column("tp", justify="right")
    for metric in METRICS:
        table.add_column(metric_words(metric), justify="right")
    table.add_column("saturated")
    for rep in replayed:
        cells = []
        for metric in METRICS:
            error = rep.error(metric)
            cells.append(f"{100 * error:+.0f} %" if error is not None and math.isfinite(error) else "-")
        table.add_row(rep.run.id[:24], rep.run.family, str(rep.run.tp), *cells,
                      f"{'yes' if rep.run.saturated else 'no'} / {'yes' if rep.saturated else 'no'}")
    return table


def validate_runs(runs: list[Path], engine: str | None, engine_file: Path | None, hardware: str | None,
                  max_num_batched_tokens: int, time_scale: float, as_json: bool, device_profile: Path | None = None) -> None:
    """Replay every run on the engine profile; print predicted / measured and the median errors."""
    from calibrate.fitting.engine_profile import predict, summary_errors

    try:
        if not 0 < time_scale <= 1:
            raise ValueError(f"--time-scale must be in (0, 1], got {time_scale}")
        real = _read(runs, hardware, max_num_batched_tokens, device_profile)
        profile = _engine(real, engine, engine_file)
        replayed = []
        with progress_bar("replaying runs", transient=as_json) as progress:
            task = progress.add_task("runs", total=len(real))
            for run in real:
                replayed.append(predict(profile, run, time_scale))
                progress.advance(task)
    except ValueError as exc:
        fail(str(exc))
    errors = summary_errors(replayed)
    if as_json:
        typer.echo(dumps({"engine": profile.id, "errors": errors,
                          "runs": [{"id": r.run.id, "model": r.run.family, "tp": r.run.tp, "measured": r.run.measured,
                                    "predicted": r.predicted, "saturated": [r.run.saturated, r.saturated]}
                                   for r in replayed]}))
        return
    out = Console()  # the terminal's width: the table is narrow, the sentences wrap
    out.print(runs_table(f"{len(real)} runs of {sources_name(runs)} on engine {profile.id}: error of the predicted "
                         "value (saturated: measured / predicted)", replayed))
    out.print("median absolute error: " + error_words(errors))
    if profile.errors:
        out.print(f"(the profile's own cross-validated figures, on what it was fitted on -- {profile.fitted_on}: "
                  + "; ".join(f"{k.replace('_', ' ')}: " + error_words(v) for k, v in profile.errors.items()) + ")")


def calibrate_runs(runs: list[Path], out: Path, engine: str | None, hardware: str | None, max_num_batched_tokens: int,
                   fit_time_scale: float, time_scale: float, evaluations: int, device_profile: Path | None = None,
                   workers: int = 1, as_json: bool = False, refit: str = "full") -> None:
    """Fit an engine profile on the runs (cross-validated) and write it."""
    from calibrate.fitting.engine_profile import cross_validate

    try:
        if out is None:
            raise ValueError("--runs needs --out: the engine profile file to write (then --engine-file it)")
        if out.is_dir() or not out.parent.is_dir():
            raise ValueError(f"--out {out}: give a file in an existing folder, e.g. {out.parent / 'my-engine.json'}")
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        if refit not in ("full", "step"):
            raise ValueError(f"--refit must be full or step, got {refit!r}")
        real = _read(runs, hardware, max_num_batched_tokens, device_profile)
        if len(real) < 2:
            raise ValueError(f"--runs gave {len(real)} run: fitting needs at least 2 (3 or more to cross-validate "
                             "usefully), e.g. replays of one trace at several rates")
        base = _engine(real, engine)
        with progress_bar("{task.description}", transient=True) as progress:
            task = progress.add_task("fitting", total=None)
            result = cross_validate(base, real, fit_time_scale, time_scale, evaluations,
                                    progress=lambda text: progress.update(task, description=text), workers=workers,
                                    refit=refit)
    except ValueError as exc:
        fail(str(exc))
    result.profile.save(out)
    if as_json:
        by_run = {}
        for label, replayed in (("in_sample", result.in_sample), ("leave_one_run_out", result.leave_one_run_out),
                                ("leave_one_model_out", result.leave_one_model_out)):
            for rep in replayed:
                by_run.setdefault(rep.run.id, {"id": rep.run.id, "model": rep.run.family, "tp": rep.run.tp,
                                               "measured": rep.run.measured})[label] = rep.predicted
        typer.echo(dumps({"profile": str(out), "engine": result.profile.id, "fitted_on": result.profile.fitted_on,
                          "parameters": dict(zip(result.names, result.theta)), "errors": result.profile.errors,
                          "runs": list(by_run.values())}))
        return
    console = Console()  # the terminal's width: the table is narrow, the sentences wrap
    console.print(runs_table(f"leave one run out on {sources_name(runs)}: error of the predicted value "
                             "(saturated: measured / predicted)", result.leave_one_run_out))
    for label, errors in result.profile.errors.items():
        console.print(f"{label.replace('_', ' ')}: " + error_words(errors))
    console.print(f"wrote {out}: use it with --engine-file {out}")
