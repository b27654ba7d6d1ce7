"""What a model costs: its parameter count written out from the hyper-parameters (seed 001),
and the measured time of its forward pass against O(N²D) + O(N·D²) (seed 004), and what its
KV cache holds per token (MHA / GQA: a key and a value per key/value head; MLA: a latent and
one rotated key).

Pure torch/numpy/pandas (no plotting); the Playground page draws the results
(viz/figures/by_hand.py).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch

from core.net.config import ModelConfig
from core.net.model import Transformer


# ------------------------------------------------------------------ token mixing
def mixing_cost(n: np.ndarray, d: int, d_k: int) -> dict:
    """Multiply-adds of one layer's token mixing on n tokens of width d (seed 004's count):
    softmax attention's Q Kᵀ and weights·V take 2 n² d, its four projections 4 n d²; a linear
    mixer (a state of d_k × d_v per head, d_v = d_k) writes and reads its state once per token:
    2 n d d_k, with the same projections. Memory: a KV cache keeps 2 n d numbers; the state
    d d_k, whatever n."""
    n = np.asarray(n, dtype=float)
    proj = 4 * n * d * d
    return {"softmax": 2 * n * n * d + proj, "linear": 2 * n * d * d_k + proj,
            "cache": 2 * n * d, "state": np.full_like(n, d * d_k)}


# ------------------------------------------------------------------ parameters
def meta_model(cfg: ModelConfig) -> torch.nn.Module:
    """Transformer(cfg) on the meta device: every shape, no memory, no initialisation cost."""
    with torch.device("meta"):
        return Transformer(cfg)


def weight_shapes(net: torch.nn.Module) -> pd.DataFrame:
    """One row per parameter tensor: name, shape, number of entries."""
    rows = [{"tensor": n, "shape": " × ".join(str(s) for s in p.shape), "entries": int(p.numel())}
            for n, p in net.named_parameters()]
    return pd.DataFrame(rows)


def _norm_params(cfg: ModelConfig) -> int:
    return cfg.d_model * (2 if cfg.norm == "layernorm" else 1)  # LayerNorm: gain + bias; RMSNorm: gain


def param_formula(cfg: ModelConfig) -> pd.DataFrame:
    """The parameter count written out from d, H, H_kv, d_k, m, L, V by hand (not by counting tensors).

    Columns: part, formula, each (per copy), copies, total."""
    d, H, Hkv, dk, m = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff
    b = 1 if cfg.bias else 0
    attn = d * H * dk + 2 * d * Hkv * dk + H * dk * d + b * (H * dk + 2 * Hkv * dk + d)
    attn_f = "d·H·d_k + 2·d·H_kv·d_k + H·d_k·d" + (" + (H·d_k + 2·H_kv·d_k + d)" if b else "")
    if H * dk == d and Hkv == H:
        attn_f += f"  = 4d²{' + 4d' if b else ''}"
    n_mats = 3 if cfg.activation == "swiglu" else 2
    ffn = n_mats * d * m + b * ((n_mats - 1) * m + d)
    ffn_f = ("3·d·m" + (" + 2m + d" if b else "") + " (SwiGLU: W_1, W_3, W_2)") if n_mats == 3 else \
        ("2·d·m" + (" + m + d" if b else "") + " (W_1, W_2 and biases)")
    norm = _norm_params(cfg)
    norm_f = "2d (LayerNorm γ, β)" if cfg.norm == "layernorm" else "d (RMSNorm g)"
    rows = []

    def add(part, formula, each, copies):
        rows.append({"part": part, "formula": formula, "each": int(each), "copies": int(copies),
                     "total": int(each) * int(copies)})

    def embedding(stack: str, vocab: int, vocab_sym: str):
        add(f"{stack} token embedding", f"{vocab_sym}·d", vocab * d, 1)
        if cfg.positional == "learned":
            add(f"{stack} learned positions", "max_len·d", cfg.max_len * d, 1)
        if cfg.type_vocab_size:
            add(f"{stack} token types", "types·d", cfg.type_vocab_size * d, 1)
        if cfg.embed_norm:
            add(f"{stack} embedding LayerNorm", "2d", 2 * d, 1)

    if cfg.has_encoder:
        L = cfg.n_layers
        embedding("encoder", cfg.src_vocab_size, "V_src")
        add("encoder self-attention", attn_f, attn, L)
        add("encoder FFN", ffn_f, ffn, L)
        add("encoder norms (2 per layer)", norm_f, norm, 2 * L)
        if cfg.final_norm:
            add("encoder final norm", norm_f, norm, 1)
    if cfg.has_decoder:
        cross = cfg.kind == "encoder-decoder"
        L = cfg.n_decoder_layers if cross else cfg.n_layers
        embedding("decoder", cfg.tgt_vocab_size, "V_tgt")
        add("decoder self-attention (masked)", attn_f, attn, L)
        if cross:
            add("decoder cross-attention", attn_f, attn, L)
        add("decoder FFN", ffn_f, ffn, L)
        add(f"decoder norms ({3 if cross else 2} per layer)", norm_f, norm, (3 if cross else 2) * L)
        if cfg.final_norm:
            add("decoder final norm", norm_f, norm, 1)
        if cfg.tie_embeddings:
            add("output projection (tied to the embedding)", "0 (shared)", 0, 1)
        else:
            V = cfg.tgt_vocab_size
            add("output projection", "d·V_tgt" + (" + V_tgt" if b else ""), d * V + b * V, 1)
    return pd.DataFrame(rows)


def layer_formula(cfg: ModelConfig) -> str:
    """Per-layer count of the notes' post-norm encoder block, as a formula with its value."""
    d, m = cfg.d_model, cfg.d_ff
    return f"4d² + 4d + 2dm + m + d + 4d = {4 * d * d + 4 * d + 2 * d * m + m + d + 4 * d:,}"


