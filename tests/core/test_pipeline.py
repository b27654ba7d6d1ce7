"""The Inside page's pieces (viz.inside.step_model, viz.inside.step_checks, viz.inside.figures) on random core models:
steps hold the trace's real tensors, the column notation is the transpose of the row one,
the checks hold (and catch tampering), and large inputs are drawn reduced."""

import math

import numpy as np
import pytest
import torch

import core
from core import trace_names as tn
from viz.figures.heatmaps import to_numpy
from viz.figures.reduce import block_means
from viz.inside.figures import (
    MAX_CELLS_DRAWN, MAX_TOKENS_DRAWN, MIN_FEATURES_DRAWN, colour_limit, drawn_matrix, step_figure,
)
from viz.inside.step_checks import head_checks, residual_checks, row_sum_error
from viz.inside.step_model import COLS, ROWS, Step, kv_head, layer_steps, mask_kind, shapes_table, steps_by_key

TEXT = "the small dog sees the cat"


def _model(**kw):
    base = dict(kind="encoder", n_layers=2, d_model=32, n_heads=4, d_ff=64, max_len=512)
    base.update(kw)
    return core.load_model("random", device="cpu", config=core.ModelConfig(**base), seed=3)


@pytest.fixture(scope="module")
def encoder():
    m = _model()
    return m, m.trace(TEXT)


@pytest.fixture(scope="module")
def seq2seq():
    m = _model(kind="encoder-decoder", n_layers=2)
    return m, m.trace(TEXT, target="the dog sees the cat")


@pytest.fixture(scope="module")
def llama_like():
    """Pre-norm RMSNorm SwiGLU decoder with RoPE and grouped-query attention (4 query, 2 kv heads)."""
    m = _model(kind="decoder", n_heads=4, n_kv_heads=2, positional="rope", norm="rmsnorm", norm_placement="pre",
               activation="swiglu", bias=False, rope_layout="interleaved")
    return m, m.trace(TEXT)


def _z(fig) -> np.ndarray:
    return np.asarray(fig.data[0].z, dtype=np.float64)


def _same(a, b) -> bool:
    """Equal including NaN cells (plotly draws -inf cells as NaN)."""
    return np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), equal_nan=True)


# ------------------------------------------------------------------ the steps are the trace
def test_steps_hold_the_recorded_tensors(encoder):
    model, trace = encoder
    steps = steps_by_key(layer_steps(trace, "encoder", "self_attn", 1, 2, model.config))
    for key, name, idx in [("q", "encoder.1.self_attn.q", 2), ("k", "encoder.1.self_attn.k", 2),
                           ("v", "encoder.1.self_attn.v", 2), ("scores", "encoder.1.self_attn.scores", 2),
                           ("weights", "encoder.1.self_attn.weights", 2), ("heads", "encoder.1.self_attn.heads", 2),
                           ("attn-out", "encoder.1.self_attn.out", None), ("ffn-hidden", "encoder.1.ffn.hidden", None),
                           ("x", "embed.encoder.tokens", None), ("p", "embed.encoder.positions", None),
                           ("sum", "embed.encoder.sum", None), ("xin", "encoder.0.out", None)]:
        expected = trace[name] if idx is None else trace[name][idx]
        assert steps[key].name == name
        np.testing.assert_array_equal(steps[key].matrix, to_numpy(expected))
    assert steps["ffn-hidden"].matrix.shape == (6, 64)  # n x m
    assert steps["ffn-hidden"].dims == ("n", "m")


def test_scaled_is_scores_over_sqrt_dk(encoder):
    model, trace = encoder
    d_k = model.config.d_head
    for head in range(model.config.n_heads):
        steps = steps_by_key(layer_steps(trace, "encoder", "self_attn", 0, head, model.config))
        scores = to_numpy(trace["encoder.0.self_attn.scores"][head]).astype(np.float64)
        np.testing.assert_allclose(steps["scaled"].matrix, scores / math.sqrt(d_k), rtol=1e-6, atol=1e-6)
        assert f"\\sqrt{{{d_k}}}" in steps["scaled"].latex_rows


