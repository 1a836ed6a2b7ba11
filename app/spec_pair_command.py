"""`servecast train-pair` and `servecast acceptance`: a trained target/draft pair for speculative
decoding, and the acceptance its draft achieves on held-out text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.common import fail

DEFAULT_PAIR = Path.home() / ".cache" / "servecast" / "spec-pair"


def show_acceptance(stats: dict) -> None:
    table = Table(title=f"draft acceptance on held-out text (gamma={stats['num_speculative_tokens']}, "
                        f"temperature {stats['temperature']})")
    table.add_column("draft position")
    table.add_column("accepted (given proposed)", justify="right")
    table.add_column("proposed", justify="right")
    for i, (rate, n) in enumerate(zip(stats["acceptance_by_position"], stats["proposed_by_position"]), start=1):
        table.add_row(str(i), f"{rate:.1%}", str(n))
    Console().print(table)
    Console().print(f"mean accepted drafts per verification: {stats['mean_accepted_per_verification']:.2f}; "
                    f"{stats['output_tokens']} tokens in {stats['steps']} engine steps")


def train_pair_command(
    out: Path = typer.Option(DEFAULT_PAIR, help="where to save target/, draft/, held-out text and pair.json"),
    target_seconds: float = typer.Option(240.0, help="training time of the target (CPU seconds of wall time)"),
    draft_seconds: float = typer.Option(60.0, help="training time of the draft"),
    corpus: Optional[Path] = typer.Option(None, help="directory of .py files (default: this Python's stdlib)"),
    force: bool = typer.Option(False, help="train again even if the pair exists"),
) -> None:
    """Train a small byte-level target and a smaller draft on Python source (offline), then
    measure the draft's acceptance on held-out files. Reused once saved."""
    from calibrate.fitting.spec_pair import PairSpec, measure_acceptance, train_pair

    try:
        if target_seconds <= 0 or draft_seconds <= 0:
            raise ValueError("training times must be positive")
        if (out / "pair.json").exists() and not force:
            Console().print(f"{out} already holds a trained pair (use --force to train again)")
        else:
            out.mkdir(parents=True, exist_ok=True)
            spec = PairSpec(target_seconds=target_seconds, draft_seconds=draft_seconds)
            with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()) as progress:
                tasks = {w: progress.add_task(f"train {w}", total=s) for w, s in
                         (("target", target_seconds), ("draft", draft_seconds))}

                def on_progress(which: str, elapsed: float, loss: float) -> None:
                    progress.update(tasks[which], completed=min(elapsed, progress.tasks[tasks[which]].total),
                                    description=f"train {which} (loss {loss:.2f})")

                info = train_pair(out, spec, corpus, on_progress)
            Console().print(f"target: {info['target']['parameters']:,} parameters, {info['target']['steps']} steps, "
                            f"loss {info['target']['train_loss']:.2f}; draft: {info['draft']['parameters']:,} "
                            f"parameters, {info['draft']['steps']} steps, loss {info['draft']['train_loss']:.2f}")
        stats = measure_acceptance(out)
    except ValueError as exc:
        fail(str(exc))
    (out / "acceptance.json").write_text(json.dumps(stats, indent=2))
    show_acceptance(stats)


def acceptance_command(
    pair: Path = typer.Option(DEFAULT_PAIR, help="a pair saved by `servecast train-pair`"),
    gamma: int = typer.Option(4, help="draft tokens per verification (1..8)"),
    temperature: float = typer.Option(0.0, help="0: greedy"),
    num_prompts: int = typer.Option(32),
    output_bytes: int = typer.Option(64),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Measure the pair's draft acceptance per position on held-out text."""
    from calibrate.fitting.spec_pair import measure_acceptance

    try:
        if not (pair / "pair.json").exists():
            raise ValueError(f"no trained pair at {pair}: run `servecast train-pair --out {pair}` first")
        stats = measure_acceptance(pair, gamma, num_prompts, output_bytes=output_bytes, temperature=temperature)
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(stats))
    else:
        show_acceptance(stats)
