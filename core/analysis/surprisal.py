"""How surprising each token of a decoder's input is to the model: surprisal and entropy.

For token t (t >= 1) of a decoder-only model's input, the distribution p( . | tokens < t) is
the softmax of the logits at position t - 1, and

    surprisal[t] = -log2 p(token t | tokens < t)          (bits)
    entropy[t]   = -sum_v p(v | tokens < t) log2 p(v | ...) (bits: how unsure the model was)

Token 0 has no prediction (NaN). The logits are computed from the trace's stored final
hidden states ROWS positions at a time (never n x V at once: 1.5 GB at 8,192 tokens of
SmolLM2), through the trace's runner.
"""

from __future__ import annotations

import math
from typing import Dict

import numpy as np
import torch

from ..head_maps import derived

ROWS = 256


def surprisal(trace) -> Dict[str, np.ndarray]:
    """{'surprisal': n bits, 'entropy': n bits, 'p': n probabilities} for a decoder-only trace
    (meta 'target_ids'); kept with the trace (core.head_maps.derived)."""
    if trace.meta.get("kind") != "decoder":
        raise ValueError("surprisal needs a decoder-only model (it predicts each next token)")
    key = ("surprisal",)
    memo = derived(trace)
    if key in memo:
        return memo[key]
    ids = torch.as_tensor(list(trace.meta["target_ids"]), dtype=torch.long)
    n = len(ids)
    runner = trace.runner
    s = np.full(n, np.nan)
    e = np.full(n, np.nan)
    p = np.full(n, np.nan)
    with torch.inference_mode():
        for r0 in range(0, n - 1, ROWS):
            r1 = min(n - 1, r0 + ROWS)
            if runner is not None:
                logits = runner.logits(trace, rows=slice(r0, r1))
            else:
                logits = trace["logits"][r0:r1]
            logp = torch.log_softmax(logits.double(), dim=-1)
            nxt = logp.gather(1, ids[r0 + 1:r1 + 1, None])[:, 0]
            s[r0 + 1:r1 + 1] = (-nxt / math.log(2)).numpy()
            p[r0 + 1:r1 + 1] = nxt.exp().numpy()
            e[r0 + 1:r1 + 1] = (-(logp.exp() * logp).sum(-1) / math.log(2)).numpy()
    out = {"surprisal": s, "entropy": e, "p": p}
    memo[key] = out
    return out
