"""The random presets of the attentions DeepSeek V3 / V3.2, Gemma 4 and Qwen3.5 ship (random:mla,
dsa, shared_kv, gated_attn) on the pages that show them: every page opens on each, Inside's
numpy reference writes out the output gate, and each number read from a chart is compared with
the core's trace or with numpy written here."""

import numpy as np
import pytest

import core
from conftest import assert_no_exception
from core import trace_names as tn
from core.registry import RANDOM_PRESETS

TEXT = "the small dog sees the cat and the old man sleeps near the river"
NEW = ("mla", "dsa", "shared_kv", "gated_attn")
PAGES = ("inside", "explore", "kvcache", "heads", "positions", "circuits")


def _model(name):
    return core.load_model(name, device="cpu")


def test_each_new_preset_has_its_mechanism():
    assert set(NEW) <= set(RANDOM_PRESETS)
    mla, dsa = _model("random:mla"), _model("random:dsa")
    assert mla.config.mla["kv_lora_rank"] == 8 and mla.config.d_model == 64 and mla.config.moe is None
    assert dsa.config.mla["index"]["topk"] == 4
    sel = dsa.trace(TEXT)[tn.attn("decoder", 1, "self_attn", "selected")].numpy()
    assert (sel.sum(-1) == np.minimum(np.arange(1, sel.shape[0] + 1), 4)).all()  # top 4 of the causal keys
    kv = _model("random:shared_kv").config
    assert kv.kv_source == [None, None, 0, 1] and kv.k_eq_v
    tr = _model("random:gated_attn").trace(TEXT)
    g = tr[tn.attn("decoder", 2, "self_attn", "gate")].numpy()
    assert g.shape == (4, len(tr.tokens("target")), 16) and 0 < g.min() and g.max() < 1


@pytest.mark.parametrize("preset", NEW)
def test_every_page_opens_on_the_new_presets(app_test, preset):
    for page in PAGES:
        at = app_test(page, model=f"random:{preset}", text=TEXT)
        at.run()
        assert_no_exception(at)
        assert any(f"weights of random:{preset} are random" in i.value for i in at.info), (page, preset)


def test_reference_writes_out_the_output_gate_and_shared_keys():
    from viz.figures.reference import reference_layer

    for p in ("gated_attn", "shared_kv"):
        tr = _model(f"random:{p}:1").trace(TEXT)
        for i in range(4):
            ref = reference_layer(tr, "decoder", i, {"self_attn": 2})
            np.testing.assert_allclose(ref["self_attn.maps2"]["weights"],
                                       tr[tn.attn("decoder", i, "self_attn", "weights")][2].double().numpy(), atol=1e-5)
            if p == "gated_attn":
                np.testing.assert_allclose(ref["self_attn.gate"], tr[tn.attn("decoder", i, "self_attn", "gate")].double()
                                           .numpy(), atol=1e-6)
            np.testing.assert_allclose(ref["out"], tr[tn.out("decoder", i)].double().numpy(), atol=1e-4)


# ------------------------------------------------------------------ Inside: MLA step by step, with a fault
def _data(at, key):
    from conftest import chart_by_key, figure

    return figure(chart_by_key(at, key))["data"]


def _fresh():
    import streamlit as st

    from viz.ui import models

    models.trace_cache.clear()
    st.cache_data.clear()


LATENT_CHECKS = ("c_KV = RMSNorm(X W_DKV)", "K_nope = c_KV W_UK (head 2)", "V = c_KV W_UV (head 2)",
                 "k_rope = RoPE(X W_KR)", "every head's rotated key is the same k_rope", "q (head 2)")


