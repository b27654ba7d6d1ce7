"""Score attribution (core.analysis.score_attribution / pattern_attribution) against a float64
computation written here from the contract alone: no code of core.analysis is used. The
reference takes every component as a whole d-vector at one position (embeddings and token
types from the trace; each head's stored output times its d_k columns of W_o from the raw
state dict; each MLP's recorded output; every norm's and bias's shift), maps them through
every norm with its scale frozen at the norm's RECORDED input (the trace's residual / out /
sub-layer outputs), projects each through W_q^h and W_k^g from the state dict, applies QK-norm
frozen at the recorded pre-norm q / k, rotates by RoPE written here (the layer's own base) and
pairs them. Every term and the sum are compared, and the sum with the model's own score.

Families: smollm2 (a short text), toy-translate, and one tiny random checkpoint each of BERT,
GPT-2, Llama, Qwen3 (QK-norm, GQA, d_k != d / H), Gemma 2 (norms after the sub-layers, soft-cap,
sliding window), GPT-NeoX (parallel block, partial rotary), OLMo-2 (full QK-norm, no pre norms),
ModernBERT (embedding norm, identity first norm, local RoPE base), Marian and BART
(post-norm cross-attention: decoder queries, encoder keys) and T5 (pre-norm, the encoder's
final norm before the keys, relative position bias outside the score)."""

from __future__ import annotations

import math
import weakref

import pytest
import torch

import core
import core.analysis as ca

F64 = torch.float64
TOL = 1e-4


# ------------------------------------------------------------------------------ the reference
_SD64 = weakref.WeakKeyDictionary()


def _sd64(model):
    """The model's state dict in float64, made once per model (the reference reads it at every position)."""
    sd = _SD64.get(model.net)
    if sd is None:
        sd = _SD64[model.net] = {k: v.detach().to(F64) for k, v in model.net.state_dict().items()}
    return sd


def _norm_map(sd, prefix, z, eps, layer_norm):
    """A norm frozen at z (its recorded input, d): fn(v, with_shift) and its shift (or None).
    None when the state dict holds no such norm (an identity)."""
    w = sd.get(prefix + ".weight")
    b = sd.get(prefix + ".bias")
    if w is None:
        return None
    z = z.to(F64)
    if layer_norm:
        s = 1.0 / math.sqrt(float(((z - z.mean()) ** 2).mean()) + eps)
    else:
        s = 1.0 / math.sqrt(float((z ** 2).mean()) + eps)

    def fn(v):
        if layer_norm:
            v = v - v.mean()
        return v * s * w

    return fn, b


def _through(comps, nm, bias_name):
    """Every component mapped by a frozen norm (nm: (fn, shift)); its shift one more component."""
    if nm is None:
        return comps
    fn, b = nm
    out = [(n, fn(v)) for n, v in comps]
    if b is not None:
        out.append((bias_name, b.clone()))
    return out


def _rope(v, p, dims, base, layout):
    """v (d_k,) rotated for position p: pairs of the first `dims` features by p * base^(-2k/dims)."""
    v = v.clone()
    half = dims // 2
    for k in range(half):
        ang = p * base ** (-2.0 * k / dims)
        c, s = math.cos(ang), math.sin(ang)
        a, b = (k, k + half) if layout == "half" else (2 * k, 2 * k + 1)
        x1, x2 = float(v[a]), float(v[b])
        v[a], v[b] = x1 * c - x2 * s, x2 * c + x1 * s
    return v


