"""The 'inside' page driven through AppTest: it renders, reports bad input as warnings, draws
the core's real tensors, transposes them in column notation, and keeps its state in the URL."""

import numpy as np
import pytest

import core
from conftest import open_first, assert_no_exception, chart_by_key, heatmap_z

TEXT = "the small dog sees the cat"
WEIGHTS = "inside-weights-fig"


OPEN_FIRST = (1, 3)  # the groups open on a first visit: the input, and scores -> weights


@pytest.fixture
def app_test(app_test):
    """The page with every group of steps open (they start closed but for OPEN_FIRST and draw
    only while open): these tests read every step."""
    def make(page: str = "", **params):
        at = app_test(page, **params)
        for gi in range(1, 10):
            at.session_state[f"inside.group-{gi}.open"] = True
        return at

    return make


def _warnings(at):
    return [w.value for w in at.warning]


def test_default_state_renders(app_test):
    at = app_test("inside")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    ids = [c.proto.id for c in at.get("plotly_chart")]
    for key in ["inside-x-fig", "inside-q-fig", "inside-k-fig", "inside-v-fig", "inside-scores-fig",
                "inside-scaled-fig", "inside-mask-fig", "inside-weights-fig", "inside-heads-fig",
                "inside-attn-out-fig", "inside-ffn-hidden-fig", "inside-out-fig"]:
        assert any(key in i for i in ids), key
    assert at.query_params["layer"] == "0" and at.query_params["head"] == "0"
    assert at.query_params["notation"] == "rows"
    assert len(at.latex) >= 15  # a formula per step
    captions = " ".join(c.value for c in at.caption)
    assert "✓" in captions and "each row of A sums to 1" in captions and "fused kernel computed it" in captions
    assert "run again with the explicit formula gives the output the fused forward pass stored" in captions
    assert "✗" not in captions


def test_empty_text_warns(app_test):
    at = app_test("inside", text="")
    at.run()
    assert_no_exception(at)
    assert any("empty" in w for w in _warnings(at)), _warnings(at)
    assert not at.get("plotly_chart")


def test_600_token_input(app_test):
    text = " ".join([TEXT] * 100)  # 600 words
    at = app_test("inside", text=text, layer="2", head="3")
    at.run()
    assert_no_exception(at)
    assert any("cut to the model's maximum" in w for w in _warnings(at)), _warnings(at)
    z = heatmap_z(chart_by_key(at, WEIGHTS))
    assert z.shape[0] <= 128 and np.allclose(z.sum(1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_600_tokens_on_a_long_context_model_are_drawn_reduced(app_test):
    """minilm keeps 512 of the 600 tokens: the page draws block means, says so, and still
    checks the full tensors."""
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm's weight package is not installed")
    at = app_test("inside", model="minilm", text=" ".join([TEXT] * 100), layer="1", head="4")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]  # an error on the page is a failure, never a skip
    assert any("Long input (512 tokens)" in i.value for i in at.info), [i.value for i in at.info]
    z = heatmap_z(chart_by_key(at, WEIGHTS))
    assert z.shape == (128, 128)  # 512 tokens as 128 blocks of 4
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-4)  # block means of rows that sum to 1
    for key in ("inside-x-fig", "inside-ffn-hidden-fig", "inside-q-fig"):
        cells = heatmap_z(chart_by_key(at, key)).size
        assert cells <= 128 * 128, key
    captions = " ".join(c.value for c in at.caption)
    assert "✗" not in captions and "block means" in captions


@pytest.mark.parametrize("layer, head, expect", [("99", "-4", ["layer 99 is out of range", "head -4 is out of range"]),
                                                 ("abc", "2.5", ["layer='abc' is not a whole number",
                                                                 "head='2.5' is not a whole number"])])
def test_bad_layer_head_in_url(app_test, layer, head, expect):
    at = app_test("inside", text=TEXT, layer=layer, head=head)
    at.run()
    assert_no_exception(at)
    warns = " ".join(_warnings(at))
    for e in expect:
        assert e in warns, warns
    assert int(at.query_params["layer"]) in range(3) and int(at.query_params["head"]) in range(4)
    if layer == "99":
        assert at.query_params["layer"] == "2" and at.query_params["head"] == "0"


