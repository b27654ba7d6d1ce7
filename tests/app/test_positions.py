"""viz.figures.sinusoid and viz.positions.figures: the sinusoidal matrix, its relative-distance property and
the notes' example, checked against the formula written out independently here (radians, Vaswani et al. 2017)."""

import math

import numpy as np
import pytest
import torch

import core
from viz.figures import sinusoid
from viz.positions import figures as vp


def formula(n: int, d: int) -> np.ndarray:
    """PE[i, 2j] = sin(i / 10000^(2j/d)), PE[i, 2j+1] = cos(same), one cell at a time."""
    pe = np.zeros((n, d))
    for i in range(n):
        for c in range(d):
            j2 = c - c % 2  # 2j
            angle = i / 10000 ** (j2 / d)
            pe[i, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("n,d", [(4, 4), (50, 16), (7, 10), (33, 128), (3, 5)])
def test_pe_matrix_is_the_formula(n, d):
    assert np.allclose(sinusoid.pe_matrix(n, d), formula(n, d), atol=1e-12)


def test_money_table_recomputed_in_radians():
    t = vp.money_tables(4)
    pe = t["pe"].to_numpy()
    assert np.allclose(pe, formula(4, 4), atol=1e-12)
    # the notes' PE_{1,0} = 0.02 is not the formula: in radians it is sin(1)
    assert pe[1, 0] == pytest.approx(math.sin(1.0))
    assert round(pe[1, 0], 2) == 0.84
    assert pe[1, 1] == pytest.approx(math.cos(1.0))
    assert pe[3, 0] == pytest.approx(math.sin(3.0))
    # inputs are the example's embeddings, and the sums are computed from them
    x = t["x"].to_numpy()
    assert x.shape == (4, 4) and x[3].tolist() == [0.41, 0.08, 0.51, 0.87]
    assert np.allclose(t["sum"].to_numpy(), x + formula(4, 4), atol=1e-12)
    assert t["sum"].to_numpy()[3, 1] == pytest.approx(0.08 + math.cos(3.0))


def test_degrees_reproduce_the_notes_mistake():
    deg = vp.money_tables(4)["pe_degrees"].to_numpy()
    assert deg[1, 0] == pytest.approx(math.sin(math.radians(1.0)))
    assert round(deg[1, 0], 2) == vp.NOTES_PE_1_0  # 0.02: the notes read the angle as degrees
    assert round(deg[1, 1], 2) == 1.0
    note = vp.money_note()
    assert "0.8415" in note and "0.0175" in note and "degrees" in note


@pytest.mark.parametrize("n,d", [(64, 4), (64, 128), (200, 512), (30, 1024)])
def test_dot_product_depends_only_on_offset(n, d):
    G = vp.pe_dot_matrix(sinusoid.pe_matrix(n, d))
    omegas = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    for i in range(0, n, max(1, n // 17)):
        for j in range(0, n, max(1, n // 13)):
            expected = np.cos((i - j) * omegas).sum()  # sum_j cos((i - j) w_j)
            assert abs(G[i, j] - expected) < 1e-9
            assert abs(G[i, j] - G[abs(i - j), 0]) < 1e-9  # Toeplitz (and symmetric)
    assert vp.toeplitz_deviation(G) < 1e-9
    assert np.allclose(np.diag(G), d / 2)


def test_offset_curves_coincide_for_every_start():
    P = sinusoid.pe_matrix(80, 64)
    curves = vp.dot_by_offset(P, [0, 20, 40])
    d0, v0 = curves[0]
    for i in (20, 40):
        d_i, v_i = curves[i]
        assert d_i[0] == 0 and len(d_i) == 80 - i
        assert np.allclose(v_i, v0[: len(v_i)], atol=1e-9)


def test_stride_keeps_sin_cos_pairs():
    cols = vp.stride_indices(1024, 256, pairs=True)
    assert len(cols) <= 258
    assert all(c % 2 == 0 and c + 1 in cols for c in cols if c % 2 == 0)
    assert any(c % 2 == 1 for c in cols)
    assert vp.stride_indices(100, 256) == list(range(100))
    rows = vp.stride_indices(1000, 256)
    assert rows[0] == 0 and len(rows) <= 256


def test_heatmap_shows_exact_values():
    P = sinusoid.pe_matrix(12, 8)
    fig = sinusoid.positional_heatmap(P, title="t")
    assert np.allclose(np.asarray(fig.data[0].z, dtype=float), core.sinusoidal_encoding(12, 8).numpy(), atol=1e-6)


def test_model_positions_of_the_bundled_model():
    model = core.load_model("toy-translate", device="cpu")
    tr = model.trace("show me the money")
    info = vp.model_positions(tr)
    assert info["stack"] == "encoder" and info["tokens"] == ["show", "me", "the", "money"]
    assert info["scheme"] == "sinusoidal"
    n, d = info["P"].shape
    assert (n, d) == (4, model.config.d_model)
    assert np.allclose(info["P"], formula(n, d), atol=1e-6)
    p_check, x_check = info["checks"]  # P against the numpy formula, X against X' + P
    assert p_check.ok and p_check.error < 1e-6 and x_check.ok and x_check.error < 1e-5


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_pe_matrix_is_independent_of_core(layout):
    """The page's formula is its own numpy code, and agrees with core's to float64 precision."""
    ours = sinusoid.pe_matrix(50, 12, layout)
    assert np.allclose(ours, core.sinusoidal_encoding(50, 12, dtype=torch.float64, layout=layout).numpy(), atol=1e-12)
    if layout == "half":
        assert np.allclose(ours[:, :6], formula(50, 12)[:, 0::2]) and np.allclose(ours[:, 6:], formula(50, 12)[:, 1::2])


def test_position_checks_fail_when_the_models_positions_are_off(monkeypatch):
    """A model whose P is 1 % off the formula (its buffer tampered with) fails both checks."""
    model = core.load_model("toy-translate", device="cpu")
    monkeypatch.setattr(model.net.src_embed, "pe", model.net.src_embed.pe * 1.01)
    info = vp.model_positions(model.trace("show me the money"))
    assert [c.ok for c in info["checks"]] == [False, False], [c.text() for c in info["checks"]]


@pytest.mark.parametrize("family", ["bert", "gpt2", "marian"])
def test_position_checks_hold_on_learned_layernormed_and_half_layout_positions(tmp_path, family):
    """Learned tables (GPT-2), BERT's LayerNorm after the sum with token types, Marian's sin | cos."""
    if family == "marian":
        from test_hf_seq2seq import _build

        from core.loaders import hf_seq2seq

        _build(family, tmp_path)
        model = hf_seq2seq.load(tmp_path, device="cpu")
    else:
        from hf_builders import build, save

        save(build(family, tmp_path)[0], tmp_path)
        model = core.load_model(str(tmp_path), device="cpu")
    info = vp.model_positions(model.trace("the bank of the river"))
    assert len(info["checks"]) == 2 and all(c.ok for c in info["checks"]), [c.text() for c in info["checks"]]


def test_toeplitz_check_fails_on_a_broken_formula():
    assert vp.toeplitz_check(vp.pe_dot_matrix(sinusoid.pe_matrix(20, 8))).ok
    bad = sinusoid.pe_matrix(20, 8)
    bad[:, 1::2] = np.sin(np.arange(20)[:, None] * 0.3)  # cosines replaced: no longer a rotation
    assert not vp.toeplitz_check(vp.pe_dot_matrix(bad)).ok


def test_model_positions_rope_has_no_additive_p():
    cfg = core.ModelConfig(kind="decoder", d_model=32, n_heads=4, d_ff=64, n_layers=1, positional="rope")
    model = core.load_model("random", config=cfg, seed=0, device="cpu")
    info = vp.model_positions(model.trace("the dog sees the cat"))
    assert info["stack"] == "decoder" and info["P"] is None and info["scheme"] == "rope"
    ang = vp.rope_angle_matrix(5, 8, 10000.0)
    assert ang.shape == (5, 4)
    assert ang[3, 0] == pytest.approx(3.0)  # position 3, first pair: angle 3 rad
    assert ang[1, 1] == pytest.approx(1 / 10000 ** (2 / 8))