def test_column_figure_is_the_transpose_of_the_row_figure(seq2seq):
    model, trace = seq2seq
    for stack, kind in [("encoder", "self_attn"), ("decoder", "self_attn"), ("decoder", "cross_attn")]:
        for step in layer_steps(trace, stack, kind, 1, 3, model.config):
            if step.matrix is None:
                continue
            rows = step_figure(step, ROWS)
            cols = step_figure(step, COLS)
            assert _same(_z(cols), _z(rows).T), step.key
            assert step.shape(COLS) == step.shape(ROWS)[::-1]
            # labels travel with the transpose: hover (column label, row label) pairs are swapped
            cd_rows, cd_cols = np.asarray(rows.data[0].customdata), np.asarray(cols.data[0].customdata)
            assert (cd_cols[..., 1] == cd_rows[..., 0].T).all() and (cd_cols[..., 0] == cd_rows[..., 1].T).all()


def test_row_figure_draws_the_matrix_itself(seq2seq):
    model, trace = seq2seq
    steps = steps_by_key(layer_steps(trace, "decoder", "self_attn", 0, 1, model.config))
    w = to_numpy(trace["decoder.0.self_attn.weights"][1])
    np.testing.assert_allclose(_z(step_figure(steps["weights"])), w, atol=1e-7)
    # the causal mask: -inf above the diagonal, drawn blank (NaN) and labelled "-∞"
    fig = step_figure(steps["mask"])
    z = _z(fig)
    n = z.shape[0]
    assert np.isnan(z[np.triu_indices(n, 1)]).all() and (z[np.tril_indices(n)] == 0).all()
    assert "-∞" in np.asarray(fig.data[0].text).ravel().tolist()


def test_formulas_switch_with_the_notation(seq2seq):
    model, trace = seq2seq
    steps = steps_by_key(layer_steps(trace, "decoder", "cross_attn", 0, 0, model.config))
    assert "Q K^{T}" in steps["scores"].latex(ROWS)
    assert "K^{T} Q" in steps["scores"].latex(COLS)
    assert r"\operatorname{softmax}_{\text{row}}" in steps["weights"].latex(ROWS)
    assert r"\operatorname{softmax}_{\text{col}}" in steps["weights"].latex(COLS)
    assert "W_{h,q}" in steps["q"].latex(ROWS) and "W_{Q}^{h\\,T}" in steps["q"].latex(COLS)
    assert "V A^{T}" in steps["heads"].latex(COLS)
    # cross-attention: keys and values from the encoder's output, n_q x n_k maps
    assert r"Z_{\text{enc}}" in steps["k"].latex(ROWS)
    assert steps["weights"].dims == ("n_q", "n_k")
    assert steps["weights"].shape_latex(COLS).startswith(r"n_k \times n_q")
    np.testing.assert_array_equal(steps["mem"].matrix, to_numpy(trace["encoder.1.out"]))


# ------------------------------------------------------------------ order of the block
def test_post_norm_order_and_decoder_sublayers(seq2seq):
    model, trace = seq2seq
    keys = [s.key for s in layer_steps(trace, "decoder", "cross_attn", 1, 0, model.config)]
    order = ["xin", "mem", "self_attn-out", "residual1", "norm1", "q", "k", "v", "scores", "scaled", "mask",
             "masked", "weights", "heads", "attn-out", "residual2", "norm2", "ffn-hidden", "ffn-out", "residual3",
             "norm3", "out"]
    assert [k for k in keys if k in order] == order