def _stream(model, tr, stack, p, upto, prefix=""):
    """[(name, d-vector)] of `stack` at position p: entering sub-layer `upto` = (layer, kind)
    (before that sub-layer's own pre-norm), or the stack's output (upto None), plus the recorded
    value the last pre-norm is frozen at."""
    cfg = model.config
    sd = _sd64(model)
    ln = cfg.norm == "layernorm"
    eps = cfg.norm_eps
    pre = cfg.norm_placement == "pre"
    emb = "src_embed" if stack == "encoder" else "tgt_embed"
    comps = [(prefix + "embed", tr[f"embed.{stack}.tokens"][p].to(F64))]
    for part in ("positions", "types"):
        if f"embed.{stack}.{part}" in tr:
            comps.append((prefix + part, tr[f"embed.{stack}.{part}"][p].to(F64)))
    if f"{emb}.norm.weight" in sd:
        comps = _through(comps, _norm_map(sd, f"{emb}.norm", tr[f"embed.{stack}.presum_norm"][p], eps, True),
                         prefix + "bias")
    n_layers = len(model.net.layers(stack))
    for i in range(n_layers):
        layer = model.net.layers(stack)[i]
        subs = ["self_attn"] + (["cross_attn"] if layer.cross_attn is not None else []) + ["ffn"]
        x_in = tr[f"embed.{stack}.sum"][p] if i == 0 else tr[f"{stack}.{i - 1}.out"][p]
        for j, kind in enumerate(subs, start=1):
            before = x_in if j == 1 else tr[f"{stack}.{i}.residual{j - 1}"][p]
            if upto == (i, kind):
                return comps, (x_in if cfg.parallel_block else before), f"{stack}.{i}.norms.{j - 1}"
            if kind == "ffn":
                new = [(f"{prefix}L{i}.mlp", tr[f"{stack}.{i}.ffn.out"][p].to(F64))]
                raw = tr[f"{stack}.{i}.ffn.out"][p]
            else:
                dk = cfg.d_head
                w_o = sd[f"{stack}.{i}.{kind}.w_o.weight"]
                heads = tr[f"{stack}.{i}.{kind}.heads"][:, p].to(F64)
                tag = "" if kind == "self_attn" else "x"
                new = [(f"{prefix}L{i}{tag}H{h}", w_o[:, h * dk:(h + 1) * dk] @ heads[h]) for h in range(cfg.n_heads)]
                if f"{stack}.{i}.{kind}.w_o.bias" in sd:
                    bname = "attn_bias" if kind == "self_attn" else "cross_attn_bias"
                    new.append((f"{prefix}L{i}.{bname}", sd[f"{stack}.{i}.{kind}.w_o.bias"]))
                raw = tr[f"{stack}.{i}.{kind}.out"][p]
            if f"{stack}.{i}.post_norms.{j - 1}.weight" in sd:  # the write normed, frozen at itself
                new = _through(new, _norm_map(sd, f"{stack}.{i}.post_norms.{j - 1}", raw, eps, ln), prefix + "bias")
            comps = comps + new
            if not pre:
                comps = _through(comps, _norm_map(sd, f"{stack}.{i}.norms.{j - 1}", tr[f"{stack}.{i}.residual{j}"][p],
                                                  eps, ln), prefix + "bias")
    last = tr[f"{stack}.{n_layers - 1}.out"][p]
    return comps, last, f"{stack}_norm"


def side_vectors(model, tr, stack, layer, head, attn, which, p):
    """[(component, d_k vector)] of head `head`'s q (which="q"; `head` a query head), k or v
    (a kv head) at position p, in float64: the stream's components mapped through the frozen
    norms, W_q / W_k / W_v from the state dict, QK-norm and RoPE (q and k only)."""
    cfg = model.config
    sd = _sd64(model)
    ln, eps, dk = cfg.norm == "layernorm", cfg.norm_eps, cfg.d_head
    pre = cfg.norm_placement == "pre"
    base = f"{stack}.{layer}.{attn}"
    h = head
    if attn == "cross_attn" and which != "q":
        stream_stack, upto, prefix = "encoder", None, "enc."
    else:
        stream_stack, upto, prefix = stack, (layer, attn), ""
    comps, frozen_at, norm_name = _stream(model, tr, stream_stack, p, upto, prefix)
    if pre:
        comps = _through(comps, _norm_map(sd, norm_name, frozen_at, eps, ln), prefix + "bias")
    w = sd[f"{base}.w_{which}.weight"][h * dk:(h + 1) * dk]
    vecs = [(n, w @ v) for n, v in comps]
    if f"{base}.w_{which}.bias" in sd:
        vecs.append(("bias", sd[f"{base}.w_{which}.bias"][h * dk:(h + 1) * dk]))
    if which == "v":
        return vecs
    if f"{base}.{which}_norm.weight" in sd:  # QK-norm at its recorded input
        rec = tr[f"{base}.{which}_pre_norm"][:, p].to(F64)  # heads x d_k
        gain = sd[f"{base}.{which}_norm.weight"]
        if cfg.qk_norm == "full":
            fac = 1.0 / math.sqrt(float((rec ** 2).mean()) + eps)
            gain = gain[h * dk:(h + 1) * dk]
        else:
            fac = 1.0 / math.sqrt(float((rec[h] ** 2).mean()) + eps)
        vecs = [(n, v * fac * gain) for n, v in vecs]
    elif cfg.qk_norm == "l2" and (cfg.qk_norm_layers is None or layer in cfg.qk_norm_layers):
        # Llama 4: an RMSNorm without gain over each head, frozen at this position's own q or k
        # (the sum of the side's vectors: the norm's input, as projected)
        whole = sum(v for _, v in vecs)
        fac = 1.0 / math.sqrt(float((whole ** 2).mean()) + eps)
        vecs = [(n, v * fac) for n, v in vecs]
    nope = cfg.nope_layers is not None and layer in cfg.nope_layers  # SmolLM3, Llama 4, EXAONE 4: no rotation
    if cfg.positional == "rope" and attn == "self_attn" and not nope:
        local = cfg.layer_types is not None and cfg.layer_types[layer] == "sliding_attention"
        theta = cfg.rope_theta_local if (local and cfg.rope_theta_local is not None) else cfg.rope_theta
        factor = 1.0
        dims = cfg.rotary_dim or dk
        if cfg.rope_scaling and cfg.rope_scaling["type"] == "yarn":
            # YaRN (gpt-oss): the frequencies are core's (held against transformers by the logits'
            # parity of tests/parity/test_new_attention.py); the rotation, and the attention factor
            # on cos and sin (so on each side), are written here
            from core.net.positional import rope_attention_factor, rope_inv_freq
            inv = rope_inv_freq(dims, theta, cfg.rope_scaling).double()
            att = rope_attention_factor(cfg.rope_scaling)
            return [(n, att * _rope_freqs(v, p, inv, cfg.rope_layout)) for n, v in vecs]
        if not (local and cfg.rope_theta_local is not None) and cfg.rope_scaling:
            assert cfg.rope_scaling["type"] == "linear"
            factor = float(cfg.rope_scaling["factor"])
        vecs = [(n, _rope(v, p / factor, dims, theta, cfg.rope_layout)) for n, v in vecs]
    return vecs


