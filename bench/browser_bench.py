"""Browser benchmark: the app in headless Chromium (Playwright), on a warm server.

    python -m bench.browser_bench [--reps 10] [--long-reps 5] [--no-keep-freed-memory] [--json]
                                  [--only SCENARIO ...]   # e.g. --only corpus

Each figure is the median over repetitions, measured in the page from the user's action
(the keydown of Enter, the pointerdown of a click, as the page's own event timestamps) to
the first moment the chart `.st-key-<key>[data-stale="false"] .js-plotly-plot` holds the
new figure: a different plotly data object than before the action, which also passes a
check that it is the new data (the typed tokens on the x axis, "head h" in the title, 72
maps, one more decoder row...). The page is polled every animation frame.

1. sentence: type a new 20-token sentence (minilm: [CLS] + 18 words + [SEP]) + Enter on
   /explore -> the heatmap shows its tokens; also toy-translate (20 words), the app's default;
2. model view: click the tab "Model view (all layers × heads)" -> the 72-map grid (minilm,
   6 layers x 12 heads, 20 tokens, tiled into one heatmap by viz.grid) is drawn;
3. head: choose another head in the "Head" selectbox -> the heatmap's title says that head;
4. decoder step: press "Next" on /decoder (toy-translate, inference) -> "decoder-weights"
   shows one more row (the target's figure); also reported: until all five of the step's
   charts hold their new figures;
   decoder in the browser: the stepper's "Step in the browser" toggle on, a click on the
   all-steps figure's slider at the next step -> its title names that step (the figure
   restyles itself: no Streamlit run, which the page's script state confirms; also on the
   smollm2 run below);
   floor: the same press of Next on bench/floor/app.py, a bare Streamlit fragment with no
   chart and with five plain heatmaps of the decoder's sizes (values in the cells, no model,
   none of the app's code), each on its own server: what Streamlit and plotly.js cost on this
   machine, under the decoder's figure;
5. long input: 512 minilm tokens + Enter -> the heatmap is drawn; then the model view tab ->
   the grid; then a head change at 512 tokens; the page's longest main-thread task
   (PerformanceObserver 'longtask') while the 512-token views update tells whether the page
   stays responsive;
6. corpus: /corpus with 500 pasted sentences of 20 minilm tokens (10,000 tokens: the joint
   scatter of one head's queries and keys has 20,000 points; the page reads 2,000 sentences,
   1 MB, and draws up to 20,000 tokens). The paste + Ctrl+Enter runs the corpus job and the
   PCA (one run, reported, not the target). The target, "20,000 points drawn in <= 2 s once
   the projection is ready", is timed on changes that reuse the cached job and projection:
   "Colour by" (position, token, query / key in turn) and a return to a head seen before;
   each until the scatter holds 2 x 10,000 points in that colouring and head. Also reported:
   the longest main-thread task, and CPU seconds per redraw of the server, Chromium's
   renderer and its GPU process (WebGL runs in software under --disable-gpu), which load on
   the shared machine does not stretch as it does wall time.

The server runs `python -m bench.serve run app.py` (streamlit run, after
core.device.keep_freed_memory(), which the app calls too), one torch thread, no file watcher.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench.app_server import CHROMIUM, AppServer, launch, start_app, wait_idle_once
from bench.common import ROOT, Result, median, text_of

TAB_MODEL = "Model view (all layers × heads)"
TAB_MAP = "Heatmap"

# Marks the user's action with the page's own clock, and records long main-thread tasks.
INIT_JS = """
window.__bench = {armed: false, t0: null, longtasks: []};
for (const type of ['pointerdown', 'keydown']) {
  document.addEventListener(type, e => {
    const b = window.__bench;
    if (!b.armed || (type === 'keydown' && e.key !== 'Enter')) return;
    b.t0 = e.timeStamp; b.armed = false;
  }, true);
}
window.__bench.states = [];
new MutationObserver(muts => {
  for (const m of muts) {
    const v = m.target.getAttribute && m.target.getAttribute('data-test-script-state');
    if (v) window.__bench.states.push([performance.now(), v]);
  }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ['data-test-script-state']});
try {
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) window.__bench.longtasks.push([e.startTime, e.duration]);
  }).observe({type: 'longtask', buffered: true});
} catch (err) {}
"""

# Helpers for predicates: the live plot of a key (non-stale), its data rows, its ticks, title.
HELPERS_JS = """
window.__plot = key => document.querySelector('.st-key-' + key + '[data-stale="false"] .js-plotly-plot');
window.__rows = z => {
  if (!z) return -1;
  if (z.shape) return parseInt(String(z.shape).split(',')[0]);
  if (z._inputArray) z = z._inputArray;
  return z.length;
};
window.__title = e => { const t = e && e.layout && e.layout.title; return (t && (t.text || t)) || ''; };
window.__ticks = e => (e && e.layout && e.layout.xaxis && e.layout.xaxis.ticktext) || [];
window.__len = v => { if (!v) return -1; if (v._inputArray) v = v._inputArray; return v.length === undefined ? -1 : v.length; };
"""


def start_server(keep_freed: bool = True, timeout: float = 180, root: Path = ROOT) -> AppServer:
    """The app through bench.serve (keep_freed_memory before streamlit starts), one torch
    thread, no file watcher; its log in a fresh temporary folder."""
    env = {"ATTENTION_LAB_THREADS": os.environ.get("ATTENTION_LAB_THREADS", "1"),
           "STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none"}
    if not keep_freed:
        env["ATTENTION_LAB_KEEP_FREED_MEMORY"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)  # bench.serve
    return start_app(Path(root), Path(tempfile.mkdtemp(prefix="attention-lab-bench-")), env=env, timeout=timeout,
                     module="bench.serve")


# ------------------------------------------------------------------ page helpers
def wait_idle(page, timeout: float = 120_000) -> None:
    wait_idle_once(page, timeout)


def wait_chart(page, key: str, timeout: float = 120_000) -> None:
    page.wait_for_selector(f'.st-key-{key}[data-stale="false"] .js-plotly-plot', timeout=timeout)


def remember(page, key: str) -> None:
    """Note the chart's current plotly data object, so a later predicate can see a new one."""
    page.evaluate(HELPERS_JS)
    page.evaluate("key => { const e = window.__plot(key); window.__benchOld = e ? e.data : null; }", key)