def test_inside_shows_the_latent_compression_step_by_step(app_test):
    from conftest import decode_array

    _fresh()
    at = app_test("inside", model="random:mla", text=TEXT, attn="decoder.self_attn", layer="1", head="2")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    passed = [c.value for c in at.caption if c.value.startswith(":green[✓")]
    for label in LATENT_CHECKS:
        assert any(label in c for c in passed), (label, passed)
    tr = _model("random:mla").trace(TEXT)
    latent = decode_array(_data(at, "inside-latent-latent-fig")[0]["z"]).astype(float)
    np.testing.assert_allclose(latent, tr[tn.attn("decoder", 1, "self_attn", "latent")].numpy(), atol=1e-5)
    assert latent.shape == (len(tr.tokens("target")), 8)
    v = decode_array(_data(at, "inside-latent-v-fig")[0]["z"]).astype(float)
    np.testing.assert_allclose(v, tr[tn.attn("decoder", 1, "self_attn", "v")][2].numpy(), atol=1e-5)
    assert any("r + d_rope = 16 numbers a position and layer" in c.value and "H (d_k + d_v) = 128" in c.value
               for c in at.caption)


def test_a_fault_in_the_latent_up_projection_shows_as_a_failed_check(app_test, monkeypatch):
    """W_UKV's output 2 % off inside the core: K_nope and V fail visibly, the latent itself still holds."""
    from core.net.latent import LatentAttention

    orig = LatentAttention.forward

    def forward(self, *a, **kw):
        hook = self.w_kvb.register_forward_hook(lambda m, i, out: out * 1.02)
        try:
            return orig(self, *a, **kw)
        finally:
            hook.remove()

    with monkeypatch.context() as mp:
        mp.setattr(LatentAttention, "forward", forward)
        _fresh()
        at = app_test("inside", model="random:mla", text=TEXT, attn="decoder.self_attn", layer="1", head="2")
        at.run()
        assert_no_exception(at)
        errors = " ".join(e.value for e in at.error)
        assert "✗ FAILED: K_nope = c_KV W_UK (head 2)" in errors and "✗ FAILED: V = c_KV W_UV (head 2)" in errors
        assert "checks of the latent attention failed" in errors
        assert "FAILED: c_KV" not in errors
    _fresh()


# ------------------------------------------------------------------ the sparse selection
def _dense(q, k, scale):
    s = q.astype(np.float64) @ k.T.astype(np.float64) * scale
    s[np.triu(np.ones_like(s, dtype=bool), 1)] = -np.inf
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("page, key", [("explore", "explore-heatmap"), ("inside", "inside-weights-fig")])
def test_the_selection_is_outlined_beside_the_dense_map(app_test, page, key):
    _fresh()
    at = app_test(page, model="random:dsa", text=TEXT, attn="decoder.self_attn", layer="2", head="1")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    m = _model("random:dsa")
    tr = m.trace(TEXT)
    sel = tr[tn.attn("decoder", 2, "self_attn", "selected")].numpy()
    data = _data(at, key)
    box = [d for d in data if d.get("name") == "selected"]
    assert len(box) == 1
    got = outlined(data[0], box[0])
    assert got == set(zip(*np.nonzero(sel))) and len(got) == sel.sum()
    q, k = (tr[tn.attn("decoder", 2, "self_attn", p)][1].numpy() for p in ("q", "k"))
    dense = _dense(q, k, float(m.net.decoder[2].self_attn.scale))
    np.testing.assert_allclose(decode_array_z(_data(at, f"{page}-dense-map")), dense, atol=1e-6)
    outside = np.asarray(_data(at, f"{page}-outside")[0]["y"], dtype=float) if isinstance(
        _data(at, f"{page}-outside")[0]["y"], list) else decode_array_z(_data(at, f"{page}-outside"), "y")
    np.testing.assert_allclose(outside, (dense * ~sel).sum(-1), atol=1e-6)
    assert outside[:4].max() < 1e-12 and outside[4:].min() > 0  # the first 4 queries keep every key they see
    passed = [c.value for c in at.caption if c.value.startswith(":green[✓")]
    assert any("renormalised over the kept keys" in c for c in passed)


