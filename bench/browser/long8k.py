"""Browser benchmark scenario "smollm2_8k": smollm2 at its own context on /explore.

A document of 8,000 smollm2 tokens (the notes' passage as ~195 sentences in paragraphs of
five) is typed into Explore + Ctrl+Enter. The server runs the traced pass (minutes on a
CPU; the page shows the time warning and a progress bar), then the page draws one head's
map, an overview of pooled blocks. Then the model view tab (its layer range of pooled maps)
and the Long document tab (its span x span map of sentences). Timed in the page: the trace
(from the progress bar's first layer to its "Done"), each view from the end of the trace or
the tab's click until its chart holds the new figure, and Chromium's longest main-thread
task ('longtask') during each of the three (the page cannot react to input during one).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from bench.browser.page import LAST, TAB_MAP, TAB_MODEL, click_tab, longtasks_since, set_text, timed, wait_chart, wait_idle
from bench.common import PASSAGE

TAB_LONG = "Long document"
N_TOKENS = 8000
TIMEOUT = 1_500_000  # 25 minutes: the trace alone takes minutes on a 2-core CPU

# Notes the trace's progress bar: page-clock times of its first "layer" text and of "Done".
PROGRESS_JS = """() => { const p = window.__bench.progress = {start: null, done: null, gone: null, warning: null};
  const iv = setInterval(() => {
    const bar = document.querySelector('[data-testid="stProgress"]');
    const t = bar ? bar.textContent : '';
    if (p.start === null && /Running the model: layer/.test(t)) p.start = performance.now();
    if (p.done === null && /Done/.test(t)) p.done = performance.now();
    if (p.start !== null && !bar && p.gone === null) p.gone = performance.now();
    if (p.warning === null) { const w = [...document.querySelectorAll('[data-testid="stAlert"]')]
        .map(x => x.textContent).find(x => /traced pass will take/.test(x)); if (w) p.warning = w; }
    if (p.gone !== null) clearInterval(iv);
  }, 50); }"""


def tasks_since_action(page) -> list:
    """Chromium's long tasks since the last timed action: [start, duration] in seconds, the start
    counted from the action (so they can be set against the chart's drawn time and the script's end)."""
    return page.evaluate("() => { const t0 = window.__bench.t0; return window.__bench.longtasks"
                         ".filter(x => x[0] + x[1] >= t0).map(x => [+((x[0] - t0) / 1000).toFixed(2), "
                         "+(x[1] / 1000).toFixed(3)]); }")


def smol_document(model, n: int = N_TOKENS) -> str:
    """Text of exactly n smollm2 tokens: the notes' passage as sentences, five to a paragraph."""
    sent = PASSAGE.strip().capitalize() + "."
    paras = [" ".join([sent] * 5) for _ in range(n // 150 + 2)]
    text = "\n\n".join(paras)
    enc = model.tokenizer.encode(text)
    text = text[: enc.offsets[n - 1][1]]
    got = len(model.tokenizer.encode(text).ids)
    assert abs(got - n) <= 2, (n, got)
    return text


def scenario_smollm2_8k(page, base_url: str, text: str, shots: Path | None = None) -> dict:
    """One run (minutes): trace, map, model view, span view; times and longest tasks in seconds."""
    page.goto(f"{base_url}/explore?model=smollm2&text=" + urllib.parse.quote("A short warm up sentence."))
    wait_idle(page, 300_000)
    wait_chart(page, "explore-heatmap", 300_000)
    click_tab(page, TAB_MAP, 300_000)
    out = {"load_before": list(os.getloadavg())}  # the browser shares the machine's cores: stretched by load
    page.evaluate(PROGRESS_JS)
    press = set_text(page, "Sentence (press Ctrl+Enter)", text)
    t_map = timed(page, press, "explore-heatmap", "/blocks of/.test(window.__title(e))", None, TIMEOUT)
    bd = dict(LAST)
    prog = page.evaluate("() => Object.assign({t0: window.__bench.t0, drawn: null}, window.__bench.progress)")
    # the map's draw time counted from the trace's end ("Done", else the bar's removal)
    end = prog["done"] if prog["done"] is not None else prog["gone"]
    t0 = prog["t0"]
    out["enter_to_map"] = t_map
    out["trace"] = (end - prog["start"]) / 1000 if end is not None and prog["start"] is not None else None
    out["trace_from_enter"] = (end - t0) / 1000 if end is not None and t0 is not None else None
    out["map_after_trace"] = t_map - out["trace_from_enter"] if out["trace_from_enter"] is not None else None
    tasks = longtasks_since(page, end if end is not None else (t0 or 0))
    out["map_longest_task"] = max((d for _, d in tasks), default=0.0) / 1000
    out["map_breakdown"] = bd
    out["map_tasks"] = tasks_since_action(page)
    out["warning"] = prog.get("warning")
    if shots:
        page.screenshot(path=str(shots / "smollm2_8k-map.png"), full_page=True)

    tab = page.get_by_role("tab", name=TAB_MODEL)
    out["model_view"] = timed(page, tab.click, "explore-grid",
                              "e.data.length === 2 && (e.data[1].customdata || []).length > 0", None, TIMEOUT)
    out["model_view_longest_task"] = LAST.get("longest_task")
    out["model_view_breakdown"] = dict(LAST)
    out["model_view_tasks"] = tasks_since_action(page)
    if shots:
        page.screenshot(path=str(shots / "smollm2_8k-model-view.png"), full_page=True)

    tab = page.get_by_role("tab", name=TAB_LONG)
    out["spans"] = timed(page, tab.click, "explore-spans", "/sentences × sentences/.test(window.__title(e))", None,
                         TIMEOUT)
    out["spans_longest_task"] = LAST.get("longest_task")
    out["spans_breakdown"] = dict(LAST)
    out["spans_tasks"] = tasks_since_action(page)
    out["n_spans"] = page.evaluate("() => { const e = window.__plot('explore-spans'); return window.__rows(e.data[0].z); }")
    out["load_after"] = list(os.getloadavg())
    out["exceptions_on_page"] = page.locator('[data-testid="stException"]').count()
    if shots:
        page.screenshot(path=str(shots / "smollm2_8k-spans.png"), full_page=True)
    return out