def arm(page) -> None:
    page.evaluate("() => { window.__bench.armed = true; window.__bench.t0 = null; }")


LAST = {}  # breakdown of the last timed action (seconds from the action)


def timed(page, action, key: str, check_js: str, arg=None, timeout: float = 120_000) -> float:
    """Seconds from the user's action (page clock) until chart `key` shows a new figure that
    passes check_js (a JS expression over `e`, the plot element, and `arg`). LAST gets the
    breakdown: when the server started and finished the script run, and the longest
    main-thread task from the action until the page is idle again (seconds)."""
    remember(page, key)
    arm(page)
    t_py = time.perf_counter()
    action()
    fn = ("([key, arg]) => { const e = window.__plot(key); "
          "if (!e || !e.data || e.data === window.__benchOld) return false; "
          f"if (!({check_js})) return false; return performance.now(); }}")
    handle = page.wait_for_function(fn, arg=[key, arg], polling="raf", timeout=timeout)
    t_done = handle.json_value()
    py = time.perf_counter() - t_py
    try:  # the script may still run (and the browser draw) after this chart shows: let it finish
        wait_idle(page, timeout)
    except Exception:
        pass
    info = page.evaluate("""([t1]) => { const b = window.__bench; const t0 = b.t0;
        if (t0 === null) return null;
        const st = b.states.filter(x => x[0] >= t0);
        const run = st.find(x => x[1] === 'running'); const end = st.filter(x => x[1] === 'notRunning' && (!run || x[0] >= run[0]));
        const lt = b.longtasks.filter(x => x[0] + x[1] >= t0);
        return {t0: t0, run: run ? run[0] - t0 : null, end: end.length ? end[0][0] - t0 : null,
                longest: lt.length ? Math.max(...lt.map(x => x[1])) : 0}; }""", [t_done])
    LAST.clear()
    if info is None:
        LAST.update(total=py)
        return py
    total = (t_done - info["t0"]) / 1000
    LAST.update(total=total, script_start=(info["run"] or 0) / 1000 if info["run"] is not None else None,
                script_end=info["end"] / 1000 if info["end"] is not None else None, longest_task=info["longest"] / 1000)
    return total


def collect(breakdowns: list) -> dict:
    """Medians of the breakdowns of a scenario's repetitions."""
    out = {}
    for k in ("total", "script_start", "script_end", "longest_task"):
        xs = [b[k] for b in breakdowns if b.get(k) is not None]
        out[k] = median(xs) if xs else None
    return out


def longtasks_since(page, t_from_ms: float) -> list:
    return page.evaluate("t => window.__bench.longtasks.filter(x => x[0] + x[1] >= t)", t_from_ms)


def click_tab(page, name: str, timeout: float = 120_000) -> None:
    """Open a tab and wait until it is selected and its rerun has finished (the Heatmap tab:
    until its chart is drawn), so the next action cannot race the rerun."""
    tab = page.get_by_role("tab", name=name)
    if tab.get_attribute("aria-selected") != "true":
        tab.click()
    page.wait_for_function("name => [...document.querySelectorAll('[role=tab]')].some("
                           "t => t.textContent.trim() === name && t.getAttribute('aria-selected') === 'true')",
                           arg=name, timeout=timeout)
    wait_idle(page, timeout)
    if name == TAB_MAP:
        wait_chart(page, "explore-heatmap", timeout)


def choose(page, label: str, option: str, timed_action=None):
    """Open the selectbox labelled `label`; choose `option` (the click is the timed action)."""
    page.get_by_role("combobox", name=label, exact=True).click()
    opt = page.get_by_role("option", name=option, exact=True)
    opt.wait_for(timeout=30_000)
    return opt.click


def set_text(page, label: str, text: str):
    box = page.get_by_label(label)
    box.fill(text)
    return lambda: box.press("Enter")


# ------------------------------------------------------------------ sentences
WORDS20 = ("the old farmer walked slowly across the green field toward a quiet river near his small house "
           "while birds sang above the tall trees and children played with a red ball in the warm evening sun "
           "after the long day of hard work the family sat together at the wooden table sharing bread cheese "
           "and stories about the village market where people sold apples fish honey and bright woven cloth").split()