def outlined(heat, box):
    """The (row, column) cells outlined: each square's 5 corners then a gap, its centre a cell's x and y."""
    from conftest import decode_array

    xs, ys = (list(np.asarray(heat[a] if isinstance(heat[a], list) else decode_array(heat[a]), dtype=float))
              for a in ("x", "y"))
    bx, by = (np.asarray([np.nan if v is None else v for v in box[a]], dtype=float) for a in ("x", "y"))
    assert len(bx) % 6 == 0 and np.isnan(bx[5::6]).all()
    cells = set()
    for i in range(0, len(bx), 6):
        cx, cy = bx[i:i + 4].mean(), by[i:i + 4].mean()
        assert np.ptp(bx[i:i + 4]) < 1 and np.ptp(by[i:i + 4]) < 1  # a square within one cell
        r, c = int(np.argmin(np.abs(np.array(ys) - cy))), int(np.argmin(np.abs(np.array(xs) - cx)))
        assert abs(ys[r] - cy) < 1e-9 and abs(xs[c] - cx) < 1e-9  # centred on the cell
        cells.add((r, c))
    return cells


def decode_array_z(data, field="z"):
    from conftest import decode_array

    return decode_array(data[0][field]).astype(float)


# ------------------------------------------------------------------ shared keys, K = V, the output gate
def test_explore_names_the_layer_a_shared_layer_reads_from(app_test):
    from conftest import chart_by_key, figure

    at = app_test("explore", model="random:shared_kv", text=TEXT, attn="decoder.self_attn", layer="3")
    at.run()
    assert_no_exception(at)
    title = figure(chart_by_key(at, "explore-heatmap"))["layout"]["title"]["text"]
    assert "causal · RoPE · keys and values from layer 1 · K = V" in title
    at = app_test("explore", model="random:shared_kv", text=TEXT, attn="decoder.self_attn", tab="model")
    at.run()
    assert figure(chart_by_key(at, "explore-grid"))["layout"]["yaxis"]["ticktext"] == [
        "L0 · sliding 4 · RoPE", "L1 · causal · RoPE · K = V", "L2 · sliding 4 · RoPE · keys and values from layer 0",
        "L3 · causal · RoPE · keys and values from layer 1 · K = V"]


def test_inside_shows_the_output_gate_per_head(app_test):
    _fresh()
    at = app_test("inside", model="random:gated_attn", text=TEXT, attn="decoder.self_attn", layer="2")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    z = decode_array_z(_data(at, "inside-gate-fig"))
    tr = _model("random:gated_attn").trace(TEXT)
    np.testing.assert_allclose(z, tr[tn.attn("decoder", 2, "self_attn", "gate")].double().mean(-1).numpy(), atol=1e-6)
    assert z.shape == (4, len(tr.tokens("target"))) and 0 < z.min() and z.max() < 1


