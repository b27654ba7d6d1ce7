"""The lens, direct logit attribution, activation patching and head ablation on Gemma 2 and
GPT-NeoX (Pythia) against transformers: tiny random checkpoints written by transformers with
save_pretrained and read back with core.load_model. Gemma 2 with its final logit soft-cap,
attention soft-cap, a sliding window shorter than the sentence and the norms after each
sub-layer; GPT-NeoX with the parallel block and partial rotary positions. The references are
written here from transformers' own modules (hidden states, forward hooks), not this core."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import core
import core.analysis as ca
import gemma_builders
import hf_builders
from hf_builders import SENTENCES, save
from test_patching import HFPatcher

pytest.importorskip("transformers")

TOL = 1e-4
FAMILIES = ["gemma2", "gpt_neox"]
CLEAN = "the small dog sees the cat near the old river bank"
CORRUPT = "the small cat sees the dog near the old river bank"


class Parts:
    """The pieces of a transformers causal LM the references read."""

    def __init__(self, hf):
        self.hf = hf
        if hasattr(hf, "gpt_neox"):
            m = hf.gpt_neox
            self.layers, self.norm, self.lm_head = list(m.layers), m.final_layer_norm, hf.get_output_embeddings()
            self.attn = [l.attention for l in self.layers]
            self.o_proj = [l.attention.dense for l in self.layers]
            self.cap = None
        else:
            m = hf.model
            self.layers, self.norm, self.lm_head = list(m.layers), m.norm, hf.lm_head
            self.attn = [l.self_attn for l in self.layers]
            self.o_proj = [l.self_attn.o_proj for l in self.layers]
            self.cap = hf.config.final_logit_softcapping
        self.mlp = [l.mlp for l in self.layers]
        self.n_heads = hf.config.num_attention_heads
        self.d_head = self.o_proj[0].weight.shape[1] // self.n_heads

    def head(self, h):
        """The model's own output head on residual-stream vectors: final norm, lm_head, final soft-cap."""
        logits = self.lm_head(self.norm(h))
        return logits if self.cap is None else self.cap * torch.tanh(logits / self.cap)

    def logits(self, ids):
        with torch.no_grad():
            return self.hf(torch.tensor([ids]), use_cache=False).logits[0].double()


@pytest.fixture(scope="module")
def fam(tmp_path_factory):
    """family -> (transformers model, Parts, our model of the same folder), built once."""
    root = tmp_path_factory.mktemp("family-analyses")
    made = {}

    def get(family, **over):
        key = (family, tuple(sorted(over.items())))
        if key not in made:
            folder = root / f"{family}-{len(made)}"
            build = gemma_builders.build if family.startswith("gemma") else hf_builders.build
            hf, folder = build(family, folder, **over)
            save(hf, folder)
            hf.config._attn_implementation = "eager"  # Gemma 2's attention soft-cap is in the eager path
            made[key] = hf, Parts(hf), core.load_model(str(folder), device="cpu")
        return made[key]

    return get


def test_the_checkpoints_have_their_peculiarities(fam):
    _, _, g = fam("gemma2")
    cfg = g.config
    assert cfg.final_softcap == 3.0 and cfg.post_sublayer_norm and cfg.sliding_window == 4
    assert len(g.tokenizer.encode(SENTENCES[0]).ids) > 4  # the window is shorter than the sentence
    _, _, p = fam("gpt_neox")
    assert p.config.parallel_block and 0 < p.config.rotary_dim < p.config.d_head


