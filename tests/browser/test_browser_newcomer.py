"""A newcomer's first ten minutes (issue 19), in a real browser: the lecture notes' examples
open on a model that reads them, a copied URL reproduces the figure, byte-level tokens read
as text, the model view opens around the selected layer, the stepper's controls. One server
for the module; screenshots go to test-artifacts/screenshots/ (`make screenshots`: docs/screenshots/)."""

import re
import urllib.parse

import pytest

from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle, watched_context
from viz.ui.widgets import NOTES_EXAMPLES

pytestmark = pytest.mark.browser

UNK = ("<unk>", "&lt;unk&gt;", "[UNK]")  # tick labels are HTML-escaped


@pytest.fixture
def page(browser):
    ctx = watched_context(browser, viewport={"width": 1400, "height": 2000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _unk(fig) -> int:
    return sum(t in UNK for t in fig["layout"]["xaxis"]["ticktext"])


def _wait_heatmap(page, old_ticks=None):
    """Wait for the explore heatmap drawn for a new input (its key tokens differ from old_ticks)."""
    page.wait_for_function(
        """(old) => { const e = document.querySelector('.st-key-explore-heatmap[data-stale="false"] .js-plotly-plot');
                      return e && JSON.stringify(Array.from(e.layout.xaxis.ticktext)) !== JSON.stringify(old); }""",
        arg=old_ticks, timeout=120_000)
    wait_idle(page, timeout=120_000)
    return chart_data(page, "explore-heatmap")


def test_first_click_on_each_notes_example(server, page):
    """Opening Explore and clicking a notes example gives a map with at most one <unk> at once:
    an example the model cannot read opens on one that can (its button says which)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for label in NOTES_EXAMPLES:
        page.goto(f"{server.url}/explore")
        wait_idle(page, timeout=120_000)
        before = chart_data(page, "explore-heatmap")["layout"]["xaxis"]["ticktext"]
        page.get_by_role("button", name=re.compile("^" + re.escape(label) + r"( → \w+)?$")).click()
        fig = _wait_heatmap(page, before)  # no notes example is the default sentence
        assert _unk(fig) <= 1, (label, fig["layout"]["xaxis"]["ticktext"])
        assert page.locator(".st-key-explore-reader button").count() == 0, label
        assert no_exception(page), label


def test_a_typed_sentence_the_model_cannot_read_gets_an_offer(server, page):
    """A sentence typed by hand that is mostly <unk> to toy-translate: an offer to switch model
    that, clicked, does, keeping the sentence."""
    page.goto(f"{server.url}/explore?model=toy-translate&text=" + urllib.parse.quote(NOTES_EXAMPLES["bank (river)"]))
    wait_idle(page, timeout=120_000)
    fig = chart_data(page, "explore-heatmap")
    assert _unk(fig) > 1
    offer = page.locator(".st-key-explore-reader button")
    assert offer.count() == 1, f"{_unk(fig)} <unk> and no offer of a model that reads it"
    page.screenshot(path=str(SCREENSHOTS / "newcomer-offer.png"))
    offer.click()
    fig = _wait_heatmap(page, fig["layout"]["xaxis"]["ticktext"])
    assert _unk(fig) <= 1, fig["layout"]["xaxis"]["ticktext"]


def test_examples_one_button_per_sentence(server, page):
    page.goto(f"{server.url}/explore")
    wait_idle(page)
    chart_data(page, "explore-heatmap")
    labels = [t.strip().lower() for t in page.get_by_role("button").all_inner_texts()]
    assert labels.count("show me the money") == 1, labels


def _toggle(page, label):
    page.get_by_text(label, exact=True).click()
    wait_idle(page, timeout=120_000)


def _fresh_same(browser, url, keys):
    """The figures `keys` drawn by `url` in a fresh browser context (no session, no cookies)."""
    ctx = watched_context(browser, viewport={"width": 1400, "height": 2000})
    try:
        pg = ctx.new_page()
        pg.goto(url)
        wait_idle(pg, timeout=120_000)
        assert no_exception(pg)
        return {k: chart_data(pg, k) for k in keys}, pg.url
    finally:
        ctx.close()


def _same_figure(a, b):
    assert [t.get("z") for t in a["data"]] == [t.get("z") for t in b["data"]]
    assert a["layout"]["title"] == b["layout"]["title"]
    assert a["layout"]["xaxis"].get("ticktext") == b["layout"]["xaxis"].get("ticktext")
    assert [t.get("zmax") for t in a["data"]] == [t.get("zmax") for t in b["data"]]


def test_copied_url_reproduces_the_figure(server, page, browser):
    """Every switch that changes a figure is in the URL: a copied link opened in a fresh
    context draws the same numbers (explore with minilm, compare, the playground's tab)."""
    text = urllib.parse.quote("Show me the money, said the banker")
    page.goto(f"{server.url}/explore?model=minilm&text={text}")
    wait_idle(page, timeout=120_000)
    chart_data(page, "explore-heatmap", timeout=120_000)
    for label in ("Average over heads", "Scale colours per map", "Log colour scale", "Hide special tokens",
                  "Read in words"):
        _toggle(page, label)
    page.get_by_role("tab", name="Model view (all layers × heads)").click()
    wait_idle(page, timeout=120_000)
    mine = {k: chart_data(page, k) for k in ("explore-enlarged", "explore-grid")}
    assert "in words" in mine["explore-enlarged"]["layout"]["title"]["text"]
    theirs, _ = _fresh_same(browser, page.url, mine)
    for k in mine:
        _same_figure(mine[k], theirs[k])

    page.goto(f"{server.url}/compare")
    wait_idle(page, timeout=120_000)
    chart_data(page, "compare-attn-a", timeout=120_000)
    _toggle(page, "Average over heads")
    _toggle(page, "Read in words")
    mine = {k: chart_data(page, k) for k in ("compare-attn-a", "compare-attn-b")}
    theirs, _ = _fresh_same(browser, page.url, mine)
    for k in mine:
        assert mine[k]["data"][0]["y"] == theirs[k]["data"][0]["y"] and mine[k]["data"][0]["x"] == theirs[k]["data"][0]["x"]

    page.goto(f"{server.url}/playground")
    wait_idle(page, timeout=120_000)
    page.get_by_role("tab", name="3 · Symmetric vs learned").click()
    wait_idle(page, timeout=120_000)
    ctx = watched_context(browser)
    try:
        pg = ctx.new_page()
        pg.goto(page.url)
        wait_idle(pg, timeout=120_000)
        assert pg.get_by_role("tab", name="3 · Symmetric vs learned").get_attribute("aria-selected") == "true"
    finally:
        ctx.close()


def _labels(fig) -> list:
    out = []
    for t in fig["data"]:
        for k in ("x", "y", "text"):
            v = t.get(k)
            out += [str(s) for s in v] if isinstance(v, list) else []
    for ax in ("xaxis", "yaxis"):
        out += [str(s) for s in fig["layout"].get(ax, {}).get("ticktext") or []]
    return out


def test_byte_pieces_read_as_text(server, page):
    """SmolLM2 on emoji: the tokens and the next-token bars show characters, never escaped bytes."""
    text = urllib.parse.quote("I love pizza 🍕🍕")
    page.goto(f"{server.url}/explore?model=smollm2&text={text}")
    wait_idle(page, timeout=180_000)
    labels = _labels(chart_data(page, "explore-heatmap", timeout=180_000))
    assert any("🍕" in s for s in labels), labels
    assert not any("\\x" in s for s in labels), labels
    assert "\\x" not in page.locator('[data-testid="stMain"]').inner_text()
    page.goto(f"{server.url}/decoder?model=smollm2&text={text}&step=1")
    wait_idle(page, timeout=180_000)
    bars = _labels(chart_data(page, "decoder-next", timeout=180_000))
    assert bars and not any("\\x" in s for s in bars), bars
    assert "\\x" not in page.locator('[data-testid="stMain"]').inner_text()
    page.screenshot(path=str(SCREENSHOTS / "newcomer-byte-pieces.png"))


def _label_gap_px(fig, axis: str, length_px: float) -> float:
    vals = list(fig["layout"][axis]["tickvals"])
    span = max(vals) - min(vals) + 1
    return length_px / span * (vals[1] - vals[0]) if len(vals) > 1 else length_px


def test_model_view_opens_around_the_selected_layer(server, page):
    """SmolLM2 at layer 27: the grid opens on layers that hold 27, and the enlarged map's
    query labels are at least a line apart."""
    text = urllib.parse.quote(" ".join(["the cat sat on the mat and looked at the dog"] * 4))
    page.goto(f"{server.url}/explore?model=smollm2&text={text}&layer=27&head=3&tab=model")
    wait_idle(page, timeout=180_000)
    grid = chart_data(page, "explore-grid", timeout=180_000)
    layers = {int(c[0]) for c in grid["data"][1]["customdata"]}
    assert 27 in layers, sorted(layers)
    assert page.get_by_text("is outside the layers drawn").count() == 0
    small = chart_data(page, "explore-enlarged")
    lay = small["layout"]
    plot_h = lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]
    assert _label_gap_px(small, "yaxis", plot_h) >= 14, lay["yaxis"]["tickvals"]
    page.screenshot(path=str(SCREENSHOTS / "newcomer-model-view.png"))


def test_decoder_stepper_controls(server, page):
    """One Play/Pause button; leaving while playing and coming back does not jump to the end;
    the end message is no box at step 1; next-token labels stay inside the plot and the
    teacher's token is marked whatever its probability."""
    import core

    sentence = "the small dog sees the cat"
    n_steps = len(core.load_model("toy-translate", device="cpu").steps(sentence))
    text = urllib.parse.quote(sentence)
    page.goto(f"{server.url}/decoder?model=toy-translate&text={text}&step=1")
    wait_idle(page)
    chart_data(page, "decoder-next")
    assert page.locator('[data-testid="stAlert"]', has_text="Generation ended").count() == 0
    page.locator(".st-key-decoder-btn-play button").first.click()
    page.wait_for_function("""() => [...document.querySelectorAll('button')].some(b => b.innerText.includes('Pause'))""",
                           timeout=30_000)
    names = [t.strip() for t in page.get_by_role("button").all_inner_texts()]
    assert not any(n.endswith("Play") for n in names), names  # no ghost Play under the Pause
    page.locator('[data-testid="stSidebarNav"] a[href$="/explore"]').click()
    page.wait_for_url("**/explore**")
    wait_idle(page)
    page.locator('[data-testid="stSidebarNav"] a[href$="/decoder"]').click()
    page.wait_for_url("**/decoder**")
    wait_idle(page)
    page.wait_for_timeout(2 * 700 + 500)  # two play delays: it would have moved on by now
    wait_idle(page)
    step = int(urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)["step"][0])
    assert step < n_steps, (step, n_steps)
    assert page.locator(".st-key-decoder-btn-play button").first.inner_text().strip().endswith("Play")

    target = urllib.parse.quote("le ketur belmo")
    page.goto(f"{server.url}/decoder?model=toy-translate&text={text}&mode=teacher&target={target}&step=2")
    wait_idle(page)
    fig = chart_data(page, "decoder-next")
    bars, marks = fig["data"][0], [t for t in fig["data"][1:] if t.get("name") == "teacher"]
    assert len(marks) == 1  # the teacher's token, marked even at p = 0
    pos = bars["textposition"]
    top = max(range(len(bars["x"])), key=lambda i: bars["x"][i])
    assert isinstance(pos, list) and pos[top] == "inside"  # the longest bar's label is never pushed past the axis
    page.screenshot(path=str(SCREENSHOTS / "newcomer-decoder.png"), full_page=True)


def test_lecture_notes_are_named_for_a_reader(server, page):
    """The notes are listed on one page with title and author, and no page calls them "seed"."""
    import re

    from viz.figures.citations import NOTES

    page.goto(f"{server.url}/notes")
    wait_idle(page)
    table = page.locator('[data-testid="stTable"]').inner_text()
    for n in NOTES.values():
        assert n.short in table and n.title in table, n
    assert "Oualid Missaoui" in table
    page.screenshot(path=str(SCREENSHOTS / "newcomer-notes.png"))
    for name in ("playground", "inside", "decoder", "compare", "positions"):
        page.goto(f"{server.url}/{name}")
        wait_idle(page, timeout=120_000)
        page.wait_for_selector('[data-testid="stMain"] .js-plotly-plot', timeout=120_000)
        wait_idle(page, timeout=120_000)
        text = page.locator('[data-testid="stMain"]').text_content()  # hidden tabs included
        assert not re.search(r"\bseeds? 00\d", text, re.I), (name, re.findall(r".{40}seeds? 00\d.{20}", text, re.I))
        assert no_exception(page), name


def test_downloads_say_size_and_offer_one_layer(server, page):
    """The buttons give each file's size before it is made; the current layer alone comes as
    a file named for what it holds."""
    import io

    import numpy as np

    page.goto(f"{server.url}/explore?layer=1&head=2&text=" + urllib.parse.quote("the small dog sees the cat"))
    wait_idle(page)
    chart_data(page, "explore-heatmap")
    page.locator(".st-key-explore-dl-pop button").first.click()  # the map's data downloads: one popover
    whole = page.locator(".st-key-explore-dl-npz button").first.inner_text()
    assert re.search(r"≈\d+(\.\d)? (kB|MB|GB)", whole), whole
    with page.expect_download() as info:
        page.locator(".st-key-explore-dl-layer button").first.click()
    d = info.value
    assert d.suggested_filename == "toy-translate-encoder-self-attn-layer1-all-heads.npz"
    with np.load(io.BytesIO(open(d.path(), "rb").read())) as z:
        assert z["encoder.1.self_attn.weights"].shape[0] == 4  # every head
        assert not any(k.startswith(("encoder.0.", "decoder.")) for k in z.files)
    page.screenshot(path=str(SCREENSHOTS / "newcomer-downloads.png"))


def test_head_view_and_playground_titles_clear_the_labels(server, page):
    """The head view's lines stop short of the token labels and its heads' colours differ; the
    playground's symmetric-vs-learned maps leave room above for their rotated key labels."""
    import html

    from viz.figures.heatmaps import label_margins

    text = urllib.parse.quote("the small dog sees the cat")
    page.goto(f"{server.url}/explore?text={text}&tab=heads")
    wait_idle(page)
    fig = chart_data(page, "explore-headview")
    lines = [t for t in fig["data"] if t.get("mode") == "lines"]
    xs = [x for t in lines for x in t["x"] if x is not None]
    assert xs and 0 < min(xs) and max(xs) < 1  # labels sit at x = 0 and x = 1
    colours = {t["name"]: t["line"]["color"] for t in lines}

    assert len(colours) >= 3 and len(set(colours.values())) == len(colours)  # one colour per head

    page.goto(f"{server.url}/playground?text=" + urllib.parse.quote("I swam across the river") + "&tab=symmetric")
    wait_idle(page, timeout=120_000)
    for key in ("playground-sym-scores", "playground-learned-scores", "playground-sym-weights"):
        f = chart_data(page, key, timeout=120_000)
        labels = [html.unescape(t) for t in f["layout"]["xaxis"]["ticktext"]]
        assert f["layout"]["margin"]["t"] >= label_margins(labels, labels)["t"], key
        assert f["layout"]["title"].get("yanchor") == "top", key  # above the axis title, not on it
    page.screenshot(path=str(SCREENSHOTS / "newcomer-playground-symmetric.png"), full_page=True)


def test_compare_says_it_opens_on_its_own_pair(server, page):
    """Coming from Explore with a sentence of one's own, Compare says it shows its own pair and
    offers the sentence back in one click."""
    mine = "the old man sleeps near the river"
    page.goto(f"{server.url}/explore?text=" + urllib.parse.quote(mine))
    wait_idle(page)
    chart_data(page, "explore-heatmap")
    page.locator('[data-testid="stSidebarNav"] a[href$="/compare"]').click()
    page.wait_for_url("**/compare**")
    wait_idle(page, timeout=120_000)
    assert page.locator('[data-testid="stAlert"]', has_text="its own pair").count() == 1
    page.locator(".st-key-compare-use-mine button").first.click()
    page.wait_for_function("(t) => [...document.querySelectorAll('input, textarea')].some(i => i.value === t)", arg=mine,
                           timeout=60_000)
    wait_idle(page, timeout=120_000)
    assert "toy-translate" in page.url and urllib.parse.quote_plus(mine) in page.url
    assert no_exception(page)


def _query(url: str) -> dict:
    return urllib.parse.parse_qs(urllib.parse.urlparse(url).query)


def test_back_after_a_page_switch_takes_one_press(server, page):
    """A page switch is one user action and makes one history entry: Back, pressed once,
    returns to the page before it with its URL state and figure."""
    text = urllib.parse.quote("the small dog sees the cat")
    page.goto(f"{server.url}/explore?text={text}&layer=1&head=2&mean=1")
    wait_idle(page, timeout=120_000)
    before_url, before = page.url, chart_data(page, "explore-heatmap")
    entries = page.evaluate("history.length")
    page.locator('[data-testid="stSidebarNav"] a[href$="/positions"]').click()
    page.wait_for_url("**/positions**")
    wait_idle(page, timeout=120_000)
    page.wait_for_function("() => location.search.includes('model=')")  # the new page has written its state
    made = page.evaluate("history.length") - entries
    page.go_back()
    page.wait_for_url("**/explore**")
    wait_idle(page, timeout=120_000)
    assert urllib.parse.urlparse(page.url).path.endswith("/explore"), page.url
    assert made == 1, f"a page switch made {made} history entries"
    assert _query(page.url) == _query(before_url)
    _same_figure(chart_data(page, "explore-heatmap"), before)
    page.screenshot(path=str(SCREENSHOTS / "newcomer-back.png"))


def _alerts(page) -> list:
    return [t.strip() for t in page.locator('[data-testid="stAlertContainer"]').all_inner_texts()]


def test_a_url_value_the_page_does_not_show_is_named_with_why(server, page):
    """A URL value the page replaces or does without is named, with the value given, the value
    shown and why, once; after the next click it is not said again."""
    text = urllib.parse.quote("the small dog sees the cat")
    page.goto(f"{server.url}/explore?text={text}&layer=1&head=99&words=1&target=le")
    wait_idle(page, timeout=120_000)
    chart_data(page, "explore-heatmap")
    said = _alerts(page)
    expect = ["The URL's head=99 is replaced by 3: head 99 is out of range (0–3 in toy-translate's encoder "
              "self-attention).",
              "The URL's words=1 is ignored: toy-translate's tokens are whole words",
              "The URL's target='le' is ignored: this page has no target"]
    for e in expect:
        assert sum(e in s for s in said) == 1, (e, said)
    assert _query(page.url)["head"] == ["3"] and "target" not in _query(page.url)
    page.screenshot(path=str(SCREENSHOTS / "newcomer-url-overridden.png"))
    _toggle(page, "Average over heads")  # the page's own URL from now on: nothing more to say about it
    assert not any("The URL's" in s for s in _alerts(page)), _alerts(page)

    page.goto(f"{server.url}/decoder?model=minilm&text={text}")
    wait_idle(page, timeout=120_000)
    said = "\n".join(_alerts(page))
    assert "The URL's model='minilm' is replaced by 'toy-translate'" in said, said
    assert "minilm is an encoder model; the decoder stepper needs a model that generates text" in said, said

    page.goto(f"{server.url}/positions?layer=2&d=7")
    wait_idle(page, timeout=120_000)
    said = "\n".join(_alerts(page))
    assert "The URL's layer=2 is ignored: this page has no layer" in said, said
    assert "The URL's d=7 is replaced by 8: d must be even" in said, said
    assert no_exception(page)


def _open_tab(page, name):
    """Open the tab `name` (again, should a click land while a run is still ending and be lost)."""
    tab = page.get_by_role("tab", name=name)
    for _ in range(3):
        tab.click()
        wait_idle(page, timeout=120_000)
        if tab.get_attribute("aria-selected") == "true":
            return
    raise AssertionError(f"the tab {name!r} does not open")


def _playground_figures(page) -> dict:
    """The playground's figures that its in-tab controls change, each read with its tab open
    (the random model's map only where it has been built)."""
    out = {}
    for tab, keys in (("1 · Attention by hand", ["playground-hand-weights"]), ("2 · Parameter-free", ["playground-pfree"]),
                      ("3 · Symmetric vs learned", ["playground-sym-scores", "playground-learned-weights"]),
                      ("4 · Why scale", ["playground-scaling-std", "playground-scaling-entropy"]),
                      ("5 · Hyper-parameters", ["playground-random-attn"])):
        _open_tab(page, tab)
        out.update({k: chart_data(page, k, timeout=120_000) for k in keys
                    if k != "playground-random-attn" or page.locator(f".st-key-{k} .js-plotly-plot").count()})
    return out


def _numbers(fig) -> list:
    return [[t.get(k) for k in ("x", "y", "z")] for t in fig["data"]]


def _title(fig) -> str:
    """The figure's title without a measured time ("3.9 ms forward")."""
    return re.sub(r"\d+(\.\d+)? ms forward", "… ms forward", fig["layout"]["title"]["text"])


def test_playground_controls_in_the_url(server, page, browser):
    """The controls inside the playground's tabs (scaling, sign of the softmax's input, layer and
    head, the scaling demo's keys and seed, the hyper-parameters and the built model) are in
    the URL: a copied link opened in a fresh context draws the same figures."""
    text = urllib.parse.quote("the small dog sees the cat")
    page.goto(f"{server.url}/playground?text={text}")
    wait_idle(page, timeout=120_000)
    _open_tab(page, "1 · Attention by hand")
    _toggle(page, "Scale by 1/√d_k")
    _open_tab(page, "2 · Parameter-free")
    _toggle(page, "Divide by √D")
    page.get_by_text("embed.encoder.tokens (token embeddings only)").click()
    wait_idle(page, timeout=120_000)
    _open_tab(page, "3 · Symmetric vs learned")
    page.get_by_label("Self-attention of").click()  # the decoder's self-attention, its layer 1, head 2
    page.get_by_role("option", name="decoder").click()
    wait_idle(page, timeout=120_000)
    for label, value in (("Layer", "1"), ("Head", "2")):
        page.locator('[data-testid="stMain"]').get_by_label(label, exact=True).click()
        page.get_by_role("option", name=value, exact=True).click()
        wait_idle(page, timeout=120_000)
    _open_tab(page, "4 · Why scale")
    seed = page.get_by_label("Random seed")
    seed.fill("7")
    seed.press("Enter")
    wait_idle(page, timeout=120_000)
    page.locator(".st-key-playground-sc_keys input[type=range]").press("ArrowRight")  # 16 -> 32 keys per query
    wait_idle(page, timeout=120_000)
    _open_tab(page, "5 · Hyper-parameters")
    page.locator(".st-key-playground-hp_L input[type=range]").press("ArrowRight")  # L = 3
    wait_idle(page, timeout=120_000)
    page.locator(".st-key-playground-hp_kind").get_by_role("combobox").click()
    page.get_by_role("option", name="decoder", exact=True).click()
    wait_idle(page, timeout=120_000)
    page.get_by_role("button", name="Build this model").click()
    wait_idle(page, timeout=120_000)
    mine = _playground_figures(page)

    def fresh(url, screenshot=None):
        ctx = watched_context(browser, viewport={"width": 1400, "height": 2400})
        try:
            pg = ctx.new_page()
            pg.goto(url)
            wait_idle(pg, timeout=120_000)
            assert no_exception(pg)
            figures = _playground_figures(pg)
            if screenshot:  # the copied link's tab 5: the same model, built
                pg.screenshot(path=str(SCREENSHOTS / screenshot), full_page=True)
            return figures
        finally:
            ctx.close()

    default = fresh(f"{server.url}/playground?text={text}")
    theirs = fresh(page.url, "newcomer-playground-url.png")
    assert set(theirs) == set(mine) and "playground-random-attn" not in default
    for k in mine:
        if k in default:  # every control was moved: each figure differs from the page's first one
            assert _numbers(mine[k]) != _numbers(default[k]) or _title(mine[k]) != _title(default[k]), k
        assert _numbers(mine[k]) == _numbers(theirs[k]), k
        assert _title(mine[k]) == _title(theirs[k]), k
