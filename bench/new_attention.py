"""The 2025-26 attentions at 2,048 tokens: a traced pass against the untraced forward of the same
random model, one random config per mechanism (core/net/config.py's fields, as the families of
core/loaders/families set them).

    python -m bench.new_attention [--quick] [--json]

    sinks+moe    gpt-oss: learned sinks, sliding windows of 128 on alternate layers, YaRN, a
                 mixture of 8 experts (top 2) with the clamped SwiGLU
    nope         SmolLM3: no positions on layers 1 and 3
    windows      OLMo 3 / EXAONE 4: windows of 512 on three layers of four, norms after the
                 sub-layers, QK-norm
    chunked+moe  Llama 4: chunks of 512 on the RoPE layers, a NoPE layer with temperature
                 tuning, QK L2 norm, experts with a shared one on layers 1 and 3
    mla+moe      DeepSeek V3: multi-head latent attention (rank 128, rotated key 32), experts with
                 sigmoid routing, groups and a shared expert after one dense layer
    dsa          DeepSeek V3.2: the same latent attention with the lightning indexer keeping the
                 top 256 keys of each query
    shared_kv    Gemma 4: the last two layers reuse an earlier layer's keys and values, K = V on
                 the global layers, v-norm, windows of 512
    gated        Qwen3.5: an output gate on softmax attention, per-head QK-norm
    gated_delta  Qwen3.5's hybrid: three Gated DeltaNet layers to one gated attention layer
    mamba2       Granite 4 style: three Mamba2 layers to one attention layer
    short_conv   LFM2 style: three short-convolution layers to one attention layer
    kda+mla      Kimi Linear: three Kimi Delta Attention layers (a decay per key channel) to one
                 latent attention layer without positions
    olmo_hybrid  OLMo Hybrid: three pre-norm Gated DeltaNet layers (beta up to 2) to one OLMo-3
                 attention layer (norms after the sub-layers, QK-norm)
The token mixers' maps (their exact implicit attention) are computed when read, as softmax
layers' are, so the traced pass records only their inputs.

Per config: median process-CPU time of the traced pass (the Trace from ids, bench.common) and
of model.net's forward (no recorder), alternating rounds; target traced / untraced <= 1.3x.
Threads: core.device.configure_threads ($ATTENTION_LAB_THREADS, default 1).
"""

from __future__ import annotations

import argparse
import json

from bench.common import alternate, machine_info, median, paired_ratio, trace_from_ids

