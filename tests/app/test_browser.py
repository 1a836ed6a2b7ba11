"""A real browser: headless Chromium drives the running app through a plan and saves a screenshot
of the Plan page (test-artifacts/plan-page.png). Skipped where Chromium is missing (.ci/run installs
Debian's package)."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout_s: float):
    """The body of url once it answers (polling until timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class DevTools:
    """Just enough of the Chrome DevTools Protocol: send a command, wait for its answer."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.ids = itertools.count(1)

    def __call__(self, method: str, **params):
        message_id = next(self.ids)
        self.conn.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.conn.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        return self("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                text = self.evaluate("document.body.innerText")
                raise AssertionError(f"timed out waiting for {expression}; the page shows: {text[:2000]}")
            time.sleep(0.5)


def test_a_browser_plans_a_fleet_and_saves_a_screenshot() -> None:
    app_port, debug_port = free_port(), free_port()
    app = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "dashboard" / "main.py"),
                            "--server.port", str(app_port), "--server.headless", "true",
                            "--browser.gatherUsageStats", "false"], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    browser = None
    try:
        assert get(f"http://127.0.0.1:{app_port}/_stcore/health", 90) == b"ok"
        browser = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                                    "--disable-dev-shm-usage", f"--remote-debugging-port={debug_port}",
                                    "--window-size=1400,2600", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tabs = json.loads(get(f"http://127.0.0.1:{debug_port}/json", 60))
        from websockets.sync.client import connect

        with connect(next(t for t in tabs if t["type"] == "page")["webSocketDebuggerUrl"], max_size=None) as conn:
            page = DevTools(conn)
            page("Page.enable")
            page("Page.navigate", url=f"http://127.0.0.1:{app_port}/")
            page.wait_for("document.body.innerText.includes('press Plan')", 120)
            clicked = page.evaluate("(() => { const b = Array.from(document.querySelectorAll('button'))"
                                    ".find(b => b.innerText.trim() === 'Plan'); if (b) b.click(); return !!b; })()")
            assert clicked, "no Plan button on the page"
            # The default question (every priced GPU x bf16, fp8 x TP 1-8, each rate at steady state):
            # minutes on 2 cores.
            page.wait_for("document.body.innerText.includes('Recommended:')", 900)
            # The Pareto chart drawn and the candidate table's download offered: the plan is on screen.
            page.wait_for("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0"
                          " && document.body.innerText.includes('candidates (CSV)')", 120)
            time.sleep(2)  # let the chart finish drawing
            shot = page("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
        artifacts = ROOT / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "plan-page.png").write_bytes(png)
    finally:
        for process in (browser, app):
            if process is not None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
