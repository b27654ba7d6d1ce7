"""Multi-head latent attention (DeepSeek V3) and its sparse selection (DeepSeek V3.2) against
transformers' eager code, on tiny random checkpoints whose peculiarities bite on ~30 tokens
(tests/hf_builders.py MLA: a latent of rank 6, a compressed query, YaRN with both mscales,
DeepSeek's interleaved RoPE, grouped sigmoid routing with a correction bias, a shared expert;
V3.2's indexer keeping 6 keys per query).

- each family loads through core.load_model; logits and every layer's weights within 1e-4;
  `.latent` and `.v` against transformers' own tensors (hooked), `.k`'s rotated part shared by
  every head;
- V3.2: `.selected` is transformers' indexer's choice (hooked), `.weights` are 0 off it, and
  each row keeps min(k, i + 1) keys;
- each peculiarity switched off IN TRANSFORMERS moves its output far past the tolerance;
- layer_kinds says "latent rank r" and "top-k k"; generation with and without the cache gives
  the same tokens, and the cache holds (r + d_rope) numbers a position and layer (+ d_I with
  an indexer);
- score attribution says why it does not apply.
"""

from __future__ import annotations

import copy

import pytest
import torch

import core
from core.net.recorder import Recorder
from hf_builders import build, hf_eager

pytest.importorskip("transformers")

FAMILIES = ["deepseek_v3", "deepseek_v32"]
TEXT = "the small dog sees the old cat near the river bank because it was tired"
TOL = 1e-4
FAR = 100 * TOL


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


def _hooked(hf, ids, names):
    """transformers' eager forward with the outputs of the modules named by `names` (a suffix
    of the module name -> key) kept per layer: {key: [layer 0's, layer 1's, ...]}."""
    hf.config._attn_implementation = "eager"
    got, hooks = {k: [] for k in names.values()}, []
    for name, mod in hf.named_modules():
        for suffix, key in names.items():
            if name.endswith(suffix):
                hooks.append(mod.register_forward_hook(lambda m, a, out, key=key: got[key].append(out)))
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return got


@pytest.mark.parametrize("fam", FAMILIES)
def test_matches_transformers_eager(zoo, fam):
    hf, ours, tr, ids, (attn, _, logits) = zoo(fam)
    n = len(ids)
    assert 20 <= n <= 40
    worst = float((tr["logits"] - logits).abs().max())
    assert worst < TOL, f"{fam} logits off by {worst:.3g}"
    c = hf.config
    theirs = _hooked(hf, ids, {"self_attn.kv_a_layernorm": "latent", "self_attn.kv_b_proj": "kv"})
    assert len(attn) == tr.layers("decoder") == c.num_hidden_layers
    for i, a in enumerate(attn):
        got = tr[f"decoder.{i}.self_attn.weights"]
        d = float((got - a).abs().max())
        assert d < TOL, f"{fam} layer {i} weights off by {d:.3g}"
        latent = tr[f"decoder.{i}.self_attn.latent"]
        assert latent.shape == (n, c.kv_lora_rank)
        torch.testing.assert_close(latent, theirs["latent"][i][0], atol=TOL, rtol=0)
        kv = theirs["kv"][i][0].view(n, c.num_attention_heads, -1).transpose(0, 1)  # H x n x (d_nope + d_v)
        v = tr[f"decoder.{i}.self_attn.v"]
        assert v.shape == (c.num_attention_heads, n, c.v_head_dim)
        torch.testing.assert_close(v, kv[..., c.qk_nope_head_dim:], atol=TOL, rtol=0)
        k = tr[f"decoder.{i}.self_attn.k"]
        q = tr[f"decoder.{i}.self_attn.q"]
        assert k.shape == q.shape == (c.num_attention_heads, n, c.qk_nope_head_dim + c.qk_rope_head_dim)
        torch.testing.assert_close(k[..., :c.qk_nope_head_dim], kv[..., :c.qk_nope_head_dim], atol=TOL, rtol=0)
        rot = k[..., c.qk_nope_head_dim:]
        assert torch.equal(rot, rot[:1].expand_as(rot))  # one rotated key shared by every head
        # the scores the weights come from are q . k as recorded, times the scale (mscale included)
        torch.testing.assert_close(tr[f"decoder.{i}.self_attn.scores"], q @ k.transpose(-1, -2), atol=1e-4, rtol=1e-5)


