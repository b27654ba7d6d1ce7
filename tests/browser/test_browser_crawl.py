"""Every control of every page, clicked in a real browser (Chromium) against one real server.

For each page of the registry (viz/ui/registry.py: a page added there joins the crawl) and each
model of MODELS the page accepts (the three bundled ones and a tiny random Llama checkpoint in a
folder named by ATTENTION_LAB_MODELS), on a short sentence. smollm2 comes last: a control or a
download is clicked on the first model that shows it, so the 135M-parameter decoder, the costliest
to run here, is clicked only where it shows something the others do not.
- every download button is clicked (those inside popovers too, and those a click offers) and
  what comes back is parsed by its type: CSV with pandas, NPZ with numpy, SVG as XML, PNG by its
  header, Parquet with pyarrow; no file may be empty. Each button (its key, else its label) once
  per page, on the first model that shows it. An SVG is drawn by the one export function
  (viz.figures.export) from the chart's own figure;
- every button, tab, radio option and segmented-control option is clicked once per page (on the
  first model that shows it), each popover and expander opened (EXCLUDED below lists what is
  not clicked, and why);
- every in-app link (a page link, a markdown link to a page) is checked to name a page of the
  registry, and one link of each form (the page it names and the URL fields it carries) is
  followed per page: it must land on that page, showing its heading, with the values carried;
- nothing may raise: no exception element and no "Traceback" in the page after any action, and
  no traceback or error in the server's log (read from its file, page by page).

A page "accepts" a model when, opened with ?model=<name>, its model picker shows that model (a
page that does not take it says so and picks its own). The crawl's size (pages x models, clicks,
downloads by type, links) is printed at the end and written to test-artifacts/crawl.json.

Waits are on the app's own state (bench/app_server.py's IDLE_JS: the run finished, nothing stale,
no skeleton), never fixed sleeps.
"""

from __future__ import annotations

import io
import json
import re
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import core
from browser_utils import ROOT, require_browser, start_server, wait_idle
from viz.ui.registry import PAGES, BY_KEY, HOME

pytestmark = pytest.mark.browser

TEXT = "the small dog sees the cat"
LOCAL = "tiny-llama"  # a decoder from a local checkpoint (tests/hf_builders.py)
MODELS = ("toy-translate", LOCAL, "minilm", "smollm2")
TIMEOUT = 240_000  # ms: one page run on a loaded machine (smollm2's attribution, cold)
DOWNLOAD_TIMEOUT = TIMEOUT  # a file built when clicked: an SVG is drawn by a headless Chromium the server starts
VIEWPORT = (1400, 2400)

# Controls not clicked, each with why: (page key, model or None for any, label as shown).
EXCLUDED = {
    # Integrated gradients again at 128 steps on smollm2 (135M parameters): a minute of CPU for a
    # button that reruns the same code path as the page's first run, with a larger step count
    # (clicked on the other models).
    ("attribution", "smollm2", "Raise the steps to 128"),
}

CRAWL: dict = {"pages": {}, "views": {}, "downloads": Counter(), "clicks": Counter(), "links": 0, "links checked": 0,
               "excluded": [], "failed": [], "errors": 0}

LOG_ERROR = re.compile(r"Traceback|\w+Error\b|\bERROR\b|Exception\b")
# The app's own warnings (its log format: time, logger, level, message) name what they recovered
# from, an exception's class included (viz.figures.export draws a figure again when kaleido's
# browser gave none): a warning is not an error. Anything else that names an error is.
OWN_WARNING = re.compile(r"^\S+ \S+ attention_lab(\.\w+)* WARNING ")


# ------------------------------------------------------------------ the server, one for the module
@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_builders import build

    root = tmp_path_factory.mktemp("crawl-models")
    hf, folder = build("llama", root / LOCAL)
    hf.save_pretrained(str(folder))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, models_dir):
    require_browser()
    srv = start_server(tmp_path_factory.mktemp("server"), env_extra={"ATTENTION_LAB_MODELS": str(models_dir)})
    yield srv
    srv.stop()


