"""The conformance matrix: ONE list of model families (CASES: every family the loaders accept,
the GGUF architectures as tiny files written here, and the three bundled models) against ONE
list of read paths (PATHS). Each cell compares what the path reads with an independent
reference, transformers' eager forward of the same checkpoint where there is one (REF),
within the stated tolerance (TOL); a cell that does not apply says why (not_applicable) and
is skipped with that reason, never silently.

Adding a family: one entry in CASES (tests/family_zoo.py builds it; the Mamba2 and
short-convolution families and Kimi Linear, tests/mixer_builders.py). A layer whose token mixer is not softmax
attention has no map here: the paths read the softmax layers (softmax_layers), and a model with
none says so. Adding a path: one
function in PATHS (and, where it does not apply somewhere, a reason in not_applicable).
The closing test prints the matrix's size and the worst figure per path."""

from __future__ import annotations

import math
import re
from typing import Callable, Dict

import pytest
import torch

import core
import core.analysis as ca
import core.head_maps as hm
from family_zoo import FAMILIES, HYBRID, SOURCE, TARGET, TEXT, make_loader
from mixer_builders import MIXER_FAMILIES

pytest.importorskip("transformers")

GGUF = ["gguf-llama", "gguf-qwen2", "gguf-qwen3", "gguf-phi3", "gguf-gemma2", "gguf-gemma3"]
BUNDLED = ["toy-translate", "minilm", "smollm2"]
CASES = FAMILIES + HYBRID + MIXER_FAMILIES + GGUF + BUNDLED
# attention weights and logits / hidden states against transformers (the contract's 1e-4); value
# norms are weights times ||v W_o^h|| (sizes of a few units here), so 10x that
TOL = {"weights": 1e-4, "logits": 1e-4}
RESULTS: Dict[tuple, float] = {}
SKIPPED: Dict[tuple, str] = {}
STEP_TEXT = "the small dog sees the cat"


# ------------------------------------------------------------------ the models and their references
@pytest.fixture(scope="module")
def get(tmp_path_factory):
    load = make_loader(tmp_path_factory)
    cache = {}

    def get_(case):
        if case in cache:
            return cache[case]
        if case in FAMILIES or case in HYBRID:
            hf, ours = load(case)
        elif case in GGUF:
            hf, ours = _gguf(case, tmp_path_factory.mktemp(case))
        elif case in MIXER_FAMILIES:  # Mamba2, short-convolution and Kimi Linear families (tests/mixer_builders.py)
            from mixer_builders import build
            hf, folder = build(case, tmp_path_factory.mktemp(case))
            ours = core.load_model(str(folder), device="cpu")
        else:
            ours = core.load_model(case, device="cpu")
            hf = _bundled_reference(case)
        cache[case] = (hf, ours)
        return cache[case]

    return get_


def _gguf(case, folder):
    pytest.importorskip("gguf")
    arch = case.split("-", 1)[1]
    if arch in ("gemma2", "gemma3"):
        from gemma_builders import build
        from test_gguf_gemma import write_gguf
        fam = "gemma3_text" if arch == "gemma3" else "gemma2"
        hf, f = build(fam, folder / "hf", **({"query_pre_attn_scalar": 12} if arch == "gemma2" else {}))
        kw = {"scale": 20 ** -0.5, "pattern": [True, True, False, True]} if arch == "gemma3" else {}
        path = write_gguf(hf, folder / f"tiny-{arch}.gguf", arch, vocab=f / "tokenizer.json", **kw)
    else:
        from hf_builders import build
        from test_gguf_loader import write_gguf
        hf, f = build(arch, folder / "hf", **({"sliding_window": 4} if arch == "phi3" else {}))
        path = write_gguf(hf, f / "tokenizer.json", folder / f"tiny-{arch}.gguf", arch=arch)
    return hf, core.load_model(str(path), device="cpu")


