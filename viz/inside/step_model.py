"""Inside a head: one attention head and the layer around it, as a list of `Step`s, each a real
tensor of the trace with its formula in both notations of the lecture notes, its explanation
and its shape: the embeddings, each sub-layer with its norms and residuals, and, for the chosen
attention, the head in detail (its projections Q, K, V and RoPE's rotation where the model uses
it, the scores and their scaling, mask and softmax, the head's output and the heads'
concatenation). The checks of these steps are in viz/inside/step_checks.py, their pictures in
viz/inside/figures.py. No Streamlit here, so it works in Jupyter too:

    steps = layer_steps(trace, "encoder", "self_attn", layer=0, head=2)
    fig = step_figure(steps_by_key(steps)["weights"], notation="cols")  # viz.inside.figures

Notation. Seeds 000, 001, 003 and 004 put tokens in ROWS: X is n x d, Q = X W_q,
A = softmax(Q K^T / sqrt(d_k)), head = A V. Seed 002 puts tokens in COLUMNS: X is d x n,
Q = W_q^T X, Z = V softmax(. / sqrt(p)) with p = d_k. Every matrix is stored here in the
row form (the core's); the column form of a picture is its transpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from core import trace_names as tn
from core.net.positional import rope_angles
from viz.figures.heatmaps import to_numpy as _np
from viz.figures.select import axis_tokens

ROWS, COLS = "rows", "cols"
NOTATIONS = {
    ROWS: "tokens as rows (seeds 000/001/003/004)",
    COLS: "tokens as columns (seed 002)",
}
KIND_TEXT = {"self_attn": "self-attention", "cross_attn": "cross-attention"}


@dataclass
class Step:
    """One picture of the pipeline. `matrix` is in the row form (tokens first)."""

    key: str  # unique within a pipeline, e.g. "q", "scores", "weights"
    group: str  # section it belongs to
    title: str
    matrix: Optional[np.ndarray]  # None: a text-only step (e.g. "no positional vector here")
    name: Optional[str] = None  # the Trace name it comes from (None if computed here)
    latex_rows: str = ""
    latex_cols: str = ""
    explain: str = ""
    dims: Tuple[str, str] = ("n", "d")  # symbols of the row-form shape
    axes: Tuple[str, str] = ("token", "feature")  # what the row-form axes index
    row_labels: List[str] = field(default_factory=list)
    col_labels: List[str] = field(default_factory=list)
    style: str = "signed"  # signed | attention | mask | angle | softcap
    value_name: str = "value"
    extra: dict = field(default_factory=dict)  # what a style needs beside the matrix (softcap: scaled, cap, mask)

    def latex(self, notation: str = ROWS) -> str:
        """The formula, centred lines: parts separated by ',\\quad' (or a top-level '\\\\')
        go on separate lines so that narrow columns fit."""
        tex = self.latex_cols if notation == COLS and self.latex_cols else self.latex_rows
        if not tex:
            return ""
        return r"\begin{gathered} " + r" \\ ".join(tex.split(r",\quad ")) + r" \end{gathered}"

    def shape(self, notation: str = ROWS) -> Tuple[int, int]:
        r, c = self.matrix.shape
        return (c, r) if notation == COLS else (r, c)

    def shape_latex(self, notation: str = ROWS) -> str:
        """E.g. 'n \\times d_k = 6 \\times 32' (swapped in column notation)."""
        a, b = self.dims if notation == ROWS else self.dims[::-1]
        if self.matrix is None:
            return ""
        r, c = self.shape(notation)
        return rf"{a} \times {b} = {r} \times {c}"



# ------------------------------------------------------------------ small helpers
def kv_head(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The key/value head that query head `head` reads under grouped-query attention."""
    return head // (n_heads // n_kv_heads)


def mask_kind(mask) -> str:
    """'none' (all 0), 'causal' (-inf exactly above the diagonal), 'padding' (-inf in whole
    key columns), 'causal+padding' or 'custom'."""
    m = _np(mask)
    blocked = np.isneginf(m)
    if not blocked.any():
        return "none"
    n_q, n_k = m.shape
    q_pos = np.arange(n_k - n_q, n_k)[:, None]
    causal = np.arange(n_k)[None, :] > q_pos
    if np.array_equal(blocked, causal):
        return "causal"
    cols = blocked.all(0)
    if np.array_equal(blocked, np.broadcast_to(cols, blocked.shape)):
        return "padding"
    if np.array_equal(blocked, causal | cols[None, :]):
        return "causal+padding"
    return "custom"


def feature_labels(n: int, prefix: str = "") -> List[str]:
    return [f"{prefix}{j}" for j in range(n)]


# ------------------------------------------------------------------ the pipeline
def _norm_latex(cfg, arg: str) -> str:
    return rf"\operatorname{{{'RMSNorm' if cfg.norm == 'rmsnorm' else 'LayerNorm'}}}({arg})"


def _norm_formula(cfg, notation: str) -> str:
    who = "x^{(i)}" if notation == ROWS else "x_i"
    if cfg.norm == "rmsnorm":
        return (rf"\operatorname{{RMSNorm}}({who}) = "
                rf"g \odot \frac{{{who}}}{{\sqrt{{\tfrac1d \sum_k ({who})_k^2 + \epsilon}}}}")
    return rf"\operatorname{{LayerNorm}}({who}) = \gamma \odot \frac{{{who} - \mu}}{{\sqrt{{\sigma^2 + \epsilon}}}} + \beta"


def _norm_explain(cfg, what: str) -> str:
    if cfg.norm == "rmsnorm":
        return (f"RMSNorm of {what}: each token's vector is divided by its root-mean-square (no mean "
                f"subtraction, ε = {cfg.norm_eps:g}) and scaled by a learned g.")
    return (f"LayerNorm of {what}: each token's vector gets mean 0 and variance 1 over its d features "
            f"(ε = {cfg.norm_eps:g}), then a learned scale γ and shift β.")


def layer_input_name(trace, stack: str, layer: int) -> str:
    return tn.stored_input(stack, layer)


def memory_name(trace) -> Optional[str]:
    """The encoder output that cross-attention reads its keys and values from."""
    return tn.stack_output(trace, "encoder") if trace.layers("encoder") else None