@pytest.fixture(scope="module", autouse=True)
def report(request):
    t0 = time.monotonic()
    yield
    CRAWL["seconds"] = round(time.monotonic() - t0, 1)
    out = ROOT / "test-artifacts" / "crawl.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(CRAWL, indent=1, default=dict))
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        pm = sum(len(v) for v in CRAWL["pages"].values())
        tr.write_line(f"crawl: {len(CRAWL['pages'])} pages, {pm} page x model views, clicks {dict(CRAWL['clicks'])}, "
                      f"downloads {dict(CRAWL['downloads'])}, links followed {CRAWL['links']} (checked "
                      f"{CRAWL['links checked']}), excluded {len(CRAWL['excluded'])}, errors {CRAWL['errors']}, "
                      f"{CRAWL['seconds']} s")


# ------------------------------------------------------------------ reading the page
MAIN = '[data-testid="stMain"]'
KINDS = {  # what is clicked: (kind, the selector of one control)
    "button": f'{MAIN} [data-testid="stButton"]',
    "tab": f'{MAIN} [data-testid="stTab"]',
    "radio": f'{MAIN} [data-testid="stRadioOption"]',
    "segment": f'{MAIN} [data-testid="stButtonGroup"] button',
    "expander": f'{MAIN} [data-testid="stExpander"] summary',
    "popover": f'{MAIN} [data-testid="stPopover"]',
}
DOWNLOAD = '[data-testid="stDownloadButton"]'
POPOVER_BODY = '[data-testid="stPopoverBody"]'


def _settle(page) -> None:
    wait_idle(page, timeout=TIMEOUT)
    # Play (the decoder stepper) advances one step per rerun until the end: wait for it to stop
    page.wait_for_function("() => !Array.from(document.querySelectorAll('[data-testid=\"stButton\"] button'))"
                           ".some(b => b.innerText.trim().endsWith('Pause'))", timeout=TIMEOUT)
    wait_idle(page, timeout=TIMEOUT)


def _raised(page) -> str:
    """What the page shows of an exception, '' when none."""
    if page.locator('[data-testid="stException"]').count():
        return page.locator('[data-testid="stException"]').first.inner_text()[:1500]
    body = page.locator(MAIN).inner_text()
    return body[body.index("Traceback"):][:1500] if "Traceback" in body else ""


def _said(page) -> str:
    """What the page says in its alerts (info, warning, error), for a failure's message."""
    return " | ".join(page.eval_on_selector_all(f"{MAIN} [data-testid='stAlert']", "els => els.map(e => e.innerText)"))[:1500]


def _label(loc) -> str:
    return re.sub(r"\s+", " ", re.sub(ICONS, "", loc.inner_text())).strip()


# One round trip reads every control's label (its text, whitespace folded: the same whether it is
# shown or inside a closed expander).
# An expander's summary carries its Material icon's name in its text (keyboard_arrow_right when closed,
# keyboard_arrow_down when open): left out, so one expander has one label whether or not a click opened it.
ICONS = r"keyboard_arrow_(?:right|down|up|left)|expand_(?:more|less)"
LABELS_JS = """([sel, icons]) => Array.from(document.querySelectorAll(sel)).map(e => e.textContent
  .replace(new RegExp(icons, 'g'), '').replace(/\\s+/g, ' ').trim())"""  # ICONS, passed in


def _labels(page, sel: str) -> list:
    return page.evaluate(LABELS_JS, [sel, ICONS])


def _controls(page) -> list:
    """(kind, label, occurrence) of every control of the page as it is now."""
    out = []
    for kind, sel in KINDS.items():
        seen = Counter()
        for label in _labels(page, sel):
            out.append((kind, label, seen[label]))
            seen[label] += 1
    return out


def _find(page, kind: str, label: str, occurrence: int):
    """The control (kind, label, occurrence) on the page now, or None."""
    hits = [i for i, t in enumerate(_labels(page, KINDS[kind])) if t == label]
    return page.locator(KINDS[kind]).nth(hits[occurrence]) if len(hits) > occurrence else None