# ------------------------------------------------------------------ the logit lens
@pytest.mark.parametrize("family", FAMILIES)
def test_lens_matches_transformers_hidden_states(fam, family):
    hf, parts, ours = fam(family)
    tr = ours.trace(SENTENCES[0])
    ids = tr.meta["target_ids"]
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    final = torch.log_softmax(out.logits[0].double(), -1)
    # transformers' last hidden state is the final norm's output; the lens reads the last layer's
    # output before it, which a forward hook on the last layer gives
    kept = {}
    h = parts.layers[-1].register_forward_hook(lambda m, a, o: kept.update(v=(o[0] if isinstance(o, tuple) else o)))
    try:
        parts.logits(ids)
    finally:
        h.remove()
    streams = list(out.hidden_states[:-1]) + [kept["v"]]
    assert len(streams) == tr.layers("decoder") + 1
    df = ca.lens(tr, positions=range(len(ids)))
    worst = 0.0
    kls = []
    with torch.no_grad():
        for layer, hs in enumerate(streams):
            logp = torch.log_softmax(parts.head(hs[0]).double(), -1)
            p = logp.exp()
            tgt = final.argmax(-1)
            ref = {"target_prob": p.gather(1, tgt[:, None])[:, 0].numpy(), "entropy": (-(p * logp).sum(-1)).numpy(),
                   "kl": (final.exp() * (final - logp)).sum(-1).numpy()}
            rows = df[df.layer == layer].sort_values("position")
            for col, v in ref.items():
                worst = max(worst, float(np.abs(rows[col].to_numpy() - v).max()))
            top = np.stack(rows.top_probs.to_numpy())
            worst = max(worst, float(np.abs(top - torch.topk(p, top.shape[1]).values.numpy()).max()))
            kls.append(ref["kl"].max())
    assert worst < TOL, worst
    assert kls[0] > 1e-2  # the lens moves between layers, so the comparison can fail
    assert df[df.layer == df.layer.max()].kl.max() < 1e-6


# ------------------------------------------------------------------ direct logit attribution
@torch.no_grad()
def reference_attribution(parts, ids, target, baseline, position, post_norms=False):
    """Every head's direct logit attribution from hooks: its slice of Concat(heads) through its
    slice of the output projection (and, with post_norms, the post-attention RMSNorm with its
    scale frozen at the hooked attention output), through the final norm with its scale frozen
    at the hooked final input, dotted with W_U[target] - W_U[baseline]."""
    got = {"concat": {}, "attn": {}}
    hs = [parts.norm.register_forward_pre_hook(lambda m, a: got.__setitem__("final_in", a[0][0, position].double()))]
    for i in range(len(parts.layers)):
        hs.append(parts.o_proj[i].register_forward_pre_hook(
            lambda m, a, i=i: got["concat"].__setitem__(i, a[0][0, position].double())))
        hs.append(parts.o_proj[i].register_forward_hook(
            lambda m, a, o, i=i: got["attn"].__setitem__(i, o[0, position].double())))
    try:
        logits = parts.logits(ids)
    finally:
        for h in hs:
            h.remove()
    norm, x = parts.norm, got["final_in"]
    u = parts.lm_head.weight[target].double() - parts.lm_head.weight[baseline].double()
    centre = isinstance(norm, torch.nn.LayerNorm)
    if centre:
        s, g = 1.0 / torch.sqrt(x.var(unbiased=False) + norm.eps), norm.weight.double()
    else:  # Gemma's RMSNorm scales by 1 + w
        s, g = 1.0 / torch.sqrt(x.pow(2).mean() + norm.eps), 1.0 + norm.weight.double()
    out = np.zeros((len(parts.layers), parts.n_heads))
    for i in range(len(parts.layers)):
        c, w = got["concat"][i], parts.o_proj[i].weight.double()
        if post_norms:
            pn, a = parts.layers[i].post_attention_layernorm, got["attn"][i]
            post = (1.0 + pn.weight.double()) / torch.sqrt(a.pow(2).mean() + pn.eps)
        for h in range(parts.n_heads):
            sl = slice(h * parts.d_head, (h + 1) * parts.d_head)
            term = c[sl] @ w[:, sl].T
            if post_norms:
                term = term * post
            if centre:
                term = term - term.mean()
            out[i, h] = float((term * s * g) @ u)
    return out, float(logits[position, target] - logits[position, baseline])


def _check_attribution(parts, ours, post_norms=False):
    tr = ours.trace(SENTENCES[1])
    ids, p = tr.meta["target_ids"], 5
    top2 = tr["topk.ids"][p].tolist()[:2]
    df = ca.logit_attribution(tr, top2[0], baseline=top2[1], position=p)
    ref, diff = reference_attribution(parts, ids, top2[0], top2[1], p, post_norms)
    heads = df[df.kind == "head"]
    grid = np.full(ref.shape, np.nan)
    grid[heads.layer.to_numpy(), heads["head"].to_numpy()] = heads.contribution.to_numpy()
    assert np.abs(ref).max() > 1e-2  # the heads move the logit difference, so the comparison can fail
    assert np.abs(grid - ref).max() < TOL, np.abs(grid - ref).max()
    assert abs(df.contribution.sum() - diff) <= TOL * max(1.0, abs(diff)), (df.contribution.sum(), diff)
    return df