def _rope_freqs(v, p, inv, layout):
    """v (d_k,) rotated for position p with the given frequencies (len(inv) pairs)."""
    v = v.clone()
    half = len(inv)
    for k in range(half):
        ang = p * float(inv[k])
        c, s = math.cos(ang), math.sin(ang)
        a, b = (k, k + half) if layout == "half" else (2 * k, 2 * k + 1)
        x1, x2 = float(v[a]), float(v[b])
        v[a], v[b] = x1 * c - x2 * s, x2 * c + x1 * s
    return v


def reference(model, tr, stack, layer, head, attn, i, j):
    """{(query component, key component): term} and their sum, in float64."""
    cfg = model.config
    dk = cfg.d_head
    g = head // (cfg.n_heads // cfg.n_kv_heads)
    qs = side_vectors(model, tr, stack, layer, head, attn, "q", i)
    ks = side_vectors(model, tr, stack, layer, g, attn, "k", j)
    scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / math.sqrt(dk)
    terms = {}
    for a, qa in qs:
        for b, kb in ks:
            terms[(a, b)] = terms.get((a, b), 0.0) + scale * float(qa @ kb)
    return terms


def _compare(model, tr, stack, layer, head, attn, i, j):
    df = ca.score_attribution(tr, stack, layer, head, i, j, attn=attn)
    ref = reference(model, tr, stack, layer, head, attn, i, j)
    ours = {(a, b): t for a, b, t in df[["query_component", "key_component", "term"]].itertuples(index=False)}
    assert set(ours) == set(ref), (set(ours) ^ set(ref))
    size = max(1.0, max(abs(v) for v in ref.values()))
    worst = max(abs(ours[k] - ref[k]) for k in ref)
    assert worst <= 2e-5 * size, (worst, size)
    # The score the analysis reports and the model's own score (its attention pass's scaled map)
    # are each held against the float64 reference written here (the sum of its terms), not
    # against each other: both read the same map, so comparing them would check only indexing.
    want = sum(ref.values())
    score = df.attrs["score"]
    own = float(tr[f"{stack}.{layer}.{attn}.scaled"][head, i, j])
    assert abs(score - want) <= TOL * max(1.0, abs(want)), (score, want)
    assert abs(own - want) <= TOL * max(1.0, abs(want)), (own, want)
    assert abs(df.attrs["sum"] - want) <= TOL * max(1.0, abs(want))
    assert abs(df["term"].sum() - df.attrs["sum"]) <= 1e-9 * max(1.0, abs(score))
    return df, ref


