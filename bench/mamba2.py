"""A Mamba2 mixer's implicit attention at 2,048 tokens, against one forward of the mixer,
measured in one run (core/net/mamba2.py):

    python -m bench.mamba2 [--tokens 2048] [--quick] [--json]

One random layer of Mamba2-130m's shape (d_model 768, 24 heads of 64, a state of 128, one
group, a conv of 4 taps, chunks of 256). Rows, median process-CPU time over alternating rounds:
- forward: the chunked form, no recorder (what a pass costs);
- forward, recorded: the same with q, k, v, decay, skip, heads and out kept (maps=False: no map, as a traced pass);
- A, one head: `Mamba2Mixer.weights_from(q, k, decay, head=0)` from the recorded tensors
  (O(n^2 N) for that head), and its ratio to the forward;
- A, every head.
Then, once: the recurrent form over the same input and its largest gap to the chunked one.
Threads: core.device.configure_threads ($ATTENTION_LAB_THREADS, default 1).
"""

from __future__ import annotations

import argparse
import json
import time

from bench.common import alternate, machine_info, median, paired_ratio


def run(tokens: int, rounds: int) -> dict:
    import torch

    from core.device import configure_threads
    from core.net.mamba2 import Mamba2Mixer, Mamba2Spec
    from core.net.recorder import Recorder

    threads = configure_threads()
    spec = Mamba2Spec(d_model=768, n_heads=24, head_dim=64, d_state=128, n_groups=1, conv_kernel=4, chunk_size=256)
    torch.manual_seed(0)
    mixer = Mamba2Mixer(spec).eval()
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
        mixer.A_log.copy_(torch.linspace(0.0, 2.7, spec.n_heads))  # rates 1..16, as Mamba2 starts them
        mixer.dt_bias.copy_(torch.linspace(-6.0, -2.3, spec.n_heads))  # steps 0.0025..0.1
    x = torch.randn(1, tokens, spec.d_model)
    with torch.inference_mode():
        rec = Recorder(maps=False)
        chunked = mixer(x, rec=rec)
        t = rec.tensors
        fns = {"forward": lambda: mixer(x),
               "forward_recorded": lambda: mixer(x, rec=Recorder(maps=False)),
               "A_one_head": lambda: mixer.weights_from(t["q"], t["k"], t["decay"], head=0),
               "A_every_head": lambda: mixer.weights_from(t["q"], t["k"], t["decay"])}
        timing = alternate(fns, rounds, warmup=1)
        c0 = time.process_time()
        recurrent = mixer(x, cache={})
        recurrent_s = time.process_time() - c0
        A = mixer.weights_from(t["q"], t["k"], t["decay"])
        rebuilt = (A @ t["v"] + t["skip"] - t["heads"]).abs().max().item() / t["heads"].abs().max().item()
    cpu_ms = {k: round(median(v["cpu"]) * 1000, 1) for k, v in timing.items()}
    return {"machine": machine_info(), "threads": threads, "rounds": rounds, "tokens": tokens,
            "cpu_ms": cpu_ms,
            "A_one_head_over_forward": round(paired_ratio(timing["A_one_head"]["cpu"], timing["forward"]["cpu"]), 3),
            "recurrent_cpu_ms": round(recurrent_s * 1000, 1),
            "chunked_vs_recurrent_max_abs": (chunked - recurrent).abs().max().item(),
            "output_max_abs": chunked.abs().max().item(),
            "A_rebuild_rel": rebuilt}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--quick", action="store_true", help="2 rounds instead of 5")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run(args.tokens, 2 if args.quick else 5)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"threads {out['threads']}, {out['rounds']} rounds, {out['tokens']} tokens, "
          f"load {out['machine'].get('load_average')}")
    for k, v in out["cpu_ms"].items():
        print(f"{k:18s} {v:9.1f} ms")
    print(f"A for one head / forward: {out['A_one_head_over_forward']:.3f}x")
    print(f"recurrent form {out['recurrent_cpu_ms']:.1f} ms; chunked vs recurrent max |diff| "
          f"{out['chunked_vs_recurrent_max_abs']:.2e} (outputs up to {out['output_max_abs']:.2f}); "
          f"A @ v + skip vs heads {out['A_rebuild_rel']:.2e} of heads' max")


if __name__ == "__main__":
    main()