def test_selection_is_transformers(zoo):
    hf, ours, tr, ids, (attn, _, _) = zoo("deepseek_v32")
    n, k = len(ids), hf.config.index_topk
    assert n > 3 * k  # most rows are sparse
    picked = _hooked(hf, ids, {"self_attn.indexer": "idx"})["idx"]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for i, top in enumerate(picked):
        want = torch.zeros(n, n, dtype=torch.bool).scatter_(1, top[0].long(), True) & causal
        sel = tr[f"decoder.{i}.self_attn.selected"]
        assert sel.dtype == torch.bool and torch.equal(sel, want), f"layer {i}"
        assert torch.equal(sel.sum(-1), torch.clamp(torch.arange(1, n + 1), max=k))
        w = tr[f"decoder.{i}.self_attn.weights"]
        assert torch.all(w[:, ~sel] == 0) and torch.all(torch.isinf(tr[f"decoder.{i}.self_attn.mask"][~sel]))
        scores = tr[f"decoder.{i}.self_attn.index_scores"]
        assert scores.shape == (n, n) and torch.all(torch.isinf(scores[~causal]))
        # the kept keys are the row's best index scores
        low = scores.masked_fill(~sel, float("inf")).min(-1).values
        high = scores.masked_fill(sel | ~causal, float("-inf")).max(-1).values
        assert torch.all(low >= high)


# ------------------------------------------------------------------ each peculiarity switched off in transformers
def _attns(m):
    return [layer.self_attn for layer in m.model.layers]


def _gates(m):
    return [layer.mlp.gate for layer in m.model.layers if hasattr(layer.mlp, "gate")]


def _no_mscale(m):
    m.model.rotary_emb.attention_scaling = 1.0
    for a in _attns(m):
        a.scaling = a.qk_head_dim ** -0.5


def _no_interleave(m):
    m.config.rope_interleave = False


def _no_score_bias(m):
    for g in _gates(m):
        g.e_score_correction_bias.zero_()


def _no_groups(m):
    for g in _gates(m):
        g.num_group, g.topk_group = 1, 1


def _no_routed_scale(m):
    for g in _gates(m):
        g.routed_scaling_factor = 1.0


def _no_norm_topk(m):
    for g in _gates(m):
        g.norm_topk_prob = False


def _no_shared(m):
    for layer in m.model.layers:
        if hasattr(layer.mlp, "shared_experts"):
            layer.mlp.shared_experts.down_proj.weight.data.zero_()


def _dense_selection(m):
    m.config.index_topk = 10 ** 6
    for a in _attns(m):
        a.indexer.index_topk = 10 ** 6


OFF = [("deepseek_v3", "mscale", _no_mscale), ("deepseek_v3", "interleave", _no_interleave),
       ("deepseek_v3", "score_bias", _no_score_bias), ("deepseek_v3", "groups", _no_groups),
       ("deepseek_v3", "routed_scale", _no_routed_scale), ("deepseek_v3", "norm_topk", _no_norm_topk),
       ("deepseek_v3", "shared_expert", _no_shared),
       ("deepseek_v32", "selection", _dense_selection), ("deepseek_v32", "mscale", _no_mscale)]


@pytest.mark.parametrize("fam,what,off", OFF, ids=[f"{f}-{w}" for f, w, _ in OFF])
def test_switching_a_mechanism_off_moves_transformers(zoo, fam, what, off):
    hf, _, _, ids, (attn, _, logits) = zoo(fam)
    changed = copy.deepcopy(hf)
    with torch.no_grad():
        off(changed)
    attn2, _, logits2 = hf_eager(changed, ids)
    moved = max([float((logits2 - logits).abs().max())] + [float((a - b).abs().max()) for a, b in zip(attn, attn2)])
    assert moved > FAR, f"{fam} without its {what} moves by {moved:.3g} only"


