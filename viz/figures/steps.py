"""Inside a head: one attention head and the layer around it, as a list of `Step`s
(viz/figures/step.py): the embeddings, each sub-layer with its norms and residuals, and, for the
chosen attention, the head in detail (viz/figures/head_steps.py). The numerical checks of those
steps are in viz/figures/checks.py, their pictures in viz/figures/step_figures.py. No Streamlit here, so it
works in Jupyter too:

    steps = layer_steps(trace, "encoder", "self_attn", layer=0, head=2)
    fig = step_figure(steps_by_key(steps)["weights"], notation="cols")  # viz.figures.step_figures
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from core import trace_names as tn
from viz.figures.heatmaps import to_numpy as _np
from viz.figures.head_steps import attention_steps
from viz.figures.select import axis_tokens
from viz.figures.step import COLS, KIND_TEXT, ROWS, Step
from viz.figures.step import feature_labels as _feature_labels


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
            col_labels=_feature_labels(m.shape[1], prefix))

    # ---- embeddings -------------------------------------------------------------
    g_emb = "Input: token embeddings and positions"
    scale_note = (rf" ($E_{{t_i}}$, the row of token id $t_i$), multiplied by $\sqrt{{d}}$ = {math.sqrt(d):.2f} "
                  "as in Vaswani et al." if cfg.embed_scale else "")
    x_rows = r"X = \begin{bmatrix} x^{(1)T} \\ \vdots \\ x^{(n)T} \end{bmatrix} \in \mathbb{R}^{n \times d}"
    x_cols = r"X = [x_1, \dots, x_n] \in \mathbb{R}^{d \times n}"
    if cfg.embed_scale:
        x_rows += r",\quad x^{(i)} = \sqrt{d}\; E_{t_i}"
        x_cols += r",\quad x_i = \sqrt{d}\; E_{t_i}"
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
                        col_labels=_feature_labels(m.shape[1])))
    return out


def block_notes(cfg, trace, stack: str, layer: int) -> str:
    """One line on what this model's block does beyond the plain pre-/post-norm layer (norms
    after the sub-layers, soft-capping, QK-norm, the layer's kind): '' when nothing."""
    notes = []
    if getattr(cfg, "post_sublayer_norm", False):
        notes.append("a norm after each sub-layer as well as before it: x + Norm(f(Norm(x)))")
    if getattr(cfg, "qk_norm", None):
        notes.append(f"QK-norm ({'per head' if cfg.qk_norm == 'head' else 'over the whole projection'}) "
                     "before RoPE")
    if getattr(cfg, "attn_softcap", None):
        notes.append(f"attention scores soft-capped at ±{cfg.attn_softcap:g}")
    if getattr(cfg, "final_softcap", None) and stack == "decoder":
        notes.append(f"logits soft-capped at ±{cfg.final_softcap:g}")
    kinds = trace.meta.get("layer_kinds")
    if kinds and layer < len(kinds):
        n_local = sum(k == "local" for k in kinds)
        what = (f"local: sliding window of {cfg.sliding_window}" + (" tokens back" if stack == "decoder" else
                f" (±{cfg.sliding_window // 2} tokens)") if kinds[layer] == "local" else "global: full attention")
        theta = (cfg.rope_theta_local if kinds[layer] == "local" and getattr(cfg, "rope_theta_local", None)
                 else cfg.rope_theta)
        notes.append(f"layer {layer} is {what}, RoPE base {theta:g} ({n_local} local and "
                     f"{len(kinds) - n_local} global layers)")
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

