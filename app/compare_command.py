"""`servecast compare`: the errors between two run summaries (a simulation and a replay, two
replays, ...), metric by metric: A, B and the relative error (A - B) / B.

Both sides are summary JSON in the one schema (docs/summary.md; `servecast simulate` and
`servecast replay` write it). A metric missing or null on either side is shown as missing, not an
error; its relative error is null then, and where B is 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.table import Table

from app.common import dumps, fail, wide_console

LATENCIES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "E2E"}
STATS = ("mean", "p50", "p90", "p99")
THROUGHPUTS = {"requests_per_s": "req/s", "output_tokens_per_s": "output tok/s", "total_tokens_per_s": "total tok/s"}
# Compared figures: summary key path -> label.
METRICS = {**{f"{key}.{stat}": f"{name} {stat}" for key, name in LATENCIES.items() for stat in STATS},
           **{f"throughput.{key}": f"throughput ({unit})" for key, unit in THROUGHPUTS.items()}}


def read_summary(path: Path) -> dict:
    """A summary JSON file, or the summary.json of a run folder; exits 2 with the reason when it is not one."""
    file = path / "summary.json" if path.is_dir() else path
    try:
        summary = json.loads(file.read_text())
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(f"{file} is not JSON ({exc})")
    if not isinstance(summary, dict) or "num_requests" not in summary:
        fail(f"{file} is not a run summary (no num_requests): give the summary.json of servecast simulate or replay")
    return summary


def figure(summary: dict, path: str) -> float | None:
    """The number at a dotted key path, or None where it is missing, null or not a finite number."""
    value = summary
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def errors(a: dict, b: dict) -> dict[str, dict]:
    """Per metric: {"a", "b", "relative_error"}: (a - b) / b, None where either is missing or b is 0."""
    out = {}
    for path in METRICS:
        x, y = figure(a, path), figure(b, path)
        out[path] = {"a": x, "b": y, "relative_error": (x - y) / y if x is not None and y else None}
    return out


def print_errors(table_rows: dict[str, dict], a: Path, b: Path) -> None:
    def show(path: str, value: float | None) -> str:
        if value is None:
            return "missing"
        return f"{value * 1e3:,.2f} ms" if path.split(".")[0] in LATENCIES else f"{value:,.2f}"

    table = Table(title=f"A = {a}, B = {b}")
    for column in ("metric", "A", "B", "(A - B) / B"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for path, row in table_rows.items():
        error = row["relative_error"]
        table.add_row(METRICS[path], show(path, row["a"]), show(path, row["b"]),
                      "-" if error is None else f"{error:+.1%}")
    wide_console(80).print(table)


def compare_command(
    a: Path = typer.Argument(..., help="summary A (summary.json, or a run folder holding one)"),
    b: Path = typer.Argument(..., help="summary B, the reference the errors are relative to"),
    as_json: bool = typer.Option(False, "--json", help="print the errors as JSON on stdout, nothing else"),
) -> None:
    """The errors between two run summaries (e.g. a simulation and a replay): (A - B) / B per metric."""
    rows = errors(read_summary(a), read_summary(b))
    if as_json:
        typer.echo(dumps({"a": str(a), "b": str(b), "metrics": rows}))
        return
    print_errors(rows, a, b)