def minilm_sentences(model, n: int, length: int = 20, seed: int = 0) -> list:
    """n different sentences of exactly `length` minilm positions (one-piece words)."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        words = rng.sample(WORDS20, length - 2)
        text = " ".join(words)
        if text in seen or len(model.tokenizer.encode(text)) != length:
            continue
        seen.add(text)
        out.append(text)
    return out


def toy_sentences(n: int, length: int = 20, seed: int = 1) -> list:
    from core.toy import toy_task

    rng = random.Random(seed)
    out = []
    while len(out) < n:
        words = []
        while len(words) < length:
            src, _, _ = toy_task.sample(rng)
            words += (["and"] if words else []) + src
        words = words[:length]
        text = " ".join(words)
        if text not in out:
            out.append(text)
    return out


def expected_ticks(tokens) -> list:
    from viz.figures import safe_labels

    return safe_labels(tokens)


# ------------------------------------------------------------------ scenarios
def scenario_sentence(page, base_url: str, model_name: str, texts: list, ticks: list, warm: int) -> list:
    page.goto(f"{base_url}/explore?model={model_name}&text=" + urllib.parse.quote(texts[0]))
    wait_idle(page)
    wait_chart(page, "explore-heatmap")
    times, bds = [], []
    for i, (text, tk) in enumerate(zip(texts[1:], ticks[1:])):
        press = set_text(page, "Sentence (press Enter)", text)
        t = timed(page, press, "explore-heatmap", "JSON.stringify(window.__ticks(e)) === JSON.stringify(arg)", tk)
        if i >= warm:
            times.append(t)
            bds.append(dict(LAST))
        wait_idle(page)
    return times, bds


def other_head(page, i: int, n_heads: int = 12) -> int:
    """A head for repetition i, never the one shown now (choosing it again would do nothing)."""
    current = page.get_by_role("combobox", name="Head", exact=True).input_value()
    h = (i * 5 + 1) % n_heads
    return (h + 1) % n_heads if str(h) == current else h


# the tiled model view (viz.grid): one heatmap + one click target per map
GRID_CHECK = "e.data.length === 2 && (e.data[1].customdata || []).length === arg && window.__ticks(e).length === 12"
HEAD_CHECK = "new RegExp('head ' + arg + '(\\\\D|$)').test(window.__title(e))"


def scenario_head(page, n_reps: int, warm: int, n_heads: int = 12) -> list:
    wait_chart(page, "explore-heatmap")
    times, bds = [], []
    for i in range(n_reps + warm):
        h = other_head(page, i, n_heads)
        click = choose(page, "Head", str(h))
        t = timed(page, click, "explore-heatmap", HEAD_CHECK, h)
        if i >= warm:
            times.append(t)
            bds.append(dict(LAST))
        wait_idle(page)
    return times, bds


def scenario_model_view(page, n_reps: int, warm: int, n_maps: int) -> list:
    times, bds = [], []
    failures = 0
    for i in range(n_reps + warm):
        click_tab(page, TAB_MAP)
        tab = page.get_by_role("tab", name=TAB_MODEL)
        try:
            t = timed(page, tab.click, "explore-grid", GRID_CHECK, n_maps, timeout=60_000)
        except Exception:
            failures += 1  # counted, not timed; the next repetition starts from the Heatmap tab again
            if failures > 2:
                raise
            continue
        if i >= warm:
            times.append(t)
            bds.append(dict(LAST))
        wait_idle(page)
    click_tab(page, TAB_MAP)
    return times, bds


DECODER_CHARTS = ["decoder-mask", "decoder-masked", "decoder-weights", "decoder-cross", "decoder-next"]
# Notes, from before the action, the first frame at which each chart holds a new figure.
WATCH_ALL_JS = """keys => { window.__seen = {}; const old = {};
  for (const k of keys) { const e = window.__plot(k); old[k] = e ? e.data : null; }
  function poll() { for (const k of keys) { const e = window.__plot(k);
      if (e && e.data && e.data !== old[k] && !(k in window.__seen)) window.__seen[k] = performance.now(); }
    if (Object.keys(window.__seen).length < keys.length) requestAnimationFrame(poll); }
  requestAnimationFrame(poll); }"""


def all_seen(page, n: int) -> float:
    """Seconds from the action until the last of the n charts WATCH_ALL_JS watches held a new figure."""
    page.wait_for_function("n => Object.keys(window.__seen).length >= n", arg=n, timeout=60_000)
    return page.evaluate("() => (Math.max(...Object.values(window.__seen)) - window.__bench.t0) / 1000")


def scenario_decoder(page, base_url: str, text: str, n_reps: int, warm: int) -> dict:
    page.goto(f"{base_url}/decoder?model=toy-translate&text=" + urllib.parse.quote(text))
    wait_idle(page, 180_000)
    if page.locator('[data-testid="stException"]').count():
        return {"error": "the decoder page raised an exception: "
                         + page.locator('[data-testid="stException"]').first.inner_text()[:300]}
    try:
        wait_chart(page, "decoder-weights", 60_000)
    except Exception as exc:
        return {"error": f"no chart with key decoder-weights on /decoder ({exc.__class__.__name__})"}
    times, all_times, bds = [], [], []
    direction = "Next"
    for i in range(n_reps + warm):
        btn = page.get_by_role("button", name=direction, exact=True)
        if btn.is_disabled():
            direction = "Previous" if direction == "Next" else "Next"
            btn = page.get_by_role("button", name=direction, exact=True)
        rows = page.evaluate("() => window.__rows(window.__plot('decoder-weights').data[0].z)")
        want = rows + (1 if direction == "Next" else -1)
        page.evaluate(WATCH_ALL_JS, DECODER_CHARTS)  # when does each of the step's charts change?
        t = timed(page, btn.click, "decoder-weights", "window.__rows(e.data[0].z) === arg", want)
        t_all = all_seen(page, len(DECODER_CHARTS))
        if i >= warm:
            times.append(t)
            all_times.append(t_all)
            bds.append(dict(LAST))
        wait_idle(page)
    return {"times": times, "all_charts": all_times, "breakdown": collect(bds)}


# Where to click the all-steps figure's slider for a step (from 1): plotly labels every step,
# or every k-th when they do not fit, so the step's place comes from the first and last labels.
SLIDER_STEP_AT_JS = """step => { const root = document.querySelector('.st-key-decoder-steps') || document;
  const pts = [...root.querySelectorAll('.slider-label')].filter(e => /^[0-9]+$/.test(e.textContent))
    .map(e => { const r = e.getBoundingClientRect(); return [parseInt(e.textContent), r.x + r.width / 2]; });
  const [a, b] = [pts[0], pts[pts.length - 1]];
  const r = root.querySelector('.slider-rail-touch-rect').getBoundingClientRect();
  return [a[1] + (step - a[0]) * (b[1] - a[1]) / (b[0] - a[0]), r.y + r.height / 2]; }"""


def slider_steps(page, n_reps: int, warm: int) -> tuple:
    """On /decoder: turn "Step in the browser" on, then click the all-steps figure's slider at
    the next step (back at the end) until its title names that step. Returns the seconds per
    click and, per click, the longest main-thread task and the Streamlit runs it started
    (none expected: the figure restyles itself)."""
    page.locator(".st-key-decoder-in-browser label").first.click()
    wait_chart(page, "decoder-steps", 300_000)
    wait_idle(page, 300_000)
    page.locator(".st-key-decoder-steps").scroll_into_view_if_needed()  # mouse clicks land in the viewport
    n_steps = page.evaluate("() => window.__plot('decoder-steps').layout.sliders[0].steps.length")
    times, bds, direction = [], [], 1
    for i in range(n_reps + warm):
        active = page.evaluate("() => window.__plot('decoder-steps').layout.sliders[0].active")
        if not 0 <= active + direction < n_steps:
            direction = -direction
        label = str(active + direction + 1)
        x, y = page.evaluate(SLIDER_STEP_AT_JS, active + direction + 1)
        arm(page)
        page.mouse.click(x, y)
        done = page.wait_for_function("want => { const e = window.__plot('decoder-steps'); "
                                      "return e && window.__title(e).startsWith(want) && performance.now(); }",
                                      arg=f"Step {label} of", polling="raf", timeout=60_000)
        t = (done.json_value() - page.evaluate("window.__bench.t0")) / 1000
        page.wait_for_timeout(200)
        info = page.evaluate("""() => { const b = window.__bench; const lt = b.longtasks.filter(x => x[0] + x[1] >= b.t0);
            return {runs: b.states.filter(x => x[0] >= b.t0 && x[1] === 'running').length,
                    longest: lt.length ? Math.max(...lt.map(x => x[1])) : 0}; }""")
        if i >= warm:
            times.append(t)
            bds.append({"total": t, "longest_task": info["longest"] / 1000, "script_runs": info["runs"]})
    return times, bds


def scenario_decoder_browser(page, base_url: str, text: str, n_reps: int, warm: int) -> tuple:
    """toy-translate's stepper with "Step in the browser" on: see slider_steps."""
    page.goto(f"{base_url}/decoder?model=toy-translate&text=" + urllib.parse.quote(text))
    wait_idle(page, 180_000)
    return slider_steps(page, n_reps, warm)


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


