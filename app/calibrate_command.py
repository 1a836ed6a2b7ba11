"""`servecast calibrate` (refit the shipped efficiency curves: into ./efficiency.json, or with
--update-catalog into the simulator/catalog/efficiency.json every simulation reads) and `servecast import-vidur`
(a Vidur profiling CSV as a servecast profile)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from app.common import fail, progress_bar
from app.measured_runs import ENGINE_DEFAULT, HARDWARE_HELP, RUNS_HELP

DEFAULT_OUT = Path("efficiency.json")


def calibrate_command(
    shared: Path = typer.Option(Path("../shared"), help="the shared data folder with profiles/vidur"),
    out: Optional[Path] = typer.Option(None, help=f"parameter file to write (default: ./{DEFAULT_OUT}); with "
                                       "--runs: the engine profile to write"),
    update_catalog: bool = typer.Option(False, "--update-catalog", help="write the refit into the installed "
                                        "simulator/catalog/efficiency.json instead, which every simulation reads"),
    runs: Optional[List[Path]] = typer.Option(None, help=f"instead: fit an engine profile on measured runs: {RUNS_HELP}"),
    engine: Optional[str] = typer.Option(None, help=f"--runs: the engine profile to start from {ENGINE_DEFAULT}"),
    profile: Optional[Path] = typer.Option(None, help="--runs: the servecast profile of a profiled device (cpu-local) "
                                           "that replays ran on, as simulate takes it"),
    hardware: Optional[str] = typer.Option(None, help=HARDWARE_HELP),
    max_num_batched_tokens: int = typer.Option(2048, help="--runs: of runs whose table has no mbt column"),
    fit_time_scale: float = typer.Option(0.1, help="--runs: shorten every table run's stages this much while fitting"),
    time_scale: float = typer.Option(1.0, help="--runs: ... and this much when judging the fit (replays: whole)"),
    workers: int = typer.Option(1, help="--runs: cross-validation folds in this many processes"),
    refit: str = typer.Option("full", help="--runs: each cross-validation fold fitted afresh on the runs it keeps "
                              "(full), or one Gauss-Newton step from the full fit (step: cheaper; with as many "
                              "parameters as the kept runs' figures it keeps the full fit)"),
    evaluations: int = typer.Option(200, help="--runs: most simulations of every run while fitting (it stops "
                                    "sooner once converged)"),
    as_json: bool = typer.Option(False, "--json", help="--runs: print the fit's figures as JSON on stdout, nothing else"),
) -> None:
    """Refit the shipped efficiency curves on the Vidur A100 profiles into ./efficiency.json (or
    --out; --update-catalog: the installed catalog file); print the A40 held-out error.
    With --runs: fit a serving-engine profile on measured runs (replays, runs tables), cross-validated."""
    if update_catalog and runs:
        fail("--update-catalog refits the shipped efficiency curves; it does not apply to --runs (use --out)")
    if runs:
        from app.measured_runs import calibrate_runs

        calibrate_runs(runs, out, engine, hardware, max_num_batched_tokens, fit_time_scale, time_scale, evaluations,
                       profile, workers, as_json, refit)
        return
    from calibrate.fitting.curve import PARAMS_OUT, build_params

    if update_catalog and out is not None:
        fail("give --out FILE or --update-catalog, not both")
    target = PARAMS_OUT if update_catalog else out or DEFAULT_OUT
    # Checked before the fit, which takes minutes, so a bad path fails at once.
    if target.is_dir():
        fail(f"--out {target} is a folder: give a file path, e.g. {target / DEFAULT_OUT}")
    if not target.parent.is_dir():
        fail(f"--out {target}: folder {target.parent} does not exist; create it or choose another --out")
    try:
        with progress_bar("refitting {task.description}", transient=True) as bar:
            task = bar.add_task("", total=None)
            params = build_params(shared.resolve(), target, progress=lambda label, done, total: bar.update(
                task, description=label, completed=done, total=total))
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or target}: {exc.strerror or exc}; check the path, or choose another --out")
    Console().print(f"wrote {target.resolve()}; A40 held-out MAPE: " +
                    ", ".join(f"{k} {v:.1%}" for k, v in params["held_out_a40_mape"].items()))
    if not update_catalog:
        Console().print("the simulator reads simulator/catalog/efficiency.json, which is unchanged: rerun with "
                        "--update-catalog to install this fit there")


def import_vidur_command(
    csv_path: Path = typer.Argument(..., help="a Vidur mlp.csv, attention.csv, all_reduce.csv or send_recv.csv"),
    out: Path = typer.Option(..., help="servecast profile to write"),
    hardware: Optional[str] = typer.Option(None, help="catalog id (default: from the Vidur path)"),
) -> None:
    """Convert a Vidur profiling CSV into a servecast profile."""
    from calibrate.profiling.vidur import import_vidur_attention, import_vidur_compute, import_vidur_network
    from simulator.catalog.hardware import get_accelerator

    try:
        if csv_path.name == "mlp.csv":
            result = import_vidur_compute(csv_path, hardware)
        elif csv_path.name == "attention.csv":
            result = import_vidur_attention(csv_path, hardware)
        else:
            if hardware is None:
                raise ValueError("--hardware is needed for a network CSV")
            result = import_vidur_network(csv_path, hardware)
        get_accelerator(result.hardware)
        result.save(out)
    except ValueError as exc:
        fail(str(exc))
    Console().print(f"{len(result.measurements)} measurements of {result.hardware} written to {out}")