# ------------------------------------------------------------------ measured cost
def cost_grid(Ns: Sequence[int], Ds: Sequence[int], *, n_heads: int = 4, ff_mult: int = 4, n_layers: int = 1,
              min_repeats: int = 3, max_repeats: int = 20, point_s: float = 0.04, budget_s: float = 8.0,
              seed: int = 0, device: str = "cpu",
              progress: Optional[Callable[[float, str], None]] = None) -> Tuple[pd.DataFrame, bool]:
    """Time one forward pass (tracing off) of a random core encoder for every (N, D).

    Each point is the fastest of min_repeats..max_repeats runs (repeating until point_s is
    spent): the minimum is the least disturbed by whatever else the machine does. Returns
    (rows of N, D, seconds; finished) and stops early, finished False, once budget_s is spent."""
    start = time.perf_counter()
    rows = []
    total = len(Ns) * len(Ds)
    done = 0
    dev = torch.device(device)
    sync = dev.type == "cuda"
    for D in Ds:
        cfg = ModelConfig(kind="encoder", d_model=D, n_heads=n_heads, d_ff=ff_mult * D, n_layers=n_layers,
                          src_vocab_size=64, max_len=max(Ns))
        torch.manual_seed(seed)
        net = Transformer(cfg).to(dev).eval()
        for N in Ns:
            if time.perf_counter() - start > budget_s:
                return pd.DataFrame(rows), False
            ids = torch.randint(4, 64, (1, N), device=dev)
            with torch.inference_mode():
                net(ids)  # warm-up
                times: List[float] = []
                t_point = time.perf_counter()
                while len(times) < min_repeats or (len(times) < max_repeats and time.perf_counter() - t_point < point_s):
                    if sync:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    net(ids)  # rec=None: tracing off, fused attention
                    if sync:
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
            rows.append({"N": N, "D": D, "seconds": float(min(times)), "runs": len(times)})
            done += 1
            if progress is not None:
                progress(done / total, f"N = {N}, D = {D}: {rows[-1]['seconds'] * 1000:.2f} ms")
        del net
    return pd.DataFrame(rows), True


def fit_cost(df: pd.DataFrame) -> Dict[str, float]:
    """Fit t = c0 + a·N²D + b·N·D² with a, b, c0 >= 0, in relative error (times span decades).

    A tiny active-set non-negative least squares: solve, drop the most negative term, repeat.
    rel_rms is the root-mean-square relative error of the fitted model."""
    N, D, t = (df[c].to_numpy(dtype=np.float64) for c in ("N", "D", "seconds"))
    feats = np.stack([np.ones_like(N), N * N * D, N * D * D], 1)
    w = 1.0 / np.maximum(t, 1e-12)  # minimise sum ((t - pred) / t)^2
    A = feats * w[:, None]
    scale = np.abs(A).max(0)
    scale[scale == 0] = 1.0
    A = A / scale
    y = np.ones_like(t)  # t * w
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # drop the most negative term and refit
    coef = coef / scale
    rel = (feats @ coef) * w - 1.0  # relative residuals
    return {"c0": float(coef[0]), "a": float(coef[1]), "b": float(coef[2]),
            "rel_rms": float(np.sqrt((rel ** 2).mean())), "n": int(len(t))}


def cost_model(fit: Dict[str, float], N, D):
    N = np.asarray(N, dtype=np.float64)
    return fit["c0"] + fit["a"] * N * N * D + fit["b"] * N * D * D


