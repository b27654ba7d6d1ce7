"""Command line: python -m core models | trace | eval | corpus (the contract of DESIGN.md)."""

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

    model = load_model(args.model, device=args.device)
    result = evaluate(model, n=args.n)
    print(format_table(result), file=sys.stderr)
    print(json.dumps(result))
    return 0


def cmd_corpus(args) -> int:
    from pathlib import Path

    from . import corpus

    path = Path(args.input)
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    sentences = corpus.read_sentences(path.read_text(encoding="utf-8", errors="replace"))
    if not sentences:
        raise InputError(f"{path} holds no sentences (one a line)")
    if args.ray is not None:
        print(f"corpus: {len(sentences)} sentences on Ray ({args.ray or 'a local Ray'})", file=sys.stderr)
        result = corpus.run_ray(args.model, sentences, args.layers, address=args.ray or None,
                                batch_size=args.batch_size)
    else:
        model = load_model(args.model, device=args.device)
        print(f"corpus: {len(sentences)} sentences, {model.name} on {model.device}", file=sys.stderr)
        result = corpus.run(model, sentences, args.layers, batch_size=args.batch_size, progress=corpus.ProgressBar())
    corpus.write_parquet(result.table, args.out)
    for sid, why in result.skipped[:10]:
        print(f"skipped sentence {sid}: {why}", file=sys.stderr)
    if len(result.skipped) > 10:
        print(f"... and {len(result.skipped) - 10} more skipped", file=sys.stderr)
    print(f"{args.out}: {result.table.num_rows} rows ({len(sentences) - len(result.skipped)} sentences) "
          f"in {result.seconds:.1f} s")
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
    e.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    c = sub.add_parser("corpus", help="every token's per-head q and k over a corpus, to Parquet")
    c.add_argument("--model", default="toy-translate")
    c.add_argument("--input", required=True, help="a text file, one sentence a line")
    c.add_argument("--layers", default=None, help="comma-separated layers, e.g. 0,3 (default: all)")
    c.add_argument("--out", default="vectors.parquet")
    c.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass")
    c.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    c.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray Data: a cluster's address, or none for a local Ray")
    args = ap.parse_args(argv)
    try:
        return {"models": cmd_models, "trace": cmd_trace, "eval": cmd_eval, "corpus": cmd_corpus}[args.cmd](args)
    except (InputError, ModelUnavailable, KeyError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