def test_pre_norm_rope_gqa_steps(llama_like):
    model, trace = llama_like
    cfg = model.config
    head = 3
    steps = layer_steps(trace, "decoder", "self_attn", 1, head, cfg)
    keys = [s.key for s in steps]
    # pre-norm: Norm first, residual after the sub-layer, no norm after it
    assert keys.index("norm1") < keys.index("qhat") < keys.index("attn-out") < keys.index("residual1") \
        < keys.index("norm2") < keys.index("ffn-hidden") < keys.index("residual2") < keys.index("out")
    by = steps_by_key(steps)
    assert by["p"].matrix is None and "RoPE" in by["p"].explain
    g = kv_head(head, cfg.n_heads, cfg.n_kv_heads)
    assert g == 1
    np.testing.assert_array_equal(by["k"].matrix, to_numpy(trace["decoder.1.self_attn.k"][g]))
    np.testing.assert_array_equal(by["khat"].matrix, to_numpy(trace["decoder.1.self_attn.k_pre_rope"][g]))
    np.testing.assert_array_equal(by["qhat"].matrix, to_numpy(trace["decoder.1.self_attn.q_pre_rope"][head]))
    assert "key/value head" in by["v"].explain
    np.testing.assert_allclose(by["angles"].matrix, core.rope_angles(6, cfg.d_head, cfg.rope_theta).numpy())
    assert r"\operatorname{SiLU}" in by["ffn-hidden"].latex_rows
    assert r"\tilde{X}" in by["q"].latex_rows or r"\tilde{X}" in by["qhat"].latex_rows
    checks = head_checks(trace, "decoder", "self_attn", 1, head)
    assert {"q", "k", "heads", "weights"} <= set(checks)
    assert all(c.ok for cs in checks.values() for c in cs), [c.text() for cs in checks.values() for c in cs]


# ------------------------------------------------------------------ checks
@pytest.mark.parametrize("view", [("encoder", "self_attn"), ("decoder", "self_attn"), ("decoder", "cross_attn")])
def test_checks_hold_on_real_traces(seq2seq, view):
    model, trace = seq2seq
    stack, kind = view
    for head in range(model.config.n_heads):
        checks = head_checks(trace, stack, kind, 1, head)
        assert all(c.ok for cs in checks.values() for c in cs), [c.text() for cs in checks.values() for c in cs]
        w = trace[tn.attn(stack, 1, kind, "weights")][head]
        assert row_sum_error(w) < 1e-5
    res = residual_checks(trace, "decoder", 1)
    assert {"residual1", "residual2", "residual3", "norm1", "norm2", "norm3", "attn-out", "cross_attn-out", "ffn-hidden",
            "ffn-out", "out"} == set(res)
    assert all(c.ok for cs in res.values() for c in cs), [c.text() for cs in res.values() for c in cs]
    assert len(res["out"]) == 2  # the numpy layer and the explicit re-run, each against the fused pass


def test_checks_against_the_fused_pass_catch_a_tampered_stored_tensor(encoder):
    """The two checks that hold the explicit re-run against what the fused forward pass
    stored: a changed stored layer output or head output makes each fail."""
    model, _ = encoder
    trace = model.trace(TEXT)
    assert all(c.ok for c in residual_checks(trace, "encoder", 1)["out"])
    assert all(c.ok for c in head_checks(trace, "encoder", "self_attn", 1, 2)["heads"])
    bad = model.trace(TEXT)
    out = bad._tensors["encoder.1.out"] = bad._tensors["encoder.1.out"].clone()
    out[2, 5] += 0.5
    heads = bad._tensors["encoder.1.self_attn.heads"] = bad._tensors["encoder.1.self_attn.heads"].clone()
    heads[2, 1, 0] -= 0.25
    chk = residual_checks(bad, "encoder", 1)["out"][0]
    assert not chk.ok and chk.error == pytest.approx(0.5, rel=1e-3) and "✗" in chk.text()
    chk = head_checks(bad, "encoder", "self_attn", 1, 2)["heads"][0]
    assert not chk.ok and chk.error == pytest.approx(0.25, rel=1e-3)