def sublayers(trace, stack: str, layer: int) -> List[str]:
    """The sub-layers of a layer, in order: 'self_attn', ['cross_attn'], 'ffn'."""
    subs = [k for k in tn.ATTNS if tn.attn(stack, layer, k, "weights") in trace]
    return subs + [tn.FFN]


def _sub_symbols(n_subs: int) -> List[str]:
    """Names of the residual stream before each sub-layer and after the last: X, U, Z
    (X, U_1, U_2, Z with three sub-layers), as in seed 001's x -> u -> z."""
    if n_subs == 2:
        return ["X", "U", "Z"]
    return ["X"] + [f"U_{j}" for j in range(1, n_subs)] + ["Z"]


def layer_steps(trace, stack: str, kind: str, layer: int, head: int, config=None) -> List[Step]:
    """Every step of layer `layer` of `stack`, with (kind, head) in full detail, in the order
    the model computes them (post-norm or pre-norm, per config.norm_placement)."""
    cfg = config
    if cfg is None:
        from core.net.config import ModelConfig

        cfg = ModelConfig.from_dict(trace.meta["config"])
    steps: List[Step] = []
    toks = axis_tokens(trace, stack, "self_attn")[0]
    d = cfg.d_model
    pre = cfg.norm_placement == "pre"

    def mat(name):
        return _np(trace[name]) if name in trace else None

    def add(**kw):
        steps.append(Step(**kw))

    def tok_feat(name, key, group, title, latex_rows, latex_cols, explain, dims=("n", "d"), labels=None, prefix=""):
        m = mat(name)
        if m is None:
            return
        labels = toks if labels is None else labels
        add(key=key, group=group, title=title, matrix=m, name=name, latex_rows=latex_rows, latex_cols=latex_cols,
            explain=explain, dims=dims, axes=("token", "feature"), row_labels=list(labels),
            col_labels=feature_labels(m.shape[1], prefix))

    # ---- embeddings -------------------------------------------------------------
    g_emb = "Input: token embeddings and positions"
    scale_note = (rf" ($E_{{t_i}}$, the row of token id $t_i$), multiplied by $\sqrt{{d}}$ = {math.sqrt(d):.2f} "
                  "as in Vaswani et al." if cfg.embed_scale else "")
    x_rows = r"X = \begin{bmatrix} x^{(1)T} \\ \vdots \\ x^{(n)T} \end{bmatrix} \in \mathbb{R}^{n \times d}"
    x_cols = r"X = [x_1, \dots, x_n] \in \mathbb{R}^{d \times n}"
    if cfg.embed_scale:
        x_rows += r",\quad x^{(i)} = \sqrt{d}\; E_{t_i}"
        x_cols += r",\quad x_i = \sqrt{d}\; E_{t_i}"
    mult = float(getattr(cfg, "embed_multiplier", 1.0))
    if mult != 1.0:  # GraniteMoeHybrid, Falcon-H1: the embeddings times a number of the model's own
        scale_note += f" (times the model's embedding multiplier, {mult:g})"
        x_rows += rf",\quad x^{{(i)}} = {mult:g}\; E_{{t_i}}" if not cfg.embed_scale else ""
        x_cols += rf",\quad x_i = {mult:g}\; E_{{t_i}}" if not cfg.embed_scale else ""
    tok_feat(tn.embed(stack, "tokens"), "x", g_emb, "Token embeddings X", x_rows, x_cols,
             f"Each token's learned embedding vector{scale_note}: one row of X per token (one column in "
             "column notation).")
    if cfg.positional == "sinusoidal":
        tok_feat(tn.embed(stack, "positions"), "p", g_emb, "Positional encoding P (sinusoidal)",
                 r"P_{i,2j} = \sin\!\Big(\frac{i}{10000^{2j/d}}\Big),\quad P_{i,2j+1} = \cos\!\Big(\frac{i}{10000^{2j/d}}\Big)",
                 r"P_{2j,i} = \sin\!\Big(\frac{i}{10000^{2j/d}}\Big),\quad P_{2j+1,i} = \cos\!\Big(\frac{i}{10000^{2j/d}}\Big)",
                 "Position $i$ gets a fixed vector of sines and cosines (radians) whose frequencies fall with the "
                 "feature index $j$; computed, not learned.")
    elif cfg.positional == "learned":
        tok_feat(tn.embed(stack, "positions"), "p", g_emb, "Positional embedding P (learned)",
                 r"P = \begin{bmatrix} p^{(0)T} \\ \vdots \\ p^{(n-1)T} \end{bmatrix},\ p^{(i)} = E^{\text{pos}}_i",
                 r"P = [p_0, \dots, p_{n-1}],\ p_i = E^{\text{pos}}_i",
                 f"Position $i$ looks up its own learned vector in a table of {cfg.max_len} positions.")
    else:
        what = ("RoPE rotates the queries and keys inside every attention layer instead (shown below)"
                if cfg.positional == "rope" else "this model has no positional information at all")
        add(key="p", group=g_emb, title="No positional vector P", matrix=None,
            latex_rows=r"P = 0", latex_cols=r"P = 0",
            explain=f"{cfg.positional!r} positions: nothing is added to X; {what}.")
    if tn.embed(stack, "types") in trace:
        tok_feat(tn.embed(stack, "types"), "t", g_emb, "Token-type (segment) embedding T",
                 r"T = E^{\text{type}}_{\text{segment}_i}", r"T = [E^{\text{type}}_{\text{segment}_i}]_i",
                 "BERT adds a learned vector for the segment (sentence A or B) of each token; here all are A.")
    if tn.embed(stack, "presum_norm") in trace:
        plus = " + T" if tn.embed(stack, "types") in trace else ""
        tok_feat(tn.embed(stack, "presum_norm"), "xpt", g_emb, f"Sum X + P{plus}", rf"X + P{plus}", rf"X + P{plus}",
                 "Embeddings and positions add element by element (same shape).")
        tok_feat(tn.embed(stack, "sum"), "sum", g_emb, "Embedding LayerNorm", rf"\operatorname{{LayerNorm}}(X + P{plus})",
                 rf"\operatorname{{LayerNorm}}(X + P{plus})",
                 "BERT normalises the summed embeddings before the first layer.")
    else:
        p_txt = "" if cfg.positional in ("rope", "none") else " + P"
        tok_feat(tn.embed(stack, "sum"), "sum", g_emb, f"Input to layer 0: X{p_txt}", rf"X \leftarrow X{p_txt}",
                 rf"X \leftarrow X{p_txt}",
                 "What the first layer receives" + (": embeddings plus positions, element by element." if p_txt
                                                    else ": the token embeddings unchanged."))

    # ---- layer input / memory ---------------------------------------------------------
    g_in = f"Layer {layer} input"
    if layer > 0:
        tok_feat(layer_input_name(trace, stack, layer), "xin", g_in, f"X entering layer {layer}",
                 rf"X = \text{{output of layer }} {layer - 1}", rf"X = \text{{output of layer }} {layer - 1}",
                 ("Layer 0" if layer == 1 else f"Layers 0–{layer - 1}") + " (choose with the layer selector) turned "
                 f"the embeddings into this; layer {layer} starts from it.")
    mem = memory_name(trace) if kind == "cross_attn" else None
    if mem is not None:
        src = trace.tokens("source")
        tok_feat(mem, "mem", g_in, "Encoder output (memory)", r"Z_{\text{enc}} \in \mathbb{R}^{n_k \times d}",
                 r"Z_{\text{enc}} \in \mathbb{R}^{d \times n_k}",
                 "Cross-attention takes its keys and values from the encoder's final output, one vector per "
                 "source token.", dims=("n_k", "d"), labels=src)

    # ---- the sub-layers ---------------------------------------------------------------
    subs = sublayers(trace, stack, layer)
    syms = _sub_symbols(len(subs))
    norm_word = "RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm"
    pre_norms = pre and getattr(cfg, "pre_sublayer_norm", True)  # OLMo-2: norms after the sub-layers only
    post_norms = pre and getattr(cfg, "post_sublayer_norm", False)
    parallel = getattr(cfg, "parallel_block", False)  # GPT-NeoX: every sub-layer reads the layer input X
    for j, sub in enumerate(subs, start=1):
        x_sym, y_sym = syms[j - 1], syms[j]
        read_sym = syms[0] if parallel else x_sym  # the stream the sub-layer reads
        is_attn = sub != "ffn"
        sub_group = (f"Sub-layer {j}: {KIND_TEXT.get(sub, 'feed-forward network')}"
             + (f" (head {head} in detail)" if sub == kind else "") + (" (summary)" if is_attn and sub != kind else ""))
        f_in = (rf"\tilde{{{read_sym}}}_{{{j}}}" if parallel else rf"\tilde{{{x_sym}}}") if pre_norms else read_sym
        g_head, g_tail = ((sub_group + " · projections Q, K, V", sub_group + " · heads → output, add & norm")
                          if sub == kind else (sub_group, sub_group))
        if pre and j == 1 and layer == 0 and not getattr(cfg, "first_attn_norm", True):
            tok_feat(tn.norm(stack, layer, j), f"norm{j}", g_head, "No norm before layer 0's attention",
                     rf"{f_in} = {x_sym}", rf"{f_in} = {x_sym}",
                     "ModernBERT's first layer reads the embedding LayerNorm's output directly (its own attention "
                     "norm is the identity); every later layer normalises first.")
        elif pre_norms:
            par = (f" Parallel block: this sub-layer reads the layer's input {read_sym} (normed with its own "
                   "gains), not the stream after the attention." if parallel and j > 1 else "")
            tok_feat(tn.norm(stack, layer, j), f"norm{j}", g_head, f"{norm_word} before the sub-layer (pre-norm)",
                     rf"{f_in} = {_norm_latex(cfg, read_sym)},\quad " + _norm_formula(cfg, ROWS),
                     rf"{f_in} = {_norm_latex(cfg, read_sym)},\quad " + _norm_formula(cfg, COLS),
                     "Pre-norm: this model normalises first and adds the sub-layer's result to the un-normalised "
                     "stream. " + _norm_explain(cfg, read_sym) + par)
        if sub == kind:
            steps.extend(attention_steps(trace, cfg, stack, kind, layer, head, sub_group, f_in, toks))
            f_latex_rows = rf"\operatorname{{MultiHead}}({f_in})"
        elif is_attn:
            q_t, k_t = axis_tokens(trace, stack, sub)
            tok_feat(tn.sublayer(stack, layer, sub, "out"), f"{sub}-out", sub_group, f"{KIND_TEXT[sub].capitalize()} output",
                     rf"\operatorname{{MultiHead}}({f_in}) \in \mathbb{{R}}^{{n \times d}}",
                     rf"\operatorname{{MultiHead}}({f_in}) \in \mathbb{{R}}^{{d \times n}}",
                     f"All heads of this layer's {KIND_TEXT[sub]}, combined by W^O. Choose it in the attention "
                     "selector to see its steps.")
            f_latex_rows = rf"\operatorname{{MultiHead}}({f_in})"
        else:
            steps.extend(_ffn_steps(trace, cfg, stack, layer, sub_group, f_in, toks))
            f_latex_rows = rf"\operatorname{{FFN}}({f_in})"
        if post_norms:
            tok_feat(tn.post_norm(stack, layer, j), f"post_norm{j}", g_tail, f"{norm_word} of the sub-layer's output",
                     rf"{_norm_latex(cfg, f_latex_rows)},\quad " + _norm_formula(cfg, ROWS),
                     rf"{_norm_latex(cfg, f_latex_rows)},\quad " + _norm_formula(cfg, COLS),
                     "A norm on the sub-layer's result before it is added to the stream (its own gains; the stream "
                     "itself is never normalised inside the layer)" + ("" if pre_norms else
                                                                      ", and none before the sub-layer: OLMo-2's order")
                     + ". " + _norm_explain(cfg, "the sub-layer's output"))
            f_latex_rows = _norm_latex(cfg, f_latex_rows)
        res_rows = rf"{x_sym} + {f_latex_rows}"
        if pre:
            tok_feat(tn.residual(stack, layer, j), f"residual{j}", g_tail, "Residual: add the sub-layer's result",
                     rf"{y_sym} = {res_rows}", rf"{y_sym} = {res_rows}",
                     "The residual connection: the sub-layer's output is added to its (un-normalised) input."
                     + (f" Parallel block: {y_sym} = {syms[0]} + attention + FFN, both computed from {syms[0]}."
                        if parallel and j == len(subs) else ""))
        else:
            tok_feat(tn.residual(stack, layer, j), f"residual{j}", g_tail, "Residual: add the sub-layer's input",
                     res_rows, res_rows,
                     "The residual connection: the sub-layer's output is added to its input, token by token.")
            gam = f"\\gamma_{j}, \\beta_{j}" if cfg.norm == "layernorm" else f"g_{j}"
            tok_feat(tn.norm(stack, layer, j), f"norm{j}", g_tail, f"Add & norm: {norm_word}",
                     rf"{y_sym} = \operatorname{{{norm_word}}}\big({res_rows};\, {gam}\big),\quad " + _norm_formula(cfg, ROWS),
                     rf"{y_sym} = \operatorname{{{norm_word}}}\big({res_rows};\, {gam}\big),\quad " + _norm_formula(cfg, COLS),
                     "Post-norm (seeds 001/003): normalise after the residual add. " + _norm_explain(cfg, "the sum"))
    out_next = (f"the input of layer {layer + 1}" if layer + 1 < trace.layers(stack)
                else ("followed by the final norm" if cfg.final_norm else "the stack's output")
                + (" and the projection to the vocabulary" if stack == "decoder" else ""))
    tok_feat(tn.out(stack, layer), "out", g_tail, f"Layer {layer} output",
             rf"{syms[-1]} \in \mathbb{{R}}^{{n \times d}}", rf"{syms[-1]} \in \mathbb{{R}}^{{d \times n}}",
             f"Same shape as the layer's input: {out_next}.")
    return steps


