"""The floor of the browser benchmark: bench/floor/app.py, a bare Streamlit page, with no chart
and with plain heatmaps."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.app_server import start_app
from bench.browser.page import (HELPERS_JS, INIT_JS, WATCH_ALL_JS, all_seen, arm, timed,
                                wait_idle)
from bench.common import ROOT

FLOOR_APP = ROOT / "bench" / "floor"
FLOOR_CHARTS = 5


def scenario_floor(browser, reps: int, warm: int, rounds: int = 2) -> dict:
    """bench/floor/app.py with no chart and with FLOOR_CHARTS heatmaps, a server each, in
    turn (`rounds` times): seconds from the press of Next to the step line changing (no
    chart) and to the third chart redrawn (the place of the decoder's weights)."""
    out = {"none": [], "charts": [], "all_charts": []}
    keys = [f"floor-{i}" for i in range(FLOOR_CHARTS)]
    for _ in range(rounds):
        for variant, n in (("none", 0), ("charts", FLOOR_CHARTS)):
            server = start_app(FLOOR_APP, Path(tempfile.mkdtemp(prefix="attention-lab-floor-")),
                               env={"FLOOR_CHARTS": str(n), "STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none"})
            ctx = browser.new_context(viewport={"width": 1400, "height": 1600})
            try:
                ctx.add_init_script(INIT_JS)
                page = ctx.new_page()
                page.add_init_script(HELPERS_JS)
                page.goto(server.url)
                wait_idle(page, 120_000)
                for i in range(reps + warm):
                    btn = page.get_by_role("button", name="Next", exact=True)
                    if n:
                        page.evaluate(WATCH_ALL_JS, keys)
                        t = timed(page, btn.click, keys[2], "true")
                        t_all = all_seen(page, n)
                    else:
                        line = page.locator("strong").first.inner_text()
                        arm(page)
                        btn.click()
                        done = page.wait_for_function("t => { const s = document.querySelector('strong'); "
                                                      "return s && s.innerText !== t && performance.now(); }",
                                                      arg=line, polling="raf", timeout=60_000)
                        t = (done.json_value() - page.evaluate("window.__bench.t0")) / 1000
                    if i >= warm:
                        out[variant].append(t)
                        if n:
                            out["all_charts"].append(t_all)
                    wait_idle(page)
            finally:
                ctx.close()
                server.stop()
    return out
