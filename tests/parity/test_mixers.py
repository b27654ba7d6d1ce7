"""Token mixers that are not softmax attention (core/net/mixer.py), starting with Gated DeltaNet
(core/net/gated_delta.py).

The framework, on a small random network of our own (a gated delta layer, then a softmax layer
with an output gate):
- a mixer layer has `mixer` instead of `self_attn`, sub-layers ["mixer", "ffn"], and records
  `{stack}.{i}.mixer.*` names that parse and print back;
- `.heads` equals the gated delta rule stepped here in numpy (float64) from the recorded
  q, k, v, decay and beta, and `.weights` equals A[t, s] = beta_s k_s . P_{s+1} ... P_t q_t
  multiplied out here in numpy, P_r = exp(g_r) (I - beta_r k_r k_r^T);
- A has nothing above the diagonal and A @ v equals `.heads`;
- the chunked and the recurrent forms agree (the figure is printed), and greedy decoding with
  the cache (the recurrent form, one token at a time) gives the logits of the full pass;
- layer_info / layer_kinds say what each layer is.

The families (core/loaders/families/qwen3_next.py), on tiny random checkpoints saved by
transformers (tests/hf_builders.py HYBRID: linear, linear, full, linear; decays from a few steps
to the whole text, 20-40 tokens):
- each loads through core.load_model; logits within 1e-4 of transformers' eager code; the
  softmax layer's weights within 1e-4 and its `.gate` equal to sigmoid of the gate half of
  transformers' q_proj;
- every mixer layer: A has nothing above the diagonal, A @ v equals `.heads` within 1e-4 of its
  largest entry, and `.heads` equals what transformers' GatedDeltaNet hands its own gated norm
  (a hook on it) within 1e-4; the chunked and recurrent forms agree on the layer's own input;
- greedy decoding with the cache (the recurrent form, a token at a time) gives the tokens and
  logits of decoding without it, and transformers' own greedy tokens;
- a decay-only "effective attention" is far from the exact A (test_decay_only_map_is_far).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import core
import core.head_maps as hm
from core import trace_names as tn
from core.net.config import ModelConfig
from core.net.gated_delta import chunked_rule, recurrent_rule
from core.net.mixer import check_softmax_heads
from core.net.model import Transformer
from core.net.recorder import Recorder
from hybrid_zoo import TEXT, eager_run, greedy_three_ways, saved, zoo_getter

TOL = 1e-4
N = 30


def _net(seed: int = 0, chunk: int = 8) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(kind="decoder", d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_ff=48, n_layers=2,
                      tgt_vocab_size=50, positional="rope", norm="rmsnorm", norm_placement="pre",
                      activation="swiglu", bias=False, final_norm=True, rotary_dim=4, attn_gate=True,
                      layer_types=["linear_attention", "full_attention"],
                      mixer={"kind": "gated_delta", "heads": 4, "k_heads": 2, "d_k": 8, "d_v": 6, "conv": 4,
                             "chunk": chunk})
    net = Transformer(cfg).eval()
    m = net.decoder[0].mixer
    with torch.no_grad():  # decays of every size (some heads forget in a few steps), strong writes
        m.A_log.copy_(torch.tensor([-3.0, -1.0, 0.0, 1.0]))
        m.dt_bias.copy_(torch.tensor([-1.0, 0.0, 0.5, 1.0]))
        m.w_qkv.weight.mul_(4.0)
        m.w_b.weight.mul_(3.0)
    return net


@pytest.fixture(scope="module")
def run():
    net = _net()
    ids = torch.randint(0, 50, (1, N), generator=torch.Generator().manual_seed(1))
    rec = Recorder()
    with torch.no_grad():
        logits = net(tgt=ids, rec=rec)
    return net, ids, rec.tensors, logits


def numpy_rule(q, k, v, g, beta):
    """The gated delta rule stepped in float64: S_t = e^g_t (I - b k k^T) S_{t-1} + b k v^T, o_t = S_t^T q_t."""
    q, k, v, g, beta = (np.asarray(t, dtype=np.float64) for t in (q, k, v, g, beta))
    H, n, dk = k.shape
    out = np.zeros((H, n, v.shape[-1]))
    for h in range(H):
        S = np.zeros((dk, v.shape[-1]))
        for t in range(n):
            P = np.exp(g[h, t]) * (np.eye(dk) - beta[h, t] * np.outer(k[h, t], k[h, t]))
            S = P @ S + beta[h, t] * np.outer(k[h, t], v[h, t])
            out[h, t] = S.T @ q[h, t]
    return out


def numpy_implicit(q, k, g, beta):
    """A[h, t, s] = beta_s k_s . P_{s+1} ... P_t q_t, multiplied out (u = q_t, then u = P_r u for r = t..s+1)."""
    q, k, g, beta = (np.asarray(t, dtype=np.float64) for t in (q, k, g, beta))
    H, n, dk = k.shape
    A = np.zeros((H, n, n))
    for h in range(H):
        for t in range(n):
            u = q[h, t].copy()
            for s in range(t, -1, -1):
                A[h, t, s] = beta[h, s] * k[h, s] @ u
                u = np.exp(g[h, s]) * (u - beta[h, s] * k[h, s] * (k[h, s] @ u))  # P_s u (P_s symmetric)
    return A


def test_names_and_kinds(run):
    net, _, rec, _ = run
    layer = net.decoder[0]
    assert layer.self_attn is None and layer.mixer is not None and layer.sublayers() == ["mixer", "ffn"]
    local = layer.recorded_names()
    assert [n for n in local if n.startswith("mixer.")] == [f"mixer.{s}" for s in
                                                            ("q", "k", "v", "decay", "beta", "weights", "heads", "out")]
    for n in local:
        full = tn.at("decoder", 0, n)
        assert full in rec, full
        assert str(tn.parse(full)) == full
    assert tn.parse("decoder.0.mixer.weights").part == "mixer" and tn.is_map("decoder.0.mixer.weights")
    assert tn.is_stored("decoder.0.mixer.heads") and not tn.is_stored("decoder.0.mixer.weights")
    assert "decoder.1.self_attn.gate" in rec and net.decoder[1].mixer is None
    info = net.layer_info("decoder")
    assert info[0]["mixer"] == "gated_delta" and info[0]["kind"] == "linear" == net.layer_kinds()[0]
    assert info[0]["state"] == {"conv": (2 * 16 + 24, 3), "state": (4, 8, 6)}
    assert info[1]["mixer"] == "softmax" and info[1]["output_gate"] and net.layer_kinds()[1] == "global"
    with pytest.raises(ValueError, match="not softmax attention"):
        net.attn_spec("decoder", 0)


def test_heads_and_map_match_numpy(run):
    _, _, rec, _ = run
    q, k, v, g, beta = (rec[f"decoder.0.mixer.{s}"] for s in ("q", "k", "v", "decay", "beta"))
    heads, A = rec["decoder.0.mixer.heads"], rec["decoder.0.mixer.weights"]
    assert A.shape == (4, N, N) and heads.shape == (4, N, 6)
    want = numpy_rule(q, k, v, g, beta)
    scale = np.abs(want).max()
    assert float(np.abs(heads.double().numpy() - want).max()) < TOL * scale
    want_A = numpy_implicit(q, k, g, beta)
    d = float(np.abs(A.double().numpy() - want_A).max())
    assert d < TOL * np.abs(want_A).max(), d
    assert float(A.triu(1).abs().max()) == 0.0
    assert float((A @ v - heads).abs().max()) < TOL * float(heads.abs().max())
    assert float(A.min()) < -0.01  # signed: the key removal subtracts


def test_chunked_and_recurrent_forms_agree(run):
    net, _, _, _ = run
    m = net.decoder[0].mixer
    x = torch.randn(2, 70, 32, generator=torch.Generator().manual_seed(3))  # several chunks of 8, one partial
    with torch.no_grad():
        q, k, v, g, beta = m.rule_inputs(x)
        o1, s1 = chunked_rule(q, k, v, g, beta, 8)
        o2, s2 = recurrent_rule(q, k, v, g, beta)
    d = float((o1 - o2).abs().max())
    print(f"chunked vs recurrent: max |diff| {d:.3g} (heads up to {float(o2.abs().max()):.3g})")
    assert d < 1e-5 and float((s1 - s2).abs().max()) < 1e-5


def test_generation_with_the_cache(run):
    net, ids, _, logits = run
    cache = {}
    steps = []
    with torch.no_grad():
        steps.append(net.project(net.decode(ids[:, :10], cache=cache)))  # the chunked form into the cache
        steps.append(net.project(net.decode(ids[:, 10:17], cache=cache)))  # chunked, from the kept state
        for t in range(17, N):  # the recurrent form, a token at a time
            steps.append(net.project(net.decode(ids[:, t:t + 1], cache=cache)))
    got = torch.cat(steps, dim=1)
    d = float((got - logits).abs().max())
    print(f"cached (recurrent) vs full pass logits: max |diff| {d:.3g}")
    assert d < TOL
    assert set(cache[0]["mixer"]) == {"conv", "state"} and cache[0]["mixer"]["state"].shape == (1, 4, 8, 6)
    assert torch.equal(got.argmax(-1), logits.argmax(-1))


def test_bad_mixer_settings():
    with pytest.raises(ValueError, match="need a mixer"):
        ModelConfig(kind="decoder", n_layers=1, layer_types=["linear_attention"])
    with pytest.raises(ValueError, match="mixer kind 'nope' is not known"):
        Transformer(ModelConfig(kind="decoder", n_layers=1, tgt_vocab_size=5, layer_types=["linear_attention"],
                                mixer={"kind": "nope"}))


# ------------------------------------------------------------------ the families against transformers
FAMILIES = ["qwen3_5_text", "qwen3_next"]
FOLDERS = {}  # family -> the folder its checkpoint was saved in


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return zoo_getter(tmp_path_factory, saved, _hf_run, FOLDERS)


def _hf_run(hf, ids):
    """transformers' eager pass: logits, the softmax layers' weights by layer, each GatedDeltaNet's
    heads (its gated norm's input, H x n x d_v) and each attention's gate half of q_proj (sigmoid)."""
    heads, gates, hooks = {}, {}, []
    n = len(ids)
    for i, layer in enumerate(hf.model.layers):
        if hasattr(layer, "linear_attn"):
            la = layer.linear_attn
            hooks.append((la.norm, lambda m, a, o, i=i, la=la: heads.__setitem__(
                i, a[0].view(n, la.num_v_heads, -1).transpose(0, 1))))
        else:
            at = layer.self_attn
            hooks.append((at.q_proj, lambda m, a, o, i=i, at=at: gates.__setitem__(
                i, torch.sigmoid(o[0].view(n, -1, 2 * at.head_dim)[..., at.head_dim:]).transpose(0, 1))))
    logits, weights = eager_run(hf, ids, hooks)
    return logits, weights, heads, gates


@pytest.mark.parametrize("fam", FAMILIES)
def test_family_matches_transformers(zoo, fam):
    hf, ours, tr, ids, (logits, weights, heads, gates) = zoo(fam)
    assert 20 <= len(ids) <= 40
    d = float((tr["logits"] - logits).abs().max())
    print(f"{fam}: logits max |diff| {d:.3g}")
    assert d < TOL, f"{fam} logits off by {d:.3g}"
    kinds = ours.layer_kinds()
    assert [k["mixer"] for k in kinds] == ["gated_delta", "gated_delta", "softmax", "gated_delta"]
    assert kinds[2]["output_gate"] and kinds[2]["qk_norm"] == "head"
    assert ours.net.cfg.rotary_dim == 4
    if fam == "qwen3_next":
        assert [k["ffn"] for k in kinds] == ["moe", "moe", "dense", "moe"]
    assert list(weights) == [2] and sorted(heads) == [0, 1, 3]
    for i, a in weights.items():
        dw = float((tr[tn.self_attn("decoder", i, "weights")] - a).abs().max())
        dg = float((tr[tn.self_attn("decoder", i, "gate")] - gates[i]).abs().max())
        print(f"{fam} layer {i}: weights {dw:.3g}, gate {dg:.3g}")
        assert dw < TOL and dg < TOL
        assert tn.self_attn("decoder", i, "value_norms") not in tr  # the gate makes them something else
        with pytest.raises(ValueError, match="output gate"):
            ours.net.layer_weights("decoder", i, tr.layer_input("decoder", i)[None], what="value_norms")
    for i, want in heads.items():
        got = tr[tn.mixer("decoder", i, "heads")]
        assert tr.is_stored(tn.mixer("decoder", i, "heads"))
        assert not tr.is_stored(tn.mixer("decoder", i, "weights"))  # a map: computed when read
        dh = float((got - want).abs().max())
        A, v = tr[tn.mixer("decoder", i, "weights")], tr[tn.mixer("decoder", i, "v")]
        dav = float((A @ v - got).abs().max()) / float(got.abs().max())
        print(f"{fam} layer {i}: heads vs transformers {dh:.3g}; A @ v vs heads {dav:.3g} of the max")
        assert dh < TOL * max(1.0, float(want.abs().max()))
        assert dav < TOL
        assert float(A.triu(1).abs().max()) == 0.0
        assert A.shape == (6, len(ids), len(ids))
        pooled = tr.pooled(tn.mixer("decoder", i, "weights"), size=5)  # every mixer head, block means
        want = torch.stack([hm.pool_full(a, 5) for a in A])
        assert pooled.shape == (6, -(-len(ids) // 5), -(-len(ids) // 5))
        assert float((pooled - want).abs().max()) < 1e-6


@pytest.mark.parametrize("fam", FAMILIES)
def test_family_forms_agree(zoo, fam):
    hf, ours, tr, ids, _ = zoo(fam)
    worst = 0.0
    for i in ours.net.cfg.mixer_layers():
        m = ours.net.decoder[i].mixer
        with torch.no_grad():
            q, k, v, g, beta = m.rule_inputs(tr[tn.norm("decoder", i, 1)][None])
            a, _ = chunked_rule(q, k, v, g, beta, 8)
            b, _ = recurrent_rule(q, k, v, g, beta)
        worst = max(worst, float((a - b).abs().max()))
    print(f"{fam}: chunked vs recurrent heads, max |diff| {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("fam", FAMILIES)
def test_family_generation_with_the_cache(zoo, fam):
    hf, ours, tr, ids, _ = zoo(fam)
    with_cache, without, theirs, d = greedy_three_ways(hf, ours, ids)
    print(f"{fam}: greedy logits with the cache vs without, max |diff| {d:.3g}")
    assert with_cache == without == theirs and d < TOL


@pytest.mark.parametrize("fam", FAMILIES)
def test_decay_only_map_is_far(zoo, fam):
    """A decay-only "effective attention", the heuristic a TransformerLens-style reading of a
    linear-attention layer gives: A_decay[t, s] = exp(sum_{r=s+1..t} g_r) (q_t . k_s) for s <= t,
    the decay of the state between s and t applied to the query-key product, with neither the
    write strength beta_s nor the key removal (I - beta_r k_r k_r^T) of the steps between. It is
    measured against the exact A by ||A_decay - A||_F / ||A||_F per layer: off by O(1)."""
    hf, ours, tr, ids, _ = zoo(fam)
    for i in ours.net.cfg.mixer_layers():
        q, k, g = (tr[tn.mixer("decoder", i, s)].double() for s in ("q", "k", "decay"))
        A = tr[tn.mixer("decoder", i, "weights")].double()
        c = g.cumsum(-1)
        decay = (c[:, :, None] - c[:, None, :]).masked_fill(torch.ones_like(A[0], dtype=torch.bool).triu(1), float("-inf"))
        approx = decay.exp() * (q @ k.transpose(-1, -2))
        rel = float((approx - A).norm() / A.norm())
        print(f"{fam} layer {i}: decay-only map vs exact A, relative distance {rel:.3g}")
        assert rel > 0.3


def test_analyses_on_a_hybrid(zoo):
    """What each analysis does with a mixer layer: direct logit attribution gives it one term and
    still adds up to the logit; head scores skip it; patching patches its own points; score
    attribution, rollout, the KV cache's eviction and head ablation refuse it, saying why."""
    import core.analysis as ca

    hf, ours, tr, ids, (logits, _, _, _) = zoo("qwen3_next")
    t, b = torch.topk(logits[-1], 2).indices.tolist()
    df = ca.logit_attribution(tr, t, baseline=b)
    assert sorted(df[df.kind == "mixer"].layer) == [0, 1, 3] and sorted(set(df[df.kind == "head"].layer)) == [2]
    assert abs(float(df.contribution.sum()) - float(logits[-1, t] - logits[-1, b])) < TOL
    with pytest.raises(KeyError, match="mixes tokens with a mixer"):  # never a mixer's map under a softmax name
        next(tr.each_layer("decoder", [tn.local(tn.SELF, "weights")]))
    got = next(tr.each_layer("decoder", [tn.local(tn.MIXER, "weights")], layers=[1]))
    assert torch.equal(got[tn.local(tn.MIXER, "weights")], tr[tn.mixer("decoder", 1, "weights")])
    scores = ca.head_scores(ours, TEXT, trace=tr)
    assert sorted(set(scores.layer)) == [2]
    with pytest.raises(ValueError, match="not a query-key product"):
        ca.score_attribution(tr, "decoder", 3, 0, query=-1, key=0)
    with pytest.raises(ValueError, match="gates its heads"):  # the output gate alone refuses too
        check_softmax_heads(_NoMixers(ours.net), "decoder", 0, "score attribution")
    with pytest.raises(ValueError, match="rows do not sum to 1"):
        ca.rollout(tr, "decoder")
    with pytest.raises(ValueError, match="fixed-size state"):
        ca.evict(ours, TEXT, "full", 8)
    with pytest.raises(ValueError, match="mixes tokens with 'gated_delta'"):
        ours.trace(TEXT, ablate=[("decoder", 0, 1)])
    clean, corrupt = "the small dog sees the cat near the river", "the small dog sees the cat near the bank"
    assert len(ours.encode(corrupt).ids) == len(ours.encode(clean).ids)
    answer = ours.greedy_run(clean, 1)[0][0]
    heads = ca.patch(ours, clean, corrupt, answer, what="head")  # the mixer layers' heads are its own H
    assert sorted(set(heads.layer)) == [0, 1, 2, 3] and len(heads[heads.layer == 0]) == 6
    assert len(heads[heads.layer == 2]) == 4
    assert float(heads[heads.layer == 0].restored.abs().max()) > 0  # a mixer head's patch moves the metric
    out = ca.patch(ours, clean, corrupt, answer, what="attn_out")
    last = out[(out.layer == 3) & (out.position == out.position.max())]
    assert abs(float(last.restored.iloc[0])) > 0.01  # the last mixer's output at the last position matters


class _NoMixers:
    """A net whose layers are those of `net` with every mixer layer left out (its gate remains)."""

    def __init__(self, net):
        self.net = net

    def layers(self, stack):
        return [layer for layer in self.net.layers(stack) if layer.mixer is None]


def test_qwen3_next_fused_experts_load(zoo, tmp_path):
    """transformers' fused expert layout (experts.gate_up_proj E x 2m x d, experts.down_proj
    E x d x m) loads to the same model as the per-expert tensors the hub's checkpoints hold."""
    from safetensors.torch import load_file, save_file
    import shutil

    hf, ours, tr, ids, (logits, _, _, _) = zoo("qwen3_next")
    src = FOLDERS["qwen3_next"]
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    state = load_file(str(src / "model.safetensors"))
    fused, E = {}, hf.config.num_experts
    for i in range(hf.config.num_hidden_layers):
        pre = f"model.layers.{i}.mlp.experts"
        if f"{pre}.0.gate_proj.weight" not in state:
            continue
        fused[f"{pre}.gate_up_proj"] = torch.stack([torch.cat([state.pop(f"{pre}.{e}.gate_proj.weight"),
                                                               state.pop(f"{pre}.{e}.up_proj.weight")]) for e in range(E)])
        fused[f"{pre}.down_proj"] = torch.stack([state.pop(f"{pre}.{e}.down_proj.weight") for e in range(E)])
    assert len(fused) == 6
    save_file({**state, **fused}, str(tmp_path / "model.safetensors"))
    again = core.load_model(str(tmp_path), device="cpu").trace(TEXT)
    assert torch.equal(again["logits"], tr["logits"])


@pytest.mark.parametrize("change, match", [({"hidden_act": "gelu"}, "hidden_act"),
                                           ({"attention_bias": True}, "attention biases"),
                                           ({"layer_types": ["sliding_attention"] * 4}, "layer_types")])
def test_settings_refused(change, match):
    from core.loaders.checkpoint import CheckpointError
    from core.loaders.families import qwen3_next

    hf = {"model_type": "qwen3_5_text", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 48, "num_hidden_layers": 4, "vocab_size": 50, "hidden_act": "silu",
          "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 8,
          "linear_value_head_dim": 6, "linear_conv_kernel_dim": 4}
    cfg = qwen3_next.config(hf)  # the defaults: every 4th layer full attention, rotary over a quarter
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"] and cfg.rotary_dim == 2
    with pytest.raises(CheckpointError, match=match):
        qwen3_next.config(dict(hf, **change))


def test_multimodal_checkpoint_reads_its_text_model(tmp_path):
    """Qwen3.5's multimodal checkpoint (model_type qwen3_5) loads as its text model: the vision
    tower's tensors are left unread and the text's logits are transformers' own on text alone."""
    pytest.importorskip("transformers")
    from safetensors import safe_open
    from hf_builders import build

    hf, folder = build("qwen3_5", tmp_path)
    hf.save_pretrained(str(folder))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert any(k.startswith("model.visual.") for k in f.keys())
    ours = core.load_model(str(folder), device="cpu")
    tr = ours.trace(TEXT)
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([tr.meta["target_ids"]])).logits[0]
    d = float((tr["logits"] - logits).abs().max())
    print(f"qwen3_5 (multimodal, text alone): logits max |diff| {d:.3g}")
    assert d < TOL and [k["mixer"] for k in ours.layer_kinds()][:3] == ["gated_delta", "gated_delta", "softmax"]


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_trimmed_map_is_the_rule_on_unit_values(per_channel):
    """unit_value_rule (each chunk on the columns written so far) gives chunked_rule's heads on the
    n unit values, which a float64 loop over A[t, s] = beta_s k_s . P_{s+1}^T ... P_t^T q_t also gives."""
    from core.net.gated_delta import unit_value_rule

    torch.manual_seed(3)
    b, h, n, dk = 1, 2, 37, 6  # n not a multiple of the chunk
    q = torch.randn(b, h, n, dk) * 0.4
    k = torch.nn.functional.normalize(torch.randn(b, h, n, dk), dim=-1)
    g = -torch.rand(b, h, n, dk) * 0.4 if per_channel else -torch.rand(b, h, n) * 0.4
    beta = torch.rand(b, h, n)
    a = unit_value_rule(q, k, g, beta, 8)
    full, _ = chunked_rule(q, k, torch.eye(n).expand(b, h, n, n), g, beta, 8)
    assert (a - full).abs().max().item() < 1e-6
    assert torch.count_nonzero(torch.triu(a, 1)) == 0
    Q, K, G, Bt = (t.double().numpy() for t in (q, k, g, beta))
    want = np.zeros((h, n, n))
    for hh in range(h):
        for t in range(n):
            u = Q[0, hh, t].copy()  # P_t^T ... applied backwards from t to s + 1
            for s in range(t, -1, -1):
                want[hh, t, s] = Bt[0, hh, s] * K[0, hh, s] @ u
                dec = np.exp(G[0, hh, s])  # P_s^T = diag(e^g_s)(I - beta_s k_s k_s^T): u <- P_s^T u
                u = dec * (u - Bt[0, hh, s] * K[0, hh, s] * (K[0, hh, s] @ u))
    np.testing.assert_allclose(a[0].double().numpy(), want, atol=2e-6)
