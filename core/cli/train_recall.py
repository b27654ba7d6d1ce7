"""Train the recall models: one two-layer decoder, three token mixers, on multi-query
associative recall (core/toy/recall_task.py), and write them to assets/recall/<mixer>/.

    python -m core.cli.train_recall                    # the shipped recipe (fixed seed, one thread)
    python -m core.cli.train_recall --mixers softmax --steps 300 --out /tmp/recall   # a quick run

Each model: d = 64, two layers of the same mixer, each followed by a SwiGLU FFN, pre-norm
RMSNorm. Only the token mixer changes:
    softmax      causal softmax attention, 2 heads of 32, RoPE
    gated_delta  Gated DeltaNet (2 heads, d_k 8, d_v 32; no positions: its convolution and decay
                 order tokens): a state of 2 x 8 x 32 = 512 numbers a layer
    mamba2       Mamba2 (2 heads of 32, a state of 2 per channel; likewise): 2 x 32 x 2 = 128
A mixer keeps its state whatever the length, so as the pairs grow each must share it among more
of them; softmax attention keeps every key. Mamba2's state is sized to fade within the task: with
8 per channel (Gated DeltaNet's 512 numbers) the same recipe held 99.97% of 24 pairs.
Training draws sequences of 1 to MAX_PAIRS (24) pairs (seed 0) and scores only the query
positions; the held-out curve (seed 1) is each model's recall accuracy at PAIR_COUNTS pairs,
written to metrics.json beside the weights, and reproduced from the shipped weights by
tests/parity/test_recall_models.py. Steps: STEPS (the mixers take four times softmax's).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Dict, Sequence

import torch
import torch.nn.functional as F

from ..net.config import ModelConfig
from ..net.model import Transformer
from ..toy import recall_task

MIXERS = ("softmax", "gated_delta", "mamba2")
# the shipped recipe's steps: softmax attention has the task at a quarter of the mixers' steps
STEPS = {"softmax": 2000, "gated_delta": 8000, "mamba2": 8000}


def make_config(mixer: str) -> ModelConfig:
    """The two-layer decoder with `mixer` as both layers' token mixer."""
    base = dict(d_model=64, n_heads=2, d_ff=128, n_layers=2, kind="decoder", norm="rmsnorm",
                norm_placement="pre", activation="swiglu", bias=False,
                tgt_vocab_size=len(recall_task.vocab()), max_len=4 * recall_task.MAX_PAIRS, pad_id=0)
    if mixer == "softmax":
        return ModelConfig(positional="rope", **base)
    # fixed states: Gated DeltaNet 2 heads x d_k 8 x d_v 32, Mamba2 2 heads x 32 channels x d_state 2
    linear = dict(positional="none", layer_types=["linear_attention"] * 2, **base)
    if mixer == "gated_delta":
        return ModelConfig(mixer={"kind": "gated_delta", "heads": 2, "k_heads": 2, "d_k": 8, "d_v": 32, "conv": 4,
                                  "chunk": 16}, **linear)
    if mixer == "mamba2":
        return ModelConfig(mixer={"kind": "mamba2", "heads": 2, "head_dim": 32, "d_state": 2, "groups": 1, "conv": 4,
                                  "chunk": 16}, **linear)
    raise ValueError(f"unknown mixer {mixer!r}: one of {MIXERS}")


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train_one(mixer: str, steps: int, batch: int, seed: int, lr: float = 3e-3, log_every: int = 200) -> tuple:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    cfg = make_config(mixer)
    net = Transformer(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.1)
    t0 = time.time()
    for step in range(steps):
        n_pairs = rng.randint(1, recall_task.MAX_PAIRS)
        ids, tgt = recall_task.batch(n_pairs, batch, rng)
        logits = net(None, ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"{mixer}: step {step:5d}/{steps}  loss {loss.item():.4f}  {time.time() - t0:5.0f}s", flush=True)
    net.eval()
    return net, cfg, time.time() - t0


def logits_fn(net):
    return lambda ids: net(None, ids)


def save(net, cfg: ModelConfig, out: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
    (out / "metrics.json").write_text(json.dumps(meta, indent=1) + "\n")


def main(argv: Sequence[str] = None) -> Dict[str, dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixers", default=",".join(MIXERS))
    ap.add_argument("--steps", type=int, default=None, help=f"steps for every mixer (default: {STEPS})")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(recall_task.RECALL_DIR))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    done = {}
    for mixer in args.mixers.split(","):
        steps = args.steps or STEPS[mixer]
        net, cfg, seconds = train_one(mixer, steps, args.batch, args.seed, lr=args.lr)
        curve = recall_task.curve(logits_fn(net))
        meta = {"mixer": mixer, "seed": args.seed, "steps": steps, "batch": args.batch, "lr": args.lr,
                "train_seconds": round(seconds), "accuracy": {str(k): v for k, v in curve.items()}}
        save(net, cfg, Path(args.out) / mixer, meta)
        print(f"{mixer}: recall accuracy by pairs {curve}", flush=True)
        done[mixer] = meta
    return done


if __name__ == "__main__":
    main()