def _ffn_steps(trace, cfg, stack, layer, group, f_in, toks) -> List[Step]:
    out = []
    b1 = " + b_1" if cfg.bias else ""
    b2 = " + b_2" if cfg.bias else ""
    act = cfg.activation
    if act == "relu":
        hr, hc = rf"H = \max(0,\, {f_in} W_1{b1})", rf"H = \max(0,\, W_1^{{T}} {f_in}{b1})"
        ex = "Each token separately: a linear map to $m$ features, then ReLU (negative values become 0)."
    elif act in ("gelu", "gelu_tanh"):
        hr, hc = rf"H = \operatorname{{GELU}}({f_in} W_1{b1})", rf"H = \operatorname{{GELU}}(W_1^{{T}} {f_in}{b1})"
        ex = "Each token separately: a linear map to $m$ features, then GELU (a smooth ReLU)."
    else:
        hr = rf"H = \operatorname{{SiLU}}({f_in} W_1) \odot ({f_in} W_3)"
        hc = rf"H = \operatorname{{SiLU}}(W_1^{{T}} {f_in}) \odot (W_3^{{T}} {f_in})"
        ex = "SwiGLU, each token separately: a SiLU-activated linear map gates a second linear map, element by element."
    for name, key, title, lr, lc, explain, dims in [
        (tn.ffn(stack, layer, "hidden"), "ffn-hidden", "FFN hidden layer", hr + r",\quad H \in \mathbb{R}^{n \times m}",
         hc + r",\quad H \in \mathbb{R}^{m \times n}", ex + f" $m$ = {cfg.d_ff}.", ("n", "m")),
        (tn.ffn(stack, layer, "out"), "ffn-out", "FFN output", rf"\operatorname{{FFN}}({f_in}) = H W_2{b2}",
         rf"\operatorname{{FFN}}({f_in}) = W_2^{{T}} H{b2}",
         r"Back from $m$ to $d$ features, each token separately ($W_2 \in \mathbb{R}^{m \times d}$).", ("n", "d")),
    ]:
        if name not in trace:
            continue
        m = _np(trace[name])
        out.append(Step(key=key, group=group, title=title, matrix=m, name=name, latex_rows=lr, latex_cols=lc,
                        explain=explain, dims=dims, axes=("token", "feature"), row_labels=list(toks),
                        col_labels=feature_labels(m.shape[1])))
    return out