# ------------------------------------------------------------------ what the model says of itself, generation, analyses
@pytest.mark.parametrize("fam", FAMILIES)
def test_layer_kinds(zoo, fam):
    hf, ours, _, _, _ = zoo(fam)
    kinds = ours.layer_kinds()
    assert all(k["mixer"] == "softmax" and k["latent"] == f"latent rank {hf.config.kv_lora_rank}" for k in kinds)
    assert [k["ffn"] for k in kinds] == ["dense", "moe", "moe"]  # first_k_dense_replace = 1
    # what a pass records, in the order it records it (Layer.recorded_names, the trace's names())
    rec = Recorder()
    with torch.inference_mode():
        ours.net.decode(torch.tensor([ours.encode(TEXT).ids]), rec=rec)
    for i in range(len(kinds)):
        got = [n.split(".", 2)[2] for n in rec.tensors if n.startswith(f"decoder.{i}.")]
        assert got == ours.net.decoder[i].recorded_names(), i
        assert ("self_attn.index_scores" in got) == (fam == "deepseek_v32")
        assert got.index("self_attn.latent") < got.index("self_attn.q")
    if fam == "deepseek_v32":
        assert all(k["selection"] == f"top-k {hf.config.index_topk}" for k in kinds)
    else:
        assert not any("selection" in k for k in kinds)


@pytest.mark.parametrize("fam", FAMILIES)
def test_generation_with_and_without_the_cache(zoo, fam):
    hf, ours, _, _, _ = zoo(fam)
    ids, _, cached = ours.greedy_run(TEXT, 6, use_cache=True)
    plain_ids, _, plain = ours.greedy_run(TEXT, 6, use_cache=False)
    assert ids == plain_ids and len(ids) == 6
    torch.testing.assert_close(cached, plain, atol=1e-4, rtol=1e-4)
    # the cache holds what attention needs: a latent and the shared rotated key per position
    c, prompt = hf.config, ours.encode(TEXT).ids
    cache = {}
    with torch.inference_mode():
        ours.net.decode(torch.tensor([prompt]), cache=cache)
        ours.net.decode(torch.tensor([ids[:1]]), cache=cache)
    per = c.kv_lora_rank + c.qk_rope_head_dim + (c.index_head_dim if fam == "deepseek_v32" else 0)
    for i in range(c.num_hidden_layers):
        held = {k: t for k, t in cache[i]["self_attn"].items() if torch.is_tensor(t)}
        assert sum(t.numel() for t in held.values()) == per * (len(prompt) + 1), (i, {k: t.shape for k, t in held.items()})


def test_score_attribution_takes_latent_attention_apart(zoo):
    """Latent attention's scores are bilinear in the stream's components once its inner norms
    (of the compressed query and of the latent) are frozen at their traced factors: every
    layer's and head's terms add up to the model's own scaled score, the rotated key included;
    and the value side's shares (circuits) sum to 1 with the output they explain."""
    import core.analysis as ca

    _, ours, tr, ids, _ = zoo("deepseek_v3")
    n = len(ids)
    for layer in range(tr.layers("decoder")):
        for head in range(ours.config.n_heads):
            for q, k in ((n - 1, n - 3), (n - 1, 0), (7, 7)):
                df = ca.score_attribution(tr, "decoder", layer, head, query=q, key=k)
                s = df.attrs["score"]
                assert abs(s - df.attrs["sum"]) < 1e-4 * max(1.0, abs(s)), (layer, head, q, k)
                assert float(tr[f"decoder.{layer}.self_attn.scaled"][head, q, k]) == pytest.approx(s, abs=1e-5)
    assert {"embed", "L0H1", "L1.mlp"} <= set(df.query_component) | set(df.key_component)
    edges = ca.head_circuit(tr, "decoder", 2, 1, depth=1)
    check = edges.attrs["checks"][0]
    assert check["value_error"] < 1e-4
    assert abs(check["pattern_sum"] - check["pattern_score"]) <= 1e-4 * max(1.0, abs(check["pattern_score"]))


