"""Every check a page shows, with a fault injected into the core from outside.

REGISTRY lists the checks, one entry each: the page and view that shows it, what it compares,
how the fault is injected (monkeypatch on the core: the explicit attention path's softmax,
scale, scores or mask; a projection's output; RoPE's angles; the fused kernel's output; a norm;
the FFN; how the norms are built; or, for a check of what a page drew, the page's own drawing: the
decoder step view's rows one position late) and the texts that mark its failure and its success. For
each entry the page runs under AppTest with the fault in place and must show the failure
visibly (an st.error with the check's text); then, the fault removed, it must show the check's
success and no error at all. The trace cache and streamlit's data caches are cleared around
each run, so a clean cached trace cannot hide the fault (a trace's recomputed layers and its
checks live inside the trace, so they go with it).

To add a check: `add(Fault(...))` beside the code that shows it (or call add() from a
function in this module); the parametrised test picks it up.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import pytest
import streamlit as st
import torch

import core
import core.net.attention
import core.net.gated_delta
import core.net.layers
import core.net.mamba2
import core.net.model
import core.net.multihead
import core.trace
from conftest import assert_no_exception

TEXT = "the small dog sees the cat"


@dataclass
class Fault:
    check: str  # the check, as the page words it
    page: str
    params: object  # URL parameters, or a function that returns them (computed when the test runs)
    compares: str  # the two sides the check holds against each other
    inject: Callable  # inject(monkeypatch): the fault, put into the core from outside
    fails: str  # text of the st.error the page must show with the fault
    holds: str  # text of the success the page must show without it (a green caption or st.success)
    slow: bool = False
    key: Optional[str] = None  # the Inside page's step key the check sits at
    verify: Optional[Callable] = None  # verify(failing_page): what else its failure must say


REGISTRY: List[Fault] = []


def add(entry: Fault) -> Fault:
    REGISTRY.append(entry)
    return entry


# ------------------------------------------------------------------ faults in the core
_ORIG_SDPA = core.net.attention.scaled_dot_product_attention


def explicit_path(fault: str):
    """core.net.attention.scaled_dot_product_attention with one step of the explicit (recorded) path
    wrong, or ("fused") the fused kernel's output 1 % off. The other path is the original."""

    def sdpa(q, k, v, mask=None, record=None, scale=None, is_causal=False):
        if record is None:
            out = _ORIG_SDPA(q, k, v, mask, None, scale, is_causal)
            return out * 1.01 if fault == "fused" else out
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        if fault == "scale":
            scale = scale * 1.05  # 1/sqrt(d_k) off by 5 %
        if is_causal and mask is None:
            mask = core.net.attention.causal_mask(q.shape[-2], device=q.device, dtype=q.dtype, n_k=k.shape[-2])
        scores = q @ k.transpose(-2, -1)
        if fault == "scores":
            scores = scores * 1.01
        scaled = scores * scale
        masked = scaled if mask is None or fault == "mask" else scaled + mask
        weights = torch.softmax(masked, dim=-1)
        if fault == "softmax":  # a few percent off, rows no longer normalised
            ripple = 0.03 * torch.cos(torch.arange(weights.shape[-1], dtype=weights.dtype, device=weights.device))
            weights = weights * (1 + ripple)
        if fault == "leak":  # masked keys get a little weight
            weights = torch.where(torch.isneginf(masked), torch.full_like(weights, 1e-3), weights)
        record("scores", scores)
        record("scaled", scaled)
        record("masked", masked)
        record("weights", weights)
        return weights @ v

    def inject(mp):
        for mod in (core.net.attention, core.net.multihead, core):
            mp.setattr(mod, "scaled_dot_product_attention", sdpa)

    return inject


def projection(owner, attr: str, factor: float = 1.02):
    """A sub-module's output (e.g. an attention's w_k) `factor` times what the weight gives,
    inside the core's forward; the checkpoint's weight itself is left as it is."""

    def inject(mp):
        orig = owner.forward

        def forward(self, *a, **kw):
            hook = getattr(self, attr).register_forward_hook(lambda m, i, out: out * factor)
            try:
                return orig(self, *a, **kw)
            finally:
                hook.remove()

        mp.setattr(owner, "forward", forward)

    return inject


