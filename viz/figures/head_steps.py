"""The steps of one attention head (viz/figures/step.py's `Step`s): its projections Q, K, V (and
RoPE's rotation where the model uses it), the scores and their scaling, mask and softmax,
the head's output and the heads' concatenation, with the formulas of the lecture notes."""

from __future__ import annotations

import math
from typing import List

import numpy as np

from core import trace_names as tn
from core.net.positional import rope_angles
from viz.figures.heatmaps import to_numpy as _np
from viz.figures.select import axis_tokens
from viz.figures.step import Step, feature_labels as _feature_labels, kv_head, mask_kind


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
                        col_labels=_feature_labels(m.shape[1])))

    rope = nm("q_pre_rope") in trace
    if nm("q_pre_norm") in trace:
        out.extend(_qk_norm_steps(trace, cfg, stack, layer, kind, head, kv, g_qkv, f_in, q_toks, k_toks, nq, nk))
    src_q = "this layer's tokens" if not cross else "the decoder's tokens"
    src_kv = "the encoder's output (source tokens)" if cross else "the same tokens"
    if rope:
        qkv(nm("q_pre_rope"), head, "qhat", f"Queries before rotation Q̂ (head {head})", r"\hat Q^{(h)}", "q",
            f_in, q_toks, f"Queries from {src_q}, before RoPE adds their position.", (nq, "d_k"))
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
                        col_labels=_feature_labels(ang.shape[1]), style="angle", value_name="angle (rad)"))
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
                            col_labels=_feature_labels(m.shape[1])))

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
    m = _np(trace[nm("heads")][head])
    out.append(Step(key="heads", group=g_out, title=f"Head output AV (head {head})", matrix=m, name=nm("heads"),
                    latex_rows=r"\text{head}_h = A V \in \mathbb{R}^{" + nq + r" \times d_k},\quad y^{(i)} = \sum_j \alpha_{ij} v_j",
                    latex_cols=r"Z_h = V A^{T} \in \mathbb{R}^{d_k \times " + nq + r"},\quad z_i = \sum_j \alpha_{ij} v_j",
                    explain="Each query's output is the weighted average of the value vectors $v_j$, with its row "
                            "of $A$ as the weights.",
                    dims=(nq, "d_k"), axes=("token", "feature"), row_labels=list(q_toks),
                    col_labels=_feature_labels(m.shape[1])))
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
                    col_labels=_feature_labels(m.shape[1])))
    return out


def _qk_norm_steps(trace, cfg, stack, layer, kind, head, kv, group, f_in, q_toks, k_toks, nq, nk) -> List[Step]:
    """QK-norm (Qwen3, Gemma 3: RMSNorm over each head's d_k features; OLMo-2: over the whole
    H d_k projection): the raw projections, and the scores QKᵀ/√d_k that the un-normed and the
    normed q, k give (both without RoPE, which keeps every vector's length), so the effect of
    the norm on the score range is seen on this sentence."""
    import numpy as np

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
    over = ("each head's d_k features (per head)" if cfg.qk_norm == "head"
            else f"the whole projection of all heads ({trace[nm('q_pre_norm')].shape[0]} × {d_k} features) before it is "
                 "split into heads")
    norm_tex = (r"\operatorname{RMSNorm}_{d_k}" if cfg.qk_norm == "head" else r"\operatorname{RMSNorm}_{H d_k}")
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