def test_score_attribution_says_why_not_through_a_selection(zoo):
    import core.analysis as ca

    _, _, tr, ids, _ = zoo("deepseek_v32")
    with pytest.raises(ValueError, match="sparse selection"):
        ca.score_attribution(tr, "decoder", 1, 1, query=len(ids) - 1, key=len(ids) - 3)


@pytest.mark.parametrize("fam", FAMILIES)
def test_weights_only_reads_are_the_explicit_ones(zoo, fam):
    """The model view's weights-only read and the value norms (Transformer.layer_weights) against
    the explicit re-run, every layer: the same formula and selection, so the same numbers."""
    _, ours, tr, _, _ = zoo(fam)
    for i in range(tr.layers("decoder")):
        x = tr[f"decoder.{i - 1}.out"] if i else tr["embed.decoder.sum"]
        with torch.inference_mode():
            w = ours.net.layer_weights("decoder", i, x[None])[0]
            vn = ours.net.layer_weights("decoder", i, x[None], what="value_norms")[0]
        torch.testing.assert_close(w, tr[f"decoder.{i}.self_attn.weights"], atol=1e-6, rtol=0)
        torch.testing.assert_close(vn, tr[f"decoder.{i}.self_attn.value_norms"], atol=1e-5, rtol=0)


def test_bad_configs_say_what_is_wrong():
    base = dict(kind="decoder", tgt_vocab_size=50, n_layers=1, d_model=16, n_heads=2, positional="rope",
                norm="rmsnorm", norm_placement="pre", activation="swiglu")
    mla = {"kv_lora_rank": 4, "q_lora_rank": None, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4}
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        core.ModelConfig(**base, mla=dict(mla, qk_rope_head_dim=3))
    with pytest.raises(ValueError, match="needs q_lora_rank"):
        core.ModelConfig(**base, mla=dict(mla, index={"heads": 2, "head_dim": 8, "topk": 4}))
    with pytest.raises(ValueError, match="positive kv_lora_rank"):
        core.ModelConfig(**base, mla=dict(mla, kv_lora_rank=0))


def _cache_bytes(model, ids, new):
    """Bytes the network's cache holds after reading ids and then `new` one at a time."""
    cache = {}
    with torch.inference_mode():
        model.net.decode(torch.tensor([ids]), cache=cache)
        for t in new:
            model.net.decode(torch.tensor([[t]]), cache=cache)
    return sum(t.numel() * t.element_size() for i in range(model.config.n_layers)
               for t in cache[i]["self_attn"].values() if torch.is_tensor(t))


def test_kv_cache_bytes_per_token_are_the_cache_tensors(zoo):
    """core.net.cost's bytes per token against the cache tensors after reading a prompt and
    three more tokens: MLA (with and without the indexer's keys), and MHA and GQA of the same
    head size, whose rows of kv_cache_comparison are those models' real caches."""
    from core.net.cost import kv_cache_bytes, kv_cache_comparison

    for fam in FAMILIES:
        hf, ours, _, _, _ = zoo(fam)
        ids = ours.encode(TEXT).ids
        n = len(ids) + 3
        assert _cache_bytes(ours, ids, [5, 6, 7]) == kv_cache_bytes(ours.config) * n
        c = hf.config
        per_layer = c.kv_lora_rank + c.qk_rope_head_dim + (c.index_head_dim if fam == "deepseek_v32" else 0)
        assert kv_cache_bytes(ours.config) == 4 * c.num_hidden_layers * per_layer
    table = kv_cache_comparison(zoo("deepseek_v3")[1].config).set_index("kind")["numbers"]
    assert table.to_dict() == {"MHA": 4 * (10 + 5), "GQA": 1 * (10 + 5), "MLA": 6 + 4}  # H = 4, d_k 6 + 4, d_v 5
    base = dict(kind="decoder", tgt_vocab_size=50, n_layers=2, positional="rope", d_model=32, n_heads=4, d_head=6)
    mha = core.load_model("random", device="cpu", config=core.ModelConfig(**base))
    gqa = core.load_model("random", device="cpu", config=core.ModelConfig(**base, n_kv_heads=2))
    table = kv_cache_comparison(mha.config, kv_heads=2, rank=3, rope_dim=2).set_index("kind")["bytes_per_token"]
    ids = list(range(1, 12))
    assert _cache_bytes(mha, ids, [3, 4, 5]) == table["MHA"] * 14 == kv_cache_bytes(mha.config) * 14
    assert _cache_bytes(gqa, ids, [3, 4, 5]) == table["GQA"] * 14 == kv_cache_bytes(gqa.config) * 14
    assert table["MLA"] == (3 + 2) * 2 * 4
    with pytest.raises(ValueError, match="kv_heads must divide"):
        kv_cache_comparison(mha.config, kv_heads=3)