def rope_angles_off(mp):
    orig = core.net.multihead.apply_rope
    mp.setattr(core.net.multihead, "apply_rope", lambda x, angles, layout="half": orig(x, angles * 1.01, layout))


def causal_mask_off_by_one(mp):
    def causal_mask(n, device=None, dtype=torch.float32, n_k=None):
        n_k = n if n_k is None else n_k
        q_pos = torch.arange(n_k - n, n_k, device=device)[:, None]
        k_pos = torch.arange(n_k, device=device)[None, :]
        return torch.zeros(n, n_k, device=device, dtype=dtype).masked_fill(k_pos > q_pos + 1, float("-inf"))

    mp.setattr(core.net.multihead, "causal_mask", causal_mask)


def layer_norm_off(mp):
    orig = torch.nn.LayerNorm.forward
    mp.setattr(torch.nn.LayerNorm, "forward", lambda self, x: orig(self, x) * 1.01)


def norms_without_shift(mp):
    """Transformer(cfg) builds its LayerNorms without the shift β: the count loses 2·d per norm pair."""
    mp.setattr(core.net.layers, "make_norm", lambda cfg: torch.nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=False)
               if cfg.norm == "layernorm" else core.net.layers.RMSNorm(cfg.d_model, cfg.norm_eps))


MHA, FFN = core.net.multihead.MultiHeadAttention, core.net.layers.FeedForward


# ------------------------------------------------------------------ the registry
DEC_SELF = {"text": TEXT, "attn": "decoder.self_attn", "layer": "1", "head": "2"}
DEC_CROSS = {"text": TEXT, "attn": "decoder.cross_attn", "layer": "1", "head": "2"}
ROPE = {"model": "smollm2", "text": TEXT, "layer": "1", "head": "4"}
REC = "(float64 numpy, from the stored input and the checkpoint's weights) equals the recorded"


def inside(key, check, params, compares, inject, recorded, slow=False, holds=None):
    return add(Fault(check, "inside", params, compares, inject, fails=holds or f"{REC} `{recorded}`",
                     holds=holds or f"{REC} `{recorded}`", slow=slow, key=key))


inside("q", "Q = X W_q (+ b)", DEC_SELF, "recorded q vs numpy X W_q", projection(MHA, "w_q"), "q")
inside("k", "K = X W_k (+ b)", DEC_SELF, "recorded k vs numpy X W_k", projection(MHA, "w_k"), "k")
inside("v", "V = X W_v (+ b)", DEC_SELF, "recorded v vs numpy X W_v", projection(MHA, "w_v"), "v")
inside("k", "cross-attention K = Y W_k, Y the encoder output", DEC_CROSS, "recorded k vs numpy (encoder output) W_k",
       projection(MHA, "w_k"), "k")
inside("khat", "Q̂, K̂ before RoPE", ROPE, "recorded k_pre_rope vs numpy Norm(X) W_k", projection(MHA, "w_k"), "k_pre_rope",
       slow=True)
inside("q", "RoPE(Q̂) = Q", ROPE, "recorded q vs numpy rotation of numpy Q̂", rope_angles_off, "q", slow=True)
inside("scores", "QKᵀ = scores", DEC_SELF, "recorded scores vs numpy Q Kᵀ", explicit_path("scores"), "scores")
inside("scaled", "scale × scores = scaled", DEC_SELF, "recorded scaled vs numpy scores / √d_k", explicit_path("scale"), "scaled")
inside("mask", "M, the look-ahead mask", DEC_SELF, "recorded mask vs a causal mask built in numpy", causal_mask_off_by_one,
       "mask", holds="M built in numpy as the look-ahead mask equals the recorded `mask`")
inside("masked", "scaled + M = masked", DEC_SELF, "recorded masked vs numpy scaled + M", explicit_path("mask"), "masked")
inside("weights", "A = softmax(masked)", DEC_SELF, "recorded weights vs numpy softmax", explicit_path("softmax"), "weights")
inside("weights", "rows of A sum to 1", DEC_SELF, "row sums of the recorded weights vs 1", explicit_path("softmax"), "",
       holds="each row of A sums to 1")
