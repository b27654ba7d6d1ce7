"""A real app server and a real browser (Debian's Chromium through Playwright) for tests.

The server runs `streamlit run app.py` on a free 127.0.0.1 port and is stopped by its own
process id. Chromium is launched from /usr/bin/chromium with the flags that keep it off
the network. In CI a missing browser is a failure; elsewhere the browser tests skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = ROOT / "docs" / "screenshots"


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_browser():
    try:
        import playwright  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the playwright package is not installed (make test installs it)")
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        if os.environ.get("CI"):
            raise RuntimeError(f"Chromium not found at {CHROMIUM}; scripts/setup.sh --test installs it")
        pytest.skip("Debian's chromium is not installed (make test installs it)")


class AppServer:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path):
        self.port, self.proc, self.log = port, proc, log
        self.url = f"http://127.0.0.1:{port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def rss_mb(self) -> float:
        """Resident memory of the server process, from /proc."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")


def start_server(tmp_dir: Path, env_extra: dict | None = None, timeout: float = 120) -> AppServer:
    port = free_port()
    log = tmp_dir / f"streamlit-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    server = AppServer(port, proc, log)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited early:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"streamlit did not start within {timeout}s:\n{log.read_text()[-3000:]}")


def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def wait_idle(page, timeout: float = 60_000, settle_ms: int = 300):
    """Wait until Streamlit has finished the current run (no running indicator, no stale
    elements) and is still idle `settle_ms` later (a rerun can follow a finished run)."""
    _wait_idle_once(page, timeout)
    page.wait_for_timeout(settle_ms)
    _wait_idle_once(page, timeout)


def _wait_idle_once(page, timeout: float):
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout)
    page.wait_for_function(
        """() => {
            const app = document.querySelector('[data-testid="stApp"]');
            if (!app) return false;
            if (app.getAttribute('data-test-script-state') !== 'notRunning') return false;
            return document.querySelectorAll('[data-stale="true"]').length === 0;
        }""",
        timeout=timeout,
    )


def chart_data(page, key: str, timeout: float = 60_000) -> dict:
    """The live plotly figure (data + layout) of the chart with Streamlit key `key`."""
    sel = f'.st-key-{key}[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=timeout)
    return page.eval_on_selector(sel, """e => {
        // plotly keeps typed arrays (from base64 'bdata') under _inputArray: make them plain
        const plain = v => {
            if (v && typeof v === 'object' && v._inputArray) v = v._inputArray;
            if (ArrayBuffer.isView(v) || Array.isArray(v)) return Array.from(v, plain);
            if (v && typeof v === 'object' && Object.keys(v).every(k => /^\\d+$/.test(k))) return Object.values(v).map(plain);
            return v;
        };
        const data = e.data.map(t => Object.fromEntries(Object.entries(t).map(([k, v]) =>
            [k, ['x', 'y', 'z', 'text', 'customdata'].includes(k) ? plain(v) : v])));
        return {data: data, layout: e.layout};
    }""")


def no_exception(page) -> bool:
    return page.locator('[data-testid="stException"]').count() == 0