@pytest.mark.parametrize("preset", ["gated_delta", "kda", "mamba2", "short_conv", "shared_kv", "sinks"])
def test_kv_cache_bytes_count_only_the_layers_that_cache(preset):
    """A hybrid's token-mixer layers keep a fixed state, not a cache, and Gemma 4's shared-KV layers
    read an earlier layer's: core.net.cost counts neither, and its bytes per token are the cache
    tensors' (each tensor once) after reading a prompt and three more tokens."""
    from core.net.cost import kv_cache_bytes, kv_cache_comparison, kv_cache_layers

    model = core.load_model(f"random:{preset}", device="cpu")
    cfg, ids = model.config, list(range(3, 14))
    cache = {}
    with torch.inference_mode():
        model.net.decode(torch.tensor([ids]), cache=cache)
        for t in (5, 6, 7):
            model.net.decode(torch.tensor([[t]]), cache=cache)
    tensors = {t.data_ptr(): t.numel() * t.element_size() for i in range(cfg.n_layers)
               for t in (cache.get(i) or {}).get("self_attn", {}).values() if torch.is_tensor(t)}
    assert sum(tensors.values()) == kv_cache_bytes(cfg) * (len(ids) + 3)
    holders = [i for i in range(cfg.n_layers) if "self_attn" in (cache.get(i) or {})
               and (cfg.kv_source is None or cfg.kv_source[i] is None)]
    assert kv_cache_layers(cfg) == holders
    assert len(holders) < cfg.n_layers or preset == "sinks"
    table = kv_cache_comparison(cfg).set_index("kind")
    assert table.loc["MHA", "bytes_per_token"] == table.loc["MHA", "numbers"] * len(holders) * 4


@pytest.mark.parametrize("fam", FAMILIES)
def test_pages_read_the_new_names(zoo, fam):
    """The download estimate's shape rule gives every name of a layer its real shape (nothing is
    computed for it), and the Inside page's checks say why there is no numpy recomputation."""
    from viz.inside.step_checks import layer_checks
    from viz.ui.download_sizes import name_shape

    _, _, tr, _, _ = zoo(fam)
    for name in tr.names("decoder.1.self_attn."):
        assert name_shape(tr, name) == tuple(tr[name].shape), name
    checks = layer_checks(tr, "decoder", "self_attn", 1, 1)
    assert "latent attention" in checks.note
    assert all(c.ok for cs in checks.values() for c in cs)  # the checks that need no recomputation hold