def _bundled_reference(case):
    """transformers' model of a bundled checkpoint, or None (toy-translate: the fused pass is its reference)."""
    if case == "smollm2":
        from hf_builders import smollm2_llama
        return smollm2_llama()
    if case == "minilm":
        from transformers import BertModel
        from core.loaders.minilm import model_dir
        return BertModel.from_pretrained(str(model_dir()), attn_implementation="eager").eval()
    return None


def _eager(hf):
    hf.config._attn_implementation = "eager"
    for m in hf.modules():
        if hasattr(m, "config") and getattr(m.config, "_attn_implementation", None) not in (None, "eager"):
            m.config._attn_implementation = "eager"


# the output projection of a self-attention, by module name (its input is Concat(heads))
OPROJ = [r"attention\.output\.dense$", r"\.attn\.c_proj$", r"\.attention\.dense$", r"\.attention\.out_lin$",
         r"\.attn\.Wo$", r"\.self_attn\.out_proj$", r"\.SelfAttention\.o$", r"\.self_attn\.o_proj$"]


def _oproj(hf, stack, layer, two_stacks):
    for name, mod in hf.named_modules():
        if re.search(rf"(layers?|h|block)\.{layer}\.", name) and any(re.search(p, name) for p in OPROJ):
            if not two_stacks or f"{stack}." in name:
                return mod
    raise LookupError(f"no output projection of {stack} layer {layer}")


@torch.no_grad()
def reference(hf, ours, ids, dec_ids=None, ablate=None):
    """transformers' eager forward: {"attn": {(stack, i): H x n x n}, "out": logits (or the
    encoder's last hidden state), "mlm": masked-LM logits where the model has them}.
    ablate (stack, layer, head): that head's slice of Concat(heads) zeroed before W_o."""
    _eager(hf)
    hooks = []
    if ablate is not None:
        stack, layer, head = ablate
        dk = ours.config.d_head

        def zero(m, args):
            x = args[0].clone()
            x[..., head * dk:(head + 1) * dk] = 0
            return (x,) + tuple(args[1:])

        hooks.append(_oproj(hf, stack, layer, ours.kind == "encoder-decoder").register_forward_pre_hook(zero))
    try:
        if ours.kind == "encoder-decoder":
            out = hf(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([dec_ids]), output_attentions=True)
            attn = {("encoder", i): a[0] for i, a in enumerate(out.encoder_attentions)}
            attn.update({("decoder", i): a[0] for i, a in enumerate(out.decoder_attentions)})
            return {"attn": attn, "out": out.logits[0]}
        out = hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
        stack = "encoder" if ours.kind == "encoder" else "decoder"
        maps = [a for a in (getattr(out, "attentions", None) or []) if a is not None]
        # hybrids return the maps of their softmax layers only (Mamba2: none), in layer order
        res = {"attn": {(stack, i): a[0] for i, a in zip(softmax_layers(ours, stack), maps)}}
        if ours.kind == "encoder":  # masked-LM logits where the model has them, else the last hidden state
            res["mlm"] = out.logits[0] if hasattr(out, "logits") else None
            res["out"] = res["mlm"] if res["mlm"] is not None else out.hidden_states[-1][0]
        else:
            res["out"] = out.logits[0]
        return res
    finally:
        for h in hooks:
            h.remove()


def softmax_layers(ours, stack):
    """The layers of `stack` with softmax attention (every layer but a token mixer's alone; Falcon-H1's
    layers have both)."""
    return [i for i, layer in enumerate(ours.net.layers(stack)) if layer.self_attn is not None]


