"""Gemma 1-3 and ModernBERT checkpoints against transformers' eager forward: every attention
map and the logits (ModernBERT: the last hidden state and the masked-LM logits) within 1e-4,
with windows shorter than the sentences, soft-capping that bends the scores, QK-norm, local
and global RoPE bases and random norm gains (tests/gemma_builders.py)."""

import json

import pytest
import torch

import core
from core.loaders.checkpoint import CheckpointError
from gemma_builders import build
from hf_builders import SENTENCES
from test_hf_loaders import check_parity

pytest.importorskip("transformers")

CASES = {
    "gemma": ("gemma", {}),
    "gemma-untied-gelu": ("gemma", {"tie_word_embeddings": False, "hidden_act": "gelu"}),
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3_text", {}),
    # Gemma 3 keeps attn_logit_softcapping in its config but no layer applies it
    "gemma3-capped-untied": ("gemma3_text", {"attn_logit_softcapping": 4.0, "final_logit_softcapping": 5.0,
                                             "tie_word_embeddings": False}),
}


def _load(hf, folder):
    hf.save_pretrained(str(folder))
    return core.load_model(str(folder), device="cpu")


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(tmp_path, case):
    family, over = CASES[case]
    hf, folder = build(family, tmp_path / case, **over)
    ours = _load(hf, folder)
    assert ours.config.extra["family"] == family
    check_parity(hf, ours)


def test_gemma2_windows_caps_and_extra_norms_are_visible(tmp_path):
    hf, folder = build("gemma2", tmp_path / "g2")
    m = _load(hf, folder)
    cfg = m.config
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.sliding_window) == (4.0, 3.0, 4)
    tr = m.trace(SENTENCES[0])
    assert tr.meta["layer_kinds"] == ["local", "global", "local"]
    n = len(tr.tokens("target"))
    assert n > 4
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    local, glob = tr["decoder.0.self_attn.mask"], tr["decoder.1.self_attn.mask"]
    assert torch.all(torch.isinf(local[(i - j >= 4) | (j > i)])) and torch.all(local[(i - j < 4) & (j <= i)] == 0)
    assert torch.all(torch.isinf(glob[j > i])) and torch.all(glob[j <= i] == 0)
    scaled, capped = tr["decoder.1.self_attn.scaled"], tr["decoder.1.self_attn.capped"]
    assert torch.allclose(capped, 4.0 * torch.tanh(scaled / 4.0))
    assert float(scaled.abs().max()) > 4.0 and float(capped.abs().max()) < 4.0  # the cap bends something
    assert torch.equal(tr["decoder.1.self_attn.masked"], capped + glob)
    assert float(tr["logits"].abs().max()) < 3.0
    names = tr.names("decoder.0.")
    order = [n.split(".", 2)[2] for n in names]
    assert order.index("norm1") < order.index("self_attn.out") < order.index("post_norm1") < order.index("residual1")
    assert order.index("norm2") < order.index("ffn.out") < order.index("post_norm2") < order.index("residual2")
    # the norm gains are 1 + the stored w
    w = hf.model.layers[0].post_attention_layernorm.weight
    assert torch.allclose(m.net.decoder[0].post_norms[0].weight, 1 + w)


def test_unsupported_settings_are_named(tmp_path):
    hf, folder = build("gemma2", tmp_path / "bad")
    hf.save_pretrained(str(folder))
    cfg = json.loads((folder / "config.json").read_text())
    for key, value, said in [("attention_bias", True, "attention biases"),
                             ("hidden_activation", "relu", "hidden_activation 'relu'"),
                             ("use_bidirectional_attention", True, "bidirectional")]:
        (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(CheckpointError, match=said):
            core.load_model(str(folder), device="cpu")


def test_gemma3_qk_norm_and_local_rope_base(tmp_path):
    hf, folder = build("gemma3_text", tmp_path / "g3")
    m = _load(hf, folder)
    cfg = m.config
    assert (cfg.qk_norm, cfg.rope_theta, cfg.rope_theta_local, cfg.rope_scaling["factor"]) == ("head", 50000.0, 100.0, 2.0)
    tr = m.trace(SENTENCES[1])
    assert tr.meta["layer_kinds"] == ["local", "local", "global", "local"]
    pre, normed = tr["decoder.0.self_attn.q_pre_norm"], tr["decoder.0.self_attn.q_pre_rope"]
    gain = m.net.decoder[0].self_attn.q_norm.weight
    assert torch.allclose(normed, pre * torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * gain, atol=1e-6)
    assert torch.allclose(gain, 1 + hf.model.layers[0].self_attn.q_norm.weight)
    # RoPE at position 1 turns the first feature pair by 1 radian in a local layer (base 100, j = 0)
    # and by 1 / 2 in the global one (linear factor 2)
    for layer, angle in ((0, 1.0), (2, 0.5)):
        q0, q1 = tr[f"decoder.{layer}.self_attn.q_pre_rope"][:, 1], tr[f"decoder.{layer}.self_attn.q"][:, 1]
        half = q0.shape[-1] // 2
        c, s_ = torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))
        assert torch.allclose(q1[:, 0], q0[:, 0] * c - q0[:, half] * s_, atol=1e-5)