def block_notes(cfg, trace, stack: str, layer: int) -> str:
    """One line on what this model's block does beyond the plain pre-/post-norm layer (norms
    after the sub-layers, soft-capping, QK-norm, the layer's kind): '' when nothing."""
    notes = []
    pre, post = (cfg.sublayer_norms(layer) if hasattr(cfg, "sublayer_norms")
                 else (getattr(cfg, "pre_sublayer_norm", True), getattr(cfg, "post_sublayer_norm", False)))
    if post and pre:
        notes.append("a norm after each sub-layer as well as before it: x + Norm(f(Norm(x)))")
    elif post:
        notes.append("a norm after each sub-layer and none before it: x + Norm(f(x))")
    if getattr(cfg, "qk_norm", None):
        notes.append(f"QK-norm ({'per head' if cfg.qk_norm in ('head', 'l2') else 'over the whole projection'}"
                     + (", L2: without a gain" if cfg.qk_norm == "l2" else "")
                     + (f", on layers {', '.join(map(str, cfg.qk_norm_layers))} only"
                        if getattr(cfg, "qk_norm_layers", None) is not None else "") + ") before RoPE")
    if getattr(cfg, "attn_softcap", None):
        notes.append(f"attention scores soft-capped at ±{cfg.attn_softcap:g}")
    if getattr(cfg, "final_softcap", None) and stack == "decoder":
        notes.append(f"logits soft-capped at ±{cfg.final_softcap:g}")
    kinds = trace.meta.get("layer_kinds")
    if kinds and layer < len(kinds):
        n_local = sum(k == "local" for k in kinds)
        n_chunked = sum(k == "chunked" for k in kinds)
        what = (f"local: sliding window of {cfg.sliding_window}" + (" tokens back" if stack == "decoder" else
                f" (±{cfg.sliding_window // 2} tokens)") if kinds[layer] == "local" else
                f"chunked: its own chunk of {cfg.attn_chunk} positions" if kinds[layer] == "chunked" else
                "global: full attention")
        theta = (cfg.rope_theta_local if kinds[layer] == "local" and getattr(cfg, "rope_theta_local", None)
                 else cfg.rope_theta)
        nope = layer in (getattr(cfg, "nope_layers", None) or [])
        notes.append(f"layer {layer} is {what}, " + ("without positions (NoPE: q and k never rotated)" if nope else
                                                     f"RoPE base {theta:g}")
                     + f" ({n_local} local{f', {n_chunked} chunked' if n_chunked else ''} and "
                     f"{len(kinds) - n_local - n_chunked} global layers)")
    elif layer in (getattr(cfg, "nope_layers", None) or []):
        notes.append(f"layer {layer} is without positions (NoPE: q and k never rotated; layers "
                     f"{', '.join(map(str, cfg.nope_layers))} of {cfg.n_layers} have none)")
    return "; ".join(notes)


