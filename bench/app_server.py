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
# Between a click (or any input) and the run it asks for, the page still reads as idle: the
# browser has sent the rerun request, and the state turns 'running' only when the server answers.
# WATCH_JS (added to every page of a context by `watched_context`) counts the messages the page
# sends the server and, at each run's start, marks those sent so far answered; the page is idle
# only when every message has had its run. A message that asks for no run (rare: a stop) is
# let go after UNANSWERED_MS, which is far longer than a server takes to start a run.
WATCH_JS = """(() => {
  const al = window.__al = {sent: 0, answered: 0, lastSend: 0};
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) { al.sent += 1; al.lastSend = performance.now(); return send.call(this, data); };
  new MutationObserver(ms => { for (const m of ms)
      if (m.target.getAttribute('data-test-script-state') === 'running') al.answered = al.sent; })
    .observe(document, {attributes: true, subtree: true, attributeFilter: ['data-test-script-state']});
})();"""
UNANSWERED_MS = 10_000
IDLE_JS = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    const al = window.__al;
    return !!app && app.getAttribute('data-test-script-state') === 'notRunning'
        && (!al || al.answered >= al.sent || performance.now() - al.lastSend > %d)
        && document.querySelectorAll('[data-stale="true"], [data-testid="stSkeleton"]').length === 0;
}""" % UNANSWERED_MS
FRAMES_JS = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"


def watched_context(browser, **kw):
    """browser.new_context(**kw) whose pages run WATCH_JS (so IDLE_JS sees a requested run)."""
    ctx = browser.new_context(**kw)
    ctx.add_init_script(WATCH_JS)
    return ctx


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
