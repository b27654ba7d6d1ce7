"""Shared helpers of the browser benchmark (bench.browser_bench): the server, the page's clock
and predicates, timing an action until a chart holds its new figure, test sentences, notes."""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

from bench.app_server import AppServer, start_app, wait_idle_once
from bench.common import ROOT, median

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
    return lambda: box.press("Control+Enter")  # the text area applies on Ctrl+Enter (Enter is a new line)


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
    from viz.figures.heatmaps import safe_labels

    return safe_labels(tokens)


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
