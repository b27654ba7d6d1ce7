"""The 2025-26 softmax attentions (gpt-oss, SmolLM3, OLMo 3, EXAONE 4, Llama 4 text) against
transformers' eager code, on tiny random checkpoints whose peculiarities bite on ~30 tokens
(tests/hf_builders.py NEW: windows and chunks of 6, a NoPE layer, learned sinks, YaRN, QK L2
norm, temperature tuning, mixtures of experts).

- each family loads through core.load_model; logits and every layer's weights within 1e-4;
  `.mask` is the layer's own rule (window / chunk) built here independently;
- gpt-oss: `.sink` = 1 - the row sums of `.weights`, and = 1 - the row sums of transformers'
  weights (its eager code drops the sink's column, so that is the sink's probability there);
- Llama 4: `.scale` is the temperature formula computed here, and varies by position;
- each peculiarity switched off IN TRANSFORMERS moves its output far past the tolerance, so the
  parity above could see it;
- model.layer_kinds() says what each layer is.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import core
from hf_builders import build, hf_eager

pytest.importorskip("transformers")

FAMILIES = ["gpt_oss", "smollm3", "olmo3", "exaone4", "llama4_text"]
TEXT = "the small dog sees the old cat near the river bank because it was tired"
TOL = 1e-4
FAR = 100 * TOL  # "far beyond the tolerance"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    cache = {}

    def get(fam):
        if fam not in cache:
            hf, folder = build(fam, tmp_path_factory.mktemp(fam))
            hf.save_pretrained(str(folder))
            ours = core.load_model(str(folder), device="cpu")
            tr = ours.trace(TEXT)
            ids = tr.meta["target_ids"]
            cache[fam] = (hf, ours, tr, ids, hf_eager(hf, ids))
        return cache[fam]

    return get


def _expected_mask(kind: dict, n: int) -> torch.Tensor:
    """The layer's forbidden cells from its description, built here: causal, and a window of W
    keys (i - j >= W masked) or a chunk of C positions (i // C != j // C masked)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    off = j > i
    word, _, size = kind["mask"].partition(" ")
    if word == "sliding":
        off |= (i - j) >= int(size)
    elif word == "chunked":
        off |= (i // int(size)) != (j // int(size))
    return off


@pytest.mark.parametrize("fam", FAMILIES)
def test_matches_transformers_eager(zoo, fam):
    hf, ours, tr, ids, (attn, _, logits) = zoo(fam)
    assert 20 <= len(ids) <= 40
    worst = float((tr["logits"] - logits).abs().max())
    assert worst < TOL, f"{fam} logits off by {worst:.3g}"
    kinds = ours.layer_kinds()
    assert len(attn) == len(kinds) == tr.layers("decoder")
    for i, a in enumerate(attn):
        got = tr[f"decoder.{i}.self_attn.weights"]
        d = float((got - a).abs().max())
        assert d < TOL, f"{fam} layer {i} weights off by {d:.3g}"
        mask = tr[f"decoder.{i}.self_attn.mask"]
        assert torch.equal(torch.isinf(mask), _expected_mask(kinds[i], len(ids))), f"{fam} layer {i} mask"
        assert torch.all(got[_expected_mask(kinds[i], len(ids)).expand_as(got)] == 0)


def test_sink_is_what_the_rows_leave(zoo):
    hf, ours, tr, ids, (attn, _, _) = zoo("gpt_oss")
    for i, a in enumerate(attn):
        sink = tr[f"decoder.{i}.self_attn.sink"]
        w = tr[f"decoder.{i}.self_attn.weights"]
        assert sink.shape == w.shape[:2]
        torch.testing.assert_close(sink, 1 - w.sum(-1), atol=1e-5, rtol=0)
        torch.testing.assert_close(sink, 1 - a.sum(-1), atol=TOL, rtol=0)  # transformers' own sink share
        assert float(sink.max()) > 0.05  # the sinks take a real share here
    assert all(k["sink"] for k in ours.layer_kinds())


def test_temperature_scale(zoo):
    hf, ours, tr, ids, _ = zoo("llama4_text")
    kinds = ours.layer_kinds()
    nope = [i for i, k in enumerate(kinds) if k["positions"] == "none"]
    assert nope == [2] and kinds[2]["scale"] == "per position"
    c = hf.config
    p = torch.arange(len(ids), dtype=torch.float64)
    want = (torch.log1p(torch.floor((p + 1) / c.floor_scale)) * c.attn_scale + 1) / math.sqrt(c.head_dim)
    got = tr["decoder.2.self_attn.scale"]
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=0)
    assert float(got.max() - got.min()) > 0.1  # it varies along the text
    assert "decoder.0.self_attn.scale" not in tr  # a RoPE layer's scale is fixed


# ------------------------------------------------------------------ each mechanism switched off in transformers
def _no_sinks(m):
    for layer in m.model.layers:
        layer.self_attn.sinks.data.fill_(-1e9)  # exp(-1e9) = 0: no sink


def _all_rope(m):
    m.config.no_rope_layers = [1] * m.config.num_hidden_layers
    for layer in m.model.layers:
        layer.self_attn.use_rope = 1


def _full_layers(m):
    m.config.layer_types = ["full_attention"] * m.config.num_hidden_layers  # the masks are made per layer type


def _no_yarn(m):
    rot = m.model.rotary_emb
    d = m.config.head_dim
    rot.inv_freq = 1.0 / (m.config.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    rot.attention_scaling = 1.0


def _dense_gpt_oss(m):  # every token through expert 0 alone
    for layer in m.model.layers:
        r = layer.mlp.router
        r.weight.data.zero_()
        r.bias.data.copy_(torch.tensor([10.0, 0.0, -10.0, -10.0]))


def _no_routed_experts(m):  # Llama 4: the shared expert alone
    for layer in m.model.layers:
        if hasattr(layer.feed_forward, "experts"):
            layer.feed_forward.experts.down_proj.data.zero_()


def _no_qk_norm(m):
    for layer in m.model.layers:
        if hasattr(layer.self_attn, "qk_norm"):
            del layer.self_attn.qk_norm


def _no_temperature(m):
    for layer in m.model.layers:
        layer.self_attn.attn_temperature_tuning = False


def _exaone_rope_everywhere(m):
    for layer in m.model.layers:
        layer.self_attn.sliding_window = None  # transformers then rotates every layer (its "global NoPE" off)


OFF = [("gpt_oss", "sinks", _no_sinks), ("gpt_oss", "windows", _full_layers), ("gpt_oss", "yarn", _no_yarn),
       ("gpt_oss", "moe", _dense_gpt_oss),
       ("smollm3", "nope", _all_rope),
       ("olmo3", "windows", _full_layers),
       ("exaone4", "windows", _full_layers), ("exaone4", "nope", _exaone_rope_everywhere),
       ("llama4_text", "chunks", _full_layers), ("llama4_text", "nope", _all_rope),
       ("llama4_text", "qk_norm", _no_qk_norm), ("llama4_text", "temperature", _no_temperature),
       ("llama4_text", "moe", _no_routed_experts)]


@pytest.mark.parametrize("fam,what,off", OFF, ids=[f"{f}-{w}" for f, w, _ in OFF])
def test_switching_a_mechanism_off_moves_transformers(zoo, fam, what, off):
    hf, _, _, ids, (attn, _, logits) = zoo(fam)
    changed = copy.deepcopy(hf)
    off(changed)
    attn2, _, logits2 = hf_eager(changed, ids)
    moved = max([float((logits2 - logits).abs().max())] + [float((a - b).abs().max()) for a, b in zip(attn, attn2)])
    assert moved > FAR, f"{fam} without its {what} moves by {moved:.3g} only"


def test_layer_kinds_of_a_bundled_family():
    m = core.load_model("random", device="cpu", config=core.ModelConfig(kind="decoder", tgt_vocab_size=50, n_layers=2,
                                                                          positional="rope", d_model=32, n_heads=4))
    kinds = m.layer_kinds()
    assert [k["mask"] for k in kinds] == ["causal", "causal"]
    assert all(k["mixer"] == "softmax" and k["positions"] == "rope" and not k["sink"] for k in kinds)
    with pytest.raises(ValueError, match="no 'encoder'"):
        m.layer_kinds("encoder")


@pytest.mark.parametrize("fam", FAMILIES)
def test_score_attribution_sums_to_the_score_or_says_why(zoo, fam):
    """Score attribution on every layer: its terms add up to the model's own scaled score (no
    positions, L2 QK-norm, YaRN's scale and sinks included); a layer whose scale varies by
    position gets a ValueError that says so."""
    import core.analysis as ca

    _, ours, tr, ids, _ = zoo(fam)
    for i, kind in enumerate(ours.layer_kinds()):
        if kind["scale"] == "per position":
            with pytest.raises(ValueError, match="varies by query position"):
                ca.score_attribution(tr, "decoder", i, 1, query=len(ids) - 1, key=len(ids) - 3)
            continue
        df = ca.score_attribution(tr, "decoder", i, 1, query=len(ids) - 1, key=len(ids) - 3)
        assert abs(df.attrs["score"] - df.attrs["sum"]) < 1e-4 * max(1.0, abs(df.attrs["score"]))


def test_sinks_fused_blocked_and_explicit_agree(monkeypatch):
    """Learned sinks take three routes through the one formula: the fused CPU kernel corrected by
    each row's log-sum-exp, the unrecorded formula a block of queries at a time (gradients), and
    the recorded steps. All three against softmax([masked, sink]) V in float64, here."""
    from core.net import attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 37, 8, generator=g) * 2 for _ in range(3))
    sink = torch.randn(1, 4, 1, 1, generator=g)
    mask = attention.additive(attention.forbidden(torch.arange(37), torch.arange(37), causal=True, chunk=6))[None, None]
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(8) + mask.double()
    p = torch.softmax(torch.cat([s, sink.double().expand(1, 4, 37, 1)], -1), -1)
    want = p[..., :-1] @ v.double()
    fused = attention.scaled_dot_product_attention(q, k, v, mask, sink=sink)
    seen = {}
    explicit = attention.scaled_dot_product_attention(q, k, v, mask, record=lambda n, t: seen.setdefault(n, t),
                                                      sink=sink)
    monkeypatch.setattr(attention, "SOFTCAP_ROWS", 16)
    blocked = attention.scaled_dot_product_attention(q.requires_grad_(), k, v, mask, sink=sink)
    for got in (fused, explicit, blocked):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(seen["sink"].double(), p[..., -1], atol=1e-6, rtol=0)


