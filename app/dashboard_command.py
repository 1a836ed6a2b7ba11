"""`servecast app`: open the Streamlit dashboard (app/dashboard/)."""

from __future__ import annotations

from pathlib import Path

import typer

from app.common import fail


def app_command(port: int = typer.Option(8501, help="port to serve the app on"),
                host: str = typer.Option("127.0.0.1", help="address to serve on: this machine only by default; "
                                                           "0.0.0.0 to let other machines in (as `serve --host`)"),
                headless: bool = typer.Option(False, "--headless", help="do not open a browser")) -> None:
    """Open the Streamlit app: plan a fleet, look at a trace."""
    import os
    import subprocess
    import sys
    from importlib.util import find_spec

    if find_spec("streamlit") is None:
        fail("the app needs streamlit: pip install 'streamlit>=1.40'")
    if not 0 < port < 65536:
        fail(f"--port must be 1..65535, got {port}")
    main_page = Path(__file__).parent / "dashboard" / "main.py"
    command = [sys.executable, "-m", "streamlit", "run", str(main_page), "--server.port", str(port),
               "--server.address", host, "--server.headless", "true" if headless else "false",
               "--browser.gatherUsageStats", "false"]
    # Streamlit fails rather than move to another port, so this is the address it serves (it prints
    # its own Local/Network URLs once up).
    typer.echo(f"servecast app: serving on http://{host}:{port} (Ctrl-C to stop)")
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":  # os.exec* there starts a new process and ends this one: the PID would change
        raise typer.Exit(subprocess.call(command))
    # Streamlit replaces this process, keeping its PID: whoever stops `servecast app` (a signal, a
    # process manager, Ctrl-C) stops the server itself, and no child is left serving the port.
    os.execv(sys.executable, command)
