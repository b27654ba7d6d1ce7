"""Mixture-of-experts FFNs (ModelConfig.moe), as transformers' eager code computes them.

    gpt_oss:  logits = x W_r^T + b_r; the top-k logits' softmax weighs the k experts chosen
              (router probabilities p_e); expert e: [g, u] = x W_gu^e + b_gu^e (gate and up
              interleaved: g = even columns, u = odd ones), g = min(g, limit),
              u = clamp(u, -limit, limit), h = (u + 1) * g * sigmoid(alpha g),
              out_e = h W_d^e + b_d^e;  FFN(x) = sum over the chosen e of p_e out_e.
    llama4:   logits = x W_r^T; s_e = sigmoid(logit_e) for the top-k, 0 for the rest; the
              input is scaled BEFORE the expert: out_e = W_d^e (silu(g) * u) of [g | u] =
              (s_e x) W_gu^e (gate and up as halves); FFN(x) = shared(x) + sum_e out_e, the
              shared expert a SwiGLU FFN of d_expert.
    deepseek: logits = x W_r^T (float32); s = sigmoid(logits); the choice reads s + b (b: the
              e_score_correction_bias, never the weights): the experts fall in n_group groups,
              a group's score is the sum of its two best, the topk_group best groups stay and
              the top-k experts are chosen among theirs; p_e = s_e (over sum of the chosen s
              where norm_topk_prob) times routed_scaling_factor; expert e: [g | u] = x W_gu^e
              (halves), out_e = (silu(g) * u) W_d^e; FFN(x) = sum_e p_e out_e + shared(x), the
              shared experts one SwiGLU FFN of d_shared. The layers before first_k_dense_replace
              keep a dense FFN (ModelConfig.moe's "layers").
    qwen3_next: logits = x W_r^T; p = softmax(logits) over all E experts, the top-k kept (divided
              by their sum where norm_topk); expert e: [g | u] = x W_gu^e (halves),
              out_e = (silu(g) * u) W_d^e;  FFN(x) = sum over the chosen e of p_e out_e
              + sigmoid(x w_sg) shared(x), the shared expert a SwiGLU FFN of d_shared and w_sg
              its one-output gate (Qwen3-Next); "shared_gate": False: + shared(x), ungated
              (GraniteMoeHybrid, whose softmax over the top-k logits is this with norm_topk).

Recorded under the layer's `ffn.`: `router` (n x E: the router's logits) and `out`
(a hook point, as the dense FFN's).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .hooks import point
from .linear import Linear
from .recorder import Rec


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.moe
        self.kind = m["kind"]
        self.n_experts, self.top_k = int(m["experts"]), int(m["top_k"])
        d, de = cfg.d_model, int(m["d_expert"])
        gpt = self.kind == "gpt_oss"
        self.norm_topk = bool(m.get("norm_topk", True))
        self.router = Linear(d, self.n_experts, bias=gpt)
        if self.kind == "deepseek":  # experts stored (E, 2 m_e, d) and (E, d, m_e), as transformers keeps them
            self.score_bias = nn.Parameter(torch.zeros(self.n_experts))
            self.n_group, self.topk_group = int(m.get("n_group") or 1), int(m.get("topk_group") or 1)
            self.norm_topk, self.routed_scale = bool(m.get("norm_topk_prob", True)), float(m.get("routed_scaling_factor", 1.0))
            self.gate_up = nn.Parameter(torch.empty(self.n_experts, 2 * de, d).uniform_(-d ** -0.5, d ** -0.5))
            self.down = nn.Parameter(torch.empty(self.n_experts, d, de).uniform_(-de ** -0.5, de ** -0.5))
            ds = int(m.get("d_shared") or de)
            self.shared_w_1, self.shared_w_3 = Linear(d, ds, bias=False), Linear(d, ds, bias=False)
            self.shared_w_2 = Linear(ds, d, bias=False)
            return
        # (E, d, 2 m_e) and (E, m_e, d) as checkpoints store them; a random model draws them as
        # nn.Linear draws its weights (uniform within 1/sqrt(fan_in)), biases 0
        self.gate_up = nn.Parameter(torch.empty(self.n_experts, d, 2 * de).uniform_(-d ** -0.5, d ** -0.5))
        self.down = nn.Parameter(torch.empty(self.n_experts, de, d).uniform_(-de ** -0.5, de ** -0.5))
        if gpt:
            self.gate_up_bias = nn.Parameter(torch.zeros(self.n_experts, 2 * de))
            self.down_bias = nn.Parameter(torch.zeros(self.n_experts, d))
            self.alpha, self.limit = float(m.get("alpha", 1.702)), float(m.get("limit", 7.0))
        else:
            ds = int(m.get("d_shared", de)) if self.kind == "qwen3_next" else de
            self.shared_w_1 = Linear(d, ds, bias=False)  # the shared expert: gate, up, down
            self.shared_w_3 = Linear(d, ds, bias=False)
            self.shared_w_2 = Linear(ds, d, bias=False)
            self.shared_gate = None
            if self.kind == "qwen3_next" and m.get("shared_gate", True):
                self.shared_gate = Linear(d, 1, bias=False)  # sigmoid(x w_sg) scales the shared expert

    def _gpt_oss(self, x, logits):
        top, idx = torch.topk(logits, self.top_k, dim=-1)  # (N, k)
        probs = torch.softmax(top, dim=-1)
        out = torch.zeros_like(x)
        for e in torch.unique(idx).tolist():
            pos, tok = torch.where((idx == e).T)  # (slot, token) pairs that chose expert e
            gu = x[tok] @ self.gate_up[e] + self.gate_up_bias[e]
            g, u = gu[..., ::2].clamp(max=self.limit), gu[..., 1::2].clamp(-self.limit, self.limit)
            h = (u + 1) * (g * torch.sigmoid(g * self.alpha))
            y = h @ self.down[e] + self.down_bias[e]
            out.index_add_(0, tok, y * probs[tok, pos, None])
        return out

    def _llama4(self, x, logits):
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        scores = torch.sigmoid(torch.full_like(logits, float("-inf")).scatter_(1, idx, top))  # (N, E)
        out = self.shared_w_2(F.silu(self.shared_w_1(x)) * self.shared_w_3(x))
        de = self.down.shape[1]
        for e in torch.unique(idx).tolist():  # an expert's output on a zero input is zero (no biases)
            gu = (x * scores[:, e:e + 1]) @ self.gate_up[e]
            out = out + (gu[..., de:] * F.silu(gu[..., :de])) @ self.down[e]
        return out

    def choose(self, logits):
        """deepseek: (weights (N, k), experts (N, k)) of router logits (N, E)."""
        scores = torch.sigmoid(logits)
        pick = scores + self.score_bias
        n, e = pick.shape
        groups = pick.view(n, self.n_group, e // self.n_group).topk(min(2, e // self.n_group), dim=-1)[0].sum(-1)
        keep = torch.zeros_like(groups).scatter_(1, torch.topk(groups, self.topk_group, dim=-1)[1], 1.0)
        keep = keep.bool()[:, :, None].expand(n, self.n_group, e // self.n_group).reshape(n, e)
        idx = torch.topk(pick.masked_fill(~keep, float("-inf")), self.top_k, dim=-1)[1]
        w = scores.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * self.routed_scale, idx

    def _deepseek(self, x, logits):
        w, idx = self.choose(logits)
        out = torch.zeros_like(x)
        de = self.down.shape[2]
        for e in torch.unique(idx).tolist():
            tok, slot = torch.where(idx == e)
            gu = x[tok] @ self.gate_up[e].T
            y = (F.silu(gu[..., :de]) * gu[..., de:]) @ self.down[e].T
            out.index_add_(0, tok, y * w[tok, slot, None])
        return out + self.shared_w_2(F.silu(self.shared_w_1(x)) * self.shared_w_3(x))

    def _qwen3_next(self, x, logits):
        probs = torch.softmax(logits.float(), dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)  # (N, k)
        if self.norm_topk:
            top = top / top.sum(-1, keepdim=True)
        shared = self.shared_w_2(F.silu(self.shared_w_1(x)) * self.shared_w_3(x))
        out = shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(x)) * shared
        de = self.down.shape[1]
        for e in torch.unique(idx).tolist():
            pos, tok = torch.where((idx == e).T)  # (slot, token) pairs that chose expert e
            gu = x[tok] @ self.gate_up[e]
            y = (F.silu(gu[..., :de]) * gu[..., de:]) @ self.down[e]
            out = out.index_add(0, tok, y * top[tok, pos, None].to(y.dtype))
        return out

    def forward(self, x, rec: Rec = None):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = self.router(flat)  # (N, E)
        run = {"gpt_oss": self._gpt_oss, "llama4": self._llama4, "deepseek": self._deepseek,
               "qwen3_next": self._qwen3_next}[self.kind]
        out = run(flat, logits)
        if rec:
            rec("router", logits.view(*shape[:-1], -1))
        return point(rec, "out", out.view(shape))
