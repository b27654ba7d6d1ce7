"""A token mixer's exact implicit attention at 2,048 tokens, against one traced pass of the
mixer, measured in one run (core/net/mixer.py: the kinds):

    python -m bench.mixers [--kinds gated_delta,kimi_delta,mamba2] [--tokens 2048] [--quick] [--json]

One random layer per kind, at the size of a layer of a model people open:
    gated_delta  Gated DeltaNet (core/net/gated_delta.py): d_model 1024, 16 key and 16 value
                 heads of 128, a conv of 4 taps, chunks of 64
    kimi_delta   Kimi Delta Attention (core/net/kimi_delta.py), Kimi Linear 48B's layer: d_model
                 2304, 32 heads of 128, a decay per key channel, chunks of 16
    mamba2       Mamba2 (core/net/mamba2.py), Mamba2-130m's shape: d_model 768, 24 heads of
                 64, a state of 128, one group, a conv of 4 taps, chunks of 256
Each kind's rates spread from slow to fast over its heads, as the models start them.

Rows per kind, median process-CPU time over alternating rounds:
- traced pass: the mixer's chunked form with q, k, v, decay (beta, skip), heads and out
  recorded (a recorder without maps: what a traced pass of the model keeps of the layer);
- A, one head: the exact map of head 0 from the recorded tensors (O(n^2 d_k) for the head),
  and its ratio to the traced pass;
- A, every head: the whole layer's map, and its ratio to the traced pass.
Then, once: the recurrent form over the same input (one position at a time, with the cache) and its largest gap to the chunked one, and
how far A @ v (+ skip) is from the recorded heads (a fraction of heads' max).
Threads: core.device.configure_threads ($ATTENTION_LAB_THREADS, default 1).
"""

from __future__ import annotations

import argparse
import json
import time

from bench.common import alternate, machine_info, median, paired_ratio

KINDS = ("gated_delta", "kimi_delta", "mamba2")


def _delta_maps(mixer):
    """(one head's map, every head's, A @ v) of a delta-rule mixer from a recorder's tensors (kept
    H x n x ..., batch dropped; the rule reads (B, H, n, ...))."""
    def one(t, h=0):
        s = slice(h, h + 1)
        return mixer.implicit_attention(t["q"][None, s], t["k"][None, s], t["decay"][None, s], t["beta"][None, s])[0]

    def every(t):
        return mixer.implicit_attention(t["q"][None], t["k"][None], t["decay"][None], t["beta"][None])[0]

    return one, every, lambda t: every(t) @ t["v"]


def gated_delta_layer():
    """(mixer, d_model, one_head(t), every_head(t), rebuild(t)) for a Gated DeltaNet layer."""
    import torch

    from core.net.config import ModelConfig
    from core.net.gated_delta import GatedDeltaNet

    heads = 16
    cfg = ModelConfig(kind="decoder", d_model=1024, n_heads=8, d_ff=64, n_layers=1, norm="rmsnorm",
                      norm_placement="pre", positional="none", layer_types=["linear_attention"],
                      mixer={"kind": "gated_delta", "heads": heads, "k_heads": heads, "d_k": 128, "d_v": 128,
                             "conv": 4, "chunk": 64})
    mixer = GatedDeltaNet(cfg, 0).eval()
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
        mixer.A_log.copy_(torch.linspace(-2.0, 1.0, heads))  # rates from slow to fast
        mixer.dt_bias.copy_(torch.linspace(-4.0, 0.0, heads))

    return (mixer, cfg.d_model) + _delta_maps(mixer)


def kimi_delta_layer():
    """The same for a Kimi Delta Attention layer of Kimi Linear 48B's size."""
    import math

    import torch

    from core.net.config import ModelConfig
    from core.net.kimi_delta import KimiDeltaAttention

    heads, dk = 32, 128
    cfg = ModelConfig(kind="decoder", d_model=2304, n_heads=8, d_ff=64, n_layers=1, norm="rmsnorm",
                      norm_placement="pre", positional="none", layer_types=["linear_attention"],
                      mixer={"kind": "kimi_delta", "heads": heads, "d_k": dk, "conv": 4})
    mixer = KimiDeltaAttention(cfg, 0).eval()
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
        mixer.A_log.copy_(torch.linspace(-2.0, 1.0, heads))  # rates from slow to fast
        steps = torch.logspace(-3, -1, dk).repeat(heads)  # per channel, 0.001 .. 0.1
        mixer.dt_bias.copy_(torch.log(torch.expm1(steps)))
        assert math.isfinite(float(mixer.dt_bias.sum()))

    return (mixer, cfg.d_model) + _delta_maps(mixer)


