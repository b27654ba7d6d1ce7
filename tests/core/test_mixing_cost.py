"""The home path's cost count (core.net.cost.mixing_cost) against torch's own FLOP counter, run on
the computations the count describes: softmax attention with its four projections, and a linear
mixer that writes every token into a d_k x d_v state per head and reads it with the query."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from core.net.cost import mixing_cost


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops() // 2  # torch counts a multiply-add as two FLOPs


def test_counts_match_torch_flop_counter():
    n, d, h = 12, 32, 4
    d_k = d // h
    x = torch.randn(n, d)
    w = [torch.randn(d, d) for _ in range(4)]

    def softmax_layer():
        q, k, v = x @ w[0], x @ w[1], x @ w[2]
        out = []
        for i in range(h):
            s = slice(i * d_k, (i + 1) * d_k)
            a = torch.softmax(q[:, s] @ k[:, s].T, -1)
            out.append(a @ v[:, s])
        return torch.cat(out, -1) @ w[3]

    def linear_layer():
        q, k, v = x @ w[0], x @ w[1], x @ w[2]
        out = torch.zeros(n, d)
        for i in range(h):
            s = slice(i * d_k, (i + 1) * d_k)
            state = torch.zeros(d_k, d_k)
            for t in range(n):
                state = state + k[t, s, None] @ v[t, None, s]  # write
                out[t, s] = (q[t, None, s] @ state)[0]  # read
        return out @ w[3]

    c = mixing_cost(torch.tensor([n]).numpy(), d, d_k)
    assert _counted(softmax_layer) == int(c["softmax"][0])
    assert _counted(linear_layer) == int(c["linear"][0])
    assert int(c["cache"][0]) == 2 * n * d and int(c["state"][0]) == h * d_k * d_k