inside("weights", "A = 0 where M = -∞", DEC_SELF, "recorded weights on the numpy mask's -∞ cells vs 0", explicit_path("leak"), "",
       holds="A is exactly 0 where the numpy mask M is -∞")
inside("heads", "A V = stored head output", DEC_SELF, "recorded A V vs the head output the fused kernel stored",
       explicit_path("fused"), "", holds="equals head 2's output as the forward pass's fused kernel computed it")
inside("attn-out", "Concat(heads) Wᴼ", DEC_SELF, "recorded attention out vs numpy Concat(heads) Wᴼ", projection(MHA, "w_o"),
       "self_attn.out")
inside("norm", "norm", DEC_SELF, "recorded norm1 vs numpy LayerNorm", layer_norm_off, "norm1")
inside("ffn-hidden", "FFN hidden layer", DEC_SELF, "recorded ffn.hidden vs numpy act(X W_1 + b_1)", projection(FFN, "w_1"),
       "ffn.hidden")
inside("ffn-out", "FFN output", DEC_SELF, "recorded ffn.out vs numpy hidden W_2 + b_2", projection(FFN, "w_2"), "ffn.out")
inside("residual", "residual = input + sub-layer output", DEC_SELF, "recorded residual3 vs numpy residual",
       projection(FFN, "w_2"), "residual3")
inside("out", "layer output (numpy) = stored output", DEC_SELF, "numpy layer output vs the fused pass's stored output",
       explicit_path("fused"), "", holds="the layer's output (float64 numpy, from the stored input and the checkpoint's "
                                         "weights) equals the output the fused forward pass stored")
inside("out", "explicit re-run = fused output", DEC_SELF, "explicit re-run's layer output vs the fused pass's stored output",
       explicit_path("fused"), "", holds="run again with the explicit formula gives the output the fused forward pass "
                                         "stored")
add(Fault("learned scores shown = numpy", "playground", {"text": TEXT, "layer": "1", "head": "2", "tab": "symmetric"},
          "tab 3's learned scores (core's attention on the recorded Q, K) vs numpy from the layer input and W_q, W_k",
          explicit_path("scale"), fails="the learned scores shown equal Q Kᵀ × scale recomputed in float64 numpy",
          holds="the learned scores shown equal Q Kᵀ × scale recomputed in float64 numpy"))
add(Fault("parameter count: formula = core", "playground", {"text": TEXT, "tab": "sizes"},
          "tab 5's hand-written count vs Transformer(cfg).num_parameters()", norms_without_shift,
          fails="The formula and core's count differ", holds="The hand-written formula and core's count agree"))


# ------------------------------------------------------------------ the Positions page
def positions_off_by_one(mp):
    """The embedding adds the positions of the next token (offset + 1): P and X both off."""
    original = core.net.layers.Embedding.forward

    def shifted(self, ids, rec=None, offset=0, token_types=None):
        return original(self, ids, rec, offset=offset + 1, token_types=token_types)

    mp.setattr(core.net.layers.Embedding, "forward", shifted)