def mamba2_layer():
    """The same for a Mamba2 layer of Mamba2-130m's shape."""
    import torch

    from core.net.mamba2 import Mamba2Mixer, Mamba2Spec

    spec = Mamba2Spec(d_model=768, n_heads=24, head_dim=64, d_state=128, n_groups=1, conv_kernel=4, chunk_size=256)
    mixer = Mamba2Mixer(spec).eval()
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
        mixer.A_log.copy_(torch.linspace(0.0, 2.7, spec.n_heads))  # rates 1..16, as Mamba2 starts them
        mixer.dt_bias.copy_(torch.linspace(-6.0, -2.3, spec.n_heads))  # steps 0.0025..0.1

    def one(t):
        return mixer.weights_from(t["q"], t["k"], t["decay"], head=0)

    def every(t):
        return mixer.weights_from(t["q"], t["k"], t["decay"])

    def rebuild(t):
        return every(t) @ t["v"] + t["skip"]

    return mixer, spec.d_model, one, every, rebuild


LAYERS = {"gated_delta": gated_delta_layer, "kimi_delta": kimi_delta_layer, "mamba2": mamba2_layer}


def run_kind(kind: str, tokens: int, rounds: int) -> dict:
    import torch

    from core.net.recorder import Recorder

    torch.manual_seed(0)
    mixer, d_model, one, every, rebuild = LAYERS[kind]()
    x = torch.randn(1, tokens, d_model)
    with torch.inference_mode():
        rec = Recorder(maps=False)
        chunked = mixer(x, rec=rec)
        t = rec.tensors
        fns = {"traced_pass": lambda: mixer(x, rec=Recorder(maps=False)),
               "A_one_head": lambda: one(t),
               "A_every_head": lambda: every(t)}
        timing = alternate(fns, rounds, warmup=1)
        c0 = time.process_time()
        cache: dict = {}  # one position at a time, as generation feeds them: the recurrent form
        recurrent = torch.cat([mixer(x[:, i:i + 1], cache=cache) for i in range(tokens)], dim=1)
        recurrent_s = time.process_time() - c0
        rebuilt = (rebuild(t) - t["heads"]).abs().max().item() / t["heads"].abs().max().item()
    cpu_ms = {k: round(median(v["cpu"]) * 1000, 1) for k, v in timing.items()}
    return {"heads": mixer.n_heads, "cpu_ms": cpu_ms,
            "A_one_head_over_traced": round(paired_ratio(timing["A_one_head"]["cpu"], timing["traced_pass"]["cpu"]), 3),
            "A_every_head_over_traced": round(paired_ratio(timing["A_every_head"]["cpu"],
                                                           timing["traced_pass"]["cpu"]), 3),
            "recurrent_cpu_ms": round(recurrent_s * 1000, 1),
            "chunked_vs_recurrent_max_abs": (chunked - recurrent).abs().max().item(),
            "output_max_abs": chunked.abs().max().item(),
            "A_rebuild_rel": rebuilt}


def run(kinds, tokens: int, rounds: int) -> dict:
    from core.device import configure_threads

    threads = configure_threads()
    return {"machine": machine_info(), "threads": threads, "rounds": rounds, "tokens": tokens,
            "kinds": {k: run_kind(k, tokens, rounds) for k in kinds}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="2 rounds instead of 5")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(LAYERS))
    if unknown:
        ap.error(f"unknown kind(s) {unknown}: expected some of {sorted(LAYERS)}")
    out = run(kinds, args.tokens, 2 if args.quick else 5)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"threads {out['threads']}, {out['rounds']} rounds, {out['tokens']} tokens, "
          f"load {out['machine'].get('load_average')}")
    for kind, r in out["kinds"].items():
        print(f"{kind} ({r['heads']} heads)")
        for k, v in r["cpu_ms"].items():
            print(f"  {k:14s} {v:10.1f} ms")
        print(f"  A for one head / traced pass: {r['A_one_head_over_traced']:.3f}x; "
              f"every head / traced pass: {r['A_every_head_over_traced']:.3f}x")
        print(f"  recurrent form {r['recurrent_cpu_ms']:.1f} ms; chunked vs recurrent max |diff| "
              f"{r['chunked_vs_recurrent_max_abs']:.2e} (outputs up to {r['output_max_abs']:.2f}); "
              f"A @ v vs heads {r['A_rebuild_rel']:.2e} of heads' max")


if __name__ == "__main__":
    main()
