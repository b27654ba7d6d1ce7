"""Command line: python -m core models | trace | eval | corpus | faithfulness (the contract of docs/design.md).

`python -m core` (core/__main__.py) runs `main`; the installed `attention-lab` command
(core/cli/attention_lab.py) is this parser plus `run`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import InputError
from ..registry import MODELS, ModelUnavailable, load_model


def cmd_models(args) -> int:
    for spec in MODELS.values():
        note = "" if spec.available() else f"  [not installed: {spec.install_hint()}]"
        print(f"{spec.name}\t{spec.kind}\t{spec.description}{note}")
    roots = os.environ.get("ATTENTION_LAB_MODELS", "")
    if roots:
        from ..loaders.local_models import discover

        for m in discover(roots, taken=list(MODELS)).values():
            note = f"  [{m.problem}]" if m.problem else ""
            print(f"{m.name}\t{m.kind}\t{m.family}, {m.size} parameters, {m.path}{note}")
    return 0


FORMATS = ("npz", "csv", "parquet")


def trace_format(fmt, out) -> str:
    """--format, or the --out file's suffix when it names a format, or npz."""
    if fmt:
        return fmt
    suffix = str(out or "").rsplit(".", 1)[-1].lower()
    return suffix if suffix in FORMATS else "npz"


def cmd_trace(args) -> int:
    fmt = trace_format(args.format, args.out)
    out = args.out or f"run.{fmt}"
    model = load_model(args.model, device=args.device)
    trace = model.trace(args.text, target=args.target)
    meta = trace.meta
    if fmt == "npz":
        if args.names:
            raise ValueError("--names chooses the attention maps of a csv or parquet table; npz holds every name")
        trace.save(out)
        print(f"{out}: {len(trace)} tensors ({trace.nbytes() / 1e6:.2f} MB), model {model.name} on {meta['device_name']}")
    else:
        from ..frames import attention_names, frames, select_names

        names = select_names(trace, args.names) if args.names else attention_names(trace, "weights")
        table = frames(trace, names)
        if fmt == "csv":
            table.to_csv(out, index=False)
        else:
            table.to_parquet(out, index=False)
        print(f"{out}: {len(table)} rows from {len(names)} attention maps, model {model.name} on {meta['device_name']}")
    print("source tokens:", " ".join(trace.tokens("source")))
    if trace.tokens("target"):
        print("target tokens:", " ".join(trace.tokens("target")))
    if meta.get("unknown"):
        print("unknown words (became <unk>):", ", ".join(meta["unknown"]), file=sys.stderr)
    if meta.get("truncated"):
        print(f"warning: input truncated by {meta['truncated']} tokens to {meta['max_input_tokens']}", file=sys.stderr)
    return 0


def cmd_eval(args) -> int:
    from ..toy.evaluate import evaluate, format_table

    model = load_model(args.model, device=args.device, step=args.step)
    result = evaluate(model, n=args.n)
    if args.step is not None:
        result["step"] = model.info.get("step")
    print(format_table(result), file=sys.stderr)
    print(json.dumps(result))
    return 0


def cmd_corpus(args) -> int:
    from pathlib import Path

    from . import corpus_job

    path = Path(args.input)
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    sentences = corpus_job.read_sentences(path.read_text(encoding="utf-8", errors="replace"))
    if not sentences:
        raise InputError(f"{path} holds no sentences (one a line)")
    if args.ray is not None:
        print(f"corpus: {len(sentences)} sentences on Ray ({args.ray or 'a local Ray'})", file=sys.stderr)
        result = corpus_job.run_ray(args.model, sentences, args.layers, address=args.ray or None,
                                batch_size=args.batch_size)
    else:
        model = load_model(args.model, device=args.device)
        print(f"corpus: {len(sentences)} sentences, {model.name} on {model.device}", file=sys.stderr)
        result = corpus_job.run(model, sentences, args.layers, batch_size=args.batch_size,
                                progress=corpus_job.ProgressBar())
    corpus_job.write_parquet(result.table, args.out)
    for sid, why in result.skipped[:10]:
        print(f"skipped sentence {sid}: {why}", file=sys.stderr)
    if len(result.skipped) > 10:
        print(f"... and {len(result.skipped) - 10} more skipped", file=sys.stderr)
    print(f"{args.out}: {result.table.num_rows} rows ({len(sentences) - len(result.skipped)} sentences) "
          f"in {result.seconds:.1f} s")
    return 0