def steps_by_key(steps: Sequence[Step]) -> Dict[str, Step]:
    return {s.key: s for s in steps}


def groups(steps: Sequence[Step]) -> List[Tuple[str, List[Step]]]:
    """Consecutive steps with the same group, in order."""
    out: List[Tuple[str, List[Step]]] = []
    for s in steps:
        if out and out[-1][0] == s.group:
            out[-1][1].append(s)
        else:
            out.append((s.group, [s]))
    return out



def shapes_table(trace, stack: str, kind: str, config=None):
    """The notes' hyper-parameters with this model's values, as a small DataFrame."""
    import pandas as pd

    cfg = config
    if cfg is None:
        from core.net.config import ModelConfig

        cfg = ModelConfig.from_dict(trace.meta["config"])
    q_t, k_t = axis_tokens(trace, stack, kind)
    rows = [("n", "tokens" + (" (queries)" if kind == "cross_attn" else ""), len(q_t))]
    if kind == "cross_attn":
        rows.append(("n_k", "source tokens (keys/values)", len(k_t)))
    rows += [("d", "model width", cfg.d_model), ("d_k", "per-head width (seed 002: p)", cfg.d_head),
             ("m", "FFN width", cfg.d_ff), ("H", "heads", cfg.n_heads)]
    if cfg.n_kv_heads != cfg.n_heads:
        rows.append(("H_kv", "key/value heads (GQA)", cfg.n_kv_heads))
    rows.append(("L", f"{stack} layers", trace.layers(stack)))
    return pd.DataFrame(rows, columns=["symbol", "meaning", "value"])


