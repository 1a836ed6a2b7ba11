"""`servecast app`: open the Streamlit dashboard (app/dashboard/)."""

from __future__ import annotations

from pathlib import Path

import typer

from app.common import fail


def app_command(port: int = typer.Option(8501, help="port to serve the app on"),
                headless: bool = typer.Option(False, "--headless", help="do not open a browser")) -> None:
    """Open the Streamlit app: plan a fleet, look at a trace."""
    import subprocess
    import sys
    from importlib.util import find_spec

    if find_spec("streamlit") is None:
        fail("the app needs streamlit: pip install 'streamlit>=1.40'")
    if not 0 < port < 65536:
        fail(f"--port must be 1..65535, got {port}")
    main_page = Path(__file__).parent / "dashboard" / "main.py"
    command = [sys.executable, "-m", "streamlit", "run", str(main_page), "--server.port", str(port),
               "--server.headless", "true" if headless else "false", "--browser.gatherUsageStats", "false"]
    raise typer.Exit(subprocess.call(command))