@pytest.mark.parametrize("attn, name", [("encoder.self_attn", "encoder.1.self_attn.weights"),
                                        ("decoder.self_attn", "decoder.1.self_attn.weights"),
                                        ("decoder.cross_attn", "decoder.1.cross_attn.weights")])
def test_weights_heatmap_is_the_core_trace(app_test, toy, attn, name):
    at = app_test("inside", text=TEXT, attn=attn, layer="1", head="2")
    at.run()
    assert_no_exception(at)
    expected = toy.trace(TEXT)[name][2].numpy()
    z = heatmap_z(chart_by_key(at, WEIGHTS))
    assert z.shape == expected.shape
    np.testing.assert_allclose(z, expected, atol=1e-6)
    # scaled = scores / sqrt(d_k) on the page too
    scores = heatmap_z(chart_by_key(at, "inside-scores-fig"))
    scaled = heatmap_z(chart_by_key(at, "inside-scaled-fig"))
    np.testing.assert_allclose(scaled, scores / np.sqrt(toy.config.d_head), atol=1e-5)


def test_notation_switch_transposes(app_test):
    at = app_test("inside", text=TEXT, attn="decoder.cross_attn", layer="1", head="2")
    at.run()
    rows = {k: heatmap_z(chart_by_key(at, k)) for k in (WEIGHTS, "inside-q-fig", "inside-mask-fig")}
    latex_rows = [x.value for x in at.latex]
    at.radio(key="inside.notation").set_value("cols").run()
    assert_no_exception(at)
    assert at.query_params["notation"] == "cols"
    for k, z in rows.items():
        np.testing.assert_array_equal(heatmap_z(chart_by_key(at, k)), z.T)
    latex_cols = [x.value for x in at.latex]
    assert latex_cols != latex_rows
    assert any("softmax}_{\\text{col}}" in x for x in latex_cols)
    assert any("each column of Aᵀ sums to 1" in c.value for c in at.caption)
    # the same view opened from the URL draws the same pictures
    at2 = app_test("inside", text=TEXT, attn="decoder.cross_attn", layer="1", head="2", notation="cols")
    at2.run()
    np.testing.assert_array_equal(heatmap_z(chart_by_key(at2, WEIGHTS)), rows[WEIGHTS].T)


def test_url_round_trip(app_test):
    at = app_test("inside", text=TEXT, layer="1", head="2")
    at.run()
    qp = at.query_params
    assert (qp["layer"], qp["head"], qp["text"], qp["model"]) == ("1", "2", TEXT, "toy-translate")
    at.selectbox(key="inside.head").set_value(3).run()
    at.selectbox(key="inside.layer").set_value(2).run()
    assert_no_exception(at)
    assert at.query_params["head"] == "3" and at.query_params["layer"] == "2"
    # and that URL reopens the same view
    at2 = app_test("inside", **{k: at.query_params[k] for k in ("model", "text", "attn", "layer", "head")})
    at2.run()
    assert at2.selectbox(key="inside.layer").value == 2 and at2.selectbox(key="inside.head").value == 3
    np.testing.assert_array_equal(heatmap_z(chart_by_key(at2, WEIGHTS)), heatmap_z(chart_by_key(at, WEIGHTS)))


def test_downloads_offer_the_weights(app_test):
    at = app_test("inside", text=TEXT, layer="1", head="2")
    at.run()
    labels = [b.proto.label for b in at.get("download_button")]
    assert any(lab.startswith("This map (CSV") for lab in labels), labels
    assert any(lab.startswith("Whole trace, every layer (NPZ, ≈") for lab in labels), labels
    assert any(lab.startswith("Layer 1, all heads (NPZ, ≈") for lab in labels), labels


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "minilm"])
def test_pretrained_models_render(app_test, model):
    if not core.MODELS[model].available():
        pytest.skip(f"{model}'s weight package is not installed")
    at = app_test("inside", model=model, text=TEXT, layer="1", head="4")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]  # the weight package is installed: it must load and pass
    captions = " ".join(c.value for c in at.caption)
    assert "✗" not in captions and "each row of A sums to 1" in captions
    z = heatmap_z(chart_by_key(at, WEIGHTS))
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-5)
    ids = " ".join(c.proto.id for c in at.get("plotly_chart"))
    if model == "smollm2":  # RoPE: q and k before and after rotation, and the angles; pre-norm first
        for key in ("inside-qhat-fig", "inside-khat-fig", "inside-angles-fig", "inside-norm1-fig"):
            assert key in ids
        assert "key/value head" in captions
        assert np.all(z[0, 1:] == 0) and z[0, 0] == pytest.approx(1.0)  # causal: the first token sees only itself
    else:
        assert "inside-p-fig" in ids and "inside-t-fig" in ids  # learned positions, token types (BERT)