# ------------------------------------------------------------------ one attention head
def attention_steps(trace, cfg, stack, kind, layer, head, group, f_in, toks) -> List[Step]:
    def nm(step):  # this attention's trace name of `step`
        return tn.attn(stack, layer, kind, step)

    q_toks, k_toks = axis_tokens(trace, stack, kind)
    w_all = trace[nm("weights")]
    n_heads = w_all.shape[0]
    n_kv = trace[nm("k")].shape[0]
    kv = kv_head(head, n_heads, n_kv)
    d_k = trace[nm("q")].shape[-1]
    cross = kind == "cross_attn"
    nq, nk = ("n_q", "n_k") if cross else ("n", "n")
    kv_in = r"Z_{\text{enc}}" if cross else f_in
    b = lambda s: rf" + b_{{{s}}}" if cfg.bias else ""  # noqa: E731
    gqa = (f" Grouped-query attention: {n_heads} query heads share {n_kv} key/value heads, so query head {head} "
           rf"uses key/value head $\lfloor {head} / ({n_heads}/{n_kv}) \rfloor$ = {kv}.") if n_kv != n_heads else ""
    kv_who = f"kv head {kv}" if n_kv != n_heads else f"head {head}"
    sq = math.sqrt(d_k)
    out: List[Step] = []
    g_qkv = group + " · projections Q, K, V"
    g_att = group + " · scores → weights"
    g_out = group + " · heads → output, add & norm"

    def qkv(name, idx, key, title, sym, w, x, rows_lab, explain, dims):
        m = _np(trace[name][idx])
        out.append(Step(key=key, group=g_qkv, title=title, matrix=m, name=name,
                        latex_rows=rf"{sym} = {x}\, W_{{h,{w}}}{b(w)},\quad W_{{h,{w}}} \in \mathbb{{R}}^{{d \times d_k}}",
                        latex_cols=rf"{sym} = W_{{{w.upper()}}}^{{h\,T}} {x}{b(w)} \in \mathbb{{R}}^{{d_k \times {dims[0]}}}",
                        explain=explain, dims=dims, axes=("token", "feature"), row_labels=list(rows_lab),
                        col_labels=feature_labels(m.shape[1])))

    rope = nm("q_pre_rope") in trace
    if nm("q_pre_norm") in trace and nm("k_pre_norm") in trace:  # a layer reading another's keys (Gemma 4) has neither
        out.extend(_qk_norm_steps(trace, cfg, stack, layer, kind, head, kv, g_qkv, f_in, q_toks, k_toks, nq, nk))
    src_q = "this layer's tokens" if not cross else "the decoder's tokens"
    src_kv = "the encoder's output (source tokens)" if cross else "the same tokens"
    if rope:
        qkv(nm("q_pre_rope"), head, "qhat", f"Queries before rotation Q̂ (head {head})", r"\hat Q^{(h)}", "q",
            f_in, q_toks, f"Queries from {src_q}, before RoPE adds their position.", (nq, "d_k"))
        if nm("k_pre_rope") in trace:  # absent where the keys are another layer's, rotated there (Gemma 4)
            qkv(nm("k_pre_rope"), kv, "khat", f"Keys before rotation K̂ (kv head {kv})", r"\hat K^{(h)}", "k", kv_in,
                k_toks, f"Keys from {src_kv}, before RoPE.{gqa}", (nk, "d_k"))
    else:
        qkv(nm("q"), head, "q", f"Queries Q (head {head})", r"Q^{(h)}", "q", f_in, q_toks,
            f"One query vector per token of {src_q}: what each token is looking for.", (nq, "d_k"))
        qkv(nm("k"), kv, "k", f"Keys K ({kv_who})", r"K^{(h)}", "k", kv_in, k_toks,
            f"One key vector per token of {src_kv}: what each token offers to be found by.{gqa}", (nk, "d_k"))
    qkv(nm("v"), kv, "v", f"Values V ({kv_who})", r"V^{(h)}", "v", kv_in, k_toks,
        f"One value vector per token of {src_kv}: what each token passes on when attended to.{gqa}", (nk, "d_k"))
    if rope:
        n_pos = len(q_toks)
        r = getattr(cfg, "rotary_dim", None) or d_k  # partial rotary: the first r features only
        ang = rope_angles(n_pos, r, cfg.rope_theta, scaling=cfg.rope_scaling).numpy()
        pairs = ("(2j, 2j+1): neighbouring features" if cfg.rope_layout == "interleaved"
                 else f"(j, j+{r // 2}): the two halves of the " + ("head" if r == d_k else f"first {r} features"))
        if r < d_k:
            pairs += f"; features {r}–{d_k - 1} are not rotated (partial rotary, {r} of {d_k})"
        out.append(Step(key="angles", group=g_qkv, title="RoPE rotation angles", matrix=ang, name=None,
                        latex_rows=rf"\phi_{{i,j}} = i\,\Theta^{{-2j/{'d_k' if r == d_k else r}}},\quad \Theta = {cfg.rope_theta:g}",
                        latex_cols=rf"\phi_{{j,i}} = i\,\Theta^{{-2j/{'d_k' if r == d_k else r}}},\quad \Theta = {cfg.rope_theta:g}",
                        explain=f"Feature pair j of the query/key at position i is rotated by φ (radians); pairs are "
                                f"{pairs}. Low pairs turn fast, high pairs slowly.",
                        dims=("n", r"d_k/2"), axes=("position", "pair j"), row_labels=list(q_toks),
                        col_labels=feature_labels(ang.shape[1]), style="angle", value_name="angle (rad)"))
        rot = (r"\begin{bmatrix} \cos\phi_{i,j} & -\sin\phi_{i,j} \\ \sin\phi_{i,j} & \cos\phi_{i,j}\end{bmatrix}")
        for key, name, idx, sym, lab, who in [("q", nm("q"), head, "q", q_toks, f"head {head}"),
                                              ("k", nm("k"), kv, "k", k_toks, f"kv head {kv}")]:
            m = _np(trace[name][idx])
            out.append(Step(key=key, group=g_qkv, title=f"{'Queries' if key == 'q' else 'Keys'} after rotation "
                            f"{sym.upper()} ({who})", matrix=m, name=name,
                            latex_rows=rf"\begin{{bmatrix}} {sym}_{{i,a}} \\ {sym}_{{i,b}} \end{{bmatrix}} = {rot}"
                                       rf"\begin{{bmatrix}} \hat {sym}_{{i,a}} \\ \hat {sym}_{{i,b}} \end{{bmatrix}}",
                            latex_cols=rf"\begin{{bmatrix}} {sym}_{{a,i}} \\ {sym}_{{b,i}} \end{{bmatrix}} = {rot}"
                                       rf"\begin{{bmatrix}} \hat {sym}_{{a,i}} \\ \hat {sym}_{{b,i}} \end{{bmatrix}}",
                            explain="Each pair (a, b) = " + pairs.split(":")[0] + " is rotated by its angle φ; the dot "
                                    "product q·k then depends on the positions only through their difference.",
                            dims=(nq if key == "q" else nk, "d_k"), axes=("token", "feature"), row_labels=list(lab),
                            col_labels=feature_labels(m.shape[1])))

    def add_map(name, key, title, lr, lc, explain, style="signed", value_name="score", matrix=None):
        m = _np(trace[name][head]) if matrix is None else matrix
        out.append(Step(key=key, group=g_att, title=title, matrix=m, name=name, latex_rows=lr, latex_cols=lc,
                        explain=explain, dims=(nq, nk), axes=("query", "key"), row_labels=list(q_toks),
                        col_labels=list(k_toks), style=style, value_name=value_name))

    add_map(nm("scores"), "scores", "Scores QKᵀ",
       r"S = Q K^{T},\quad S_{ij} = q_i^{T} k_j",
       r"S^{T} = K^{T} Q,\quad (S^{T})_{ji} = k_j^{T} q_i",
       "How well each query matches each key: one dot product per (query, key) pair.")
    scale = getattr(cfg, "attn_scale", None)
    if scale is None:
        add_map(nm("scaled"), "scaled", f"Scaled: ÷ √d_k = ÷ {sq:.3g}",
           rf"\frac{{Q K^{{T}}}}{{\sqrt{{d_k}}}},\quad \sqrt{{d_k}} = \sqrt{{{d_k}}} = {sq:.4g}",
           rf"\frac{{K^{{T}} Q}}{{\sqrt{{d_k}}}},\quad \sqrt{{d_k}} = \sqrt{{{d_k}}} = {sq:.4g}",
           r"Dividing by $\sqrt{d_k}$ keeps the scores' spread independent of $d_k$ (their variance would be $d_k$), "
           "so softmax does not saturate (seed 004).")
    else:
        add_map(nm("scaled"), "scaled", f"Scaled: × {scale:.4g} (not ÷ √d_k)",
           rf"{scale:.4g} \cdot Q K^{{T}}", rf"{scale:.4g} \cdot K^{{T}} Q",
           "This model does not divide by √d_k" + (" (T5: the scale is folded into the initialisation of W_q), "
                                                  "so the scaled scores are the scores." if scale == 1.0 else "."))
    cap = getattr(cfg, "attn_softcap", None)
    capped = cap is not None and nm("capped") in trace
    if capped:
        sc = _np(trace[nm("scaled")][head])
        cm = _np(trace[nm("capped")][head])
        ok = ~np.isneginf(_np(trace[nm("mask")]))  # the pairs the mask lets through
        out.append(Step(key="capped", group=g_att, title=f"Soft-capped: {cap:g}·tanh(scaled / {cap:g})", matrix=cm,
                        name=nm("capped"),
                        latex_rows=rf"\tilde S_{{ij}} = c \tanh\!\Big(\frac{{s_{{ij}}}}{{c}}\Big),\quad c = {cap:g}",
                        latex_cols=rf"(\tilde S^{{T}})_{{ji}} = c \tanh\!\Big(\frac{{s_{{ij}}}}{{c}}\Big),\quad c = {cap:g}",
                        explain=(f"Gemma 2 squashes every scaled score into (−{cap:g}, {cap:g}) before the mask: "
                                 f"scores near 0 pass almost unchanged (slope 1), large ones flatten towards ±{cap:g}, "
                                 "so no single key can take all the weight. Each point is one (query, key) score of "
                                 f"head {head} on this sentence ({int((abs(sc[ok]) > cap / 2).sum())} of {int(ok.sum())} beyond "
                                 f"±{cap / 2:g}, where the curve visibly bends; masked pairs are left out)."),
                        dims=(nq, nk), axes=("query", "key"), row_labels=list(q_toks), col_labels=list(k_toks),
                        style="softcap", value_name="score",
                        extra={"scaled": sc, "cap": cap, "mask": _np(trace[nm("mask")])}))
    bias_name = nm("position_bias")
    has_bias = bias_name in trace
    if has_bias:
        direction = ("keys before and after the query have their own buckets (encoder)" if stack == "encoder"
                     else "only keys before the query are told apart (decoder: later keys are masked anyway)")
        add_map(bias_name, "position_bias", f"+ position bias (head {head}; relative positions, T5)",
           r"\mathrm{PB}_{ij} = b^{(h)}\big(\mathrm{bucket}(j - i)\big)",
           r"(\mathrm{PB}^{T})_{ji} = b^{(h)}\big(\mathrm{bucket}(j - i)\big)",
           "No position vectors are added to the embeddings: each head learns one number per bucket of the "
           "distance j − i, added to the scores. Near distances get a bucket each, far ones share logarithmically "
           f"wider buckets; {direction}. The same bias serves every layer of the {stack}.",
           value_name="bias")
    mask = _np(trace[nm("mask")])
    mk = mask_kind(mask)
    mask_text = {
        "none": "No mask here: every query may look at every key, so M = 0 everywhere.",
        "causal": "Look-ahead mask (seed 002's M, seed 003's B): a token may not look at later tokens; "
                  "softmax turns -∞ into a weight of exactly 0.",
        "padding": "Padding mask: the columns of padding keys are -∞, so no query attends to padding.",
        "causal+padding": "Look-ahead and padding masks together: later tokens and padding are -∞.",
        "custom": "An additive mask: 0 where a query may look, -∞ where it may not.",
    }[mk]
    kinds = trace.meta.get("layer_kinds")
    window = getattr(cfg, "sliding_window", None)
    local = (kinds[layer] == "local") if kinds and stack in ("encoder", "decoder") and not cross else (
        window is not None and stack == "decoder" and not cross)
    if local and window:
        mask_text = (f"Layer {layer} is a local (sliding-window) layer: "
                     + (f"a token sees itself and the {window - 1} tokens before it; earlier and later keys are -∞."
                        if stack == "decoder" else
                        f"a token sees the keys at most {window // 2} positions away on either side; the rest are -∞."))
    elif kinds and not cross and kinds[layer] == "chunked":
        mask_text = (f"Layer {layer} is a chunked layer (Llama 4): the positions are cut into chunks of "
                     f"{cfg.attn_chunk}, and a token sees only the keys of its own chunk up to itself; later keys and "
                     "the keys of earlier chunks are -∞.")
    elif kinds and not cross:
        mask_text = f"Layer {layer} is a global layer (no window). " + mask_text
    m_rows = (r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}" if mk.startswith("causal")
              else r"M_{ij} = \begin{cases} 0 & \text{key } j \text{ allowed} \\ -\infty & \text{otherwise} \end{cases}")
    m_cols = m_rows.replace("M_{ij}", r"(M^{T})_{ji}")
    out.append(Step(key="mask", group=g_att, title="Mask M (additive: 0 or -∞)", matrix=mask, name=nm("mask"),
                    latex_rows=m_rows, latex_cols=m_cols, explain=mask_text, dims=(nq, nk), axes=("query", "key"),
                    row_labels=list(q_toks), col_labels=list(k_toks), style="mask", value_name="mask"))
    if has_bias:
        add_map(nm("masked"), "masked", "Masked: scaled + position bias + M",
           r"Q K^{T} + \mathrm{PB} + M", r"K^{T} Q + \mathrm{PB}^{T} + M^{T}",
           r"The position bias shifts every score by an amount that depends only on the distance; adding $M$ "
           r"sets forbidden scores to $-\infty$.")
    elif capped:
        add_map(nm("masked"), "masked", "Masked: capped + M",
           r"c \tanh\!\Big(\frac{Q K^{T} \cdot \text{scale}}{c}\Big) + M",
           r"c \tanh\!\Big(\frac{K^{T} Q \cdot \text{scale}}{c}\Big) + M^{T}",
           r"The mask is added to the capped scores: forbidden ones become $-\infty$.")
    else:
        add_map(nm("masked"), "masked", "Masked: scaled + M",
           r"\frac{Q K^{T}}{\sqrt{d_k}} + M",
           r"\frac{K^{T} Q}{\sqrt{d_k}} + M^{T}",
           r"Adding $M$ leaves allowed scores unchanged and sets forbidden ones to $-\infty$. (Seed 003 eq. 18 "
           r"adds $B$ before scaling: the same, since $-\infty/\sqrt{d_k} = -\infty$.)")
    add_map(nm("weights"), "weights", f"Attention weights A = softmax (head {head})",
       r"A = \operatorname{softmax}_{\text{row}}\!\Big(\frac{Q K^{T}}{\sqrt{d_k}} + M\Big),\quad "
       r"\alpha_{ij} = \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}",
       r"A^{T} = \operatorname{softmax}_{\text{col}}\!\Big(\frac{K^{T} Q}{\sqrt{d_k}} + M^{T}\Big),\quad "
       r"\alpha_{ij} = \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}",
       r"Softmax over the keys turns each query's scores into weights $\alpha_{ij} \ge 0$ that sum to 1 "
       "(each row; each column in column notation).", style="attention", value_name="weight")
    if nm("sink") in trace:  # learned sinks (gpt-oss): the softmax's extra logit, drawn as a column of its own
        w_step = out[-1]
        w_step.extra["sink"] = _np(trace[nm("sink")][head])
        w_step.explain += (r" This layer has a **learned sink**: one more logit per head in the softmax that no key "
                           r"owns, so the keys' weights sum to $1 - 	ext{sink}$; the column **sink**, right of the "
                           r"red line, is that share (trace name `.sink`).")
    m = _np(trace[nm("heads")][head])
    out.append(Step(key="heads", group=g_out, title=f"Head output AV (head {head})", matrix=m, name=nm("heads"),
                    latex_rows=r"\text{head}_h = A V \in \mathbb{R}^{" + nq + r" \times d_k},\quad y^{(i)} = \sum_j \alpha_{ij} v_j",
                    latex_cols=r"Z_h = V A^{T} \in \mathbb{R}^{d_k \times " + nq + r"},\quad z_i = \sum_j \alpha_{ij} v_j",
                    explain="Each query's output is the weighted average of the value vectors $v_j$, with its row "
                            "of $A$ as the weights.",
                    dims=(nq, "d_k"), axes=("token", "feature"), row_labels=list(q_toks),
                    col_labels=feature_labels(m.shape[1])))
    m = _np(trace[nm("out")])
    bo = r" + b^{O}" if cfg.bias else ""
    out.append(Step(key="attn-out", group=g_out, title="Multi-head output: Concat(heads) Wᴼ", matrix=m, name=nm("out"),
                    latex_rows=rf"\operatorname{{MultiHead}}({f_in}) = \\ \operatorname{{Concat}}(\text{{head}}_1, "
                               rf"\dots, \text{{head}}_{{{n_heads}}})\, W^{{O}}{bo},\quad W^{{O}} \in \mathbb{{R}}^{{H d_k \times d}}",
                    latex_cols=rf"\operatorname{{MultiHead}}({f_in}) = W^{{O\,T}} \begin{{bmatrix}} Z_1 \\ \vdots \\ "
                               rf"Z_{{{n_heads}}} \end{{bmatrix}}{bo}",
                    explain=f"All $H$ = {n_heads} heads (not only head {head}) side by side, projected back to $d$ = "
                            f"{cfg.d_model} features by $W^O$ (seed 003 eq. 14; seed 001 writes it "
                            r"$\sum_h W_{h,c}^T\,\cdot$).",
                    dims=(nq, "d"), axes=("token", "feature"), row_labels=list(q_toks),
                    col_labels=feature_labels(m.shape[1])))
    return out