BIASES = {"attention_bias": True, "mlp_bias": True, "norm_bias": True, "classifier_bias": True,
          "hidden_activation": "gelu_pytorch_tanh", "classifier_activation": "gelu_pytorch_tanh"}


@pytest.mark.parametrize("over", [{}, BIASES], ids=["default", "biases-tanh"])
def test_modernbert_matches_transformers(tmp_path, over):
    """Every attention map, the last hidden state (after the final norm) and the masked-LM
    logits against transformers' eager ModernBertForMaskedLM."""
    hf, folder = build("modernbert", tmp_path / "mb", **over)
    m = _load(hf, folder)
    cfg = m.config
    assert (cfg.kind, cfg.sliding_window, cfg.rope_theta, cfg.rope_theta_local) == ("encoder", 4, 5000.0, 50.0)
    assert m.mlm_head is not None
    hf.config._attn_implementation = "eager"
    for text in SENTENCES:
        ids = m.encode(text).ids
        tr = m.trace(text)
        assert tr.meta["layer_kinds"] == ["global", "local", "global", "local"]
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_attentions=True)
            last = hf.model(torch.tensor([ids])).last_hidden_state[0]
        for i, a in enumerate(out.attentions):
            w = tr[f"encoder.{i}.self_attn.weights"]
            assert torch.allclose(w, a[0], atol=1e-4), (i, float((w - a[0]).abs().max()))
        h = tr["encoder.final_norm"]
        assert torch.allclose(h, last, atol=1e-4), float((h - last).abs().max())
        logits = m.mlm_logits(h)
        assert torch.allclose(logits, out.logits[0], atol=1e-4), float((logits - out.logits[0]).abs().max())
        n = len(ids)
        i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        local = tr["encoder.1.self_attn.mask"]
        assert torch.all(torch.isinf(local[(i - j).abs() > 2])) and torch.all(local[(i - j).abs() <= 2] == 0)
        assert torch.all(tr["encoder.0.self_attn.mask"] == 0)
        assert torch.all(tr["encoder.1.self_attn.weights"][:, (i - j).abs() > 2] == 0)
        w = tr["encoder.2.self_attn.weights"]
        assert float(w.max()) > 2.0 / n  # not a vacuous match


def test_modernbert_fill_mask_is_transformers_argmax(tmp_path):
    hf, folder = build("modernbert", tmp_path / "mbf")
    m = _load(hf, folder)
    text = "the small [MASK] sees the cat"
    enc = m.encode(text)
    pos = enc.tokens.index("[MASK]")
    with torch.no_grad():
        probs = torch.softmax(hf(torch.tensor([enc.ids])).logits[0, pos], -1)
    fills = m.fill_mask(text, k=3)
    assert fills[0]["top"][0][0] == m.tokenizer.token_str(int(probs.argmax()))
    assert abs(fills[0]["top"][0][1] - float(probs.max())) < 1e-5
    tr = m.trace(text)
    assert tr.meta["fill_mask"][0]["top"][0][0] == fills[0]["top"][0][0]


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "modernbert"])
def test_weights_alone_and_cached_decoding_agree_with_the_full_pass(tmp_path, family):
    """The model view's weights-only path (per-layer window, RoPE base, cap, QK-norm) equals the
    recorded maps; greedy decoding with the key/value cache (windows over a growing prefix)
    picks, at every step, the argmax of a full pass over the whole prefix."""
    hf, folder = build(family, tmp_path / family)
    m = _load(hf, folder)
    tr = m.trace(SENTENCES[1])
    stack = tr.stacks()[0]
    for i in range(m.config.n_layers):
        alone = tr._runner.self_weights(tr, stack, i)
        assert torch.allclose(alone, tr[f"{stack}.{i}.self_attn.weights"], atol=1e-6), i
    from viz.inside.step_checks import layer_checks  # a switched-off head: the numpy layer zeroes it too

    off = m.trace(SENTENCES[1], ablate=[(stack, 0, 1)])
    checks = layer_checks(off, stack, "self_attn", 0, 1)
    assert all(c.ok for cs in checks.values() for c in cs), [c.text() for cs in checks.values() for c in cs]
    assert not torch.allclose(off[f"{stack}.0.out"], tr[f"{stack}.0.out"])
    if m.kind == "encoder":
        return
    ids = m.encode(SENTENCES[0]).ids[:5]
    cache, seq, new = {}, list(ids), list(ids)
    with torch.no_grad():
        for _ in range(8):  # beyond the windows (4 and 3 tokens)
            step = m.net.project(m.net.decode(torch.tensor([new]), cache=cache)[:, -1])
            full = m.net.project(m.net.decode(torch.tensor([seq]))[:, -1])
            assert torch.allclose(step, full, atol=1e-4), float((step - full).abs().max())
            nxt = int(full.argmax())
            seq.append(nxt)
            new = [nxt]