def test_checks_catch_a_wrong_head(encoder):
    model, trace = encoder
    tensors = {n: trace[n].clone() for n in trace}
    tensors["encoder.0.self_attn.heads"][1, 2, 3] += 0.5  # not A V any more
    tensors["encoder.0.self_attn.weights"][1, 0, :] *= 1.1  # row 0 no longer sums to 1
    bad = core.Trace(tensors, trace.token_sets, trace.meta)
    checks = head_checks(bad, "encoder", "self_attn", 0, 1)
    assert not checks["heads"][0].ok and checks["heads"][0].error == pytest.approx(0.5, rel=1e-3)
    sums = checks["weights"][0]
    assert not sums.ok and sums.error == pytest.approx(0.1, rel=1e-3)
    assert "✗" in sums.text()
    assert all(c.ok for c in head_checks(trace, "encoder", "self_attn", 0, 1)["heads"])


def test_mask_kinds(seq2seq, encoder):
    model, trace = seq2seq
    assert mask_kind(trace["decoder.0.self_attn.mask"]) == "causal"
    assert mask_kind(trace["encoder.0.self_attn.mask"]) == "none"
    m, _ = encoder
    padded = m.trace(TEXT, pad_to=9)
    assert mask_kind(padded["encoder.0.self_attn.mask"]) == "padding"
    steps = steps_by_key(layer_steps(padded, "encoder", "self_attn", 0, 0, m.config))
    assert "Padding mask" in steps["mask"].explain
    assert steps["weights"].matrix[:, 6:].max() == 0.0  # padding keys get exactly 0


# ------------------------------------------------------------------ large inputs
def test_long_inputs_are_drawn_reduced():
    m = _model(max_len=512)
    trace = m.trace(" ".join(["the small dog sees the cat"] * 50))  # 300 tokens
    n = len(trace.tokens("source"))
    assert n == 300
    steps = steps_by_key(layer_steps(trace, "encoder", "self_attn", 0, 0, m.config))
    z, rl, cl, _, _, note = drawn_matrix(steps["weights"])
    f = math.ceil(n / MAX_TOKENS_DRAWN)
    assert z.shape == (math.ceil(n / f), math.ceil(n / f)) and max(z.shape) <= MAX_TOKENS_DRAWN
    assert len(rl) == z.shape[0] and len(cl) == z.shape[1] and f"{n} × {n} drawn as" in note
    w = to_numpy(trace["encoder.0.self_attn.weights"][0]).astype(np.float64)
    # weights: mean over a block of queries of the total weight on a block of keys, so rows still sum to 1
    np.testing.assert_allclose(z[0, 0], w[:f, :f].sum(1).mean(), rtol=1e-5)
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-5)
    assert "rows still sum to 1" in note
    # other n x n maps (scores) are plain block means
    zs = drawn_matrix(steps["scores"])[0]
    s = to_numpy(trace["encoder.0.self_attn.scores"][0]).astype(np.float64)
    np.testing.assert_allclose(zs[1, 2], s[f:2 * f, 2 * f:3 * f].mean(), rtol=1e-4)
    zc = drawn_matrix(steps["weights"], COLS)[0]
    np.testing.assert_array_equal(zc, z.T)
    fig = step_figure(steps["weights"])
    assert _z(fig).shape == z.shape and fig.layout.height <= 620


def test_block_means_and_feature_cut():
    m = np.array([[0.0, -np.inf, -np.inf, -np.inf], [1.0, 3.0, -np.inf, -np.inf]])
    out = block_means(m, 2, 2)
    assert out.shape == (1, 2) and out[0, 0] == pytest.approx(4.0 / 3.0) and np.isneginf(out[0, 1])
    w = np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7], [1.0, 0.0, 0.0]])  # 3 rows: a full block and a partial one
    pooled = block_means(w, 2, 2, sum_columns=True)
    np.testing.assert_allclose(pooled, [[0.525, 0.475], [1.0, 0.0]])
    np.testing.assert_allclose(pooled.sum(1), 1.0)
    wide = Step(key="w", group="g", title="t", matrix=np.arange(6 * 3000, dtype=np.float32).reshape(6, 3000),
                         axes=("token", "feature"))
    z, _, cl, _, _, note = drawn_matrix(wide, max_tokens=128, max_features=200)
    assert z.shape == (6, 200) and cl[-1] == "199" and "of 3000" in note
    z, *_ = drawn_matrix(wide)  # default: within the cell budget
    assert z.shape[0] * z.shape[1] <= max(MAX_CELLS_DRAWN, 6 * MIN_FEATURES_DRAWN)