def _clickable(loc):
    """The visible button of a Streamlit widget (a button with a tooltip is drawn twice, once hidden)."""
    inner = loc.locator("button")
    if inner.count():
        for i in range(inner.count()):
            if inner.nth(i).is_visible():
                return inner.nth(i)
    return loc


# ------------------------------------------------------------------ parsing what comes back
def _parse(name: str, data: bytes) -> str:
    """The file's type, once it parses as that type; an AssertionError says why not."""
    assert data, f"{name}: the file is empty"
    ext = name.rsplit(".", 1)[-1].lower()
    if ext == "csv":
        df = pd.read_csv(io.BytesIO(data))
        assert len(df.columns) and len(df), f"{name}: no rows"
    elif ext == "npz":
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            assert z.files, f"{name}: no arrays"
            for k in z.files:
                z[k]
    elif ext == "svg":
        root = ET.fromstring(data)
        assert root.tag.endswith("svg"), f"{name}: the root is {root.tag}"
        assert len(list(root.iter())) > 3, f"{name}: an empty drawing"
    elif ext == "png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{name}: no PNG header"
    elif ext == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(data))
        assert table.num_rows > 0, f"{name}: no rows"
    else:
        raise AssertionError(f"{name}: a download of a type the crawl cannot parse ({ext})")
    return ext


def _download(page, button, what: str) -> None:
    """Click, and parse the file that comes; a failure is listed in CRAWL["failed"] (the page's test
    fails at its end, naming every download that failed, not only the first)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        with page.expect_download(timeout=DOWNLOAD_TIMEOUT) as info:
            _clickable(button).click()
        dl = info.value
        assert dl.failure() is None, f"the download failed: {dl.failure()}"
        data = Path(dl.path()).read_bytes()
        CRAWL["downloads"][_parse(dl.suggested_filename, data)] += 1
    except PlaywrightTimeout:
        CRAWL["failed"].append(f"{what}: no file came within {DOWNLOAD_TIMEOUT // 1000} s")
    except Exception as exc:  # noqa: BLE001 - a file that does not parse, listed with why
        CRAWL["failed"].append(f"{what}: {type(exc).__name__}: {exc}")


# Each download button on the page: its key (st-key-* class, '' without), label, whether it is
# visible (one in a closed popover or expander is not: it is clicked there) and disabled.
DOWNLOADS_JS = """sel => Array.from(document.querySelectorAll(sel)).map(e => {
    const k = e.closest('[class*="st-key-"]');
    const b = Array.from(e.querySelectorAll('button')).find(x => x.offsetParent !== null);
    return [k ? Array.from(k.classList).find(c => c.startsWith('st-key-')) : '',
            e.innerText.replace(/\\s+/g, ' ').trim(), !!b, !!b && b.disabled];
})"""


def _downloads(page, where: str, done: set, popovers: bool = True) -> None:
    """Click every download button on the page (and, with `popovers`, in every popover) that `done`
    does not hold (its key, else its label: once per page). A disabled one is not offered (over
    the download budget; its help says why)."""
    def todo(key: str, label: str) -> bool:
        ident = key or label
        if ident in done:
            return False
        done.add(ident)
        return True

    sel = f"{MAIN} {DOWNLOAD}"
    for i, (key, label, visible, disabled) in enumerate(page.evaluate(DOWNLOADS_JS, sel)):
        if visible and not disabled and todo(key, label):
            _download(page, page.locator(sel).nth(i), f"{where}: download {label!r}")
    pops = page.locator(KINDS["popover"])
    for i, pop_label in enumerate(_labels(page, KINDS["popover"]) if popovers else []):
        if not pops.nth(i).is_visible():
            continue
        _clickable(pops.nth(i)).click()
        body = page.locator(POPOVER_BODY).last
        body.wait_for(state="visible", timeout=TIMEOUT)
        inner_sel = f"{POPOVER_BODY} {DOWNLOAD}"
        for j, (key, label, visible, disabled) in enumerate(page.evaluate(DOWNLOADS_JS, inner_sel)):
            if not disabled and todo(key, label):
                _download(page, page.locator(inner_sel).nth(j), f"{where}: download {label!r} in popover {pop_label!r}")
        page.keyboard.press("Escape")
    assert not _raised(page), f"{where}: after the downloads: {_raised(page)}"


# ------------------------------------------------------------------ links
def _links(page, where: str) -> list:
    """Every in-app link on the page (not '#' anchors): each must name a page of the registry."""
    hrefs = page.eval_on_selector_all(f"{MAIN} a[href]", "els => els.map(a => a.href)")
    out = []
    for h in dict.fromkeys(hrefs):
        u = urllib.parse.urlsplit(h)
        if u.hostname not in ("127.0.0.1", "localhost"):
            continue
        if u.fragment and u.path.strip("/") == urllib.parse.urlsplit(page.url).path.strip("/"):
            continue  # a heading's anchor on this page
        assert (u.path.strip("/") or HOME) in BY_KEY, f"{where}: a link to {u.path}, which is no page of the registry"
        out.append(h)
    return out


def _form(href: str) -> tuple:
    """A link's form: the page it names and the URL fields it carries (not their values)."""
    u = urllib.parse.urlsplit(href)
    return (u.path.strip("/") or HOME, tuple(sorted(k for k, _ in urllib.parse.parse_qsl(u.query))))