# ------------------------------------------------------------------ the KV cache page: MHA, GQA and MLA
@pytest.mark.parametrize("preset, own, numbers", [
    ("mla", "MLA", {"MHA": 4 * (16 + 16), "GQA": 1 * (16 + 16), "MLA": 8 + 8}),  # d_qk = 8 + 8, d_v 16, H 4
    ("sliding", "MHA", {"MHA": 4 * 2 * 16, "GQA": 1 * 2 * 16, "MLA": 4 * 16 + 16 // 2})])  # V3's r = 4 d_k, d_k / 2
def test_kvcache_gives_the_cache_per_token_of_each_layout(app_test, preset, own, numbers):
    from conftest import chart_by_key, figure

    at = app_test("kvcache", model=f"random:{preset}", text=TEXT)
    at.run()
    assert_no_exception(at)
    n = len(_model(f"random:{preset}").encode(TEXT).ids)
    table = next(d.value for d in at.dataframe if "document_bytes" in d.value.columns)
    got = dict(zip(table["kind"], table["numbers"]))
    assert got == numbers
    assert dict(zip(table["kind"], table["bytes_per_token"])) == {k: v * 4 * 4 for k, v in numbers.items()}  # L 4, fp32
    assert dict(zip(table["kind"], table["document_bytes"])) == {k: v * 16 * n for k, v in numbers.items()}
    assert list(table.loc[table["this model"], "kind"]) == [own]
    bars = figure(chart_by_key(at, "kvcache-layout"))["data"][0]
    from conftest import decode_array

    x = bars["x"] if isinstance(bars["x"], list) else decode_array(bars["x"])
    np.testing.assert_allclose(np.asarray(x, dtype=float), [numbers[k] * 16 * n / 1024 for k in ("MHA", "GQA", "MLA")])


@pytest.mark.parametrize("layer, said", [
    ("3", "reads **keys and values from layer 1** (after layer 1's norm and RoPE; Gemma 4's shared KV), so its K and V "
          "below are layer 1's and the cache holds them once. Layer 1's values are its keys (K = V)."),
    ("1", "its values are its key projection X W_k before the key's norm and RoPE (**K = V**"),
    ("2", "reads **keys and values from layer 0**")])
def test_inside_names_the_layer_a_shared_layer_reads_from(app_test, layer, said):
    at = app_test("inside", model="random:shared_kv", text=TEXT, attn="decoder.self_attn", layer=layer)
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    captions = " ".join(c.value for c in at.caption)
    assert said in captions
    if layer == "2":
        assert "K = V" not in captions
    tr = _model("random:shared_kv").trace(TEXT)
    for p in ("k", "v"):  # what the caption says: the reusing layer's keys and values are the source layer's
        src = {"3": 1, "2": 0}.get(layer)
        if src is not None:
            np.testing.assert_array_equal(tr[tn.attn("decoder", int(layer), "self_attn", p)].numpy(),
                                          tr[tn.attn("decoder", src, "self_attn", p)].numpy())


def test_the_pure_pieces_refuse_bad_input_and_transpose_the_outline():
    from viz.figures.heatmaps import attention_heatmap
    from viz.figures.sparse import add_selection_outline, dense_softmax
    from viz.inside.latent import gate_figure
    from viz.kvcache.layout import layout_table

    sel = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=bool)
    fig = add_selection_outline(attention_heatmap(np.full((3, 3), 1 / 3), list("abc"), list("abc")), sel, transposed=True)
    box = fig.data[-1]
    corners = [(x, y) for x, y in zip(box.x, box.y) if x is not None]
    centres = {(round(np.mean([c[1] for c in corners[i:i + 5][:4]])), round(np.mean([c[0] for c in corners[i:i + 5][:4]])))
               for i in range(0, len(corners), 5)}
    assert centres == set(zip(*np.nonzero(sel.T)))  # drawn where the transposed map has them
    assert {tuple(c) for c in box.customdata} == set(zip(*np.nonzero(sel)))  # the hover names (query, key)
    with pytest.raises(ValueError, match="the selection is 2 x 3, the map 3 x 3"):
        add_selection_outline(fig, sel[:2])
    with pytest.raises(ValueError, match="q and k must be n x d with the same d"):
        dense_softmax(np.zeros((3, 4)), np.zeros((3, 5)), 0.5)
    d = dense_softmax(np.eye(3), np.eye(3), 1.0)
    np.testing.assert_allclose(d[0], [1, 0, 0])
    np.testing.assert_allclose(d[2], np.exp([0, 0, 1]) / np.exp([0, 0, 1]).sum())
    with pytest.raises(ValueError, match="heads x positions x features"):
        gate_figure(np.zeros((3, 4)), list("abcd"), 0)
    with pytest.raises(ValueError, match="0 or more tokens"):
        layout_table(preset_config_of("mla"), -1)


def preset_config_of(name):
    from core.registry import preset_config

    return preset_config(name)