def pe_formula_without_cosines(mp):
    """Not the core: the page's own formula with its cosines replaced by sines, so PE·PEᵀ is no
    longer constant along its diagonals (section 3's check is about the formula itself)."""
    import viz.figures.sinusoid

    real = viz.figures.sinusoid.pe_matrix

    def broken(n, d, layout="interleaved", base=10000.0):
        pe = real(n, d, layout, base)
        pe[:, 1::2] = pe[:, 0::2][:, : d // 2] * 0.5 + 0.1
        return pe

    mp.setattr(viz.figures.sinusoid, "pe_matrix", broken)


POSITIONS = {"model": "toy-translate", "text": TEXT}
add(Fault("model's P = the formula in numpy", "positions", POSITIONS,
          "the recorded P vs the sinusoid formula written out again in float64 numpy (viz.figures.sinusoid.pe_matrix)",
          positions_off_by_one, fails="the recorded P equals the sinusoid formula",
          holds="the recorded P equals the sinusoid formula"))
add(Fault("model's X = X' + P in numpy", "positions", POSITIONS,
          "the recorded layer-0 input vs the recorded X' plus the numpy formula's P",
          positions_off_by_one, fails="the recorded layer-0 input X equals X′ + P",
          holds="the recorded layer-0 input X equals X′ + P"))
add(Fault("PE·PEᵀ constant along its diagonals", "positions", POSITIONS,
          "neighbouring diagonal entries of the formula's PE·PEᵀ against each other (a property of the formula)",
          pe_formula_without_cosines, fails="PE_i · PE_k is the same along every diagonal",
          holds="PE_i · PE_k is the same along every diagonal"))


# ------------------------------------------------------------------ the decoder stepper
def shifted_step_rows(mp):
    """Step views (Trace.prefix) give their rows one position late: row i shows row i - 1's
    numbers (rolled along the query axis), the shapes unchanged."""
    original = core.trace.decoder_rows

    def shifted(name, x, t):
        out = original(name, x, t)
        if out is x:  # not a decoder row (the encoder side, cross-attention's keys and values)
            return out
        return torch.roll(out, 1, dims=1 if out.dim() == 3 else 0)  # H x n x ... or n x ...

    mp.setattr(core.trace, "decoder_rows", shifted)


def _decoder_params() -> Dict[str, str]:
    """Teacher forcing on the greedy output, at step 3 (rows 0-2: <start> and two tokens)."""
    toy = core.load_model("toy-translate", device="cpu")
    return {"model": "toy-translate", "text": TEXT, "target": " ".join(toy.greedy_batch([TEXT])[0]), "step": "3"}


def _says_how_much_and_where(at) -> None:
    errors = [e.value for e in at.error if "max |Δ|" in e.value]
    delta = float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", errors[0]).group(1))
    assert delta > 1e-4 and "> 1e-04" in errors[0], errors[0]
    assert re.search(r" at (self|cross)-attention weights, layer \d, head \d, row \d, key \d", errors[0]) or \
        re.search(r" at top-k next-token probabilities, row \d", errors[0]), errors[0]
    assert at.radio(key="decoder.mode").value == "teacher"


add(Fault("teacher-forced rows = the prefix run alone", "decoder", _decoder_params,
          "the step's rows of the teacher-forced pass vs the decoder run on that prefix alone (its own forward pass)",
          shifted_step_rows, fails="max |Δ| =", holds="max |Δ| =", verify=_says_how_much_and_where))


def drawn_rows_shifted(mp):
    """Not the core: the step view draws its maps one row late (row i shows the trace's row i - 1, the
    shapes unchanged), as a page whose drawing code misreads the trace would. The trace behind the
    view is right, so only a check of the arrays drawn can see it."""
    import viz.decoder.figures as dv

    original = dv.head_matrix

    def shifted(trace, name, head, rows_from=0):
        m = original(trace, name, head, rows_from)
        return m if m.shape[0] < 2 else __import__("numpy").roll(m, 1, axis=0)

    mp.setattr(dv, "head_matrix", shifted)


def cached_positions_shifted(mp):
    """Greedy decoding through the KV cache places each new token one position late (its
    embedding's position offset n_past + 1): the cached steps change, a pass over the whole
    prefix (offset 0) does not."""
    orig = core.net.layers.Embedding.forward
    mp.setattr(core.net.layers.Embedding, "forward",
               lambda self, ids, rec=None, offset=0, token_types=None: orig(self, ids, rec, offset + 1 if offset else 0,
                                                                            token_types))


INFERENCE = {"model": "toy-translate", "text": TEXT, "step": "3"}
add(Fault("inference step view = the prefix run alone", "decoder", INFERENCE,
          "the maps and next-token probabilities drawn for an inference step (a view of one pass over the whole "
          "generation) vs the decoder run on that step's input alone (its own forward pass)",
          shifted_step_rows, fails="Step view check failed", holds="Step view check:"))
add(Fault("inference step view as drawn = the prefix run alone", "decoder", INFERENCE,
          "the arrays the step view drew (the mask, masked scores and weights of the layer and head shown, the "
          "cross-attention, the next-token bars) vs the decoder run on that step's input alone",
          drawn_rows_shifted, fails="Step view check failed", holds="Step view check:"))
add(Fault("teacher-forced rows as drawn = the prefix run alone", "decoder", _decoder_params,
          "the arrays the teacher-forcing view drew, rows 0 to the step's, vs the decoder run on that prefix alone",
          drawn_rows_shifted, fails="max |Δ| =", holds="max |Δ| ="))
add(Fault("KV-cache generation = the uncached run", "decoder", INFERENCE,
          "the tokens generated through the KV cache and its next-token logits vs greedy decoding with the decoder "
          "run on the whole prefix at every step", cached_positions_shifted, fails="KV-cache check failed",
          holds="KV-cache check:"))


# ------------------------------------------------------------------ the patching page
def patched_runs_start_a_layer_late(mp):
    """Transformer.run_from (where every patched run starts) skips the layer it is asked to start
    at: the patched runs lose a layer, the clean and corrupted runs do not."""
    orig = core.net.model.Transformer.run_from
    mp.setattr(core.net.model.Transformer, "run_from",
               lambda self, stack, i, x, *a, **kw: orig(self, stack, i + 1, x, *a, **kw))


add(Fault("patching the whole stream at layer 0 restores 1", "patching",
          {"model": "toy-translate", "text": "the small dog sees the cat", "corrupt": "the small cat sees the dog"},
          "the patched run's metric (the grid's batched runs, from layer 0) vs the clean run's own metric",
          patched_runs_start_a_layer_late, fails="patching the whole residual stream entering layer 0",
          holds="patching the whole residual stream entering layer 0"))
# ------------------------------------------------------------------ the Lens page
LENS = {"model": "smollm2", "text": "When Mary and John went to the store, John gave a drink to", "target": " Mary",
        "baseline": " John"}
add(Fault("contributions add up to the model's own logit", "lens", LENS,
          "the sum of direct logit attribution's rows (heads through the checkpoint's W_o, MLPs run again) vs the "
          "model's own logit difference from the pass's final hidden state",
          projection(MHA, "w_o"), fails="Contributions do not add up to the model's own logit",
          holds="Contributions add up to the model's own logit"))


# ------------------------------------------------------------------ "Why here?" (Explore, a clicked cell)
WHY = {"model": "smollm2", "text": TEXT, "attn": "decoder.self_attn", "layer": "1", "head": "4", "why": "4,1",
       "versus": "none"}
add(Fault("the terms add up to the model's own score", "explore", WHY,
          "the sum of score attribution's terms (stored heads through W_o, the stored stream, norms frozen, W_q, W_k, "
          "RoPE) vs the model's own scaled score s_ij from the trace's re-run layer",
          explicit_path("scale"), fails="The terms do not add up to the model's own score",
          holds="The terms add up to the model's own score"))


# ------------------------------------------------------------------ the Circuits page
CIRCUIT = {"model": "toy-translate", "text": TEXT, "layer": "2", "head": "1"}
add(Fault("the edges add up to the head's own score and output", "circuits", CIRCUIT,
          "the sum of the query/key edges' terms (the stored stream, norms frozen, W_q, W_k) vs the head's own "
          "attention-weighted score from the trace's re-run layer",
          explicit_path("scale"), fails="The edges do not add up to the model's own numbers",
          holds="Exact on this text"))
add(Fault("the value sources add up to the head's own output", "circuits", CIRCUIT,
          "the value-side components through W_v from the state dict, weighted by the head's attention, vs the "
          "head's own output stored by the pass",
          projection(MHA, "w_v"), fails="The edges do not add up to the model's own numbers",
          holds="Exact on this text"))


# ------------------------------------------------------------------ running a page
def _first_output_off(module, name: str):
    """module.name (a token mixer's scan, which returns (output, state)) with its output 1 % off."""

    def inject(mp):
        orig = getattr(module, name)
        mp.setattr(module, name, lambda *a, **kw: (lambda got: (got[0] * 1.01,) + tuple(got[1:]))(orig(*a, **kw)))

    return inject


MIXER_VIEW = {"text": TEXT, "attn": "decoder.mixer", "head": "2"}  # a random preset: no weight package to ask for
add(Fault("o_t = S_tᵀ q_t stepped in numpy", "inside", lambda: {"model": "random:gated_delta", "layer": "1", **MIXER_VIEW},
          "the trace's Gated DeltaNet heads against the rule stepped token by token in float64 numpy "
          "(viz/inside/recurrence.py)", _first_output_off(core.net.gated_delta, "chunked_rule"),
          fails="o_t = S_tᵀ q_t", holds="o_t = S_tᵀ q_t"))
add(Fault("y_t = S_t C_t + D x_t stepped in numpy", "inside", lambda: {"model": "random:mamba2", "layer": "0",
                                                                        **MIXER_VIEW},
          "the trace's Mamba2 heads against the scan stepped token by token in float64 numpy (viz/inside/recurrence.py)",
          _first_output_off(core.net.mamba2, "ssd_chunked"), fails="y_t = S_t C_t + D x_t", holds="y_t = S_t C_t + D x_t"))


def _clear_caches():
    from viz.ui import models

    from viz.circuits.run_panel import circuit_cache

    models.trace_cache.clear()
    circuit_cache().clear()  # the Circuits page's edges, computed from a trace
    models.check_cache.clear()  # the decoder stepper's checks
    st.cache_data.clear()  # the data caches


def _run(app_test, entry: Fault):
    _clear_caches()
    at = app_test(entry.page, **(entry.params() if callable(entry.params) else entry.params))
    if entry.page == "inside":  # every group of steps open (they draw only while open), so each
        for gi in range(1, 8):  # check shows at its step, as st.error or its green line
            at.session_state[f"inside.group-{gi}.open"] = True
    at.run()
    assert_no_exception(at)
    return at


def _errors(at) -> List[str]:
    return [e.value for e in at.error]


def _successes(at) -> List[str]:
    return [c.value for c in at.caption if c.value.startswith(":green[✓")] + [s.value for s in at.success]


def _id(entry: Fault) -> str:
    return f"{entry.page}:{entry.check}"


@pytest.mark.parametrize("entry", [pytest.param(e, id=_id(e), marks=[pytest.mark.slow] if e.slow else [])
                                   for e in REGISTRY])
def test_fault_shows_and_clean_run_holds(app_test, monkeypatch, entry):
    model = {} if callable(entry.params) else entry.params
    if model.get("model") and not core.MODELS[model["model"]].available():
        pytest.skip(f"{model['model']}'s weight package is not installed")
    with monkeypatch.context() as mp:
        entry.inject(mp)
        bad = _run(app_test, entry)
    errors = _errors(bad)
    assert any(entry.fails in e for e in errors), (entry.check, errors)
    if entry.page == "inside":
        assert any(entry.fails in e and "✗ FAILED" in e for e in errors)
        assert any("failed on this view" in e for e in errors)  # the summary at the top of the page
    if entry.verify:
        entry.verify(bad)
    good = _run(app_test, entry)
    assert not _errors(good), _errors(good)
    assert any(entry.holds in s for s in _successes(good)), (entry.check, _successes(good))


def _kind_of(key: str) -> str:
    """A step key with the sub-layer number or the attention's name taken off (residual2 ->
    residual, cross_attn-out -> attn-out): the same check on another tensor of the layer."""
    if key.startswith(("residual", "norm")):
        return key.rstrip("0123456789")
    return "attn-out" if key.endswith("-out") and key != "ffn-out" else key


def test_registry_names_every_check_of_the_inside_page(toy, smollm2):
    """Every check the Inside page shows, on an encoder-decoder and on a RoPE decoder, has at
    least one entry above per step (as many as the step shows checks)."""
    from collections import Counter

    from viz.inside.step_checks import layer_checks

    shown: Counter = Counter()
    for model in (toy, smollm2):
        tr = model.trace(TEXT)
        for stack in tr.stacks():
            for kind in tr.attention_kinds(stack):
                for key, cs in layer_checks(tr, stack, kind, 1, 2).items():
                    shown[_kind_of(key)] = max(shown[_kind_of(key)], len(cs))
    entries = Counter(e.key for e in REGISTRY if e.page == "inside")
    entries["qhat"] = entries["khat"]  # one fault before the rotation covers Q̂ and K̂ alike
    assert {k: n for k, n in shown.items() if entries[k] < n} == {}