def test_pythia_logit_attribution_matches_transformers(fam):
    """The parallel block: the MLP reads the layer's input, not the stream after the attention."""
    _, parts, ours = fam("gpt_neox")
    df = _check_attribution(parts, ours)
    assert {"attn_bias", "norm_bias", "mlp"} <= set(df.kind)


def test_gemma2_logit_attribution_refuses_the_final_soft_cap(fam):
    _, _, ours = fam("gemma2")
    with pytest.raises(ValueError, match="soft-cap"):
        ca.logit_attribution(ours.trace(SENTENCES[1]), 0, baseline=1)


def test_gemma2_without_the_cap_attributes_through_the_post_norms(fam):
    """The same architecture without the final soft-cap: the norms after the sub-layers are
    linear at their traced scales, so the rows add up to the logit difference exactly."""
    _, parts, ours = fam("gemma2", final_logit_softcapping=None)
    assert ours.config.final_softcap is None and ours.config.post_sublayer_norm
    _check_attribution(parts, ours, post_norms=True)


# ------------------------------------------------------------------ activation patching
# the two sentences differ from position 5 on (" do" "g" / " cat"), for both tokenizers
CELLS = {"resid_pre": [(0, 5), (1, 6), (1, 10), (2, 11)], "attn_out": [(0, 11), (1, 10), (1, 24), (2, 24)],
         "mlp_out": [(0, 5), (1, 11), (1, 24), (2, 24)], "head": [(0, 1), (1, 3), (2, 0)]}


@pytest.mark.parametrize("family", FAMILIES)
def test_patching_matches_transformers_hooks(fam, family):
    hf, parts, ours = fam(family)
    ids_c, ids_x = ours.encode(CLEAN).ids, ours.encode(CORRUPT).ids
    assert len(ids_c) == len(ids_x) and [p for p, (a, b) in enumerate(zip(ids_c, ids_x)) if a != b][0] == 5
    top2 = parts.logits(ids_c)[-1].topk(2).indices.tolist()
    patcher = HFPatcher(hf, parts.layers, parts.attn, parts.mlp, parts.o_proj, parts.d_head)
    for what, cells in CELLS.items():
        cells = [(i, c) for i, c in cells if i < len(parts.layers)]
        df = ca.patch(ours, CLEAN, CORRUPT, top2[0], top2[1], what=what)
        m_x = patcher.metric(patcher._logits(ids_x), *top2)
        assert abs(m_x - df.attrs["corrupt_metric"]) < TOL
        key = "head" if what == "head" else "position"
        worst = moved = 0.0
        for i, c in cells:
            row = df[(df.layer == i) & (df[key] == c)]
            assert len(row) == 1
            ref = patcher.patched(ids_c, ids_x, top2[0], top2[1], what, i, c)
            worst = max(worst, abs(ref - row.metric.iloc[0]))
            moved = max(moved, abs(ref - m_x))
        assert worst < TOL, (what, worst)
        assert moved > 100 * TOL, (what, moved)  # the patches change the metric, so the comparison can fail


# ------------------------------------------------------------------ head ablation
@pytest.mark.parametrize("family", FAMILIES)
def test_ablation_of_two_heads_matches_o_proj_pre_hook(fam, family):
    _, parts, ours = fam(family)
    heads = [("decoder", 0, 1), ("decoder", 1, 2)]
    tr = ours.trace(SENTENCES[0], ablate=heads)
    ids, got = tr.meta["target_ids"], tr["logits"].double()

    def zero(hs):
        def hook(m, a):
            x = a[0].clone()
            for h in hs:
                x[..., h * parts.d_head:(h + 1) * parts.d_head] = 0.0
            return (x,) + tuple(a[1:])
        return hook

    handles = [parts.o_proj[l].register_forward_pre_hook(zero([h for _, l2, h in heads if l2 == l]))
               for l in sorted({l for _, l, _ in heads})]
    try:
        ref = parts.logits(ids)
    finally:
        for h in handles:
            h.remove()
    plain = parts.logits(ids)
    assert (plain - ref).abs().max() > 100 * TOL  # the heads matter, so the comparison can fail
    assert (got - ref).abs().max() < TOL, float((got - ref).abs().max())