def _follow(page, href: str, where: str) -> None:
    want = urllib.parse.urlsplit(href)
    key = want.path.strip("/") or HOME
    carried = dict(urllib.parse.parse_qsl(want.query))
    page.goto(href)
    _settle(page)
    assert not _raised(page), f"{where}: following {href}: {_raised(page)}"
    got = urllib.parse.urlsplit(page.url)
    assert (got.path.strip("/") or HOME) == key, f"{where}: {href} landed on {page.url}"
    heading = page.locator(f"{MAIN} h1").first.inner_text()
    assert BY_KEY[key].heading in heading, f"{where}: {href} shows {heading!r}, not {BY_KEY[key].heading!r}"
    landed = dict(urllib.parse.parse_qsl(got.query))
    for k, v in carried.items():  # a value the page keeps is the one carried; model and text are always kept
        if k in landed or k in ("model", "text"):
            assert landed.get(k) == v, f"{where}: {href} carries {k}={v!r}, the page shows {k}={landed.get(k)!r}"
    CRAWL["links"] += 1


# ------------------------------------------------------------------ one page x model
def _url(server, spec, model) -> str:
    params = dict(spec.params)
    if model is not None:
        params.update(model=model, text=TEXT)
    return f"{server.url}/{'' if spec.default else spec.key}?{urllib.parse.urlencode(params)}"


def _accepts(page, spec, model) -> bool:
    picker = page.locator(f"{MAIN} .st-key-{spec.key}-model input")
    return picker.count() > 0 and picker.first.input_value().split(" ")[0] == model


def _log_errors(server, start: int) -> list:
    text = Path(server.log).read_text(errors="replace")[start:]
    return [line for line in text.splitlines() if LOG_ERROR.search(line) and not OWN_WARNING.match(line)]


def _click(page, target, where: str, what: str, done: set) -> None:
    target.scroll_into_view_if_needed()
    target.click()
    _settle(page)
    assert not _raised(page), f"{where}: after clicking {what}: {_raised(page)}"
    _downloads(page, where, done, popovers=False)  # a click can offer a file of its own (the KV cache page's sweep)