def scenario_decoder_long(page, base_url: str, text: str, n_reps: int, warm: int) -> dict:
    """smollm2 with a 1,024-token prompt and up to 64 new tokens: Next until the step's
    next-token chart (and its maps) show the new step. Every step is a view of one traced
    pass, so a step reads one recomputed layer (cached after the first)."""
    page.goto(f"{base_url}/decoder?model=smollm2&layer=3&head=1&text=" + urllib.parse.quote(text))
    wait_idle(page, 900_000)
    wait_chart(page, "decoder-next", 900_000)
    times, weights_times = [], []
    for i in range(n_reps + warm):
        btn = page.get_by_role("button", name="Next", exact=True)
        page.evaluate(WATCH_ALL_JS, ["decoder-weights", "decoder-next"])
        t = timed(page, btn.click, "decoder-next", "true", None, 300_000)
        page.wait_for_function("n => Object.keys(window.__seen).length >= n", arg=2, timeout=300_000)
        t_w = page.evaluate("() => (window.__seen['decoder-weights'] - window.__bench.t0) / 1000")
        if i >= warm:
            times.append(t)
            weights_times.append(t_w)
        wait_idle(page)
    browser_times, bds = slider_steps(page, n_reps, warm)  # the same run, stepped in the browser
    return {"times": times, "weights": weights_times, "browser": browser_times, "browser_breakdown": bds}


