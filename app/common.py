"""What the CLI's commands share: the stderr console and its progress bars, failing on bad input,
pydantic errors as one line, and JSON output."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from simulator.fleet.summary_parts import Part

console = Console(stderr=True)


def fail(message: str) -> None:
    """Bad input: one clear line on stderr, exit status 2, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def validation_message(exc: ValidationError) -> str:
    """A pydantic error as one line naming the field(s) and what is wrong."""
    from simulator.fleet.sim_config import validation_items

    return "; ".join(f"--{field.replace('_', '-')}: {message}" if field else message
                     for field, message in validation_items(exc))


def jsonable(value):
    """Summary values as valid JSON: a typed summary (or a section of one) as its to_dict(), NaN /
    inf as null, numpy scalars as plain numbers. The one place a summary's NaN becomes null."""
    if isinstance(value, Part):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(summary) -> str:
    return json.dumps(jsonable(summary), indent=2, allow_nan=False)


def progress_bar(label: str, transient: bool, remaining: bool = False, auto_refresh: bool = True) -> Progress:
    """A progress bar on the stderr console: label, bar, done/total, time elapsed (and time left);
    a transient one is cleared when done (the commands' --json)."""
    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if remaining:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, transient=transient, auto_refresh=auto_refresh)


def wide_console(min_width: int) -> Console:
    """A stdout console at least min_width columns wide (tables stay readable in narrow terminals)."""
    return Console(width=max(Console().width, min_width))
