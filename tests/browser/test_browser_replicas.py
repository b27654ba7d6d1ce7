"""Two replicas behind a real load balancer (issue 56): `scripts/replicas.py` (`make replicas`) starts
two app processes, HAProxy (sticky by cookie, health-checked) and a redis-server for the text store
they share; a 50,000-character text's link opens whole on either replica; a replica killed under a
session leaves it to reconnect to the survivor with its text; stopping the command leaves nothing.

One arrangement for the module, on free 127.0.0.1 ports; the tests run in order (the last stops it)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from browser_utils import ROOT, free_port, no_exception, require_browser, wait_idle
from viz.figures.text import url_text

pytestmark = pytest.mark.browser

LONG = "".join(f"Line {i}: the small dog sees the cat near the old river bank.\n" for i in range(1000))[:50_000]
CHART = '.st-key-explore-heatmap[data-stale="false"] .js-plotly-plot'
LINKS: dict = {}  # the long text's link, made by one test and opened by the next


class Replicas:
    def __init__(self, proc, info, stderr_path):
        self.proc, self.info, self.stderr_path = proc, info, stderr_path
        self.url = info["url"]

    def port_open(self, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python scripts/replicas.py` with N=2 and its own redis-server, in a process group of its own."""
    require_browser()
    d = tmp_path_factory.mktemp("replicas")
    env = {**os.environ, "ATTENTION_LAB_REPLICAS": "2", "ATTENTION_LAB_BALANCER_PORT": str(free_port()),
           "ATTENTION_LAB_TEXT_STORE": "redis", "ATTENTION_LAB_REPLICA_LOGS": str(d / "logs"),
           "ATTENTION_LAB_MACHINE_BUDGET_MB": "2000"}
    stderr_path = d / "replicas.err"
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "replicas.py")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=open(stderr_path, "w"), text=True, start_new_session=True)
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=240)
    if not line or not line[0].strip():
        proc.terminate()
        proc.wait(timeout=30)
        pytest.fail(f"scripts/replicas.py did not start:\n{stderr_path.read_text()[-3000:]}", pytrace=False)
    reps = Replicas(proc, json.loads(line[0]), stderr_path)
    yield reps
    if proc.poll() is None:  # the last test stops it; a failure before it must not leave it running
        proc.terminate()
        proc.wait(timeout=60)


def _box(page):
    return page.locator(".st-key-explore-text textarea").first


def _replica(context) -> str:
    return next((c["value"] for c in context.cookies() if c["name"] == "SERVERID"), "")


def _fresh(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 2000})
    return ctx, ctx.new_page()


