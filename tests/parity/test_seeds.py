"""The lecture notes' worked examples, recomputed through the core's own functions.

Numbers are computed from the formulas, never copied: where the notes round (0.62/0.38)
the test compares after the same rounding; where the notes are wrong (seed 003's
positional-encoding example uses degrees) the test says so.
"""

import math

import pytest
import torch

from core import causal_mask, scaled_dot_product_attention, sinusoidal_encoding


def _vectors_with_dots(dots, d_k=16):
    """Queries and keys in R^{d_k} whose dot products are exactly `dots` (n_q x n_k)."""
    dots = torch.as_tensor(dots, dtype=torch.float64)
    n_q, n_k = dots.shape
    k = torch.zeros(n_k, d_k, dtype=torch.float64)
    k[torch.arange(n_k), torch.arange(n_k)] = 1.0  # keys: unit vectors e_1..e_nk
    q = torch.zeros(n_q, d_k, dtype=torch.float64)
    q[:, :n_k] = dots  # q_i . e_j = dots[i, j]
    return q, k


def test_help_me_appendix_seed_003():
    # "help me!": q1.k1 = 6, q1.k2 = 4, q2.k1 = 3, q2.k2 = 8, d_q = d_k = 16
    q, k = _vectors_with_dots([[6, 4], [3, 8]])
    v = torch.randn(2, 5, dtype=torch.float64)
    rec = {}
    out = scaled_dot_product_attention(q, k, v, record=lambda n, t: rec.__setitem__(n, t))
    assert torch.allclose(rec["scores"], torch.tensor([[6.0, 4.0], [3.0, 8.0]], dtype=torch.float64))
    assert torch.allclose(rec["scaled"], torch.tensor([[1.5, 1.0], [0.75, 2.0]], dtype=torch.float64))
    w = rec["weights"]
    expected = [[math.exp(1.5) / (math.exp(1.5) + math.exp(1.0)), 0], [math.exp(0.75) / (math.exp(0.75) + math.exp(2.0)), 0]]
    expected[0][1] = 1 - expected[0][0]
    expected[1][1] = 1 - expected[1][0]
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    # the notes print two decimals: 0.62 / 0.38 and 0.22 / 0.78
    assert [[round(x, 2) for x in row] for row in w.tolist()] == [[0.62, 0.38], [0.22, 0.78]]
    # A_1 = 0.62 v_1 + 0.38 v_2 (with the unrounded weights)
    assert torch.allclose(out[0], w[0, 0] * v[0] + w[0, 1] * v[1])


def test_sinusoidal_encoding_is_the_formula():
    for n, d in [(4, 4), (50, 128), (7, 9)]:
        pe = sinusoidal_encoding(n, d, dtype=torch.float64)
        for i in range(n):
            for c in range(d):
                j = c // 2
                angle = i / 10000 ** (2 * j / d)
                ref = math.sin(angle) if c % 2 == 0 else math.cos(angle)
                assert abs(pe[i, c].item() - ref) < 1e-12


def test_show_me_the_money_in_radians_seed_003():
    """The notes print PE_1 = [0.02, 1, 0, 1]: sin(1 degree) ~ 0.017. In radians (Vaswani et
    al.) PE_1 = [sin 1, cos 1, sin 0.01, cos 0.01] = [0.84, 0.54, 0.01, 1.00]."""
    pe = sinusoidal_encoding(4, 4, dtype=torch.float64)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert [round(x, 2) for x in pe[1].tolist()] == [0.84, 0.54, 0.01, 1.0]
    assert round(math.sin(math.radians(1)), 2) == 0.02  # where the notes' 0.02 comes from
    money = torch.tensor([0.41, 0.08, 0.51, 0.87], dtype=torch.float64)
    x = money + pe[3]  # equation (5), recomputed
    assert [round(v, 2) for v in x.tolist()] == [round(0.41 + math.sin(3), 2), round(0.08 + math.cos(3), 2),
                                                 round(0.51 + math.sin(0.03), 2), round(0.87 + math.cos(0.03), 2)]


@pytest.mark.parametrize("delta", [1, 3, 10])
def test_relative_position_is_a_rotation_seed_003_eq4(delta):
    d = 16
    pe = sinusoidal_encoding(40, d, dtype=torch.float64)
    for j in range(d // 2):
        w = 1 / 10000 ** (2 * j / d)
        m = torch.tensor([[math.cos(delta * w), math.sin(delta * w)], [-math.sin(delta * w), math.cos(delta * w)]],
                         dtype=torch.float64)
        for i in range(0, 40 - delta, 7):
            assert torch.allclose(m @ pe[i, 2 * j : 2 * j + 2], pe[i + delta, 2 * j : 2 * j + 2], atol=1e-12)


def test_look_ahead_mask_seed_003():
    """B for "<start> not on your life <end>": 0 on and below the diagonal, -inf above;
    after softmax the upper triangle is exactly 0 and rows sum to 1."""
    b = causal_mask(6)
    assert (b.tril() == 0).all() and torch.isneginf(b.triu(1)[b.triu(1) != 0]).all()
    assert torch.isneginf(b[0, 1:]).all() and (b[5] == 0).all()
    scores = torch.randn(6, 6) * 5
    rec = {}
    scaled_dot_product_attention(scores, torch.eye(6), torch.randn(6, 3), b, record=lambda n, t: rec.__setitem__(n, t))
    w = rec["weights"]
    assert (w.triu(1) == 0).all()
    assert torch.allclose(w.sum(-1), torch.ones(6))
    assert w[0, 0] == 1.0
