"""Shared test helpers: the bundled models, run pages with AppTest, read plotly figures back
as numbers, and a real server and browser for the browser tests.

Model fixtures load once per test module, on the app's default device unless the module
sets DEVICE (e.g. DEVICE = "cpu"); a model whose weight package is not installed skips."""

import base64
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

import core
import core.device

# Texts too long for a URL are kept on disk (viz.ui.text_store): the tests' go to a folder of their own
os.environ.setdefault("ATTENTION_LAB_TEXT_STORE", os.path.join(tempfile.mkdtemp(prefix="attention-lab-texts-")))

# Tests share the machine with a browser and an app server: one intra-op thread keeps
# torch from spinning against them (see core.device.configure_threads).
core.device.configure_threads()

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")


def decode_array(value):
    """A plotly JSON array (list, or base64 dict with bdata/dtype/shape) as numpy."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            if isinstance(shape, str):
                shape = [int(s) for s in shape.split(",")]
            arr = arr.reshape(shape)
        return arr
    return np.array(value, dtype=float)


def figure(chart) -> dict:
    """The plotly figure dict of an AppTest plotly_chart element."""
    return json.loads(chart.proto.spec)


def chart_by_key(at, key: str):
    """The plotly chart whose Streamlit key is `key` (its element id ends with the key)."""
    for el in at.get("plotly_chart"):
        if el.proto.id.endswith(key) or key in el.proto.id:
            return el
    raise AssertionError(f"no plotly_chart with key {key!r}; ids: {[e.proto.id for e in at.get('plotly_chart')]}")


def heatmap_z(chart, trace_index: int = 0) -> np.ndarray:
    return decode_array(figure(chart)["data"][trace_index]["z"]).astype(float)


def grid_tile(fig: dict, layer: int, head: int) -> np.ndarray:
    """One map of a tiled model view (viz.figures.grid.tiled_head_grid), given its real layer number.

    Reads the layout from the heatmap's category names ("layer l · query q", "head h · key k"),
    independently of the figure builder's own arithmetic."""
    heat = fig["data"][0]
    z = decode_array(heat["z"]).astype(float)
    rows = [i for i, y in enumerate(heat["y"]) if str(y).startswith(f"layer {layer} · ")]
    cols = [j for j, x in enumerate(heat["x"]) if str(x).startswith(f"head {head} · ")]
    assert rows and cols, f"no map for layer {layer}, head {head}"
    assert rows == list(range(rows[0], rows[-1] + 1)) and cols == list(range(cols[0], cols[-1] + 1))
    return z[rows[0]: rows[-1] + 1, cols[0]: cols[-1] + 1]


def grid_shape(fig: dict) -> tuple:
    """(layers, heads) drawn in a tiled model view: its click targets, one per map."""
    cd = fig["data"][1]["customdata"]
    cd = decode_array(cd) if isinstance(cd, dict) else np.array(cd)
    return len({int(r[0]) for r in cd}), len({int(r[1]) for r in cd})


def assert_no_exception(at):
    assert not at.exception, [e.message for e in at.exception]


def open_first(at, key: str):
    """Open page `key` (viz/<key>/page.py) on the FIRST run of `at`.

    Why not AppTest.switch_page: before the app has run once it has no registry of the pages
    st.navigation makes, so it names a page by its file's name, and every page's file is
    page.py: it would open one same page for every key, without an error. Running the home
    page first to fill the registry would cost every AppTest a page run more. So the page's
    hash is set as st.Page computes it: calc_hash of its url_path, which is the page's key
    (app.py); the home page, at /, is the app's default. After a first run, use `switch_page`."""
    from streamlit.util import calc_hash

    from viz.ui.registry import page

    if not page(key).default:
        at._page_hash = calc_hash(key)
    return at


def switch_page(at, key: str):
    """Open page `key` on the next run of an AppTest that has run once: AppTest's own
    switch_page, which finds the page st.navigation registered for viz/<key>/page.py."""
    from viz.ui.registry import page

    return at.switch_page(page(key).file)


@pytest.fixture
def app_test():
    from streamlit.testing.v1 import AppTest

    def make(page: str = "", **params):
        at = AppTest.from_file(APP, default_timeout=120)
        if page:
            open_first(at, page)
        for k, v in params.items():
            at.query_params[k] = v
        return at

    return make


