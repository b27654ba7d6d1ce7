"""Browser benchmark scenarios on /decoder: Next (toy-translate and smollm2's long prompt) and
the all-steps figure's slider stepped in the browser."""

from __future__ import annotations

import urllib.parse

from bench.browser.page import (LAST, WATCH_ALL_JS, all_seen, arm, collect, timed, wait_chart, wait_idle)

DECODER_CHARTS = ["decoder-mask", "decoder-masked", "decoder-weights", "decoder-cross", "decoder-next"]


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


def scenario_decoder_long(page, base_url: str, text: str, n_reps: int, warm: int) -> dict:
    """smollm2 with a 1,024-token prompt and up to 64 new tokens: Next until the step's
    next-token chart (and its maps) show the new step. Every step is a view of one traced
    pass, so a step reads one recomputed layer (cached after the first)."""
    page.goto(f"{base_url}/decoder?model=smollm2&layer=3&head=1&text=" + urllib.parse.quote(text))
    wait_idle(page, 900_000)
    wait_chart(page, "decoder-next", 900_000)
    times, weights_times, breakdowns = [], [], []
    for i in range(n_reps + warm):
        btn = page.get_by_role("button", name="Next", exact=True)
        page.evaluate(WATCH_ALL_JS, ["decoder-weights", "decoder-next"])
        t = timed(page, btn.click, "decoder-next", "true", None, 300_000)
        bd = dict(LAST)
        page.wait_for_function("n => Object.keys(window.__seen).length >= n", arg=2, timeout=300_000)
        t_w = page.evaluate("() => (window.__seen['decoder-weights'] - window.__bench.t0) / 1000")
        if i >= warm:
            times.append(t)
            weights_times.append(t_w)
            breakdowns.append(bd)
        wait_idle(page)
    browser_times, bds = slider_steps(page, n_reps, warm)  # the same run, stepped in the browser
    return {"times": times, "weights": weights_times, "breakdown": collect(breakdowns), "browser": browser_times,
            "browser_breakdown": bds}