def _qk_norm_steps(trace, cfg, stack, layer, kind, head, kv, group, f_in, q_toks, k_toks, nq, nk) -> List[Step]:
    """QK-norm (Qwen3, Gemma 3: RMSNorm over each head's d_k features; OLMo-2: over the whole
    H d_k projection): the raw projections, and the scores QKᵀ/√d_k that the un-normed and the
    normed q, k give (both without RoPE, which keeps every vector's length), so the effect of
    the norm on the score range is seen on this sentence."""

    def nm(step):
        return tn.attn(stack, layer, kind, step)

    q_raw, k_raw = _np(trace[nm("q_pre_norm")][head]), _np(trace[nm("k_pre_norm")][kv])
    q_name, k_name = ("q_pre_rope", "k_pre_rope") if nm("q_pre_rope") in trace else ("q", "k")  # normed, before RoPE
    q_n, k_n = _np(trace[nm(q_name)][head]), _np(trace[nm(k_name)][kv])
    d_k = q_raw.shape[-1]
    mask = _np(trace[nm("mask")])
    allowed = np.isfinite(mask)
    before_s = (q_raw.astype(np.float64) @ k_raw.T.astype(np.float64)) / math.sqrt(d_k)
    after_s = (q_n.astype(np.float64) @ k_n.T.astype(np.float64)) / math.sqrt(d_k)

    def span(s):
        v = s[allowed] if allowed.any() else s.ravel()
        return float(v.min()), float(v.max())

    (b0, b1), (a0, a1) = span(before_s), span(after_s)
    over = ("each head's d_k features (per head)" if cfg.qk_norm in ("head", "l2")
            else f"the whole projection of all heads ({trace[nm('q_pre_norm')].shape[0]} × {d_k} features) before it is "
                 "split into heads")
    norm_tex = (r"\operatorname{RMSNorm}_{d_k}" if cfg.qk_norm in ("head", "l2") else r"\operatorname{RMSNorm}_{H d_k}")
    out = [Step(key="qknorm", group=group, title=f"QK-norm: scores before the norm (head {head})", matrix=before_s,
                name=None,
                latex_rows=rf"\tfrac{{1}}{{\sqrt{{d_k}}}} (X W_q)(X W_k)^{{T}},\quad X = {f_in}",
                latex_cols=rf"\tfrac{{1}}{{\sqrt{{d_k}}}} (W_k^{{T}} X)^{{T}} (W_q^{{T}} X),\quad X = {f_in}",
                explain=(f"This model normalises queries and keys (RMSNorm over {over}, ε = {cfg.norm_eps:g}, learned "
                         "gains) before RoPE. Here the scores the raw projections `q_pre_norm`, `k_pre_norm` would "
                         f"give (no RoPE): from {b0:.3g} to {b1:.3g} over the allowed cells, a range of {b1 - b0:.3g}."),
                dims=(nq, nk), axes=("query", "key"), row_labels=list(q_toks), col_labels=list(k_toks),
                value_name="score"),
           Step(key="qknorm-after", group=group, title=f"QK-norm: scores after the norm (head {head})", matrix=after_s,
                name=None,
                latex_rows=rf"\hat Q = {norm_tex}(X W_q),\ \hat K = {norm_tex}(X W_k),\quad "
                           r"\tfrac{1}{\sqrt{d_k}} \hat Q \hat K^{T}",
                latex_cols=rf"\hat Q = {norm_tex}(W_q^{{T}} X),\ \hat K = {norm_tex}(W_k^{{T}} X),\quad "
                           r"\tfrac{1}{\sqrt{d_k}} \hat K^{T} \hat Q",
                explain=(f"The same scores from the normed q and k (still without RoPE): from {a0:.3g} to {a1:.3g}, a "
                         f"range of {a1 - a0:.3g} ({(a1 - a0) / max(b1 - b0, 1e-12):.2g} × the range before). Each "
                         "normed vector has a root-mean-square set by the learned gains, so no query or key can grow "
                         "large enough to saturate the softmax on its own."),
                dims=(nq, nk), axes=("query", "key"), row_labels=list(q_toks), col_labels=list(k_toks),
                value_name="score")]
    return out