# ------------------------------------------------------------------ the bundled models
def _load(request, name: str):
    if not core.MODELS[name].available():
        pytest.skip(f"{name}'s weight package is not installed")
    return core.load_model(name, device=getattr(request.module, "DEVICE", None))


@pytest.fixture(scope="module")
def toy(request):
    return _load(request, "toy-translate")


@pytest.fixture(scope="module")
def minilm(request):
    return _load(request, "minilm")


@pytest.fixture(scope="module")
def smollm2(request):
    return _load(request, "smollm2")


# ------------------------------------------------------------------ the checkout stays as it was
DOCS = ROOT / "docs"
_DOCS_AT_START = {}


def _docs_files() -> dict:
    """Every file under docs/ with its modification time and size."""
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in DOCS.rglob("*") if p.is_file()}


def pytest_sessionstart(session):
    _DOCS_AT_START.update(_docs_files())


def pytest_sessionfinish(session, exitstatus):
    """Tests write their screenshots under test-artifacts/ (browser_utils.SCREENSHOTS): a run that
    wrote into docs/ fails, unless it was asked to (`make screenshots` sets
    ATTENTION_LAB_SCREENSHOTS to docs/screenshots)."""
    target = os.environ.get("ATTENTION_LAB_SCREENSHOTS")
    if target and Path(target).resolve().is_relative_to(DOCS.resolve()):
        return
    now = _docs_files()
    changed = sorted(str(p.relative_to(ROOT)) for p in now if _DOCS_AT_START.get(p) != now[p])
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = (f"the tests wrote {len(changed)} file(s) under docs/ ({', '.join(changed[:5])}"
               f"{', ...' if len(changed) > 5 else ''}): screenshots belong in test-artifacts/; "
               "`make screenshots` refreshes the README's")
        if reporter:
            reporter.write_line("ERROR: " + msg, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ------------------------------------------------------------------ browser tests
_SOURCES: dict = {}


def _source(item) -> str:
    path = str(item.fspath)
    if path not in _SOURCES:
        _SOURCES[path] = Path(path).read_text(encoding="utf-8")
    return _SOURCES[path]


def pytest_collection_modifyitems(config, items):
    """The tiers `make test-fast` leaves out are marked here from what a test uses, not by hand:
    `app` for a test that runs a page through AppTest, `slow` for one that loads smollm2, and
    `browser` for every test in tests/browser/.

    No test is run again on failure: a browser test waits on the app's own script state
    (browser_utils.wait_idle, wait_rerun), so a failure is a bug, in the app or in the test."""
    for item in items:
        if "app_test" in item.fixturenames or "AppTest" in _source(item):
            item.add_marker(pytest.mark.app)
        if any("smol" in f for f in item.fixturenames):
            item.add_marker(pytest.mark.slow)
        if Path(str(item.fspath)).parent.name == "browser" and not item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.browser)  # tests/browser/ is the browser tier, marked or not


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real app server on a free 127.0.0.1 port, one per test module, stopped by its pid."""
    from browser_utils import require_browser, start_server

    require_browser()
    srv = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(server):
    """Debian's Chromium through Playwright, one per test module."""
    from playwright.sync_api import sync_playwright

    from browser_utils import launch

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


def _outside(url: str) -> bool:
    """A request that would leave the machine: http(s) or ws(s) to a host other than this one."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname not in ("127.0.0.1", "localhost")


@pytest.fixture
def page(browser, request):
    """A fresh browser context and page, VIEWPORT = (width, height) of the module, else 1400 x 2400.
    Every request the page makes is watched: one to another host (the app promises that nothing
    leaves the machine) fails the test at teardown; `page.outside` lists them."""
    from browser_utils import watched_context

    width, height = getattr(request.module, "VIEWPORT", (1400, 2400))
    ctx = watched_context(browser, viewport={"width": width, "height": height})
    pg = ctx.new_page()
    pg.outside = []
    ctx.on("request", lambda r: pg.outside.append(r.url) if _outside(r.url) else None)
    yield pg
    ctx.close()
    assert not pg.outside, f"the page asked another host: {pg.outside[:5]}"