def cmd_faithfulness(args) -> int:
    from . import faithfulness_job

    return faithfulness_job.main(args)


COMMANDS = {"models": cmd_models, "trace": cmd_trace, "eval": cmd_eval, "corpus": cmd_corpus,
            "faithfulness": cmd_faithfulness}


def build_parser(prog: str = "python -m core"):
    """The parser and its subcommand group (core/cli/attention_lab.py adds `run` to it)."""
    ap = argparse.ArgumentParser(prog=prog, description="Attention Lab: see how attention works. "
                                 "The transformer core's commands: models, traces, evaluation.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    what = "list the models: name, kind, description (and how to install a missing one)"
    sub.add_parser("models", help=what, description=what)
    what = ("run a model on a sentence and save it: every intermediate to .npz, or the attention "
            "maps as one long table (layer, head, query, key, value) to .csv or .parquet")
    t = sub.add_parser("trace", help=what, description=what)
    t.add_argument("--model", default="toy-translate")
    t.add_argument("--text", required=True)
    t.add_argument("--target", default=None, help="teacher-forced target (decoders); default: greedy")
    t.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    t.add_argument("--format", default=None, choices=FORMATS,
                   help="npz: every trace name; csv / parquet: the attention maps as a long table "
                        "(default: from --out's suffix, else npz)")
    t.add_argument("--names", nargs="+", default=None, metavar="NAME",
                   help="csv / parquet: the attention names to write, wildcards allowed, e.g. "
                        "'decoder.*.cross_attn.weights' encoder.0.self_attn.scores (default: every .weights)")
    t.add_argument("--out", default=None, help="output file (default: run.FORMAT)")
    what = "held-out exact match and alignment accuracy (toy-translate), as one JSON line"
    e = sub.add_parser("eval", help=what, description=what)
    e.add_argument("--model", default="toy-translate")
    e.add_argument("--n", type=int, default=None)
    e.add_argument("--step", type=int, default=None,
                   help="toy-translate after this many training updates (a saved step; default: the final weights)")
    e.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    what = "every token's per-head query and key over a corpus of sentences, to Parquet"
    c = sub.add_parser("corpus", help=what, description=what)
    c.add_argument("--model", default="toy-translate")
    c.add_argument("--input", required=True, help="a text file, one sentence a line")
    c.add_argument("--layers", default=None, help="comma-separated layers, e.g. 0,3 (default: all)")
    c.add_argument("--out", default="vectors.parquet")
    c.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass")
    c.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    c.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray Data: a cluster's address, or none for a local Ray")
    what = ("which explanation is faithful over a corpus: comprehensiveness and sufficiency of every "
            "attribution method (mean and spread per method), to CSV")
    f = sub.add_parser("faithfulness", help=what, description=what)
    f.add_argument("--model", default="smollm2")
    f.add_argument("--input", required=True, help="a text file, one sentence a line")
    f.add_argument("--out", default="faithfulness.csv")
    f.add_argument("--per-sentence", default=None, metavar="CSV", help="also write one row per sentence and method")
    f.add_argument("--methods", default=None, help="comma-separated methods (default: all)")
    f.add_argument("--fractions", default=None, help="comma-separated fractions (default: 0.1,0.2,0.3,0.4,0.5)")
    f.add_argument("--steps", type=int, default=64, help="integrated gradients' steps")
    f.add_argument("--device", default=None, choices=["cpu", "cuda", "mps"])
    f.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray Data: a cluster's address, or none for a local Ray")
    return ap, sub


def main(argv=None, prog: str = "python -m core", extend=None) -> int:
    """Parse and run one command. `extend(sub)` may add subcommands; it returns their handlers."""
    ap, sub = build_parser(prog)
    handlers = dict(COMMANDS)
    if extend is not None:
        handlers.update(extend(sub))
    args = ap.parse_args(argv)
    try:
        return handlers[args.cmd](args)
    except (InputError, ModelUnavailable, KeyError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