class Cell:
    """One case's trace, its ids and transformers' reference, made once per case."""
    cache: dict = {}

    def __init__(self, case, hf, ours):
        self.case, self.hf, self.ours = case, hf, ours
        self.tr = ours.trace(SOURCE, target=TARGET) if ours.kind == "encoder-decoder" else ours.trace(TEXT)
        self.stack = "encoder" if ours.kind == "encoder" else "decoder"
        self.ids = ours.encode(SOURCE if ours.kind == "encoder-decoder" else TEXT).ids
        self.dec = self.tr.meta.get("target_ids")
        if ours.kind == "decoder":
            self.ids = self.dec
        self.ref = None if hf is None else reference(hf, ours, self.ids, self.dec)

    @classmethod
    def of(cls, case, get):
        if case not in cls.cache:
            cls.cache[case] = cls(case, *get(case))
        return cls.cache[case]

    def self_layers(self):
        """Every softmax self-attention layer (a token mixer's layer has mixer names instead)."""
        return [(s, i) for s in ("encoder", "decoder") for i in range(self.tr.layers(s))
                if f"{s}.{i}.self_attn.weights" in self.tr]

    def ref_weights(self, stack, i):
        """The reference map: transformers' where there is one; else (toy-translate) softmax of
        the fused pass's q k^T in float64 with the look-ahead mask built here."""
        if self.ref is not None:
            return self.ref["attn"][(stack, i)]
        q = self.tr[f"{stack}.{i}.self_attn.q"].double()
        k = self.tr[f"{stack}.{i}.self_attn.k"].double()
        s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if stack == "decoder":
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, -1).float()


def _worst(pairs):
    return max(float((a.double() - b.double()).abs().max()) for a, b in pairs)


# ------------------------------------------------------------------ the read paths
def full(c):
    return _worst((c.tr[f"{s}.{i}.self_attn.weights"], c.ref_weights(s, i)) for s, i in c.self_layers()), TOL["weights"]


def pooled_1(c):
    return _worst((c.tr.pooled(f"{s}.{i}.self_attn.weights", size=1), c.ref_weights(s, i))
                  for s, i in c.self_layers()), TOL["weights"]


def pooled_odd(c):
    """Blocks of a size that does not divide n against the reference's block means."""
    out = []
    for s, i in c.self_layers():
        ref = c.ref_weights(s, i)
        size = next(z for z in (3, 4, 5, 7) if ref.shape[-1] % z and ref.shape[-2] % z)
        out.append((c.tr.pooled(f"{s}.{i}.self_attn.weights", size=size),
                    torch.stack([hm.pool_full(r, size) for r in ref])))
    return _worst(out), TOL["weights"]


def tiles(c):
    """One head's map over several tiles (TILE_ROWS = 4 here), each layer that tiles."""
    from pytest import MonkeyPatch
    with MonkeyPatch.context() as mp:
        mp.setattr(hm, "TILE_ROWS", 4)
        pairs = []
        for s, i in c.self_layers():
            if not hm.tileable(c.tr, s, "self_attn"):
                continue
            lm = hm.LayerMaps(c.tr, s, i)
            pairs.append((torch.stack([lm.head(h) for h in range(lm.n_heads)]), c.ref_weights(s, i)))
        assert lm.n > 4  # two tiles at least
    return _worst(pairs), TOL["weights"]


