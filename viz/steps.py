"""Inside a head: one attention head and the layer around it, as a list of `Step`s.

Pure functions from a Trace to a list of `Step`s: the real tensor of each step, with its
formula in both notations of the lecture notes, a one-line explanation and its shape. The
numerical checks of those steps are in viz/checks.py, their pictures in viz/step_figures.py.
No Streamlit here, so it works in Jupyter too:

    steps = layer_steps(trace, "encoder", "self_attn", layer=0, head=2)
    fig = step_figure(steps_by_key(steps)["weights"], notation="cols")  # viz.step_figures

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

from core.positional import rope_angles
from viz.figures import to_numpy
from viz.select import axis_tokens

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
    style: str = "signed"  # signed | attention | mask | angle
    value_name: str = "value"

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
    m = to_numpy(mask)
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



def _np(t) -> np.ndarray:
    return to_numpy(t)


def _feature_labels(n: int, prefix: str = "") -> List[str]:
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
    return f"embed.{stack}.sum" if layer == 0 else f"{stack}.{layer - 1}.out"


def memory_name(trace) -> Optional[str]:
    """The encoder output that cross-attention reads its keys and values from."""
    if "encoder.final_norm" in trace:
        return "encoder.final_norm"
    n = trace.layers("encoder")
    return f"encoder.{n - 1}.out" if n else None


def sublayers(trace, stack: str, layer: int) -> List[str]:
    """The sub-layers of a layer, in order: 'self_attn', ['cross_attn'], 'ffn'."""
    subs = [k for k in ("self_attn", "cross_attn") if f"{stack}.{layer}.{k}.weights" in trace]
    return subs + ["ffn"]


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
        from core.config import ModelConfig

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
    e = f"embed.{stack}"
    scale_note = (rf" ($E_{{t_i}}$, the row of token id $t_i$), multiplied by $\sqrt{{d}}$ = {math.sqrt(d):.2f} "
                  "as in Vaswani et al." if cfg.embed_scale else "")
    x_rows = r"X = \begin{bmatrix} x^{(1)T} \\ \vdots \\ x^{(n)T} \end{bmatrix} \in \mathbb{R}^{n \times d}"
    x_cols = r"X = [x_1, \dots, x_n] \in \mathbb{R}^{d \times n}"
    if cfg.embed_scale:
        x_rows += r",\quad x^{(i)} = \sqrt{d}\; E_{t_i}"
        x_cols += r",\quad x_i = \sqrt{d}\; E_{t_i}"
    tok_feat(f"{e}.tokens", "x", g_emb, "Token embeddings X", x_rows, x_cols,
             f"Each token's learned embedding vector{scale_note}: one row of X per token (one column in "
             "column notation).")
    if cfg.positional == "sinusoidal":
        tok_feat(f"{e}.positions", "p", g_emb, "Positional encoding P (sinusoidal)",
                 r"P_{i,2j} = \sin\!\Big(\frac{i}{10000^{2j/d}}\Big),\quad P_{i,2j+1} = \cos\!\Big(\frac{i}{10000^{2j/d}}\Big)",
                 r"P_{2j,i} = \sin\!\Big(\frac{i}{10000^{2j/d}}\Big),\quad P_{2j+1,i} = \cos\!\Big(\frac{i}{10000^{2j/d}}\Big)",
                 "Position $i$ gets a fixed vector of sines and cosines (radians) whose frequencies fall with the "
                 "feature index $j$; computed, not learned.")
    elif cfg.positional == "learned":
        tok_feat(f"{e}.positions", "p", g_emb, "Positional embedding P (learned)",
                 r"P = \begin{bmatrix} p^{(0)T} \\ \vdots \\ p^{(n-1)T} \end{bmatrix},\ p^{(i)} = E^{\text{pos}}_i",
                 r"P = [p_0, \dots, p_{n-1}],\ p_i = E^{\text{pos}}_i",
                 f"Position $i$ looks up its own learned vector in a table of {cfg.max_len} positions.")
    else:
        what = ("RoPE rotates the queries and keys inside every attention layer instead (shown below)"
                if cfg.positional == "rope" else "this model has no positional information at all")
        add(key="p", group=g_emb, title="No positional vector P", matrix=None,
            latex_rows=r"P = 0", latex_cols=r"P = 0",
            explain=f"{cfg.positional!r} positions: nothing is added to X; {what}.")
    if f"{e}.types" in trace:
        tok_feat(f"{e}.types", "t", g_emb, "Token-type (segment) embedding T",
                 r"T = E^{\text{type}}_{\text{segment}_i}", r"T = [E^{\text{type}}_{\text{segment}_i}]_i",
                 "BERT adds a learned vector for the segment (sentence A or B) of each token; here all are A.")
    if f"{e}.presum_norm" in trace:
        plus = " + T" if f"{e}.types" in trace else ""
        tok_feat(f"{e}.presum_norm", "xpt", g_emb, f"Sum X + P{plus}", rf"X + P{plus}", rf"X + P{plus}",
                 "Embeddings and positions add element by element (same shape).")
        tok_feat(f"{e}.sum", "sum", g_emb, "Embedding LayerNorm", rf"\operatorname{{LayerNorm}}(X + P{plus})",
                 rf"\operatorname{{LayerNorm}}(X + P{plus})",
                 "BERT normalises the summed embeddings before the first layer.")
    else:
        p_txt = "" if cfg.positional in ("rope", "none") else " + P"
        tok_feat(f"{e}.sum", "sum", g_emb, f"Input to layer 0: X{p_txt}", rf"X \leftarrow X{p_txt}",
                 rf"X \leftarrow X{p_txt}",
                 "What the first layer receives" + (": embeddings plus positions, element by element." if p_txt
                                                    else ": the token embeddings unchanged."))

    # ---- layer input / memory ---------------------------------------------------------
    g_in = f"Layer {layer} input"
    if layer > 0:
        tok_feat(layer_input_name(trace, stack, layer), "xin", g_in, f"X entering layer {layer}",
                 rf"X = \text{{output of layer }} {layer - 1}", rf"X = \text{{output of layer }} {layer - 1}",
                 (f"Layer 0" if layer == 1 else f"Layers 0–{layer - 1}") + " (choose with the layer selector) turned "
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
    p = f"{stack}.{layer}"
    norm_word = "RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm"
    for j, sub in enumerate(subs, start=1):
        x_sym, y_sym = syms[j - 1], syms[j]
        is_attn = sub != "ffn"
        sub_group = (f"Sub-layer {j}: {KIND_TEXT.get(sub, 'feed-forward network')}"
             + (f" (head {head} in detail)" if sub == kind else "") + (" (summary)" if is_attn and sub != kind else ""))
        f_in = rf"\tilde{{{x_sym}}}" if pre else x_sym  # what the sub-layer function reads
        g_head, g_tail = ((sub_group + " · projections Q, K, V", sub_group + " · heads → output, add & norm")
                          if sub == kind else (sub_group, sub_group))
        if pre:
            tok_feat(f"{p}.norm{j}", f"norm{j}", g_head, f"{norm_word} before the sub-layer (pre-norm)",
                     rf"{f_in} = {_norm_latex(cfg, x_sym)},\quad " + _norm_formula(cfg, ROWS),
                     rf"{f_in} = {_norm_latex(cfg, x_sym)},\quad " + _norm_formula(cfg, COLS),
                     "Pre-norm: this model normalises first and adds the sub-layer's result to the un-normalised "
                     "stream. " + _norm_explain(cfg, x_sym))
        if sub == kind:
            steps.extend(_attention_steps(trace, cfg, stack, kind, layer, head, sub_group, f_in, toks))
            f_latex_rows = rf"\operatorname{{MultiHead}}({f_in})"
        elif is_attn:
            q_t, k_t = axis_tokens(trace, stack, sub)
            tok_feat(f"{p}.{sub}.out", f"{sub}-out", sub_group, f"{KIND_TEXT[sub].capitalize()} output",
                     rf"\operatorname{{MultiHead}}({f_in}) \in \mathbb{{R}}^{{n \times d}}",
                     rf"\operatorname{{MultiHead}}({f_in}) \in \mathbb{{R}}^{{d \times n}}",
                     f"All heads of this layer's {KIND_TEXT[sub]}, combined by W^O. Choose it in the attention "
                     "selector to see its steps.")
            f_latex_rows = rf"\operatorname{{MultiHead}}({f_in})"
        else:
            steps.extend(_ffn_steps(trace, cfg, p, sub_group, f_in, toks))
            f_latex_rows = rf"\operatorname{{FFN}}({f_in})"
        res_rows = rf"{x_sym} + {f_latex_rows}"
        if pre:
            tok_feat(f"{p}.residual{j}", f"residual{j}", g_tail, "Residual: add the sub-layer's result",
                     rf"{y_sym} = {res_rows}", rf"{y_sym} = {res_rows}",
                     "The residual connection: the sub-layer's output is added to its (un-normalised) input.")
        else:
            tok_feat(f"{p}.residual{j}", f"residual{j}", g_tail, "Residual: add the sub-layer's input",
                     res_rows, res_rows,
                     "The residual connection: the sub-layer's output is added to its input, token by token.")
            gam = f"\\gamma_{j}, \\beta_{j}" if cfg.norm == "layernorm" else f"g_{j}"
            tok_feat(f"{p}.norm{j}", f"norm{j}", g_tail, f"Add & norm: {norm_word}",
                     rf"{y_sym} = \operatorname{{{norm_word}}}\big({res_rows};\, {gam}\big),\quad " + _norm_formula(cfg, ROWS),
                     rf"{y_sym} = \operatorname{{{norm_word}}}\big({res_rows};\, {gam}\big),\quad " + _norm_formula(cfg, COLS),
                     "Post-norm (seeds 001/003): normalise after the residual add. " + _norm_explain(cfg, "the sum"))
    out_next = (f"the input of layer {layer + 1}" if layer + 1 < trace.layers(stack)
                else ("followed by the final norm" if cfg.final_norm else "the stack's output")
                + (" and the projection to the vocabulary" if stack == "decoder" else ""))
    tok_feat(f"{p}.out", "out", g_tail, f"Layer {layer} output",
             rf"{syms[-1]} \in \mathbb{{R}}^{{n \times d}}", rf"{syms[-1]} \in \mathbb{{R}}^{{d \times n}}",
             f"Same shape as the layer's input: {out_next}.")
    return steps


def _attention_steps(trace, cfg, stack, kind, layer, head, group, f_in, toks) -> List[Step]:
    p = f"{stack}.{layer}.{kind}"
    q_toks, k_toks = axis_tokens(trace, stack, kind)
    w_all = trace[f"{p}.weights"]
    n_heads = w_all.shape[0]
    n_kv = trace[f"{p}.k"].shape[0]
    kv = kv_head(head, n_heads, n_kv)
    d_k = trace[f"{p}.q"].shape[-1]
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
                        col_labels=_feature_labels(m.shape[1])))

    rope = f"{p}.q_pre_rope" in trace
    hat = r"\hat " if rope else ""
    src_q = "this layer's tokens" if not cross else "the decoder's tokens"
    src_kv = "the encoder's output (source tokens)" if cross else "the same tokens"
    if rope:
        qkv(f"{p}.q_pre_rope", head, "qhat", f"Queries before rotation Q̂ (head {head})", r"\hat Q^{(h)}", "q",
            f_in, q_toks, f"Queries from {src_q}, before RoPE adds their position.", (nq, "d_k"))
        qkv(f"{p}.k_pre_rope", kv, "khat", f"Keys before rotation K̂ (kv head {kv})", r"\hat K^{(h)}", "k", kv_in,
            k_toks, f"Keys from {src_kv}, before RoPE.{gqa}", (nk, "d_k"))
    else:
        qkv(f"{p}.q", head, "q", f"Queries Q (head {head})", r"Q^{(h)}", "q", f_in, q_toks,
            f"One query vector per token of {src_q}: what each token is looking for.", (nq, "d_k"))
        qkv(f"{p}.k", kv, "k", f"Keys K ({kv_who})", r"K^{(h)}", "k", kv_in, k_toks,
            f"One key vector per token of {src_kv}: what each token offers to be found by.{gqa}", (nk, "d_k"))
    qkv(f"{p}.v", kv, "v", f"Values V ({kv_who})", r"V^{(h)}", "v", kv_in, k_toks,
        f"One value vector per token of {src_kv}: what each token passes on when attended to.{gqa}", (nk, "d_k"))
    if rope:
        n_pos = len(q_toks)
        ang = rope_angles(n_pos, d_k, cfg.rope_theta).numpy()
        pairs = ("(2j, 2j+1): neighbouring features" if cfg.rope_layout == "interleaved"
                 else f"(j, j+{d_k // 2}): the two halves of the head")
        out.append(Step(key="angles", group=g_qkv, title="RoPE rotation angles", matrix=ang, name=None,
                        latex_rows=rf"\phi_{{i,j}} = i\,\Theta^{{-2j/d_k}},\quad \Theta = {cfg.rope_theta:g}",
                        latex_cols=rf"\phi_{{j,i}} = i\,\Theta^{{-2j/d_k}},\quad \Theta = {cfg.rope_theta:g}",
                        explain=f"Feature pair j of the query/key at position i is rotated by φ (radians); pairs are "
                                f"{pairs}. Low pairs turn fast, high pairs slowly.",
                        dims=("n", r"d_k/2"), axes=("position", "pair j"), row_labels=list(q_toks),
                        col_labels=_feature_labels(ang.shape[1]), style="angle", value_name="angle (rad)"))
        rot = (r"\begin{bmatrix} \cos\phi_{i,j} & -\sin\phi_{i,j} \\ \sin\phi_{i,j} & \cos\phi_{i,j}\end{bmatrix}")
        for key, name, idx, sym, lab, who in [("q", f"{p}.q", head, "q", q_toks, f"head {head}"),
                                              ("k", f"{p}.k", kv, "k", k_toks, f"kv head {kv}")]:
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
                            col_labels=_feature_labels(m.shape[1])))

    def add_map(name, key, title, lr, lc, explain, style="signed", value_name="score", matrix=None):
        m = _np(trace[name][head]) if matrix is None else matrix
        out.append(Step(key=key, group=g_att, title=title, matrix=m, name=name, latex_rows=lr, latex_cols=lc,
                        explain=explain, dims=(nq, nk), axes=("query", "key"), row_labels=list(q_toks),
                        col_labels=list(k_toks), style=style, value_name=value_name))

    add_map(f"{p}.scores", "scores", "Scores QKᵀ",
       r"S = Q K^{T},\quad S_{ij} = q_i^{T} k_j",
       r"S^{T} = K^{T} Q,\quad (S^{T})_{ji} = k_j^{T} q_i",
       "How well each query matches each key: one dot product per (query, key) pair.")
    scale = getattr(cfg, "attn_scale", None)
    if scale is None:
        add_map(f"{p}.scaled", "scaled", f"Scaled: ÷ √d_k = ÷ {sq:.3g}",
           rf"\frac{{Q K^{{T}}}}{{\sqrt{{d_k}}}},\quad \sqrt{{d_k}} = \sqrt{{{d_k}}} = {sq:.4g}",
           rf"\frac{{K^{{T}} Q}}{{\sqrt{{d_k}}}},\quad \sqrt{{d_k}} = \sqrt{{{d_k}}} = {sq:.4g}",
           r"Dividing by $\sqrt{d_k}$ keeps the scores' spread independent of $d_k$ (their variance would be $d_k$), "
           "so softmax does not saturate (seed 004).")
    else:
        add_map(f"{p}.scaled", "scaled", f"Scaled: × {scale:.4g} (not ÷ √d_k)",
           rf"{scale:.4g} \cdot Q K^{{T}}", rf"{scale:.4g} \cdot K^{{T}} Q",
           "This model does not divide by √d_k" + (" (T5: the scale is folded into the initialisation of W_q), "
                                                  "so the scaled scores are the scores." if scale == 1.0 else "."))
    bias_name = f"{p}.position_bias"
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
    mask = _np(trace[f"{p}.mask"])
    mk = mask_kind(mask)
    mask_text = {
        "none": "No mask here: every query may look at every key, so M = 0 everywhere.",
        "causal": "Look-ahead mask (seed 002's M, seed 003's B): a token may not look at later tokens; "
                  "softmax turns -∞ into a weight of exactly 0.",
        "padding": "Padding mask: the columns of padding keys are -∞, so no query attends to padding.",
        "causal+padding": "Look-ahead and padding masks together: later tokens and padding are -∞.",
        "custom": "An additive mask: 0 where a query may look, -∞ where it may not.",
    }[mk]
    m_rows = (r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}" if mk.startswith("causal")
              else r"M_{ij} = \begin{cases} 0 & \text{key } j \text{ allowed} \\ -\infty & \text{otherwise} \end{cases}")
    m_cols = m_rows.replace("M_{ij}", r"(M^{T})_{ji}")
    out.append(Step(key="mask", group=g_att, title="Mask M (additive: 0 or -∞)", matrix=mask, name=f"{p}.mask",
                    latex_rows=m_rows, latex_cols=m_cols, explain=mask_text, dims=(nq, nk), axes=("query", "key"),
                    row_labels=list(q_toks), col_labels=list(k_toks), style="mask", value_name="mask"))
    if has_bias:
        add_map(f"{p}.masked", "masked", "Masked: scaled + position bias + M",
           r"Q K^{T} + \mathrm{PB} + M", r"K^{T} Q + \mathrm{PB}^{T} + M^{T}",
           r"The position bias shifts every score by an amount that depends only on the distance; adding $M$ "
           r"sets forbidden scores to $-\infty$.")
    else:
        add_map(f"{p}.masked", "masked", "Masked: scaled + M",
           r"\frac{Q K^{T}}{\sqrt{d_k}} + M",
           r"\frac{K^{T} Q}{\sqrt{d_k}} + M^{T}",
           r"Adding $M$ leaves allowed scores unchanged and sets forbidden ones to $-\infty$. (Seed 003 eq. 18 "
           r"adds $B$ before scaling: the same, since $-\infty/\sqrt{d_k} = -\infty$.)")
    add_map(f"{p}.weights", "weights", f"Attention weights A = softmax (head {head})",
       r"A = \operatorname{softmax}_{\text{row}}\!\Big(\frac{Q K^{T}}{\sqrt{d_k}} + M\Big),\quad "
       r"\alpha_{ij} = \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}",
       r"A^{T} = \operatorname{softmax}_{\text{col}}\!\Big(\frac{K^{T} Q}{\sqrt{d_k}} + M^{T}\Big),\quad "
       r"\alpha_{ij} = \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}",
       r"Softmax over the keys turns each query's scores into weights $\alpha_{ij} \ge 0$ that sum to 1 "
       "(each row; each column in column notation).", style="attention", value_name="weight")
    m = _np(trace[f"{p}.heads"][head])
    out.append(Step(key="heads", group=g_out, title=f"Head output AV (head {head})", matrix=m, name=f"{p}.heads",
                    latex_rows=r"\text{head}_h = A V \in \mathbb{R}^{" + nq + r" \times d_k},\quad y^{(i)} = \sum_j \alpha_{ij} v_j",
                    latex_cols=r"Z_h = V A^{T} \in \mathbb{R}^{d_k \times " + nq + r"},\quad z_i = \sum_j \alpha_{ij} v_j",
                    explain="Each query's output is the weighted average of the value vectors $v_j$, with its row "
                            "of $A$ as the weights.",
                    dims=(nq, "d_k"), axes=("token", "feature"), row_labels=list(q_toks),
                    col_labels=_feature_labels(m.shape[1])))
    m = _np(trace[f"{p}.out"])
    bo = r" + b^{O}" if cfg.bias else ""
    out.append(Step(key="attn-out", group=g_out, title="Multi-head output: Concat(heads) Wᴼ", matrix=m, name=f"{p}.out",
                    latex_rows=rf"\operatorname{{MultiHead}}({f_in}) = \\ \operatorname{{Concat}}(\text{{head}}_1, "
                               rf"\dots, \text{{head}}_{{{n_heads}}})\, W^{{O}}{bo},\quad W^{{O}} \in \mathbb{{R}}^{{H d_k \times d}}",
                    latex_cols=rf"\operatorname{{MultiHead}}({f_in}) = W^{{O\,T}} \begin{{bmatrix}} Z_1 \\ \vdots \\ "
                               rf"Z_{{{n_heads}}} \end{{bmatrix}}{bo}",
                    explain=f"All $H$ = {n_heads} heads (not only head {head}) side by side, projected back to $d$ = "
                            f"{cfg.d_model} features by $W^O$ (seed 003 eq. 14; seed 001 writes it "
                            r"$\sum_h W_{h,c}^T\,\cdot$).",
                    dims=(nq, "d"), axes=("token", "feature"), row_labels=list(q_toks),
                    col_labels=_feature_labels(m.shape[1])))
    return out


def _ffn_steps(trace, cfg, p, group, f_in, toks) -> List[Step]:
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
        (f"{p}.ffn.hidden", "ffn-hidden", "FFN hidden layer", hr + r",\quad H \in \mathbb{R}^{n \times m}",
         hc + r",\quad H \in \mathbb{R}^{m \times n}", ex + f" $m$ = {cfg.d_ff}.", ("n", "m")),
        (f"{p}.ffn.out", "ffn-out", "FFN output", rf"\operatorname{{FFN}}({f_in}) = H W_2{b2}",
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
        from core.config import ModelConfig

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