def test_colour_limit_clips_outlier_features():
    z = np.random.default_rng(0).normal(size=(6, 500))
    a, clipped = colour_limit(z)
    assert not clipped and a == pytest.approx(np.abs(z).max())
    z[2, 7] = 500.0
    a, clipped = colour_limit(z)
    assert clipped and a < 10
    assert colour_limit(np.zeros((2, 2))) == (1.0, False)


def test_shapes_table_uses_the_notes_symbols(llama_like):
    model, trace = llama_like
    t = shapes_table(trace, "decoder", "self_attn", model.config)
    vals = dict(zip(t.symbol, t.value))
    assert vals == {"n": 6, "d": 32, "d_k": 8, "m": 64, "H": 4, "H_kv": 2, "L": 2}
    assert torch.is_tensor(trace["decoder.0.self_attn.k"]) and trace["decoder.0.self_attn.k"].shape[0] == 2


def test_block_means_of_finite_maps_equal_a_direct_loop():
    """The reshape path (no -inf) against plain Python over blocks, partial blocks included."""
    from viz.figures.reduce import block_means

    g = torch.Generator().manual_seed(4)
    m = torch.rand(2, 23, 17, generator=g, dtype=torch.float64)
    for sum_columns in (False, True):
        got = block_means(m, 5, 4, sum_columns=sum_columns)
        assert got.shape == (2, 5, 5)
        for b in range(2):
            for i in range(5):
                for j in range(5):
                    cell = m[b, 5 * i:5 * i + 5, 4 * j:4 * j + 4]
                    want = cell.sum(1).mean() if sum_columns else cell.mean()
                    assert got[b, i, j].item() == pytest.approx(want.item(), rel=1e-12)
    with_inf = m.clone()
    with_inf[0, 0, :] = float("-inf")
    assert torch.allclose(block_means(with_inf, 5, 4)[1], block_means(m, 5, 4)[1])  # the -inf path agrees


def test_block_notes_say_where_the_norms_are():
    """Inside a head's line on the block: a norm before and after each sub-layer (Gemma 2), after
    only (OLMo 2 / 3, OLMo Hybrid's attention layer), and nothing for a plain pre-norm layer (or
    OLMo Hybrid's pre-norm mixer layers)."""
    from types import SimpleNamespace

    from core.net.config import ModelConfig
    from viz.inside.step_model import block_notes

    trace = SimpleNamespace(meta={})
    base = dict(kind="decoder", d_model=32, n_heads=4, d_ff=64, n_layers=4, tgt_vocab_size=50, norm="rmsnorm",
                norm_placement="pre")
    both = ModelConfig(**base, post_sublayer_norm=True)
    after = ModelConfig(**base, pre_sublayer_norm=False, post_sublayer_norm=True)
    assert "as well as before it: x + Norm(f(Norm(x)))" in block_notes(both, trace, "decoder", 0)
    assert "none before it: x + Norm(f(x))" in block_notes(after, trace, "decoder", 0)
    assert block_notes(ModelConfig(**base), trace, "decoder", 0) == ""
    hybrid = ModelConfig(**base, pre_sublayer_norm=False, post_sublayer_norm=True, mixer_sublayer_norms=(True, False),
                         layer_types=["linear_attention"] * 3 + ["full_attention"], positional="none",
                         mixer={"kind": "gated_delta", "heads": 2, "d_k": 8, "d_v": 8, "conv": 4})
    assert block_notes(hybrid, trace, "decoder", 0) == ""
    assert "none before it" in block_notes(hybrid, trace, "decoder", 3)
