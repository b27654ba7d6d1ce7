"""Which input tokens the output depends on: input attribution beside attention.

    import core, core.analysis as ca
    model = core.load_model("smollm2")
    df = ca.attribute(model, "The capital of France is", "integrated_gradients")   # position, token, score
    df.attrs["completeness_error"]                                                 # |sum - (f(x) - f(b))| / |f(x) - f(b)|

What is explained is f = logit[target] - logit[baseline] (baseline None: logit[target]) at one
output position: the next token after the text (decoders), the [MASK] / <mask> token (encoders
with a masked-LM head), a chosen decoder position (encoder-decoders: the source tokens are
attributed, `position` is the decoder position whose next token is explained, default 0, the
first word of the greedy translation). e_i is token i's embedding as the model adds it
(scaling included); b_i the baseline token's embedding (`baseline_token` None: the tokenizer's
pad token, else its end-of-sequence token): positions and everything else stay. Embeddings are
replaced through the hook point `embed.{stack}.tokens` (core/net/hooks.py), so every method
runs the model's own forward pass (fused attention), batched.

Methods (docs/design.md, "What the output owes to each part"):
    grad_x_input          sum_d df/de_i * e_i
    integrated_gradients  (e_i - b_i) . mean_k grad f(b + alpha_k (e - b)), alpha_k = (k + 0.5) / steps
                          (captum's "riemann_middle" rule, the steps batched); fix_first=True
                          keeps token 0 (the attention sink) at its own embedding on the path;
                          complete_within=0.05 triples the steps (reusing every earlier point)
                          until the completeness error is within 5%, up to max_steps
    occlusion             f(x) - f(x with e_i replaced by b_i) (captum's Occlusion, one row at a time)
    attention             the last layer's attention, mean of heads, the explained position's row
    rollout, flow         attention rollout / flow (core/analysis/attention_flow.py), that row
    value_norm            the last layer's value norms ||a_ij v_j W_o^h|| (Kobayashi et al. 2020), mean of heads
For encoder-decoders the attention-based rows are those of the last decoder layer's
cross-attention (rollout and flow: that row times the encoder's rollout / flow).

faithfulness (DeYoung et al. 2020): for each method's ranking, comprehensiveness (the drop of
p(target) when the top fraction of tokens is replaced by the baseline token's embedding) and
sufficiency (the drop when all BUT the top fraction is), averaged over fractions, with a seeded
random ranking as the floor; the deletion curve p(target) after replacing the top k tokens,
k = 0..n. Every perturbed input of every method runs in a few batched passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from .. import trace_names as tn
from ..net.hooks import Hooks
from ..net.mixer import MIXER_REASONS
from . import _checks as checks
from .token_ids import input_token_id, input_vocab, output_token_id

GRADIENT_METHODS = ("grad_x_input", "integrated_gradients", "occlusion")
ATTENTION_METHODS = ("attention", "rollout", "flow", "value_norm")
METHODS = GRADIENT_METHODS + ATTENTION_METHODS
SIGNED = set(GRADIENT_METHODS)  # scores that can be negative (a diverging colour scale)
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)
BATCH_TOKENS = 4096  # token positions per batched pass (steps, occlusions, perturbations)
RANDOM_SEED = 0

Progress = Optional[Callable[[float, str], None]]  # progress(fraction done, what is running)


# --------------------------------------------------------------------------- the explained output
@dataclass
class Setup:
    """One explained output: the ids, the attributed stack, the embeddings and f."""

    model: object
    stack: str  # whose token embeddings are attributed: "decoder" (decoders), else "encoder"
    ids: torch.Tensor  # (1, n) attributed ids
    tokens: List[str]
    position: int  # output position whose next token (or mask fill) is explained
    target_id: int
    contrast_id: Optional[int]  # f's `baseline` token (logit[target] - logit[contrast])
    baseline_id: int  # the token whose embedding replaces e_i
    dec_ids: Optional[torch.Tensor] = None  # encoder-decoders: the decoder input
    fixed: List[int] = field(default_factory=list)  # positions never perturbed (the [MASK] itself)
    word_ids: List = field(default_factory=list)
    special: List[bool] = field(default_factory=list)
    text: str = ""

    @property
    def n(self) -> int:
        return self.ids.shape[1]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self.model.net.src_embed if self.stack == "encoder" else self.model.net.tgt_embed
        with torch.no_grad():
            return emb.tok(ids) * emb.scale

    @property
    def e(self) -> torch.Tensor:
        return self.embed(self.ids)  # (1, n, d)

    @property
    def b(self) -> torch.Tensor:
        return self.embed(torch.full_like(self.ids, self.baseline_id))  # (1, n, d)

    def logits(self, emb: torch.Tensor) -> torch.Tensor:
        """The explained position's logits (B, V) with the token embeddings replaced by emb (B, n, d)."""
        net, bsz = self.model.net, emb.shape[0]
        hooks = Hooks({tn.embed(self.stack, "tokens"): lambda t: emb})
        if self.model.kind == "decoder":
            h = net.decode(self.ids.expand(bsz, -1), rec=hooks)[:, self.position]
            return net.project(h)
        memory = net.encode(self.ids.expand(bsz, -1), rec=hooks)
        if self.model.kind == "encoder":
            return self.model.mlm_head.to(emb.device)(memory[:, self.position])
        h = net.decode(self.dec_ids.expand(bsz, -1), memory)[:, self.position]
        return net.project(h)

    def f(self, emb: torch.Tensor) -> torch.Tensor:
        """f = logit[target] - logit[contrast] (B,)."""
        lg = self.logits(emb)
        out = lg[:, self.target_id]
        return out if self.contrast_id is None else out - lg[:, self.contrast_id]

    def prob(self, emb: torch.Tensor) -> torch.Tensor:
        """p(target) (B,)."""
        return torch.softmax(self.logits(emb).float(), dim=-1)[:, self.target_id]

    def batch_rows(self) -> int:
        return max(1, BATCH_TOKENS // max(1, self.n))


def baseline_token_id(model, baseline_token=None) -> int:
    """The token whose embedding replaces a token's: `baseline_token` (id or string), else the
    tokenizer's pad token, else its end-of-sequence token."""
    if baseline_token is not None:
        return input_token_id(model, baseline_token, "baseline token")
    tk = model.tokenizer
    vocab = input_vocab(model)
    candidates = [getattr(tk, "pad_id", None), getattr(tk, "info", {}).get("pad_id")]
    index = getattr(tk, "index", {}) or {}
    candidates += [index.get(p) for p in ("[PAD]", "<pad>", "<|pad|>", "<|padding|>", "<PAD>")]
    candidates += [getattr(tk, "eos_id", None), getattr(model, "end_id", None), getattr(tk, "sep_id", None)]
    for c in candidates:
        if isinstance(c, (int, np.integer)) and 0 <= int(c) < vocab:
            return int(c)
    return int(model.config.pad_id)


def setup(model, text: str, target=None, baseline=None, baseline_token=None, position: Optional[int] = None) -> Setup:
    """The explained output of `text` (see the module's docstring); ValueError when the model
    has no output to explain (an encoder without a masked-LM head) or no [MASK] in the text."""
    kind = model.kind
    enc = model.encode(text)
    dev = model.device
    ids = torch.tensor([list(enc.ids)], dtype=torch.long, device=dev)
    tokens, fixed, dec_ids = model.source_strings(enc), [], None
    if kind == "encoder":
        if getattr(model, "mlm_head", None) is None:
            raise ValueError(f"attribution needs an output: {model.name} is an encoder without an output head "
                             "(no masked-LM head), so there is no prediction to explain. Its attention can still be "
                             "read and compared on the Compare page.")
        mask_id = getattr(model.tokenizer, "mask_id", None)
        where = [i for i, t in enumerate(enc.ids) if mask_id is not None and t == mask_id]
        if not where:
            tok = getattr(model.tokenizer, "mask_token", "[MASK]")
            raise ValueError(f"put a {tok} token in the sentence: {model.name} explains the word it predicts there")
        position = where[0] if position is None else checks.position(position, len(enc.ids), "position")
        fixed = [position]
    elif kind == "encoder-decoder":
        tr = model.trace(text)
        dec = list(tr.meta["target_ids"])
        position = 0 if position is None else checks.index(position, len(dec), "the decoder position")
        dec_ids = torch.tensor([dec], dtype=torch.long, device=dev)
    else:  # a decoder explains its next token after the last position
        last = ids.shape[1] - 1
        if position is not None and checks.position(position, ids.shape[1], "position") != last:
            raise ValueError(f"a decoder's attribution explains the next token after the text: position "
                             f"{checks.shown(position)} is not its last position ({last}, or -1)")
        position = last
    s = Setup(model, "decoder" if kind == "decoder" else "encoder", ids, tokens, position, 0, None,
              baseline_token_id(model, baseline_token), dec_ids, fixed, list(enc.word_ids), list(enc.special), text)
    if target is None:
        with torch.no_grad():
            s.target_id = int(s.logits(s.e).argmax(-1)[0])
    else:
        s.target_id = output_token_id(model, target, "target token")
    s.contrast_id = None if baseline is None else output_token_id(model, baseline, "contrast token")
    return s


def top_targets(model, text: str, k: int = 10, position: Optional[int] = None) -> List[tuple]:
    """The model's top-k (id, token, probability) at the explained position (the target picker)."""
    s = setup(model, text, position=position)
    with torch.no_grad():
        p = torch.softmax(s.logits(s.e).float(), -1)[0]
    top = torch.topk(p, min(k, p.shape[-1]))
    tk = model.target_tokenizer if model.kind == "encoder-decoder" else model.tokenizer
    return [(int(i), tk.token_str(int(i)), float(v)) for i, v in zip(top.indices, top.values)]


# --------------------------------------------------------------------------- the methods
def _grad_x_input(s: Setup) -> np.ndarray:
    e = s.e.clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(s.f(e).sum(), e)
    return (g * s.e).sum(-1)[0].double().cpu().numpy()


def _path_baseline(s: Setup, fix_first: bool) -> torch.Tensor:
    b = s.b.clone()
    keep = list(s.fixed) + ([0] if fix_first else [])
    if keep:
        b[:, keep] = s.e[:, keep]
    return b


REFINE = 3  # each refinement triples the steps: the midpoints of N steps are among those of 3N
COMPLETE_WITHIN = 0.05  # the completeness error an adaptive integration stops at (the page's warning line)


def _path_grad_sum(s: Setup, e: torch.Tensor, b: torch.Tensor, alphas: Sequence[float]) -> torch.Tensor:
    """Σ_k ∂f/∂emb at b + α_k (e − b), (n, d) in float64, the alphas run in batches of
    s.batch_rows() rows (one forward and one backward pass per batch)."""
    total = torch.zeros(e.shape[1:], dtype=torch.float64)
    rows = s.batch_rows()
    for lo in range(0, len(alphas), rows):
        a = torch.tensor(alphas[lo:lo + rows], dtype=e.dtype, device=e.device)[:, None, None]
        path = (b + a * (e - b)).detach().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(s.f(path).sum(), path)
        total += g.double().sum(0).cpu()
    return total


def _integrated_gradients(s: Setup, steps: int, fix_first: bool = False, complete_within: Optional[float] = None,
                          max_steps: Optional[int] = None):
    """(per-position scores, f(x), f(b), steps used, completeness error) by the midpoint rule
    α_k = (k + 0.5) / steps, the steps batched. complete_within (e.g. 0.05): while the
    completeness error is above it, the steps are tripled (64 -> 192 -> 576) up to max_steps
    (default 9 x steps). Tripling, not doubling: the midpoints of N steps are exactly every third
    midpoint of 3N ((k + 0.5) / N = (3k + 1 + 0.5) / 3N), so each refinement reuses every gradient
    already taken and pays only for the 2N new points; doubling's midpoints share none."""
    steps = checks.whole(steps, "steps", lo=1)
    e, b = s.e, _path_baseline(s, fix_first)
    with torch.no_grad():
        fx, fb = s.f(torch.cat([e, b])).double().cpu().tolist()
    delta = (e - b)[0].double().cpu()
    limit = max(steps, max_steps if max_steps is not None else steps * REFINE ** 2)
    n = steps
    grad_sum = _path_grad_sum(s, e, b, [(k + 0.5) / n for k in range(n)])
    while True:
        scores = (delta * grad_sum / n).sum(-1).numpy()
        err = completeness_error(scores, fx, fb)
        if complete_within is None or err <= complete_within or n * REFINE > limit:
            return scores, fx, fb, n, err
        new = [(k + 0.5) / (n * REFINE) for k in range(n * REFINE) if k % REFINE != 1]  # k % 3 == 1: the old points
        grad_sum = grad_sum + _path_grad_sum(s, e, b, new)
        n *= REFINE


def completeness_error(scores, f_x: float, f_b: float) -> float:
    """|sum of scores - (f(x) - f(b))| / |f(x) - f(b)|: 0 for a complete attribution."""
    gap = f_x - f_b
    total = float(np.sum(scores))
    return abs(total - gap) / abs(gap) if gap != 0 else (0.0 if total == 0 else float("inf"))


def _occlusion(s: Setup) -> np.ndarray:
    from captum.attr import Occlusion

    d = s.e.shape[-1]
    occ = Occlusion(lambda emb: s.f(emb))
    with torch.no_grad():
        attr = occ.attribute(s.e, sliding_window_shapes=(1, d), strides=(1, d), baselines=s.b,
                             perturbations_per_eval=min(s.n, s.batch_rows()))
    return attr[0, :, 0].double().cpu().numpy()  # every element of row i holds f(x) - f(x without i)


def _trace_rows(s: Setup, trace, methods: Sequence[str]) -> Dict[str, np.ndarray]:
    """The attention-based scores: rows of the explained position."""
    from .attention_flow import flow, rollout

    out = {}
    if s.model.kind == "encoder-decoder":
        last = trace.layers("decoder") - 1
        row = trace[tn.cross_attn("decoder", last, "weights")].double().mean(0)[s.position].numpy()
        for m in methods:
            if m == "attention":
                out[m] = row
            elif m == "rollout":
                out[m] = row @ rollout(trace, "encoder")[-1]
            elif m == "flow":
                n_enc = trace.layers("encoder")
                out[m] = row @ flow(trace, "encoder", layers=[n_enc - 1])[-1]
            elif m == "value_norm":
                out[m] = trace[tn.cross_attn("decoder", last, "value_norms")].double().mean(0)[s.position].numpy()
        return out
    stack, last = s.stack, trace.layers(s.stack) - 1
    if tn.self_attn(stack, last, "weights") not in trace and any(
            m in ("attention", "rollout", "flow", "value_norm") for m in methods):
        raise ValueError(f"the last layer ({stack} {last}) mixes tokens with a mixer, not softmax attention: "
                         f"{MIXER_REASONS['softmax']}, so the attention-based rankings do not apply")
    for m in methods:
        if m == "attention":
            out[m] = trace[tn.self_attn(stack, last, "weights")].double().mean(0)[s.position].numpy()
        elif m == "rollout":
            out[m] = rollout(trace, stack)[-1, s.position]
        elif m == "flow":
            out[m] = flow(trace, stack, query=s.position, layers=[last])[-1, s.position]
        elif m == "value_norm":
            out[m] = trace[tn.self_attn(stack, last, "value_norms")].double().mean(0)[s.position].numpy()
    return out


def _check_methods(methods) -> List[str]:
    methods = list(METHODS if methods is None else [methods] if isinstance(methods, str) else methods)
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown attribution method {bad[0]!r}: one of {', '.join(METHODS)}")
    return methods


def _frame(s: Setup, scores: np.ndarray, method: str, extra: Optional[dict] = None) -> pd.DataFrame:
    df = pd.DataFrame({"position": np.arange(s.n), "token": s.tokens, "score": np.asarray(scores, dtype=np.float64)})
    df.attrs.update(method=method, baseline_token_id=s.baseline_id, target_id=s.target_id,
                    contrast_id=s.contrast_id, position=s.position, model=s.model.name, stack=s.stack,
                    word_ids=list(s.word_ids), special=list(s.special), fixed=list(s.fixed))
    df.attrs.update(extra or {})
    return df


def attribute_setup(s: Setup, methods=None, steps: int = 64, fix_first: bool = False, trace=None,
                    progress: Progress = None, complete_within: Optional[float] = None,
                    max_steps: Optional[int] = None) -> Dict[str, pd.DataFrame]:
    """Every asked-for method on one explained output (one trace shared by the attention-based
    ones): method -> DataFrame (position, token, score). complete_within / max_steps: integrated
    gradients' adaptive steps (_integrated_gradients); its frame's attrs say the steps used
    ("steps") and asked ("steps_asked")."""
    methods = _check_methods(methods)
    out: Dict[str, pd.DataFrame] = {}
    for k, m in enumerate(methods):
        if progress:
            progress(k / len(methods), m)
        if m == "grad_x_input":
            out[m] = _frame(s, _grad_x_input(s), m)
        elif m == "integrated_gradients":
            scores, fx, fb, used, _ = _integrated_gradients(s, steps, fix_first, complete_within, max_steps)
            # the error shown is computed here from the returned scores, outside the integration, so a
            # faulty integration shows as one (tests/app/test_app_attribution.py injects one)
            out[m] = _frame(s, scores, m, {"completeness_error": completeness_error(scores, fx, fb), "f_x": fx, "f_baseline": fb,
                                           "steps": int(used), "steps_asked": int(steps),
                                           "complete_within": complete_within, "fix_first": bool(fix_first)})
        elif m == "occlusion":
            out[m] = _frame(s, _occlusion(s), m)
        else:
            if trace is None:
                trace = s.model.trace(s.text)
            out[m] = _frame(s, _trace_rows(s, trace, [m])[m], m)
    if progress:
        progress(1.0, "done")
    return out


def attribute_all(model, text: str, methods=None, target=None, baseline=None, steps: int = 64, baseline_token=None,
                  position: Optional[int] = None, fix_first: bool = False, progress: Progress = None,
                  complete_within: Optional[float] = None, max_steps: Optional[int] = None):
    """(Setup, {method: DataFrame}) for several methods at once (one setup, one trace)."""
    methods = _check_methods(methods)
    s = setup(model, text, target, baseline, baseline_token, position)
    trace = model.trace(text) if any(m in ATTENTION_METHODS for m in methods) else None
    return s, attribute_setup(s, methods, steps, fix_first, trace, progress, complete_within, max_steps)


def attribute(model, text: str, method: str, target=None, baseline=None, steps: int = 64, baseline_token=None,
              position: Optional[int] = None, fix_first: bool = False, complete_within: Optional[float] = None,
              max_steps: Optional[int] = None) -> pd.DataFrame:
    """Which input tokens f = logit[target] - logit[baseline] depends on (the module's
    docstring): columns position, token, score; df.attrs["baseline_token_id"], and for
    integrated gradients df.attrs["completeness_error"] = |sum - (f(x) - f(b))| / |f(x) - f(b)|
    and df.attrs["steps"], the steps used (more than `steps` only with complete_within)."""
    return attribute_all(model, text, [method], target, baseline, steps, baseline_token, position, fix_first,
                         None, complete_within, max_steps)[1][method]


# --------------------------------------------------------------------------- faithfulness