def test_smollm3_gguf_matches_transformers(tmp_path):
    """A smollm3 GGUF file (rows permuted as llama.cpp's converter writes them) with the
    architecture's own rule, no positions on every fourth layer, against transformers."""
    pytest.importorskip("gguf")
    from test_gguf_loader import write_gguf

    hf, folder = build("smollm3", tmp_path / "hf", no_rope_layers=[1, 1, 1, 0])
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "tiny-smollm3.gguf", arch="smollm3")
    ours = core.load_model(str(path), device="cpu")
    assert [k["positions"] for k in ours.layer_kinds()] == ["rope", "rope", "rope", "none"]
    tr = ours.trace(TEXT)
    attn, _, logits = hf_eager(hf, tr.meta["target_ids"])
    assert float((tr["logits"] - logits).abs().max()) < TOL
    for i, a in enumerate(attn):
        assert float((tr[f"decoder.{i}.self_attn.weights"] - a).abs().max()) < TOL, i


@pytest.mark.parametrize("fam", FAMILIES)
def test_weights_only_reads_are_the_explicit_ones(zoo, fam):
    """The model view's weights-only read and the value norms (Transformer.layer_weights: no
    values, heads or W_o) against the explicit re-run, every layer: the same formula (sinks,
    chunks, per-position scales included), so the same numbers."""
    _, ours, tr, _, _ = zoo(fam)
    for i in range(tr.layers("decoder")):
        x = tr[f"decoder.{i - 1}.out"] if i else tr["embed.decoder.sum"]
        with torch.inference_mode():
            w = ours.net.layer_weights("decoder", i, x[None])[0]
            vn = ours.net.layer_weights("decoder", i, x[None], what="value_norms")[0]
        torch.testing.assert_close(w, tr[f"decoder.{i}.self_attn.weights"], atol=1e-6, rtol=0)
        torch.testing.assert_close(vn, tr[f"decoder.{i}.self_attn.value_norms"], atol=1e-5, rtol=0)