def scenario_long(page, base_url: str, texts: list, warm: int) -> dict:
    """512-token inputs: heatmap after Enter, grid after the tab click, head change; long tasks."""
    page.goto(f"{base_url}/explore?model=minilm&text=" + urllib.parse.quote("a short warm up sentence"))
    wait_idle(page)
    wait_chart(page, "explore-heatmap")
    maps, grids, heads, longest, bd = [], [], [], [], {"map": [], "grid": [], "head": []}
    for i, text in enumerate(texts):
        click_tab(page, TAB_MAP, 180_000)
        t_start = page.evaluate("() => performance.now()")
        press = set_text(page, "Sentence (press Enter)", text)
        t_map = timed(page, press, "explore-heatmap",
                      "window.__rows(e.data[0].z) === 512 || /blocks of/.test(window.__title(e))", None, 180_000)
        bd_map = dict(LAST)
        wait_idle(page, 180_000)
        tab = page.get_by_role("tab", name=TAB_MODEL)
        t_grid = timed(page, tab.click, "explore-grid", GRID_CHECK, 72, 180_000)
        bd_grid = dict(LAST)
        wait_idle(page, 180_000)
        click_tab(page, TAB_MAP, 180_000)
        h = other_head(page, i + 3)
        click = choose(page, "Head", str(h))
        t_head = timed(page, click, "explore-heatmap", HEAD_CHECK, h, 180_000)
        wait_idle(page, 180_000)
        tasks = longtasks_since(page, t_start)
        if i >= warm:
            maps.append(t_map)
            grids.append(t_grid)
            heads.append(t_head)
            longest.append(max((d for _, d in tasks), default=0.0) / 1000)
            bd["map"].append(bd_map)
            bd["grid"].append(bd_grid)
            bd["head"].append(dict(LAST))
    return {"map": maps, "grid": grids, "head": heads, "longest_task": longest,
            "breakdown": {k: collect(v) for k, v in bd.items()}}


