"""Browser benchmark scenario "first_load": each page opened afresh, until it is usable.

A page is opened in a fresh session (a navigation, so a new Streamlit session on the warm
server) and timed on the page's own clock from the start of the navigation until the page is
usable: Streamlit's run has ended, no element is stale or still a skeleton (grey placeholder),
and, where the page has charts, the first of them is drawn. Also noted: until every chart it
mounted is drawn, how many plotly charts it mounted, and its longest main-thread task.

Beside each page, the floor: bench/floor/app.py opened the same way with as many plain
heatmaps as the page mounted (`?charts=N`; a bare Streamlit page, no model, none of the app's
code), at the same depth of URL: `/bare` beside a page opened by its own link (`/explore`),
`/` beside the home page. Streamlit's browser code opened at `/name` first asks
`/name/_stcore/health`, is refused and asks `/_stcore/health` after a fixed 100 ms wait, so
every page of a multipage app opened by its link pays it and a floor at `/` would not; each
round also opens the floor at both depths with one chart and the rows say what that wait cost.
The target is a ratio, read in the same run so load on the shared machine cancels: no page
over 2x the floor of a bare page with the same number of charts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.app_server import IDLE_JS, start_app
from bench.browser.floor import FLOOR_APP

FIRST_LOAD_PAGES = ("home", "explore", "inside", "positions", "decoder", "compare", "heads", "corpus", "playground",
                    "notes")
FIRST_LOAD_TARGET = 2.0  # x the floor with the same number of charts

# Usable: the run has ended (after one was seen), nothing stale or a skeleton, the first chart drawn.
USABLE_JS = """() => { const b = window.__bench;
  if (!b || !b.states.some(x => x[1] === 'running')) return false;
  if (!(""" + IDLE_JS + """)()) return false;
  const n = document.querySelectorAll('[data-testid="stPlotlyChart"]').length;
  const drawn = [...document.querySelectorAll('.js-plotly-plot')].filter(e => e._fullLayout).length;
  return (n === 0 || drawn >= 1) && performance.now(); }"""
ALL_DRAWN_JS = """() => { const n = document.querySelectorAll('[data-testid="stPlotlyChart"]').length;
  const drawn = [...document.querySelectorAll('.js-plotly-plot')].filter(e => e._fullLayout).length;
  return drawn >= n && performance.now(); }"""
COUNT_JS = "() => document.querySelectorAll('[data-testid=\"stPlotlyChart\"]').length"


def open_page(page, url: str, timeout: float = 300_000) -> dict:
    """Open `url` afresh; seconds from the navigation's start until usable (USABLE_JS), until
    every mounted chart is drawn, the end of the last script run, the charts and longest task.
    A run that starts again within half a second of the page looking usable (a page that
    reruns itself, the root URL switching to /explore) is waited for too."""
    page.goto("about:blank")
    page.goto(url, wait_until="commit")
    for _ in range(5):
        t_usable = page.wait_for_function(USABLE_JS, polling="raf", timeout=timeout).json_value()
        t_all = page.wait_for_function(ALL_DRAWN_JS, polling="raf", timeout=timeout).json_value()
        page.wait_for_timeout(500)
        again = page.evaluate("t => window.__bench.states.some(x => x[0] > t && x[1] === 'running')", t_usable)
        if not again:
            break
    info = page.evaluate("""t => { const b = window.__bench;
        const ends = b.states.filter(x => x[1] === 'notRunning' && x[0] <= t);
        const lt = b.longtasks.filter(x => x[0] <= t);
        return {script_end: ends.length ? ends[ends.length - 1][0] : null,
                longest: lt.length ? Math.max(...lt.map(x => x[1])) : 0}; }""", max(t_usable, t_all))
    return {"usable": t_usable / 1000, "all_drawn": max(t_usable, t_all) / 1000, "charts": page.evaluate(COUNT_JS),
            "script_end": None if info["script_end"] is None else info["script_end"] / 1000,
            "longest_task": info["longest"] / 1000,
            "exception": page.locator('[data-testid="stException"]').count() > 0}


def scenario_first_load(page, base_url: str, reps: int, warm: int, pages=FIRST_LOAD_PAGES) -> dict:
    """Each page of `pages` opened reps + warm times (the first `warm` untimed: the server's
    caches filled), each time followed by the floor page with as many heatmaps as it mounted
    (its own server, started here). Returns, per page, the page's and the floor's openings."""
    floor = start_app(FLOOR_APP, Path(tempfile.mkdtemp(prefix="attention-lab-floor-")),
                      env={"STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none"})
    out = {name: {"page": [], "floor": []} for name in pages}
    out["_probe"] = {"root": [], "bare": []}
    try:
        for i in range(reps + warm):
            for name in pages:
                got = open_page(page, f"{base_url}/" + ("" if name == "home" else name))
                fl = open_page(page, f"{floor.url}/{'' if name == 'home' else 'bare'}?charts={got['charts']}")
                if i >= warm:
                    out[name]["page"].append(got)
                    out[name]["floor"].append(fl)
            for depth, path in (("root", "/"), ("bare", "/bare")):
                got = open_page(page, f"{floor.url}{path}?charts=1")
                if i >= warm:
                    out["_probe"][depth].append(got["usable"])
    finally:
        floor.stop()
    return out


def first_load_rows(page, server, reps: int, warm: int, results: list, details: dict, attempt, pages=None) -> None:
    """One row per page: its opening (median) over the floor's with as many charts, target 2x."""
    from bench.browser.page import _note
    from bench.common import Result, median

    pages = tuple(pages or FIRST_LOAD_PAGES)
    names = [(f"first load: /{'' if p == 'home' else p} opened -> usable and first chart drawn, over the floor "
              "with as many charts", FIRST_LOAD_TARGET) for p in pages]
    r = attempt("first load", names, lambda: scenario_first_load(page, server.url, reps, warm, pages))
    if not r:
        return
    details["first_load"] = r
    probe = median(r["_probe"]["bare"]) - median(r["_probe"]["root"])
    for (name, target), p in zip(names, pages):
        got, fl = r[p]["page"], r[p]["floor"]
        t, f = median([g["usable"] for g in got]), median([g["usable"] for g in fl])
        n = max(g["charts"] for g in got)
        end = [g["script_end"] for g in got if g["script_end"] is not None]
        note = (f"page {t:.2f} s ({_note([g['usable'] for g in got])}), floor with {n} chart{'s' if n != 1 else ''} "
                f"at {'/' if p == 'home' else '/bare'} {f:.2f} s (the floor with one chart at /bare minus at /: "
                f"{probe:+.2f} s, Streamlit's base-path probe); every chart drawn after {median([g['all_drawn'] for g in got]):.2f} s (floor "
                f"{median([g['all_drawn'] for g in fl]):.2f} s); last script run ended "
                f"{median(end) if end else float('nan'):.2f} s; longest main-thread task "
                f"{median([g['longest_task'] for g in got]):.2f} s"
                + ("; the page showed an exception" if any(g["exception"] for g in got) else ""))
        results.append(Result("first load", name.replace("opened", f"({n} charts) opened"), t / f if f else None, "x",
                              target, note=note))