def _crawl(page, url: str, spec, model, seen: dict) -> None:
    """Crawl the page as loaded from `url`. seen["controls"]: (kind, label) clicked on an earlier
    model of this page (each control is clicked once per page); seen["files"]: the downloads done;
    seen["forms"]: the link forms followed (one link of each form is followed, every link checked)."""
    where = f"/{spec.key} on {model}"
    assert not _raised(page), f"{where}: {_raised(page)}"
    _downloads(page, where, seen["files"])
    links = _links(page, where)
    for kind, label, occurrence in _controls(page):
        if (spec.key, model, label) in EXCLUDED or (spec.key, None, label) in EXCLUDED:
            CRAWL["excluded"].append(f"{where}: {kind} {label!r}")
            continue
        if (kind, label, occurrence) in seen["controls"]:
            continue
        loc = _find(page, kind, label, occurrence)
        if loc is None:  # an earlier click changed the page (a new sentence, another mode): start again
            page.goto(url)
            _settle(page)
            loc = _find(page, kind, label, occurrence)
        assert loc is not None, (f"{where}: the {kind} {label!r} of the first view cannot be found again; the page "
                                 f"shows the {kind}s {_labels(page, KINDS[kind])} and says: {_said(page)}")
        seen["controls"].add((kind, label, occurrence))
        if not loc.is_visible():  # inside a closed expander ("Make corrupted" on Patching): open it first
            loc.evaluate("e => { const d = e.closest('details'); if (d && !d.open) d.querySelector('summary').click(); }")
            _settle(page)
            loc = _find(page, kind, label, occurrence)
            assert loc is not None and loc.is_visible(), f"{where}: the {kind} {label!r} is never shown"
        target = loc if kind in ("tab", "radio", "segment", "expander") else _clickable(loc)
        if target.is_disabled():
            CRAWL["clicks"][f"{kind} (disabled)"] += 1
            continue
        _click(page, target, where, f"the {kind} {label!r}", seen["files"])
        CRAWL["clicks"][kind] += 1
        if kind == "popover":  # what a popover holds: its buttons (example sentences) are clicked too
            inner = page.locator(f"{POPOVER_BODY} [data-testid='stButton']")
            labels = [_label(inner.nth(i)) for i in range(inner.count())]
            page.keyboard.press("Escape")
            for inner_label in labels:
                if ("button", inner_label, 0) in seen["controls"]:
                    continue
                seen["controls"].add(("button", inner_label, 0))
                page.goto(url)  # the first view again: the last example changed the sentence
                _settle(page)
                pop = _find(page, kind, label, occurrence)
                assert pop is not None, f"{where}: the popover {label!r} of the first view cannot be found again"
                _clickable(pop).click()
                page.locator(POPOVER_BODY).last.wait_for(state="visible", timeout=TIMEOUT)
                inner = page.locator(f"{POPOVER_BODY} [data-testid='stButton']")
                b = inner.nth([_label(inner.nth(k)) for k in range(inner.count())].index(inner_label))
                _click(page, _clickable(b), where, f"{inner_label!r} in {label!r}", seen["files"])
                CRAWL["clicks"]["button"] += 1
    for href in links:
        CRAWL["links checked"] += 1
        if _form(href) not in seen["forms"]:
            seen["forms"].add(_form(href))
            _follow(page, href, where)


@pytest.mark.parametrize("spec", PAGES, ids=[p.key for p in PAGES])
def test_every_control_of_the_page(server, page, spec):
    start = len(Path(server.log).read_text(errors="replace"))
    models = [m for m in MODELS if m == LOCAL or core.MODELS[m].available()] if spec.reads_url else [None]
    seen = {"controls": set(), "files": set(), "forms": set()}
    crawled = []
    for model in models:
        t0 = time.monotonic()
        url = _url(server, spec, model)
        page.goto(url)
        _settle(page)
        if model is not None and not _accepts(page, spec, model):
            continue  # the page does not take this model (it said so and picked its own)
        _crawl(page, url, spec, model, seen)
        crawled.append(model)
        CRAWL["views"][f"/{spec.key} on {model}"] = round(time.monotonic() - t0, 1)
    CRAWL["pages"][spec.key] = crawled
    assert crawled, f"/{spec.key} accepts none of {MODELS}"
    errors = _log_errors(server, start)
    failed = [f for f in CRAWL["failed"] if f.startswith(f"/{spec.key} ")]
    CRAWL["errors"] += len(errors) + len(failed)
    assert not failed, f"/{spec.key}: {len(failed)} download(s) failed:\n" + "\n".join(failed)
    assert not errors, f"/{spec.key}: the server logged errors:\n" + "\n".join(errors[:20])