def _proc_table() -> dict:
    """pid -> (parent pid, CPU seconds (user + system, all threads), command line) from /proc."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        out[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmd)
    return out


def cpu_seconds(server_pid: int) -> dict:
    """CPU seconds so far of the app server, and of this process's Chromium by kind: the page's
    renderer(s) and the GPU process (WebGL, software-rendered by SwiftShader under --disable-gpu).
    Unlike wall time, these do not grow when other jobs want the cores."""
    procs, me = _proc_table(), os.getpid()

    def mine(pid: int) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in procs:
                return False
            pid = procs[pid][0]
        return False

    out = {"server": procs[server_pid][1] if server_pid in procs else float("nan"), "renderer": 0.0, "gpu": 0.0}
    for pid, (_, cpu, cmd) in procs.items():
        if "chrom" in cmd and mine(pid):
            kind = "gpu" if "--type=gpu-process" in cmd else "renderer" if "--type=renderer" in cmd else None
            if kind:
                out[kind] += cpu
    return out


def cpu_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


CORPUS_SENTENCES, CORPUS_SENTENCE_LEN = 500, 20  # pasted: 10,000 minilm tokens -> 20,000 points
# "Colour by" options as the page names them (viz.corpus.COLOR_BY), in the order the scenario cycles
CORPUS_COLOURS = [("position", "position"), ("token", "token (most frequent)"), ("type", "query / key")]
# the joint scatter: two traces (queries, keys) of arg[0] points each, coloured by arg[1], head arg[2]
CORPUS_CHECK = ("e.data.length === 2 && window.__len(e.data[0].x) === arg[0] && window.__len(e.data[1].x) === arg[0] "
                "&& (typeof e.data[0].marker.color === 'string' ? 'type' : e.data[0].marker.colorbar ? 'position' "
                ": 'token') === arg[1] && new RegExp('head ' + arg[2] + ' ').test(window.__title(e))")


def scenario_corpus(page, base_url: str, sentences: list, n_tokens: int, n_reps: int, warm: int,
                    server_pid: int) -> dict:
    """The corpus page's joint scatter of 2 x n_tokens points (queries and keys of one head,
    minilm layer 0): the pasted corpus (`sentences`, all within the page's default of 500) is
    traced and projected once (timed, but not the target: the corpus job + PCA + draw); then
    the target: "Colour by" changes, which reuse the cached corpus job and projection and only
    rebuild the figure and draw it; then returns to a head seen before (its projection cached),
    after one untimed first visit that computes it. Each repetition also records the CPU
    seconds (cpu_seconds) from before the action until the page is idle again."""
    page.goto(f"{base_url}/corpus?model=minilm&layer=0&head=0&projection=pca")
    wait_idle(page, 300_000)
    wait_chart(page, "corpus-scatter", 300_000)  # the bundled corpus first
    colour = page.get_by_role("combobox", name="Colour by", exact=True).input_value()  # gone while the corpus is empty
    mode = {shown: m for m, shown in CORPUS_COLOURS}[colour]
    page.locator(".st-key-corpus-source").get_by_role("radio", name="Paste text", exact=True).check(force=True)
    wait_idle(page)
    box = page.get_by_label("Sentences, one a line", exact=True)
    box.fill("\n".join(sentences))
    t_first = timed(page, lambda: box.press("Control+Enter"), "corpus-scatter", CORPUS_CHECK, [n_tokens, mode, 0],
                    900_000)
    first = dict(LAST)
    wait_idle(page, 900_000)
    t_lt = page.evaluate("() => performance.now()")
    times, bds = [], []
    order = [c for c in CORPUS_COLOURS if c[0] != mode] + [c for c in CORPUS_COLOURS if c[0] == mode]
    for i in range(n_reps + warm):
        mode, shown = order[i % len(order)]
        click = choose(page, "Colour by", shown)
        c0 = cpu_seconds(server_pid)
        t = timed(page, click, "corpus-scatter", CORPUS_CHECK, [n_tokens, mode, 0], 300_000)
        wait_idle(page, 300_000)
        if i >= warm:
            times.append(t)
            bds.append(dict(LAST, cpu=cpu_delta(c0, cpu_seconds(server_pid))))
    colour_tasks = longtasks_since(page, t_lt)
    # head 1's first visit computes its projection (untimed); then heads 0 and 1 in turn, both cached
    heads, hbds = [], []
    for i in range(n_reps + warm + 1):
        h = 1 - i % 2 if i else 1
        click = choose(page, "Head", str(h))
        c0 = cpu_seconds(server_pid)
        t = timed(page, click, "corpus-scatter", CORPUS_CHECK, [n_tokens, mode, h], 300_000)
        wait_idle(page, 300_000)
        if i > warm:
            heads.append(t)
            hbds.append(dict(LAST, cpu=cpu_delta(c0, cpu_seconds(server_pid))))
    return {"first": t_first, "first_breakdown": first, "colour": times, "colour_breakdown": collect(bds),
            "colour_cpu": [b["cpu"] for b in bds], "head_cpu": [b["cpu"] for b in hbds],
            "colour_longest_task": max((d for _, d in colour_tasks), default=0.0) / 1000,
            "head": heads, "head_breakdown": collect(hbds),
            "head_longest_task": max((b["longest_task"] for b in hbds if b.get("longest_task") is not None),
                                     default=None)}


def corpus_rows(model, reps: int, warm: int, page, server, results: list, details: dict, attempt) -> None:
    """The corpus scenario's rows: 20,000 points drawn after a colour change (target 2 s) and
    after a return to a cached head, the longest main-thread task, and the first draw."""
    sents = minilm_sentences(model, CORPUS_SENTENCES, CORPUS_SENTENCE_LEN, seed=15)
    n_tok = sum(len(model.tokenizer.encode(s)) for s in sents)
    n_pts = 2 * n_tok
    names = [(f"corpus: {n_pts:,}-point joint scatter (minilm, one head's queries + keys) drawn after a "
              "'Colour by' change (projection cached: figure built, sent, drawn)", 2.0),
             (f"corpus: {n_pts:,} points drawn after returning to a head whose projection is cached", 2.0),
             (f"corpus: longest main-thread task while the {n_pts:,}-point scatter is redrawn", None),
             (f"corpus: paste {len(sents)} sentences ({n_tok:,} tokens) + Ctrl+Enter -> scatter drawn (corpus job, "
              "PCA and the draw)", None)]
    r = attempt("corpus", names, lambda: scenario_corpus(page, server.url, sents, n_tok, reps, warm, server.proc.pid))
    if not r:
        return
    details["corpus"] = r
    results.append(Result("corpus", names[0][0], median(r["colour"]), "s", 2.0,
                          note=_note(r["colour"]) + _where(r["colour_breakdown"]) + _cpu(r["colour_cpu"])))
    results.append(Result("corpus", names[1][0], median(r["head"]), "s", 2.0,
                          note=_note(r["head"]) + _where(r["head_breakdown"]) + _cpu(r["head_cpu"])))
    results.append(Result("corpus", names[2][0], max(r["colour_longest_task"], r["head_longest_task"] or 0), "s", None,
                          note=f"Chromium's 'longtask' entries: worst over the colour changes "
                               f"{r['colour_longest_task']:.2f} s, over the head returns {r['head_longest_task'] or 0:.2f} s "
                               "(the page cannot react to input during one)"))
    results.append(Result("corpus", names[3][0], r["first"], "s", None,
                          note="one run, after the bundled corpus was drawn" + _where(r["first_breakdown"])))


def _cpu(cpus: list) -> str:
    """Medians of the CPU seconds per repetition (cpu_seconds), which load does not stretch."""
    if not cpus:
        return ""
    m = {k: median([c[k] for c in cpus]) for k in cpus[0]}
    return (f"; CPU per repetition (median): server {m['server']:.2f} s, browser renderer {m['renderer']:.2f} s, "
            f"GPU process (software WebGL) {m['gpu']:.2f} s")


def _note(t: list) -> str:
    return f"median of {len(t)}; all: {', '.join(f'{x:.2f}' for x in t)}"


def _where(b: dict) -> str:
    """Where the time went, from a breakdown (medians)."""
    if not b or b.get("script_end") is None:
        return ""
    parts = [f"server script ran {b['script_start'] or 0:.2f}-{b['script_end']:.2f} s after the action"]
    if b.get("longest_task"):
        parts.append(f"longest browser task {b['longest_task']:.2f} s")
    return "; " + ", ".join(parts)


def _slider_note(times: list, breakdowns: list) -> str:
    """The note of a slider_steps row: the times, the Streamlit runs the clicks started, the longest task."""
    return (_note(times) + f"; Streamlit script runs started by the {len(times)} clicks: "
            f"{sum(b['script_runs'] for b in breakdowns)}; longest main-thread task "
            f"{collect(breakdowns)['longest_task']:.3f} s (median)")


SCENARIOS = ("sentence", "model_view", "head", "decoder", "decoder_browser", "floor", "decoder_long", "toy", "long", "corpus")


def run(reps: int = 10, long_reps: int = 5, keep_freed: bool = True, quick: bool = False, app_root=None,
        only=None) -> dict:
    """Every scenario, or those named in `only` (SCENARIOS), on one warm server and browser."""
    import core

    def want(name: str) -> bool:
        return not only or name in only

    warm = 1
    results, details = [], {"reps": reps, "long_reps": long_reps, "keep_freed_memory": keep_freed}
    if not Path(CHROMIUM).exists():
        results.append(Result("browser", "all browser figures", None, "s", note=f"Chromium not found at {CHROMIUM}"))
        return {"results": [r.to_dict() for r in results], "details": details}
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        results.append(Result("browser", "all browser figures", None, "s", note="playwright is not installed"))
        return {"results": [r.to_dict() for r in results], "details": details}

    minilm = core.load_model("minilm", device="cpu")
    sents = minilm_sentences(minilm, reps + warm + 1)
    ticks = [expected_ticks(minilm.tokenizer.encode(s).tokens) for s in sents]
    server = start_server(keep_freed=keep_freed, root=Path(app_root) if app_root else ROOT)

    def attempt(section, names_targets, fn):
        """Run one scenario; on failure record 'not measured' rows with the reason."""
        try:
            return fn()
        except Exception as exc:  # a page being rewritten must not sink the other figures
            reason = f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}"
            for name, target in names_targets:
                results.append(Result(section, name, None, "s", target, note=f"failed: {reason}"))
            details.setdefault("errors", []).append(f"{names_targets[0][0]}: {reason}")
            try:
                page.screenshot(path=str(Path(server.log).parent / f"failure-{len(details['errors'])}.png"))
            except Exception:
                pass
            return None

    try:
        with sync_playwright() as p:
            browser = launch(p)
            ctx = browser.new_context(viewport={"width": 1400, "height": 1600})
            ctx.add_init_script(INIT_JS)
            page = ctx.new_page()
            page.add_init_script(HELPERS_JS)
            # warm the server: both models loaded, plotly's bundle in the browser cache
            for url in (f"{server.url}/explore", f"{server.url}/explore?model=minilm&text=warm+up"):
                for _ in range(2):
                    try:
                        page.goto(url)
                        wait_idle(page, 300_000)
                        wait_chart(page, "explore-heatmap", 300_000)
                        break
                    except Exception:
                        continue
            details["server_rss_mib_warm"] = server.rss_mib()

            def timed_row(scenario: str, detail: str, name: str, target: float, run_it) -> None:
                """One target row from a scenario that returns (times, breakdowns)."""
                if not want(scenario):
                    return
                r = attempt("browser", [(name, target)], run_it)
                if r:
                    t, b = r
                    details[detail] = {"times": t, "breakdown": collect(b)}
                    results.append(Result("browser", name, median(t), "s", target, note=_note(t) + _where(collect(b))))

            timed_row("sentence", "sentence_minilm", "type a new 20-token sentence + Enter -> heatmap (minilm)", 0.5,
                      lambda: scenario_sentence(page, server.url, "minilm", sents, ticks, warm))
            timed_row("model_view", "model_view", "minilm model view: 72 maps drawn after the tab click (20 tokens)",
                      1.5, lambda: scenario_model_view(page, reps, warm, 72))
            timed_row("head", "head", "change the head -> heatmap (minilm, 20 tokens)", 0.3,
                      lambda: scenario_head(page, reps, warm))

            if want("decoder"):
                name = "decoder step: Next -> decoder-weights (toy-translate)"
                dec = attempt("browser", [(name, 0.3)], lambda: scenario_decoder(
                    page, server.url, "the small happy dog sees the old cat near the quiet river", reps, warm))
                if dec is not None:
                    details["decoder"] = dec
                    if "error" in dec:
                        results.append(Result("browser", name, None, "s", 0.3, note=dec["error"]))
                    else:
                        results.append(Result("browser", name, median(dec["times"]), "s", 0.3,
                                              note=_note(dec["times"]) + _where(dec["breakdown"])))
                        results.append(Result("browser", "decoder step: Next -> all five of the step's charts redrawn "
                                              "(mask, masked scores, weights, cross-attention, next token)",
                                              median(dec["all_charts"]), "s", None, note=_note(dec["all_charts"])))

            if want("decoder_browser"):
                name = "decoder step in the browser: the all-steps figure's slider -> the next step (toy-translate)"
                r = attempt("browser", [(name, 0.3)], lambda: scenario_decoder_browser(
                    page, server.url, "the small happy dog sees the old cat near the quiet river", reps, warm))
                if r:
                    t, b = r
                    details["decoder_browser"] = {"times": t, "breakdown": collect(b)}
                    results.append(Result("browser", name, median(t), "s", 0.3, note=_slider_note(t, b)))

            if want("floor"):
                names = [("floor: a Streamlit fragment rerun, no chart (bench/floor: Next -> its step line changes)", None),
                         (f"floor: the same fragment with {FLOOR_CHARTS} plain heatmaps, values in the cells, no model "
                          "(Next -> the third chart redrawn)", None)]
                fl = attempt("browser", names, lambda: scenario_floor(browser, reps, warm))
                if fl:
                    details["floor"] = fl
                    results.append(Result("browser", names[0][0], median(fl["none"]), "s", None, note=_note(fl["none"])))
                    results.append(Result("browser", names[1][0], median(fl["charts"]), "s", None,
                                          note=_note(fl["charts"]) + f"; all {FLOOR_CHARTS} redrawn after "
                                               f"{median(fl['all_charts']):.3f} s (median)"))

            if want("decoder_long") and core.MODELS["smollm2"].available():
                name = "decoder step: Next -> next-token chart (smollm2, 1,024-token prompt, 64 new tokens)"

                def long_decoder():
                    from bench.common import PASSAGE

                    smol = core.load_model("smollm2", device="cpu")
                    text = PASSAGE * 40
                    text = text[: smol.tokenizer.encode(text).offsets[1023][1]]
                    return scenario_decoder_long(page, server.url, text, reps, warm)

                dl = attempt("browser", [(name, 0.3), ("decoder step in the browser (smollm2, 1,024-token prompt)", 0.3)],
                             long_decoder)
                if dl is not None:
                    details["decoder_long"] = dl
                    results.append(Result("browser", name, median(dl["times"]), "s", 0.3,
                                          note=_note(dl["times"]) + f"; its weights map (in blocks) redrawn after "
                                               f"{median(dl['weights']):.3f} s (median)"))
                    results.append(Result("browser", "decoder step in the browser: the all-steps figure's slider -> "
                                          "the next step (smollm2, 1,024-token prompt, each step's last 48 rows)",
                                          median(dl["browser"]), "s", 0.3, note=_slider_note(dl["browser"], dl["browser_breakdown"])))

            if want("toy") and not quick:
                name = "type a new 20-word sentence + Enter -> heatmap (toy-translate, greedy translation included)"

                def toy_run():
                    toys = toy_sentences(reps + warm + 1)
                    toy = core.load_model("toy-translate", device="cpu")
                    tticks = [expected_ticks(toy.tokenizer.encode(s).tokens) for s in toys]
                    return scenario_sentence(page, server.url, "toy-translate", toys, tticks, warm)

                r = attempt("browser", [(name, 0.5)], toy_run)
                if r:
                    t, b = r
                    details["sentence_toy"] = {"times": t, "breakdown": collect(b)}
                    results.append(Result("browser", name, median(t), "s", 0.5, note=_note(t) + _where(collect(b))))

            if want("long"):
                base = text_of(minilm, 512).split()
                longs = []
                for i in range(long_reps + warm):
                    w = list(base)
                    w[i + 1], w[i + 5] = w[i + 5], w[i + 1]
                    longs.append(" ".join(w))
                names = [("512 tokens + Enter -> one head's map drawn (minilm)", 3.0),
                         ("512 tokens: model view tab -> 72-map grid drawn", 3.0),
                         ("512 tokens: change the head -> heatmap", None),
                         ("512 tokens: longest main-thread task while the views update (responsive: <= 0.5 s)", 0.5)]
                lg = attempt("long input", names, lambda: scenario_long(page, server.url, longs, warm))
                if lg:
                    bd = lg["breakdown"]
                    results.append(Result("long input", names[0][0], median(lg["map"]), "s", 3.0,
                                          note=_note(lg["map"]) + _where(bd["map"])))
                    results.append(Result("long input", names[1][0], median(lg["grid"]), "s", 3.0,
                                          note=_note(lg["grid"]) + _where(bd["grid"])))
                    results.append(Result("long input", names[2][0], median(lg["head"]), "s", None,
                                          note=_note(lg["head"]) + _where(bd["head"])))
                    results.append(Result("long input", names[3][0], max(lg["longest_task"]), "s", 0.5,
                                          note="worst over the repetitions of Chromium's 'longtask' entries from the Enter "
                                               "to the head change (the page cannot react to input during one)"))
                    details["long"] = lg

            if want("corpus"):
                corpus_rows(minilm, reps, warm, page, server, results, details, attempt)
            details["server_rss_mib_end"] = server.rss_mib()
            details["exceptions_on_page"] = page.locator('[data-testid="stException"]').count()
            browser.close()
    finally:
        server.stop()
    return {"results": [r.to_dict() for r in results], "details": details}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--long-reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-keep-freed-memory", action="store_true")
    ap.add_argument("--app-root", default=None, help="serve the app.py of another checkout (e.g. with a change wired in)")
    ap.add_argument("--only", action="append", choices=SCENARIOS, metavar="SCENARIO",
                    help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    reps, long_reps = (3, 1) if args.quick else (args.reps, args.long_reps)
    res = run(reps, long_reps, keep_freed=not args.no_keep_freed_memory, quick=args.quick, app_root=args.app_root,
              only=args.only)
    if args.json:
        print(json.dumps(res, default=str))
        return
    for r in res["results"]:
        v = "-" if r["value"] is None else f"{r['value']:.3f}"
        print(f"[{r['status']:>12}] {r['name']}: {v} {r['unit']} (target {r['target']})  {r['note']}")


if __name__ == "__main__":
    main()
