"""`servecast app` is the process that serves: stopping it stops the server, leaving no child."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90  # generous: a loaded machine imports streamlit slowly
STOP_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def children_of(pid: int) -> set[int]:
    """Processes whose parent is pid (Linux /proc; empty elsewhere)."""
    found = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            # the parent is the 2nd field after the parenthesised command name
            if int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on this TCP port (Linux /proc/net; IPv6 as '::...')."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]) if width == 8 else "::" + address)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


@pytest.mark.skipif(os.name == "nt", reason="POSIX signals")
def test_sigterm_to_servecast_app_stops_the_server(tmp_path) -> None:
    port = free_port()
    log = (tmp_path / "app.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "app", "--port", str(port), "--headless"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not accepts(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.skip(f"streamlit did not start here: {log.read()[-500:]}")
            time.sleep(0.5)
        # This machine only, as `serve`: every listening socket on the port is on 127.0.0.1.
        assert listening_addresses(port) == {"127.0.0.1"}
        children = children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while accepts(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not accepts(port), f"port {port} still served after servecast app was stopped"
        assert not [pid for pid in children if alive(pid)], "a child of servecast app outlived it"
        log.seek(0)
        assert f"http://127.0.0.1:{port}" in log.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