def _served_by(url: str, cookie: str = "") -> str:
    req = urllib.request.Request(url + "/_stcore/health", headers={"Cookie": cookie} if cookie else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        set_cookie = " ".join(r.headers.get_all("Set-Cookie") or [])
    return set_cookie.split("SERVERID=")[1].split(";")[0] if "SERVERID=" in set_cookie else cookie.split("=")[-1]


def test_the_command_starts_two_replicas_behind_a_sticky_balancer_with_budgets_that_add_up(server):
    info = server.info
    assert [r["name"] for r in info["replicas"]] == ["r0", "r1"]
    assert len({r["port"] for r in info["replicas"]}) == 2
    assert info["redis"].startswith("redis://127.0.0.1:")
    for pid in info["processes"].values():
        os.kill(pid, 0)  # alive
    # each replica's gate budget is its share of the machine's: together no more than the machine's
    assert [r["budget_mb"] for r in info["replicas"]] == [1000, 1000] and info["machine_budget_mb"] == 2000
    for r in info["replicas"]:
        env = open(f"/proc/{r['pid']}/environ", "rb").read().split(b"\0")
        assert f"ATTENTION_LAB_MEMORY_BUDGET_MB={r['budget_mb']}".encode() in env
    first = [_served_by(server.url) for _ in range(4)]  # no cookie: round robin over both
    assert set(first) == {"r0", "r1"}, first
    assert {_served_by(server.url, "SERVERID=r1") for _ in range(3)} == {"r1"}  # the cookie keeps a session


def test_a_long_texts_link_opens_whole_from_five_new_browsers_over_both_replicas(server, browser):
    assert len(LONG) == 50_000 and len(url_text(LONG)) < len(LONG)
    ctx, page = _fresh(browser)
    page.goto(f"{server.url}/explore?model=toy-translate")
    wait_idle(page, timeout=120_000)
    _box(page).fill(LONG)
    _box(page).press("Control+Enter")
    page.wait_for_function("() => location.search.includes('text_key=')", timeout=120_000)
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    made_on, link = _replica(ctx), page.url
    ctx.close()
    LINKS["long"] = link
    served = []
    for _ in range(5):
        ctx, page = _fresh(browser)
        page.goto(link)
        wait_idle(page, timeout=120_000)
        assert _box(page).input_value() == LONG, "the link's text did not come back whole"
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert "does not hold" not in body and "cannot be reached" not in body and no_exception(page)
        served.append(_replica(ctx))
        ctx.close()
    assert made_on in ("r0", "r1") and set(served) == {"r0", "r1"}, (made_on, served)  # made on one, read on both


def test_a_replica_killed_under_a_session_leaves_it_to_reconnect_to_the_survivor_with_its_text(server, browser):
    link = LINKS.get("long")
    if link is None:
        pytest.skip("the long text's link is made by the test before")
    ctx, page = _fresh(browser)
    page.goto(link)
    wait_idle(page, timeout=120_000)
    page.wait_for_selector(CHART, timeout=120_000)
    victim = _replica(ctx)
    pid = next(r["pid"] for r in server.info["replicas"] if r["name"] == victim)
    os.kill(pid, signal.SIGKILL)  # the replica dies under the open session
    survivor = ({"r0", "r1"} - {victim}).pop()
    t0 = time.monotonic()
    while _replica(ctx) != survivor and time.monotonic() < t0 + 120:  # the page reconnects through the balancer
        page.wait_for_timeout(500)
    assert _replica(ctx) == survivor, "the session did not move to the surviving replica"
    print(f"reconnected to {survivor} {time.monotonic() - t0:.1f} s after {victim} was killed")
    # Streamlit's frontend keeps what it showed through the reconnect (the page runs again on the survivor at
    # the next input); a reload runs it there from its URL, which holds only the text's first part and key
    assert _box(page).input_value() == LONG
    page.reload()
    wait_idle(page, timeout=120_000)
    page.wait_for_selector(CHART, timeout=120_000)
    assert _replica(ctx) == survivor
    assert _box(page).input_value() == LONG and no_exception(page)  # its text is back, from the shared store
    assert "does not hold" not in page.locator('[data-testid="stMain"]').inner_text()
    page.screenshot(path=str(ROOT / "test-artifacts" / "screenshots" / "replicas-after-kill.png"))
    ctx.close()
    ctx, page = _fresh(browser)  # a new session with the existing link: through the survivor
    page.goto(link)
    wait_idle(page, timeout=120_000)
    assert _box(page).input_value() == LONG and _replica(ctx) == survivor and no_exception(page)
    ctx.close()
    assert server.proc.poll() is None  # the command keeps serving with one replica
    assert f"{victim} (pid {pid}) exited" in server.stderr_path.read_text()


def test_stopping_the_command_stops_everything_it_started(server):
    ports = [r["port"] for r in server.info["replicas"]]
    ports += [urllib.parse.urlsplit(server.url).port, urllib.parse.urlsplit(server.info["redis"]).port]
    assert any(server.port_open(p) for p in ports)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    for name, pid in server.info["processes"].items():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone (and reaped by the command)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.proc.pid, 0)  # nothing at all left in its process group
    assert not [p for p in ports if server.port_open(p)], "a port still answers"