# ------------------------------------------------------------------------------ models
@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """family -> our model of a tiny random checkpoint, built once."""
    import gemma_builders
    import hf_builders

    root = tmp_path_factory.mktemp("score-attribution")
    made = {}

    def get(family):
        if family not in made:
            folder = root / family
            if family in ("marian", "bart", "t5"):
                from core.loaders import hf_seq2seq
                from test_hf_seq2seq import _build

                folder.mkdir()
                _build(family, folder)
                made[family] = hf_seq2seq.load(folder, device="cpu")
            else:
                build = gemma_builders.build if family in ("gemma2", "modernbert") else hf_builders.build
                model, folder = build(family, folder)
                hf_builders.save(model, folder)
                made[family] = core.load_model(str(folder), device="cpu")
        return made[family]

    return get


DECODERS = ["gpt2", "llama", "qwen3", "gemma2", "gpt_neox", "olmo2"]
ENCODERS = ["bert", "modernbert"]
TEXT = "the small dog sees the old cat near the river"


@pytest.mark.parametrize("family", DECODERS)
def test_decoder_families_match_the_reference(hf, family):
    pytest.importorskip("transformers")
    model = hf(family)
    tr = model.trace(TEXT)
    n = tr["embed.decoder.sum"].shape[0]
    layers = model.config.n_layers
    for layer, head, i, j in [(layers - 1, model.config.n_heads - 1, n - 1, 2), (1, 0, n - 2, n - 2), (0, 1, 3, 0)]:
        _compare(model, tr, "decoder", layer, head, "self_attn", i, j)
    cfg = model.config
    if family == "gemma2":
        assert cfg.attn_softcap is not None and cfg.post_sublayer_norm
        df = ca.score_attribution(tr, "decoder", 1, 0, n - 1, 1)
        assert df.attrs["capped"] == pytest.approx(float(tr["decoder.1.self_attn.capped"][0, n - 1, 1]), abs=1e-5)
    if family == "gpt_neox":
        assert cfg.parallel_block and cfg.rotary_dim < cfg.d_head
    if family == "olmo2":
        assert cfg.qk_norm == "full" and not cfg.pre_sublayer_norm
    if family == "qwen3":
        assert cfg.qk_norm == "head" and cfg.n_kv_heads < cfg.n_heads


@pytest.mark.parametrize("family", ENCODERS)
def test_encoder_families_match_the_reference(hf, family):
    pytest.importorskip("transformers")
    model = hf(family)
    tr = model.trace(TEXT)
    n = tr["embed.encoder.sum"].shape[0]
    for layer in range(model.config.n_layers):
        _compare(model, tr, "encoder", layer, layer % model.config.n_heads, "self_attn", 1, n - 2)
    _compare(model, tr, "encoder", 0, 0, "self_attn", n - 1, 0)


@pytest.mark.parametrize("family", ["marian", "bart", "t5"])
def test_seq2seq_self_and_cross_attention_match_the_reference(hf, family):
    pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    model = hf(family)
    tr = model.trace("the cat sat on the mat", target="the cat sat")
    n_t = tr["embed.decoder.sum"].shape[0]
    n_s = tr["embed.encoder.sum"].shape[0]
    for layer in range(model.config.n_decoder_layers):
        df, _ = _compare(model, tr, "decoder", layer, 1, "cross_attn", n_t - 1, n_s - 2)
        assert any(k.startswith("enc.") for k in df["key_component"])
        assert not any(q.startswith("enc.") for q in df["query_component"])
        _compare(model, tr, "decoder", layer, 2, "self_attn", n_t - 1, 1)
    _compare(model, tr, "encoder", 1, 0, "self_attn", 1, n_s - 1)


