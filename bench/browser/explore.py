"""Browser benchmark scenarios on /explore: a new sentence, a head change, the model view tab,
512-token inputs."""

from __future__ import annotations

import urllib.parse

from bench.browser.page import (LAST, TAB_MAP, TAB_MODEL, choose, click_tab, collect, longtasks_since, set_text,
                                timed, wait_chart, wait_idle)


def scenario_sentence(page, base_url: str, model_name: str, texts: list, ticks: list, warm: int) -> list:
    page.goto(f"{base_url}/explore?model={model_name}&text=" + urllib.parse.quote(texts[0]))
    wait_idle(page)
    wait_chart(page, "explore-heatmap")
    times, bds = [], []
    for i, (text, tk) in enumerate(zip(texts[1:], ticks[1:])):
        press = set_text(page, "Sentence (press Ctrl+Enter)", text)
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


# the tiled model view (viz.figures.grid): one heatmap + one click target per map
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
    click_tab(page, TAB_MAP)  # back on the heatmap's tab: the next scenario changes its head
    return times, bds


def scenario_long(page, base_url: str, texts: list, warm: int) -> dict:
    """512-token inputs: heatmap after Enter, grid after the tab click, head change; long tasks."""
    page.goto(f"{base_url}/explore?model=minilm&text=" + urllib.parse.quote("a short warm up sentence"))
    wait_idle(page)
    wait_chart(page, "explore-heatmap")
    maps, grids, heads, longest, bd = [], [], [], [], {"map": [], "grid": [], "head": []}
    for i, text in enumerate(texts):
        click_tab(page, TAB_MAP, 180_000)
        t_start = page.evaluate("() => performance.now()")
        press = set_text(page, "Sentence (press Ctrl+Enter)", text)
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
