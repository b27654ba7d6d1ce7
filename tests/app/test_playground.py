"""viz.figures.by_hand: attention by hand, parameter-free and symmetric attention, the scaling
argument, the parameter-count formula and the cost measurement, against independent numpy."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

import core
from core import trace_names as tn
from core.net import cost
from viz.figures import by_hand


def softmax_rows(a):
    a = np.asarray(a, dtype=np.float64)
    e = np.exp(a - a.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# ------------------------------------------------------------------ 1. by hand
def test_help_me_construction_has_the_notes_dot_products():
    ex = by_hand.help_me_example()
    Q, K = by_hand.to_matrix(ex["Q"], "Q")[0], by_hand.to_matrix(ex["K"], "K")[0]
    assert by_hand.row_labels(ex["Q"], "q") == ["q1 (help)", "q2 (me)"]
    assert Q.shape == (2, 16) and K.shape == (2, 16)  # d_k = 16, as in the notes
    assert (Q @ K.T).tolist() == [[6.0, 4.0], [3.0, 8.0]]  # exact


def test_attention_by_hand_gives_the_notes_softmax():
    ex = {k: by_hand.to_matrix(v, k)[0] for k, v in by_hand.help_me_example().items()}
    res = by_hand.attention_by_hand(ex["Q"], ex["K"], ex["V"])
    assert res["scores"].tolist() == [[6.0, 4.0], [3.0, 8.0]]
    assert np.allclose(res["scaled"], [[1.5, 1.0], [0.75, 2.0]])
    w = res["weights"]
    assert np.round(w, 2).tolist() == [[0.62, 0.38], [0.22, 0.78]]
    assert w[0, 0] == pytest.approx(1 / (1 + math.exp(-0.5)))
    assert w[1, 1] == pytest.approx(1 / (1 + math.exp(-1.25)))
    assert np.allclose(res["output"], w @ ex["V"])
    assert np.allclose(res["output"][:, 2], 1.0)  # third value column: rows of S sum to 1
    lines = by_hand.weighted_sum_text(w, ["help", "me"], ["v1", "v2"])
    assert lines[0] == "A1 (help) = 0.6225 v1 + 0.3775 v2"


def test_attention_by_hand_unscaled_and_arbitrary_shapes():
    ex = {k: by_hand.to_matrix(v, k)[0] for k, v in by_hand.help_me_example().items()}
    res = by_hand.attention_by_hand(ex["Q"], ex["K"], ex["V"], scaled=False)
    assert np.allclose(res["weights"], softmax_rows([[6, 4], [3, 8]]))
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(3, 5)), rng.normal(size=(4, 5)), rng.normal(size=(4, 2))
    res = by_hand.attention_by_hand(Q, K, V)
    S = softmax_rows(Q @ K.T / math.sqrt(5))
    assert np.allclose(res["weights"], S) and np.allclose(res["output"], S @ V)


def test_to_matrix_reports_bad_cells():
    good = pd.DataFrame({"1": [1.0, 2.0], "2": ["3", " 4.5 "]}, index=["a", "b"])
    m, msgs = by_hand.to_matrix(good, "Q")
    assert msgs == [] and m.tolist() == [[1.0, 3.0], [2.0, 4.5]]
    bad = pd.DataFrame({"token": ["a", None], "1": [1.0, None], "2": ["x", "inf"]})
    m, msgs = by_hand.to_matrix(bad, "K")
    assert m is None and len(msgs) == 1
    assert "row k2, column 1 (empty)" in msgs[0] and "'x'" in msgs[0] and "'inf'" in msgs[0]
    labelled = pd.DataFrame({"token": ["q1 (help)", ""], "1": [1.0, 2.0]})
    m, msgs = by_hand.to_matrix(labelled, "Q")
    assert msgs == [] and m.tolist() == [[1.0], [2.0]]
    assert by_hand.row_labels(labelled, "q") == ["q1 (help)", "q2"]
    m, msgs = by_hand.to_matrix(pd.DataFrame(), "V")
    assert m is None and "empty" in msgs[0]


def test_tables_round_trip_through_the_url():
    ex = by_hand.help_me_example()
    for name, df in ex.items():
        back = by_hand.frame_from_url(by_hand.frame_to_url(df))
        assert by_hand.row_labels(back, name.lower()) == by_hand.row_labels(df, name.lower())
        assert np.array_equal(by_hand.to_matrix(back, name)[0], by_hand.to_matrix(df, name)[0])
    edited = ex["Q"].copy()
    edited.loc[len(edited)] = [None] + [0.1] * 15 + [float("nan")]  # an added row: no label, one empty cell
    back = by_hand.frame_from_url(by_hand.frame_to_url(edited))
    assert by_hand.row_labels(back, "q")[2] == "q3" and np.isnan(back.iloc[2, -1]) and back.iloc[2, 1] == 0.1
    assert by_hand.to_matrix(back, "Q")[0] is None  # the empty cell is reported again, as in the editor


@pytest.mark.parametrize("raw, why", [("nonsense", "not a table"), ("[]", "not a table"), ('[["q1"]]', "not a table"),
                                      ('[["q1",1,2],["q2",3]]', "differ in length"),
                                      ("[" + ",".join(['["r",1]'] * 65) + "]", "larger than")])
def test_a_garbled_table_in_the_url_says_why(raw, why):
    with pytest.raises(ValueError, match=why):
        by_hand.frame_from_url(raw)


def test_check_shapes():
    assert by_hand.check_shapes(np.zeros((2, 3)), np.zeros((4, 3)), np.zeros((4, 1))) == []
    msgs = by_hand.check_shapes(np.zeros((2, 3)), np.zeros((4, 2)), np.zeros((3, 1)))
    assert len(msgs) == 2


# ------------------------------------------------------------------ 2. parameter-free
def test_parameter_free_attention_matches_numpy():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(6, 16))
    out = by_hand.parameter_free_attention(X)
    A = softmax_rows(X @ X.T)
    assert np.allclose(out["weights"], A) and np.allclose(out["Y"], A @ X)
    assert np.allclose(out["weights"].sum(1), 1.0)
    stats = by_hand.diagonal_stats(X, out["scores"], out["weights"])
    assert stats["diag_is_row_max"] == 1.0  # random 16-d vectors: |x|^2 beats every x.y
    assert stats["mean_diag_weight"] > 0.9
    scaled = by_hand.parameter_free_attention(X, scale=1 / 4)
    assert np.diag(scaled["weights"]).mean() < stats["mean_diag_weight"]


def test_parameter_free_repeated_token_splits_weight():
    x = np.array([[3.0, 0.0], [0.0, 3.0], [3.0, 0.0]])
    w = by_hand.parameter_free_attention(x)["weights"]
    assert w[0, 0] == pytest.approx(w[0, 2]) and w[0, 0] == pytest.approx(0.5, abs=1e-3)


# ------------------------------------------------------------------ 3. symmetric vs learned
def test_symmetric_scores_are_symmetric_learned_are_not():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(7, 12))
    Wq, Wk = rng.normal(size=(12, 4)), rng.normal(size=(12, 4))
    q, k = X @ Wq, X @ Wk
    sv = by_hand.symmetric_vs_learned(q, k)
    assert np.allclose(sv["sym_scores"], sv["sym_scores"].T, atol=1e-12)
    assert float(sv["sym_asymmetry"]) < 1e-12
    assert float(sv["learned_asymmetry"]) > 0.1
    assert np.allclose(sv["sym_scores"], X @ Wq @ Wq.T @ X.T / 2)  # X U U^T X^T / sqrt(d_k)
    assert np.allclose(sv["learned_weights"], softmax_rows(q @ k.T / 2))
    # with a causal mask both softmaxes respect it
    mask = core.causal_mask(7, dtype=torch.float64).numpy()
    sv = by_hand.symmetric_vs_learned(q, k, mask)
    assert np.all(np.triu(sv["sym_weights"], 1) == 0) and np.all(np.triu(sv["learned_weights"], 1) == 0)


def test_head_qk_reproduces_the_trace():
    model = core.load_model("toy-translate", device="cpu")
    tr = model.trace("the small dog sees the cat")
    for stack, layer, head in [("encoder", 0, 0), ("encoder", 2, 3), ("decoder", 1, 2)]:
        q, k, mask = by_hand.head_qk(tr, stack, layer, head)
        sv = by_hand.symmetric_vs_learned(q, k, mask)
        recorded = tr[tn.self_attn(stack, layer, "scaled")][head].double().numpy()
        assert np.allclose(sv["learned_scores"], recorded, atol=1e-4)
        assert np.allclose(sv["learned_weights"], tr[tn.self_attn(stack, layer, "weights")][head].double().numpy(),
                           atol=1e-5)
        assert float(sv["sym_asymmetry"]) < 1e-12 < float(sv["learned_asymmetry"])


# ------------------------------------------------------------------ 4. scaling
def test_scaling_demo_spread_grows_like_sqrt_dk():
    df = by_hand.scaling_demo(d_ks=(4, 16, 64, 256, 1024), n_keys=16, n_samples=512, seed=0)
    ratio = df.std_unscaled.iloc[-1] / df.std_unscaled.iloc[0]
    assert ratio == pytest.approx(math.sqrt(1024 / 4), rel=0.1)  # 16
    for _, row in df.iterrows():
        assert row.std_unscaled / math.sqrt(row.d_k) == pytest.approx(1.0, abs=0.1)
        assert row.std_scaled == pytest.approx(1.0, abs=0.1)
    # softmax entropy collapses without scaling, stays put with it
    assert df.entropy_unscaled.iloc[-1] < 0.3 * df.entropy_unscaled.iloc[0]
    assert df.entropy_unscaled.is_monotonic_decreasing
    assert df.entropy_scaled.max() - df.entropy_scaled.min() < 0.15
    assert (df.entropy_scaled <= math.log(16) + 1e-9).all()
    assert df.max_weight_unscaled.iloc[-1] > 0.8
    again = by_hand.scaling_demo(d_ks=(4, 16, 64, 256, 1024), n_keys=16, n_samples=512, seed=0)
    pd.testing.assert_frame_equal(df, again)  # seeded


# ------------------------------------------------------------------ 5. parameters
CONFIGS = [
    dict(kind="encoder", d_model=64, n_heads=4, d_ff=256, n_layers=2),
    dict(kind="encoder-decoder", d_model=128, n_heads=4, d_ff=512, n_layers=3),
    dict(kind="encoder-decoder", d_model=32, n_heads=2, d_ff=64, n_layers=2, n_decoder_layers=1),
    dict(kind="decoder", d_model=48, n_heads=6, n_kv_heads=2, d_ff=96, n_layers=3, positional="rope",
         norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False, tie_embeddings=True),
    dict(kind="encoder", d_model=96, n_heads=3, d_head=20, d_ff=128, n_layers=2, positional="learned",
         activation="gelu", embed_norm=True, type_vocab_size=2, max_len=40),
    dict(kind="decoder", d_model=16, n_heads=16, d_ff=16, n_layers=1, norm_placement="pre", bias=False),
    dict(kind="encoder-decoder", d_model=64, n_heads=8, d_ff=128, n_layers=1, norm="rmsnorm", activation="swiglu"),
]


@pytest.mark.parametrize("kw", CONFIGS)
def test_param_formula_equals_core_count(kw):
    cfg = core.ModelConfig(src_vocab_size=190, tgt_vocab_size=173, **kw)
    formula = cost.param_formula(cfg)
    real = core.Transformer(cfg).num_parameters()
    assert int(formula.total.sum()) == real
    meta = cost.meta_model(cfg)
    assert meta.num_parameters() == real
    shapes = cost.weight_shapes(meta)
    assert int(shapes.entries.sum()) == sum(p.numel() for p in meta.parameters())


def test_notes_layer_formula():
    for d, m in [(64, 256), (128, 512), (512, 2048)]:
        cfg = core.ModelConfig(kind="encoder", d_model=d, n_heads=4, d_ff=m, n_layers=1, src_vocab_size=10)
        formula = cost.param_formula(cfg)
        per_layer = int(formula[formula.part != "encoder token embedding"].total.sum())
        assert per_layer == 4 * d * d + 4 * d + 2 * d * m + m + d + 4 * d
        assert cost.layer_formula(cfg).endswith(f"{per_layer:,}")
        layer = core.Transformer(cfg).encoder[0]
        assert sum(p.numel() for p in layer.parameters()) == per_layer


# ------------------------------------------------------------------ 6. cost
def test_cost_grid_measures_and_respects_budget():
    seen = []
    df, finished = cost.cost_grid([8, 16], [16, 32], budget_s=30, progress=lambda f, m: seen.append(f))
    assert finished and len(df) == 4 and (df.seconds > 0).all()
    assert seen[-1] == pytest.approx(1.0) and seen == sorted(seen)
    df, finished = cost.cost_grid([8, 16, 32], [16, 32], budget_s=0.0)  # spent before the first point
    assert not finished and len(df) == 0


def test_fit_cost_recovers_coefficients():
    rows = [dict(N=N, D=D, seconds=2e-4 + 3e-11 * N * N * D + 5e-11 * N * D * D)
            for N in (16, 64, 256, 1024) for D in (64, 256, 512)]
    fit = cost.fit_cost(pd.DataFrame(rows))
    assert fit["c0"] == pytest.approx(2e-4, rel=1e-6)
    assert fit["a"] == pytest.approx(3e-11, rel=1e-6) and fit["b"] == pytest.approx(5e-11, rel=1e-6)
    assert fit["rel_rms"] < 1e-9
    # never a negative coefficient, even when the data want one
    rows = [dict(N=N, D=D, seconds=1e-3 - 1e-12 * N * N * D + 1e-10 * N * D * D) for N in (16, 64, 256) for D in (64, 256)]
    fit = cost.fit_cost(pd.DataFrame(rows))
    assert min(fit["c0"], fit["a"], fit["b"]) >= 0
    assert cost.cost_model(fit, 64, 64) > 0
