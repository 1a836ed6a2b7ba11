"""`servecast catalog`: the models, accelerators and engine profiles a plan can use."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from app.catalog_tables import SECTIONS, TITLES
from app.common import dumps, fail



def catalog_command(
    section: Optional[str] = typer.Argument(None, help="models, hardware or engines (default: all three)"),
    hardware_file: Optional[str] = typer.Option(None, help="YAML with extra accelerators, listed with the catalog's"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON on stdout, nothing else"),
) -> None:
    """What a plan can use: the models, the accelerators (price, memory, how far their costs are
    known) and the serving-engine profiles."""
    from app.catalog_tables import engine_rows, hardware_rows, label, model_rows

    if section is not None and section not in SECTIONS:
        fail(f"unknown catalog section {section!r}: use models, hardware or engines (or none for all three)")
    try:
        makers = {"models": model_rows, "hardware": lambda: hardware_rows(hardware_file), "engines": engine_rows}
        tables = {name: makers[name]() for name in ([section] if section else SECTIONS)}
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(dumps(tables))
        return
    console = Console()
    for name, rows in tables.items():
        table = Table(title=TITLES[name], title_justify="left")
        for column in rows[0] if rows else ():
            table.add_column(label(column), overflow="fold")
        for row in rows:
            table.add_row(*("–" if v is None else ", ".join(v) if isinstance(v, list) else f"{v:g}"
                            if isinstance(v, float) else str(v) for v in row.values()))
        console.print(table)