def test_toy_translate_matches_the_reference_and_splits_words_from_positions(toy):
    tr = toy.trace("the small dog sees the cat")
    n = tr["embed.encoder.sum"].shape[0]
    for layer, head, i, j in [(0, 0, 1, 2), (2, 3, n - 1, 0)]:
        _compare(toy, tr, "encoder", layer, head, "self_attn", i, j)
    n_t = tr["embed.decoder.sum"].shape[0]
    _compare(toy, tr, "decoder", 1, 0, "cross_attn", n_t - 1, 2)
    _compare(toy, tr, "decoder", 2, 1, "self_attn", n_t - 1, 0)
    # layer 0: the stream is words + positions, so every score is words x words, words x
    # positions, positions x words, positions x positions, and the bias terms
    df = ca.score_attribution(tr, "encoder", 0, 0, 1, 2)
    assert set(df["query_component"]) == {"embed", "positions", "bias"}
    words = df.query("query_component == 'embed' and key_component == 'embed'")["term"].sum()
    pos = df.query("query_component == 'positions' and key_component == 'positions'")["term"].sum()
    assert words != 0 and pos != 0
    # whole patterns: encoder self-attention, decoder self- and cross-attention
    for stack, layer, head, attn in [("encoder", 0, 1, "self_attn"), ("decoder", 2, 1, "self_attn"),
                                     ("decoder", 1, 0, "cross_attn")]:
        pa = ca.pattern_attribution(tr, stack, layer, head, attn=attn)
        w = tr[f"{stack}.{layer}.{attn}.weights"][head].double()
        s = tr[f"{stack}.{layer}.{attn}.scaled"][head].double()
        own = float((w * torch.where(w > 0, s, torch.zeros_like(s))).sum())
        assert pa.attrs["score"] == pytest.approx(own, abs=1e-6 * max(1.0, abs(own)))
        assert abs(pa.attrs["sum"] - own) <= TOL * max(1.0, abs(own))


def test_smollm2_terms_match_the_reference_and_pattern_sum(smollm2):
    tr = smollm2.trace("When Mary and John went to the store, John gave a drink to")
    n = tr["embed.decoder.sum"].shape[0]
    _compare(smollm2, tr, "decoder", 4, 3, "self_attn", n - 1, 1)
    _compare(smollm2, tr, "decoder", 0, 0, "self_attn", 5, 5)
    # versus: the terms of s_ij - s_ij2
    a = ca.score_attribution(tr, "decoder", 4, 3, n - 1, 1)
    b = ca.score_attribution(tr, "decoder", 4, 3, n - 1, 3)
    v = ca.score_attribution(tr, "decoder", 4, 3, n - 1, 1, versus=3)
    assert torch.allclose(torch.tensor(v["term"].to_numpy()), torch.tensor((a["term"] - b["term"]).to_numpy()),
                          atol=1e-9)
    assert abs(v.attrs["sum"] - v.attrs["score"]) <= TOL * max(1.0, abs(v.attrs["score"]))
    # groups sum the same terms
    lay = ca.score_attribution(tr, "decoder", 4, 3, n - 1, 1, group="layer")
    kind = ca.score_attribution(tr, "decoder", 4, 3, n - 1, 1, group="kind")
    assert set(kind["query_component"]) == {"embed", "attn", "mlp"}
    assert "L2.attn" in set(lay["key_component"])
    for g in (lay, kind):
        assert g["term"].sum() == pytest.approx(a["term"].sum(), abs=1e-9)
    # the whole pattern: sum over cells of a_ij times the cell's terms, against the cells one by one
    pa = ca.pattern_attribution(tr, "decoder", 4, 3, group="kind")
    w = tr["decoder.4.self_attn.weights"][3].double()
    acc = {}
    for i in range(n):
        for j in range(i + 1):
            cell = ca.score_attribution(tr, "decoder", 4, 3, i, j, group="kind")
            for qa, kb, t in cell.itertuples(index=False):
                acc[(qa, kb)] = acc.get((qa, kb), 0.0) + float(w[i, j]) * t
    got = {(qa, kb): t for qa, kb, t in pa.itertuples(index=False)}
    assert set(got) == set(acc)
    for k in acc:
        assert got[k] == pytest.approx(acc[k], abs=1e-6 * max(1.0, abs(acc[k])))
    assert abs(pa.attrs["sum"] - pa.attrs["score"]) <= TOL * max(1.0, abs(pa.attrs["score"]))


def test_bad_input_says_why(smollm2):
    tr = smollm2.trace("a short text")
    with pytest.raises(ValueError, match="outside"):
        ca.score_attribution(tr, "decoder", 99, 0, 0, 0)
    with pytest.raises(ValueError, match="outside"):
        ca.score_attribution(tr, "decoder", 0, 99, 0, 0)
    with pytest.raises(ValueError, match="outside"):
        ca.score_attribution(tr, "decoder", 0, 0, 50, 0)
    with pytest.raises(ValueError, match="cross_attn"):
        ca.score_attribution(tr, "decoder", 0, 0, 0, 0, attn="cross_attn")
    with pytest.raises(ValueError, match="group"):
        ca.score_attribution(tr, "decoder", 0, 0, 0, 0, group="heads")