# ------------------------------------------------------------------ the KV cache
def kv_cache_numbers(cfg: ModelConfig) -> int:
    """Numbers a decoder's self-attention cache holds per position and layer, as the network
    here keeps them (core/net/multihead.py, core/net/latent.py):
        MHA / GQA  2 H_kv d_k                (a key and a value per key/value head)
        MLA        r + d_rope (+ d_I)        (the latent, the rotated key every head shares, and
                                              a sparse selection's indexer key)"""
    if not cfg.has_decoder:
        raise ValueError("an encoder keeps no KV cache: it reads its whole input at once")
    if cfg.mla is not None:
        m = cfg.mla
        return int(m["kv_lora_rank"]) + int(m["qk_rope_head_dim"]) + (int(m["index"]["head_dim"]) if m.get("index") else 0)
    return 2 * cfg.n_kv_heads * cfg.d_head


def kv_cache_layers(cfg: ModelConfig) -> List[int]:
    """The decoder layers that keep keys and values of their own: not a token mixer's layer (its
    state is fixed-size; Falcon-H1's, with softmax attention beside the mixer, does cache), not a
    layer that reads an earlier layer's keys and values (Gemma 4's kv_source)."""
    if not cfg.has_decoder:
        raise ValueError("an encoder keeps no KV cache: it reads its whole input at once")
    n_layers = cfg.n_decoder_layers if cfg.kind == "encoder-decoder" else cfg.n_layers
    beside = bool((cfg.mixer or {}).get("beside_attention"))
    mixers = set() if beside else set(cfg.mixer_layers())
    shared = {i for i, j in enumerate(cfg.kv_source or []) if j is not None}
    return [i for i in range(n_layers) if i not in mixers and i not in shared]


def kv_cache_bytes(cfg: ModelConfig, dtype_bytes: int = 4) -> int:
    """Bytes of the KV cache per token, every layer that keeps one together (kv_cache_layers;
    float32: 4 bytes a number), each with its own key/value heads and head size."""
    if dtype_bytes < 1:
        raise ValueError(f"dtype_bytes must be a positive number of bytes, not {dtype_bytes}")
    if cfg.mla is not None or cfg.kind == "encoder-decoder":
        per_layer = [kv_cache_numbers(cfg)] * len(kv_cache_layers(cfg))
    else:
        per_layer = [2 * cfg.layer_kv_heads(i) * cfg.layer_d_head(i) for i in kv_cache_layers(cfg)]
    return sum(per_layer) * int(dtype_bytes)


def kv_cache_comparison(cfg: ModelConfig, kv_heads: Optional[int] = None, rank: Optional[int] = None,
                        rope_dim: Optional[int] = None, dtype_bytes: int = 4) -> pd.DataFrame:
    """The cache per token of the same model's attention as MHA, GQA and MLA: same d, H, L and
    head sizes (q/k d_k and v d_v; MLA's d_nope + d_rope and d_v), only what is cached differs.
    kv_heads: GQA's key/value heads (default: the model's own where it groups, else H / 4);
    rank, rope_dim: MLA's latent rank and rotated key (default: the model's own where it is MLA;
    without them and no MLA in the model there is no MLA row).
    Columns: kind, formula, numbers (per position and layer), bytes_per_token (every layer that
    keeps a cache: kv_cache_layers)."""
    H = cfg.n_heads
    if cfg.mla is not None:
        m = cfg.mla
        dqk, dv = int(m["qk_nope_head_dim"]) + int(m["qk_rope_head_dim"]), int(m["v_head_dim"])
        rank = int(m["kv_lora_rank"]) if rank is None else rank
        rope_dim = int(m["qk_rope_head_dim"]) if rope_dim is None else rope_dim
    else:
        dqk = dv = cfg.d_head
    g = kv_heads if kv_heads is not None else (cfg.n_kv_heads if cfg.n_kv_heads < H else max(1, H // 4))
    if not 1 <= g <= H or H % g:
        raise ValueError(f"kv_heads must divide the {H} heads, not {g}")
    n_layers = len(kv_cache_layers(cfg))  # the layers that cache: a token mixer's or a shared-KV layer's do not
    rows = [("MHA", "H (d_k + d_v)", H * (dqk + dv)), ("GQA", f"H_kv (d_k + d_v), H_kv = {g}", g * (dqk + dv))]
    if rank is not None:
        if rope_dim is None:
            raise ValueError("an MLA row needs rope_dim with rank")
        rows.append(("MLA", "r + d_rope", int(rank) + int(rope_dim)))
    return pd.DataFrame([{"kind": k, "formula": f, "numbers": n, "bytes_per_token": n * n_layers * int(dtype_bytes)}
                         for k, f, n in rows])