def test_first_visit_draws_the_input_and_the_weights_groups_only():
    from streamlit.testing.v1 import AppTest

    from conftest import APP

    at = AppTest.from_file(APP, default_timeout=120)
    open_first(at, "inside")
    at.query_params["text"] = TEXT
    at.run()
    assert_no_exception(at)
    ids = " ".join(c.proto.id for c in at.get("plotly_chart"))
    for key in ("inside-x-fig", "inside-scores-fig", WEIGHTS):
        assert key in ids, key
    for key in ("inside-q-fig", "inside-heads-fig", "inside-ffn-hidden-fig", "inside-out-fig"):
        assert key not in ids, key
    labels = [e.label for e in at.expander if e.label[:1].isdigit()]
    assert len(labels) == 5, labels
    # opening a group draws it; the choice outlives a change of head (the label names the head)
    at.session_state["inside.group-5.open"] = True
    at.run()
    assert "inside-ffn-hidden-fig" in " ".join(c.proto.id for c in at.get("plotly_chart"))
    at.selectbox(key="inside.head").set_value(1).run()
    assert_no_exception(at)
    assert "inside-ffn-hidden-fig" in " ".join(c.proto.id for c in at.get("plotly_chart"))
    assert "head 1" in " ".join(e.label for e in at.expander)


def test_a_failed_check_in_a_closed_group_shows(monkeypatch):
    """A check of a closed group (add & norm, FFN) that fails is an error on the page, not hidden:
    the core's FFN output is 2 % off (a fault inside its forward), so the FFN group's checks fail
    while that group is closed."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import core.net.layers
    from conftest import APP
    from viz.ui import models

    orig = core.net.layers.FeedForward.forward

    def off(self, *a, **kw):
        hook = self.w_2.register_forward_hook(lambda m, i, out: out * 1.02)
        try:
            return orig(self, *a, **kw)
        finally:
            hook.remove()

    monkeypatch.setattr(core.net.layers.FeedForward, "forward", off)
    models.trace_cache.clear()  # a clean trace cached by an earlier test (with its checks) must not hide the fault
    st.cache_data.clear()
    at = AppTest.from_file(APP, default_timeout=120)
    open_first(at, "inside")
    at.query_params["text"] = TEXT
    at.run()
    monkeypatch.undo()
    models.trace_cache.clear()
    st.cache_data.clear()
    assert_no_exception(at)
    errors = [e.value for e in at.error]
    assert any("failed in “5." in e or "failed in “4." in e for e in errors), errors


@pytest.fixture(scope="module")
def later_families(tmp_path_factory):
    """A models folder holding one tiny checkpoint of each later decoder family."""
    from hf_builders import build

    root = tmp_path_factory.mktemp("later-models")
    for family in ("qwen3", "olmo2", "gpt_neox", "phi3"):
        hf, folder = build(family, root / f"tiny-{family}")
        hf.save_pretrained(str(folder))
    return root


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from gemma_builders import build as build_gemma

    root = tmp_path_factory.mktemp("gemma-models")
    for family, name in (("gemma2", "tiny-gemma2"), ("gemma3_text", "tiny-gemma3"), ("modernbert", "tiny-modernbert")):
        hf, folder = build_gemma(family, root / name)
        hf.save_pretrained(str(folder))
    return root


@pytest.mark.parametrize("family,present,absent,said", [
    ("qwen3", ("inside-qknorm-fig", "inside-qknorm-after-fig", "inside-norm1-fig"), ("inside-post_norm1-fig",),
     "QK-norm (per head)"),
    ("olmo2", ("inside-qknorm-fig", "inside-post_norm1-fig", "inside-post_norm2-fig"), ("inside-norm1-fig",),
     "none before it"),
    ("gpt_neox", ("inside-norm1-fig", "inside-norm2-fig", "inside-angles-fig"), ("inside-qknorm-fig",),
     "parallel block"),
    ("phi3", ("inside-angles-fig", "inside-norm2-fig"), ("inside-qknorm-fig",), "partial rotary (6 of 10"),
])
def test_later_families_show_their_own_steps(later_families, monkeypatch, family, present, absent, said):
    """Each later family opens on Inside with every group drawn, its checks holding, and its own
    steps: QK-norm's before/after scores, norms after the sub-layers (and none before them for
    OLMo-2), the parallel block's second norm of the layer input."""
    from streamlit.testing.v1 import AppTest

    from conftest import APP

    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(later_families))
    at = AppTest.from_file(APP, default_timeout=120)
    open_first(at, "inside")
    for k, v in dict(model=f"tiny-{family}", text=TEXT, layer="1", head="1").items():
        at.query_params[k] = v
    for g in range(1, 12):
        at.session_state[f"inside.group-{g}.open"] = True
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    ids = " ".join(c.proto.id for c in at.get("plotly_chart"))
    for key in present:
        assert key in ids, key
    for key in absent:
        assert key not in ids, key
    captions = " ".join(c.value for c in at.caption)
    assert said in captions
    assert "✗" not in captions and "each row of A sums to 1" in captions