def value_norms(c):
    """||a_ij v_j W_o^h|| against the reference's a_ij times ||v_j W_o^h|| (v: the fused pass's,
    W_o: the checkpoint's), in float64 here."""
    pairs = []
    for s, i in c.self_layers():
        attn = c.ours.net.layers(s)[i].self_attn
        v = c.tr[f"{s}.{i}.self_attn.v"].double()  # (H_kv, n, d_k)
        w_o = attn.w_o.weight.double()  # (d, H d_k)
        dk, H = attn.dk, attn.h
        a = c.ref_weights(s, i).double()
        ref = torch.stack([a[h] * (v[h // (H // v.shape[0])] @ w_o[:, h * dk:(h + 1) * dk].T).norm(dim=-1)[None, :]
                           for h in range(H)])
        pairs.append((c.tr[f"{s}.{i}.self_attn.value_norms"], ref))
    return _worst(pairs), TOL["weights"] * 10


def step(c):
    """Each step view of greedy decoding (model.steps) against the reference run on that prefix alone."""
    views = c.ours.steps(SOURCE if c.ours.kind == "encoder-decoder" else STEP_TEXT, max_new_tokens=3)
    assert len(views) >= 2
    pairs = []
    for v in views:
        dec = v.meta["target_ids"]
        if c.hf is None:  # the decoder's own pass on the prefix alone
            alone = c.ours.trace_decoder_input(SOURCE if c.ours.kind == "encoder-decoder" else STEP_TEXT, dec)
            ref = {("decoder", i): alone[f"decoder.{i}.self_attn.weights"] for i in range(v.layers("decoder"))}
        else:
            src = c.ours.encode(SOURCE).ids if c.ours.kind == "encoder-decoder" else dec
            ref = reference(c.hf, c.ours, src, dec)["attn"]
        pairs += [(v[f"decoder.{i}.self_attn.weights"], ref[("decoder", i)]) for i in range(v.layers("decoder"))
                  if f"decoder.{i}.self_attn.weights" in v]
    return _worst(pairs), TOL["weights"]


def ablated(c):
    """Head 1 of the first softmax layer (layer 0 but in a hybrid) switched off: the output
    (logits, or the encoder's last hidden state) against the reference with that head's slice of
    Concat(heads) (after an output gate) zeroed by a torch hook."""
    stack = c.stack
    layer = next(i for s, i in c.self_layers() if s == stack)
    kw = {"target": TARGET} if c.ours.kind == "encoder-decoder" else {}
    tr = c.ours.trace(SOURCE if kw else TEXT, ablate=[(stack, layer, 1)], **kw)
    ref = reference(c.hf, c.ours, c.ids, c.dec, ablate=(stack, layer, 1))
    plain = c.ref["out"]
    got = tr["logits"] if c.ours.kind != "encoder" else encoder_out(c, tr)
    assert float((ref["out"] - plain).abs().max()) > 1e-3  # the ablation moves the output, so this can fail
    return _worst([(got, ref["out"])]), TOL["logits"]


def encoder_out(c, tr):
    """An encoder's output as the reference gives it: masked-LM logits, or the last hidden state."""
    h = tr[f"encoder.{tr.layers('encoder') - 1}.out"]
    norm = c.ours.net.final_norm("encoder")  # ModernBERT's final norm comes before its head
    with torch.no_grad():
        h = h if norm is None else norm(h)
        return c.ours.mlm_logits(h) if c.ref.get("mlm") is not None else h


def lens(c):
    """The lens at the last layer is the model's own output: its top probabilities at every
    position against softmax of the reference's logits (masked-LM logits for an encoder)."""
    df = ca.lens(c.tr)
    last = df[df.layer == df.layer.max()].sort_values("position")
    logits = c.ref["mlm"] if c.ours.kind == "encoder" else c.ref["out"]
    p = torch.softmax(logits.double(), -1)[last.position.to_numpy()]
    k = len(last.top_probs.iloc[0])
    got = torch.tensor([list(t) for t in last.top_probs])
    return _worst([(got, torch.topk(p, k).values)]), TOL["logits"]


def attribution(c):
    """Direct logit attribution: its terms add up to the reference's logit difference."""
    logits = c.ref["out"][-1]
    t, b = torch.topk(logits, 2).indices.tolist()
    df = ca.logit_attribution(c.tr, t, baseline=b, position=-1)
    diff = float(logits[t] - logits[b])
    return abs(float(df.contribution.sum()) - diff) / max(1.0, abs(diff)), TOL["logits"]


CLEAN = "the small dog sees the cat near the river"
SWAPS = ["bank", "mat", "cat", "man", "book", "trophy", "old", "woman", "dog", "suitcase"]


def restore(c):
    """Patching's layer-0 restore: the corrupted run with the clean residual stream entering
    layer 0 at every differing position is the clean run (restored 1, metric equal). The
    corrupted input swaps the last word for one of the same token count whose metric (or, for
    an encoder-decoder, greedy translation) differs."""
    from core.analysis.activation_patching import restore_check
    n = len(c.ours.encode(CLEAN).ids)
    for w in SWAPS:
        corrupt = CLEAN.rsplit(" ", 1)[0] + " " + w
        if len(c.ours.encode(corrupt).ids) != n:
            continue
        try:
            r = restore_check(c.ours, CLEAN, corrupt, 3 if c.ours.kind == "decoder" else None,
                              4 if c.ours.kind == "decoder" else None)
        except ValueError:  # the same greedy translation: nothing to measure
            continue
        if abs(r["clean_metric"] - r["corrupt_metric"]) > 1e-4:  # the inputs differ in the metric
            return abs(r["patched_metric"] - r["clean_metric"]) / max(1.0, abs(r["clean_metric"])), TOL["logits"]
    if c.ours.kind == "encoder-decoder" and c.hf is not None:  # toy-translate's real translations cover the kind
        why = "this tiny random checkpoint translates every swapped source alike: patching has no position to measure"
        SKIPPED[(c.case, "restore")] = why
        pytest.skip(f"not applicable: {why}")
    pytest.fail("no one-word swap of the same token count moves the metric")


def kv_cache(c):
    """Greedy generation through the KV cache against the decoder run on the whole prefix at
    every step: the same token ids, and the next-token logits of both against the reference's
    logits on the generated sequence."""
    text = SOURCE if c.ours.kind == "encoder-decoder" else STEP_TEXT
    ids, _, cached = c.ours.greedy_run(text, 4, use_cache=True)
    plain_ids, _, plain = c.ours.greedy_run(text, 4, use_cache=False)
    assert ids == plain_ids and len(ids) >= 2
    # the stepper's check reads the uncached logits from one pass over the prompt and the tokens
    forced = c.ours.forced_logits(text, ids)
    assert forced.shape == plain.shape
    torch.testing.assert_close(forced, plain, atol=1e-4, rtol=1e-4)
    pairs = [(cached, plain)]
    if c.hf is not None:
        if c.ours.kind == "encoder-decoder":
            prefix = [c.ours.start_id]
            ref = reference(c.hf, c.ours, c.ours.encode(text).ids, prefix + ids[:-1])["out"]
        else:
            prefix = c.ours.encode(text).ids
            ref = reference(c.hf, c.ours, prefix + ids[:-1])["out"]
        pairs.append((cached, ref[len(prefix) - 1:]))
    return _worst(pairs), TOL["logits"]


EVICT_BUDGET, EVICT_SINKS = 4, 1  # StreamingLLM with 1 sink and 3 recent keys: inside the windows of 4 too


def _self_attentions(hf):
    """transformers' self-attention modules of a decoder-only model, layer by layer."""
    mods = [m for name, m in hf.named_modules() if re.search(r"\.\d+\.(self_attn|attn|attention)$", name)]
    assert len(mods) == hf.config.num_hidden_layers, [type(m).__name__ for m in mods]
    return mods


@torch.no_grad()
def masked_logprobs(hf, ids, off):
    """transformers' eager forward with, in every self-attention, the mask it builds itself (the
    look-ahead mask and the layer's own window) plus off(layer) -> (1 or H, n, n) bool, True
    where the query may not see the key: log-probabilities of each next token (n - 1,), float64."""
    _eager(hf)
    hooks = []
    for li, mod in enumerate(_self_attentions(hf)):
        def pre(m, args, kwargs, li=li):
            own = kwargs.get("attention_mask")
            assert own is not None and own.dim() == 4, "transformers built no 4-d mask to add to"
            low = torch.finfo(torch.float32).min
            if own.dtype == torch.bool:  # True: may attend
                own = torch.zeros(own.shape).masked_fill(~own, low)
            kwargs["attention_mask"] = own + torch.zeros(off(li).shape).masked_fill(off(li), low)[None]
            return args, kwargs
        hooks.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        logits = hf(torch.tensor([ids])).logits[0].double()
    finally:
        for h in hooks:
            h.remove()
    lp = torch.log_softmax(logits, -1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def evict_path(c):
    """core.analysis.evict against transformers: the full policy's log-probabilities against the
    plain eager forward's; StreamingLLM's (1 sink, budget 4) against the eager forward with
    the policy's mask written here from its definition (keys 0 and t-2..t) added to the model's
    own in every layer; H2O's against the eager forward masked, head by head and layer by layer,
    with the keys H2O's cache held (df.attrs["kept"]): the numbers evict gives for those choices.
    Models with a sliding window: `window` at that window loses no mass in the layers it is the
    window of (the global layers of Gemma 2/3 may)."""
    ours, text = c.ours, CLEAN  # a short text: H2O reads it token by token
    ids = list(ours.encode(text).ids)
    n = len(ids)
    want = torch.log_softmax(reference(c.hf, ours, ids)["out"].double(), -1)[torch.arange(n - 1), torch.tensor(ids[1:])]
    full_df = ca.evict(ours, text, "full", n)
    pairs = [(torch.tensor(full_df.logprob.to_numpy()[:-1]), want)]
    t = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    gone = (j <= t) & (j >= EVICT_SINKS) & (t - j >= EVICT_BUDGET - EVICT_SINKS)  # streaming, from its definition
    df = ca.evict(ours, text, "streaming", EVICT_BUDGET, sinks=EVICT_SINKS)
    assert df.kl.max() > 1e-6  # the policy moved the prediction: this comparison can fail
    pairs.append((torch.tensor(df.logprob.to_numpy()[:-1]), masked_logprobs(c.hf, ids, lambda li: gone[None])))
    h2o = ca.evict(ours, text, "h2o", EVICT_BUDGET)
    kept = h2o.attrs["kept"]
    H = ours.config.n_heads
    unseen = [torch.stack([torch.as_tensor(~kept(li, h)) for h in range(H)]) & (j <= t) for li in range(kept.shape[0])]
    pairs.append((torch.tensor(h2o.logprob.to_numpy()[:-1]), masked_logprobs(c.hf, ids, lambda li: unseen[li])))
    windows = [ours.net.attn_spec("decoder", li).window for li in range(ours.config.n_layers)]
    w = next((x for x in windows if x is not None), None)
    if w is not None and w < n:  # `window` at the model's own window: its sliding layers lose no mass
        heads = torch.as_tensor(ca.evict(ours, text, "window", w).attrs["mass_lost_heads"])
        local = [li for li, x in enumerate(windows) if x == w]
        pairs.append((heads[local], torch.zeros_like(heads[local])))
    return _worst(pairs), TOL["logits"]


def score_path(c):
    """Score attribution: at the last layer's head 1 (head 0 where there is one), the last query
    and its two keys of highest weight, the terms' sum is the model's own score (the trace's
    scaled map, the contract's 1e-4 x max(1, |s|)); and the two sums, soft-capped where the head
    caps (and T5's position bias added, read from the trace), differ by log(a_j / a_j2) of the
    reference's weights (transformers' eager attention). The worst relative error of the two."""
    stack, L = c.stack, c.tr.layers(c.stack)
    layer = L - 1
    head = min(1, c.ours.net.layers(stack)[layer].self_attn.h - 1)
    a = c.ref_weights(stack, layer)[head].double()  # n x n
    i = a.shape[0] - 1
    j1, j2 = torch.topk(a[i], 2).indices.tolist()
    errs, sums = [], []
    for j in (j1, j2):
        df = ca.score_attribution(c.tr, stack, layer, head, query=i, key=j)
        s, tot = df.attrs["score"], df.attrs["sum"]
        errs.append(abs(s - tot) / max(1.0, abs(s)))
        cap = df.attrs["softcap"]
        sums.append(tot if cap is None else cap * math.tanh(tot / cap))
    diff = sums[0] - sums[1]
    bias = f"{stack}.{layer}.self_attn.position_bias"
    if c.ours.config.positional == "relative":
        pb = c.tr[bias][head].double()
        diff += float(pb[i, j1] - pb[i, j2])
    log_ratio = float(torch.log(a[i, j1] / a[i, j2]))
    errs.append(abs(diff - log_ratio) / max(1.0, abs(log_ratio)))
    return max(errs), TOL["weights"]


PATHS: Dict[str, Callable] = {"full": full, "pooled_1": pooled_1, "pooled_odd": pooled_odd, "tiles": tiles,
                              "value_norms": value_norms, "step": step, "ablated": ablated, "lens": lens,
                              "attribution": attribution, "restore": restore,
                              "kv_cache": kv_cache, "evict": evict_path, "score_attribution": score_path}


def not_applicable(case, c, path):
    """Why `path` does not apply to this case (None: it applies)."""
    ours, cfg = c.ours, c.ours.config
    if not softmax_layers(ours, c.stack) and path in ("full", "pooled_1", "pooled_odd", "tiles", "value_norms",
                                                      "step", "ablated"):
        return ("every layer mixes tokens with a Mamba2 scan, no softmax attention: its implicit attention is "
                "held to transformers by tests/parity/test_mamba_families.py")
    if path in ("pooled_1", "pooled_odd", "tiles") and cfg.positional == "relative":
        if path == "tiles":
            return "T5's self-attention adds a relative position bias: its maps are read whole, never tiled"
    if path == "tiles" and cfg.positional != "relative" and not hm.tileable(c.tr, c.stack, "self_attn"):
        return "a sparse selection chooses each query's keys from its whole row of index scores: maps are read whole"
    if path in ("step", "kv_cache") and ours.kind == "encoder":
        return "an encoder does not generate: there are no steps"
    if path in ("ablated", "lens", "attribution") and c.hf is None:
        return "toy-translate has no transformers counterpart to hold the output against"
    if path == "lens":
        try:
            ca.logit_lens.lens_stack(c.tr, ours)
        except ValueError as e:
            return str(e)
        if ours.kind == "encoder" and c.ref.get("mlm") is None:
            return "the reference has no masked-LM head"
    if path == "attribution":
        from core.analysis.logit_attribution import check_applies
        try:
            check_applies(ours)
        except ValueError as e:
            return str(e)[:160]
        if ours.kind == "encoder-decoder":
            return "direct logit attribution reads decoder-only models"
    if path == "evict":
        from core.analysis.evict import check_args
        try:
            check_args(ours, "full", 4)
        except ValueError as e:
            return str(e)
    if path == "value_norms" and c.self_layers() and not all(
            f"{s}.{i}.self_attn.value_norms" in c.tr for s, i in c.self_layers()):
        from core.net.multihead import NO_VALUE_NORMS
        return NO_VALUE_NORMS[:160]
    if path == "score_attribution":
        try:
            ca.score_attribution(c.tr, c.stack, c.tr.layers(c.stack) - 1, 0, query=-1, key=0)
        except ValueError as e:
            return str(e)[:160]
    if path == "restore" and ours.kind == "encoder":
        return "an encoder predicts no next token: patching's metric is a next-token logit difference"
    return None


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "smollm2" else c for c in CASES])
def test_cell(get, case, path):
    c = Cell.of(case, get)
    why = not_applicable(case, c, path)
    if why is not None:
        SKIPPED[(case, path)] = why
        pytest.skip(f"not applicable: {why}")
    worst, tol = PATHS[path](c)
    RESULTS[(case, path)] = worst
    assert worst < tol, f"{case} x {path}: {worst:.3g} > {tol:g}"


def test_zz_summary(capsys):
    """The matrix's size and the worst figure per path (of the cells run in this session)."""
    if not RESULTS:
        pytest.skip("no cell ran in this session")
    with capsys.disabled():
        print(f"\nconformance: {len(CASES)} families x {len(PATHS)} paths = {len(CASES) * len(PATHS)} cells; "
              f"{len(RESULTS)} checked, {len(SKIPPED)} not applicable")
        for path in PATHS:
            got = {k[0]: v for k, v in RESULTS.items() if k[1] == path}
            if got:
                case = max(got, key=got.get)
                print(f"  {path:12s} worst {got[case]:.2e} ({case}), {len(got)} cells")
