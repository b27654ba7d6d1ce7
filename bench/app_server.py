"""The app as a real server, and the browser that drives it: one copy for the browser tests
(tests/browser_utils.py) and the browser benchmark (bench/browser_bench.py).

`start_app` runs `python -m <module> run app.py` on a free 127.0.0.1 port, waits for its
health endpoint and returns an `AppServer`, which is stopped by its own process id.
Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM), launched with the flags that keep
it off the network.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import status_kib

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# The page is idle when Streamlit has finished its run, no element is stale and none is still a
# skeleton. The skeletons matter: the browser draws a widget's component some time after the run
# that sent it has ended, and a widget seeded from session state (a sentence from the URL) first
# mounts with its default and takes the seeded value a render later. A click in that gap sends
# the default back to the server (an empty sentence, the first training step).
IDLE_JS = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    return !!app && app.getAttribute('data-test-script-state') === 'notRunning'
        && document.querySelectorAll('[data-stale="true"], [data-testid="stSkeleton"]').length === 0;
}"""


def wait_idle_once(page, timeout: float) -> None:
    """Wait for IDLE_JS to hold."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout)
    page.wait_for_function(IDLE_JS, timeout=timeout)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(playwright):
    """Debian's Chromium, headless and off the network, from a sync or async Playwright."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


class AppServer:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path):
        self.port, self.proc, self.log = port, proc, log
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def rss_mib(self) -> float:
        """Resident memory of the server process, from /proc (nan once it has gone)."""
        kib = status_kib("VmRSS", self.proc.pid)
        return kib / 1024 if kib >= 0 else float("nan")


def start_app(root: Path, log_dir: Path, env: dict | None = None, timeout: float = 120,
              module: str = "streamlit") -> AppServer:
    """`python -m {module} run {root}/app.py` on a free port (log: log_dir/streamlit-PORT.log),
    with os.environ plus `env`; raises RuntimeError (with the log's end) when it exits or
    is not healthy within `timeout` seconds."""
    port = free_port()
    log = Path(log_dir) / f"streamlit-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", module, "run", str(Path(root) / "app.py"), "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    proc = subprocess.Popen(cmd, cwd=root, env=full_env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
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
