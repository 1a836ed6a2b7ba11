"""`servecast calibrate` (refit the shipped efficiency curves) and `servecast import-vidur`
(a Vidur profiling CSV as a servecast profile)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from app.common import fail


def calibrate_command(
    shared: Path = typer.Option(Path("../shared"), help="the shared data folder with profiles/vidur"),
    out: Optional[Path] = typer.Option(None, help="parameter file to write (default: the shipped one); with "
                                       "--runs: the engine profile to write"),
    runs: Optional[Path] = typer.Option(None, help="instead: fit an engine profile on a markdown or CSV table of "
                                        "real runs (the shape of ../shared/reference/vllm-runs.md)"),
    engine: Optional[str] = typer.Option(None, help="--runs: the engine profile to start from (default vllm-v0.15)"),
    hardware: str = typer.Option("h100-sxm", help="--runs: the GPU of runs whose table has no Hardware column"),
    max_num_batched_tokens: int = typer.Option(2048, help="--runs: of runs whose table has no mbt column"),
    fit_time_scale: float = typer.Option(0.1, help="--runs: shorten every stage this much while fitting"),
    time_scale: float = typer.Option(1.0, help="--runs: ... and this much when judging the fit"),
    evaluations: int = typer.Option(40, help="--runs: most simulations of every run while fitting"),
) -> None:
    """Refit the shipped efficiency curves on the Vidur A100 profiles; print the A40 held-out error.
    With --runs: fit a serving-engine profile on real runs, cross-validated."""
    if runs is not None:
        from app.runs_command import calibrate_runs

        calibrate_runs(runs, out, engine, hardware, max_num_batched_tokens, fit_time_scale, time_scale, evaluations)
        return
    from calibrate.fit import PARAMS_OUT, build_params

    try:
        params = build_params(shared.resolve(), out or PARAMS_OUT)
    except ValueError as exc:
        fail(str(exc))
    Console().print(f"wrote {out or PARAMS_OUT}; A40 held-out MAPE: " +
                    ", ".join(f"{k} {v:.1%}" for k, v in params["held_out_a40_mape"].items()))


def import_vidur_command(
    csv_path: Path = typer.Argument(..., help="a Vidur mlp.csv, attention.csv, all_reduce.csv or send_recv.csv"),
    out: Path = typer.Option(..., help="servecast profile to write"),
    hardware: Optional[str] = typer.Option(None, help="catalog id (default: from the Vidur path)"),
) -> None:
    """Convert a Vidur profiling CSV into a servecast profile."""
    from calibrate.vidur import import_vidur_attention, import_vidur_compute, import_vidur_network
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