@pytest.mark.parametrize("name", ["tiny-gemma2", "tiny-gemma3", "tiny-modernbert"])
def test_gemma_and_modernbert_blocks_render_in_order_with_their_checks(app_test, gemma_dir, monkeypatch, name):
    """Gemma 2's soft-capping curve (the sentence's own scores on c·tanh(x/c)) and the norms after
    the sub-layers, Gemma 3's QK-norm, ModernBERT's local layer: drawn, in the block's order, every
    check green."""
    from conftest import decode_array, figure

    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(gemma_dir))
    at = app_test("inside", model=name, text=TEXT, layer="1", head="1")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    captions = " ".join(c.value for c in at.caption)
    assert "✓" in captions and "✗" not in captions
    assert "This model's block:" in captions and "layer 1 is" in captions
    ids = [c.proto.id for c in at.get("plotly_chart")]
    pos = {k: next(i for i, x in enumerate(ids) if x.endswith(f"inside-{k}-fig")) for k in
           {"tiny-gemma2": ("norm1", "scaled", "capped", "masked", "attn-out", "post_norm1", "residual1", "norm2",
                            "ffn-out", "post_norm2", "residual2"),
            "tiny-gemma3": ("norm1", "qknorm", "qknorm-after", "qhat", "q", "scores", "post_norm1", "residual1"),
            "tiny-modernbert": ("norm1", "qhat", "scores", "mask", "weights", "residual1", "norm2")}[name]}
    assert list(pos.values()) == sorted(pos.values()), pos  # drawn in the block's order
    if name == "tiny-gemma2":
        assert "soft-capped at ±4" in captions and "norm after each sub-layer" in captions
        tr = core.load_model(str(gemma_dir / name), device="cpu").trace(TEXT)
        fig = figure(chart_by_key(at, "inside-capped-fig"))
        curve, points = fig["data"][1], fig["data"][2]
        x, y = decode_array(points["x"]).astype(float), decode_array(points["y"]).astype(float)
        np.testing.assert_allclose(y, 4.0 * np.tanh(x / 4.0), atol=1e-5)  # the points lie on the curve
        scaled = tr["decoder.1.self_attn.scaled"][1].numpy()
        allowed = ~np.isneginf(tr["decoder.1.self_attn.mask"].numpy())
        np.testing.assert_allclose(np.sort(x), np.sort(scaled[allowed]), atol=1e-5)  # this sentence's scores
        assert "tanh" in curve["name"]
    if name == "tiny-modernbert":
        assert "±2 tokens" in captions or "at most 2 positions" in captions
