"""A real app server and a real browser (Debian's Chromium through Playwright) for tests.

The server (`streamlit run app.py` on a free 127.0.0.1 port, stopped by its own process id)
and Chromium's launch flags are bench/app_server.py's, shared with the browser benchmark.

A missing Playwright or Chromium is a failure that says what to install, never a silent skip:
`make test` (scripts/setup.sh --test) installs both. Where no browser can be had, set
ATTENTION_LAB_SKIP_BROWSER=1 to skip the browser tests on purpose (off by default).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.app_server import (CHROMIUM, CHROMIUM_ARGS, FRAMES_JS, AppServer, free_port, launch,  # noqa: F401
                               start_app, wait_idle_once, watched_context)

ROOT = Path(__file__).resolve().parent.parent
# Screenshots go to test-artifacts/screenshots/ (ignored by git), so a test run leaves the
# checkout as it was; `make screenshots` points ATTENTION_LAB_SCREENSHOTS at docs/screenshots/
# to refresh the README's pictures.
README_SCREENSHOTS = ROOT / "docs" / "screenshots"
SCREENSHOTS = Path(os.environ.get("ATTENTION_LAB_SCREENSHOTS") or ROOT / "test-artifacts" / "screenshots").resolve()
SCREENSHOTS.mkdir(parents=True, exist_ok=True)


SKIP_VAR = "ATTENTION_LAB_SKIP_BROWSER"
INSTALL_HINT = ("`make test` (scripts/setup.sh --test) installs both: Playwright with `.venv/bin/pip install -e '.[test]'`, "
                "Debian's Chromium with `sudo apt-get install chromium` (or set $CHROMIUM to a Chromium binary). "
                f"To skip the browser tests on purpose instead, set {SKIP_VAR}=1")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (Playwright not importable, no Chromium at the
    path they launch: $CHROMIUM, else /usr/bin/chromium), or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"the playwright package cannot be imported ({exc})"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (the path the browser tests launch: $CHROMIUM, else /usr/bin/chromium)"
    return None


def require_browser():
    """Skip only when ATTENTION_LAB_SKIP_BROWSER=1; otherwise fail, saying what to install,
    when the browser tests cannot run here."""
    if os.environ.get(SKIP_VAR, "") not in ("", "0"):
        pytest.skip(f"{SKIP_VAR}={os.environ[SKIP_VAR]}: the browser tests are skipped on request")
    why = browser_missing()
    if why:
        pytest.fail(f"browser tests cannot run: {why}. {INSTALL_HINT}.", pytrace=False)


def start_server(tmp_dir: Path, env_extra: dict | None = None, timeout: float = 120) -> AppServer:
    """`streamlit run app.py` from this checkout (bench/app_server.py), its log in tmp_dir."""
    return start_app(ROOT, tmp_dir, env=env_extra, timeout=timeout)


def wait_idle(page, timeout: float = 60_000):
    """Wait until the page is idle (bench/app_server.py's IDLE_JS: every message the page sent
    has had its run, the run finished, nothing stale, no element still a skeleton), then for
    the browser to draw two frames (React mounts what the finished run sent: a widget takes its
    seeded value a render later), and until it is idle again (a widget that sent its value on
    mounting has had its run)."""
    wait_idle_once(page, timeout)
    page.evaluate(FRAMES_JS)
    wait_idle_once(page, timeout)


def chart_data(page, key: str, timeout: float = 60_000) -> dict:
    """The live plotly figure (data + layout) of the chart with Streamlit key `key`."""
    sel = f'.st-key-{key}[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=timeout)
    return page.eval_on_selector(sel, """e => {
        // plotly keeps typed arrays (from base64 'bdata') under _inputArray: make them plain
        const plain = v => {
            if (v && typeof v === 'object' && v._inputArray) v = v._inputArray;
            if (ArrayBuffer.isView(v) || Array.isArray(v)) return Array.from(v, plain);
            if (v && typeof v === 'object' && Object.keys(v).every(k => /^\\d+$/.test(k))) return Object.values(v).map(plain);
            return v;
        };
        const data = e.data.map(t => Object.fromEntries(Object.entries(t).map(([k, v]) =>
            [k, ['x', 'y', 'z', 'text', 'customdata'].includes(k) ? plain(v) : v])));
        return {data: data, layout: e.layout};
    }""")


def no_exception(page) -> bool:
    return page.locator('[data-testid="stException"]').count() == 0