VARIANTS = {"q_proj-halves": dict(q_lora_rank=None, rope_interleave=False),
            "plain-rope-one-group": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                         norm_topk_prob=False, n_group=1, topk_group=1, first_k_dense_replace=0,
                                         attention_bias=True)}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_other_settings_match_transformers(tmp_path, variant):
    """The settings the main checkpoint does not take: q = x W_q (no q_lora_rank) with RoPE in
    halves (rope_interleave False); no YaRN, one expert group, unnormalised expert weights,
    experts from layer 0 and attention biases (on W_qa, W_kva and W_o)."""
    hf, folder = build("deepseek_v3", tmp_path, **VARIANTS[variant])
    hf.save_pretrained(str(folder))
    ours = core.load_model(str(folder), device="cpu")
    tr = ours.trace(TEXT)
    attn, _, logits = hf_eager(hf, tr.meta["target_ids"])
    assert float((tr["logits"] - logits).abs().max()) < TOL
    for i, a in enumerate(attn):
        assert float((tr[f"decoder.{i}.self_attn.weights"] - a).abs().max()) < TOL, i
    kinds = ours.layer_kinds()
    assert [k["ffn"] for k in kinds] == (["moe"] * 3 if variant == "plain-rope-one-group" else ["dense", "moe", "moe"])


def test_prediction_layers_past_the_model_are_passed_over(zoo, tmp_path):
    """DeepSeek's checkpoints hold a multi-token prediction module as layer num_hidden_layers
    (transformers does not load it): loading passes it over unread; a stray tensor inside a real
    layer still stops loading with its name."""
    import shutil

    from safetensors.torch import load_file, save_file

    from core.loaders.checkpoint import CheckpointError
    from hf_builders import byte_bpe_tokenizer

    hf, ours, tr, _, _ = zoo("deepseek_v3")
    src = tmp_path / "src"
    hf.save_pretrained(str(src))
    byte_bpe_tokenizer(src / "tokenizer.json")  # the builder's tokenizer (trained the same way again)
    tensors = load_file(str(src / "model.safetensors"))
    n = hf.config.num_hidden_layers
    for folder, extra in (("mtp", f"model.layers.{n}.eh_proj.weight"), ("stray", "model.layers.0.self_attn.extra.weight")):
        shutil.copytree(src, tmp_path / folder)
        save_file({**tensors, extra: torch.zeros(3, 3)}, str(tmp_path / folder / "model.safetensors"),
                  metadata={"format": "pt"})
    with_mtp = core.load_model(str(tmp_path / "mtp"), device="cpu")
    torch.testing.assert_close(with_mtp.trace(TEXT)["logits"], tr["logits"], atol=0, rtol=0)
    with pytest.raises(CheckpointError, match="self_attn.extra"):
        core.load_model(str(tmp_path / "stray"), device="cpu")


MLA_SMALL = dict(hidden_size=40, num_attention_heads=4, q_lora_rank=12, kv_lora_rank=6, qk_nope_head_dim=6,
                 qk_rope_head_dim=4, v_head_dim=5)
YARN = [{"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.8},
        {"factor": None, "mscale": 0.7},  # factor from max_position_embeddings / original
        {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 16.0, "truncate": False}]


@pytest.mark.parametrize("yarn", YARN, ids=["both-mscales", "factor-from-lengths", "real-v3"])
def test_yarn_settings_are_transformers(yarn):
    """The family's reading of YaRN (frequencies, the factor on cos and sin, the softmax scale)
    against transformers' own functions on the same config."""
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    from core.loaders.families import deepseek
    from core.net.positional import rope_attention_factor, rope_inv_freq

    rp = {"rope_type": "yarn", "original_max_position_embeddings": 64, "rope_theta": 10000.0, **yarn}
    c = tf.DeepseekV3Config(**MLA_SMALL, max_position_embeddings=512, rope_parameters=rp)
    inv, att = ROPE_INIT_FUNCTIONS["yarn"](c)
    scale = yarn_apply_mscale(c.rope_parameters, c.qk_head_dim ** -0.5)
    theta, scaling, ours = deepseek.rope(c.to_dict(), c.qk_head_dim)
    torch.testing.assert_close(rope_inv_freq(c.qk_rope_head_dim, theta, scaling).float(), inv, atol=1e-7, rtol=1e-6)
    assert rope_attention_factor(scaling) == pytest.approx(att, rel=1e-12)
    assert ours == pytest.approx(scale, rel=1e-12)