N = 2048
BASE = dict(kind="decoder", d_model=256, n_heads=8, n_kv_heads=2, d_ff=512, n_layers=4, max_len=4096,
            positional="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False)
TYPES_SW = ["sliding_attention", "full_attention"] * 2


def configs() -> dict:
    mla = {"kv_lora_rank": 128, "q_lora_rank": None, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32,
           "v_head_dim": 64, "rope_interleave": True}
    mixers = ["linear_attention"] * 3 + ["full_attention"]
    yarn = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": False}
    return {
        "sinks+moe": dict(BASE, attn_sinks=True, layer_types=TYPES_SW, sliding_window=128, rope_scaling=yarn,
                          qkv_bias=True, out_bias=False,
                          moe={"kind": "gpt_oss", "experts": 8, "top_k": 2, "d_expert": 256}),
        "nope": dict(BASE, nope_layers=[1, 3]),
        "windows": dict(BASE, layer_types=["sliding_attention"] * 3 + ["full_attention"], sliding_window=512,
                        qk_norm="full", pre_sublayer_norm=False, post_sublayer_norm=True),
        "chunked+moe": dict(BASE, layer_types=["chunked_attention"] * 3 + ["full_attention"], attn_chunk=512,
                            nope_layers=[3], qk_norm="l2", qk_norm_layers=[0, 1, 2], rope_layout="interleaved",
                            attn_temperature={"scale": 0.1, "floor": 256},
                            moe={"kind": "llama4", "experts": 8, "top_k": 1, "d_expert": 256, "layers": [1, 3]}),
        "mla+moe": dict(BASE, n_kv_heads=None, d_head=64, mla=mla,
                        moe={"kind": "deepseek", "experts": 8, "top_k": 2, "d_expert": 256, "d_shared": 256,
                             "n_group": 2, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                             "layers": [1, 2, 3]}),
        "dsa": dict(BASE, n_kv_heads=None, d_head=64,
                    mla={**mla, "q_lora_rank": 256, "index": {"heads": 4, "head_dim": 64, "topk": 256}}),
        "shared_kv": dict(BASE, layer_types=TYPES_SW, sliding_window=512, k_eq_v=True, kv_source=[None, None, 0, 1],
                          qk_norm="head", v_norm=True),
        "gated": dict(BASE, attn_gate=True, qk_norm="head"),
        "gated_delta": dict(BASE, attn_gate=True, qk_norm="head", layer_types=mixers,
                            mixer={"kind": "gated_delta", "heads": 8, "k_heads": 4, "d_k": 32, "d_v": 32, "conv": 4}),
        "mamba2": dict(BASE, layer_types=mixers,
                       mixer={"kind": "mamba2", "heads": 8, "head_dim": 64, "d_state": 64, "groups": 1, "conv": 4}),
        "short_conv": dict(BASE, layer_types=mixers, mixer={"kind": "short_conv", "conv": 3}),
        "kda+mla": dict(BASE, n_kv_heads=None, d_head=64, positional="none", layer_types=mixers,
                        mla=mla,
                        mixer={"kind": "kimi_delta", "heads": 8, "d_k": 32, "conv": 4}),
        "olmo_hybrid": dict(BASE, layer_types=mixers, qk_norm="full", mixer_sublayer_norms=(True, False),
                            pre_sublayer_norm=False, post_sublayer_norm=True,
                            mixer={"kind": "gated_delta", "heads": 8, "k_heads": 4, "d_k": 32, "d_v": 32, "conv": 4,
                                   "beta_scale": 2.0, "norm_eps": 1e-5}),
    }


def run(rounds: int) -> dict:
    import torch

    import core
    from core.device import configure_threads

    threads = configure_threads()
    rows = []
    for name, kw in configs().items():
        model = core.load_model("random", device="cpu", config=core.ModelConfig(**kw), seed=0)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(4, model.config.tgt_vocab_size, (N,), generator=g).tolist()
        toks = [str(i) for i in ids]
        t_ids = torch.tensor([ids])
        fns = {"traced": lambda: trace_from_ids(model, ids, toks), "untraced": lambda: model.net(tgt=t_ids)}
        with torch.inference_mode():
            t = alternate(fns, rounds, warmup=1)
        rows.append({"config": name, "tokens": N,
                     "cpu_ms": {k: round(median(v["cpu"]) * 1000, 1) for k, v in t.items()},
                     "ratio": round(paired_ratio(t["traced"]["cpu"], t["untraced"]["cpu"]), 3),
                     "layer_kinds": [f"{k.get('mixer', 'softmax')}/{k.get('mask')}/{k.get('positions')}"
                                     f"{'/sink' if k.get('sink') else ''}/{k.get('ffn')}"
                                     for k in model.net.layer_info("decoder")]})
    return {"machine": machine_info(), "threads": threads, "rounds": rounds, "target_ratio": 1.3, "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds instead of 5")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run(2 if args.quick else 5)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"threads {out['threads']}, {out['rounds']} rounds, load {out['machine'].get('load_average')}")
    for r in out["rows"]:
        ok = "met" if r["ratio"] <= out["target_ratio"] else "NOT met"
        print(f"{r['config']:12s} {r['tokens']} tokens: traced {r['cpu_ms']['traced']:8.1f} ms, untraced "
              f"{r['cpu_ms']['untraced']:8.1f} ms, ratio {r['ratio']:.3f} (target <= 1.3: {ok})  {r['layer_kinds']}")


if __name__ == "__main__":
    main()
