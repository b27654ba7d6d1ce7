"""Command line: python -m core models | trace | eval (the contract of DESIGN.md)."""

from __future__ import annotations

import argparse
import json
import sys

from .api import InputError
from .registry import MODELS, ModelUnavailable, load_model


def cmd_models(args) -> int:
    for spec in MODELS.values():
        note = "" if spec.available() else f"  [not installed: {spec.install_hint()}]"
        print(f"{spec.name}\t{spec.kind}\t{spec.description}{note}")
    return 0


def cmd_trace(args) -> int:
    model = load_model(args.model, device=args.device)
    trace = model.trace(args.text, target=args.target)
    trace.save(args.out)
    meta = trace.meta
    print(f"{args.out}: {len(trace)} tensors ({trace.nbytes() / 1e6:.2f} MB), model {model.name} on {meta['device_name']}")
    print("source tokens:", " ".join(trace.tokens("source")))
    if trace.tokens("target"):
        print("target tokens:", " ".join(trace.tokens("target")))
    if meta.get("unknown"):
        print("unknown words (became <unk>):", ", ".join(meta["unknown"]), file=sys.stderr)
    if meta.get("truncated"):
        print(f"warning: input truncated by {meta['truncated']} tokens to {meta['max_input_tokens']}", file=sys.stderr)
    return 0


def cmd_eval(args) -> int:
    from .evaluate import evaluate, format_table

    model = load_model(args.model, device=args.device, step=args.step)
    result = evaluate(model, n=args.n)
    if args.step is not None:
        result["step"] = model.info.get("step")
    print(format_table(result), file=sys.stderr)
    print(json.dumps(result))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core", description="Attention Lab's transformer core")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("models", help="list the models: name, kind, description")
    t = sub.add_parser("trace", help="run a model on a sentence and save every intermediate to .npz")
    t.add_argument("--model", default="toy-translate")
    t.add_argument("--text", required=True)
    t.add_argument("--target", default=None, help="teacher-forced target (decoders); default: greedy")
    t.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    t.add_argument("--out", default="run.npz")
    e = sub.add_parser("eval", help="held-out exact match and alignment accuracy (toy-translate)")
    e.add_argument("--model", default="toy-translate")
    e.add_argument("--n", type=int, default=None)
    e.add_argument("--step", type=int, default=None,
                   help="toy-translate after this many training updates (a saved step; default: the final weights)")
    e.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    args = ap.parse_args(argv)
    try:
        return {"models": cmd_models, "trace": cmd_trace, "eval": cmd_eval}[args.cmd](args)
    except (InputError, ModelUnavailable, KeyError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
