"""Held-out evaluation of toy-translate: greedy exact match and cross-attention alignment.

Alignment accuracy: run the decoder on the reference target (teacher forcing); decoder
position j predicts target word j+1, whose source word is known. A head scores a hit when
the argmax of its cross-attention row j is that source word. Every (layer, head) is
scored, and so are the per-layer head averages; the headline figure is the head trained
with guided alignment (config.extra.guided_alignment), named in the output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import torch

from ..loaders.catalog import TOY_DIR
from .. import trace_names as tn
from ..net.recorder import Recorder
from . import toy_task
from .toy_steps import (
    METRICS,
    STEPS_DIR,
    available_steps,
    best_unsupervised,
    chance_alignment,
    final_step,
    load_losses,
    weights_file,
)
from .toy_task import encode_batch


@torch.inference_mode()
def evaluate_toy(model, n: int = 1000, batch: int = 200, seed: int = 12345) -> Dict:
    triples = toy_task.test_examples(n, seed=seed)
    src_index = model.tokenizer.index
    tgt_index = model.target_tokenizer.index
    cfg = model.config
    exact = 0
    n_layers = cfg.n_decoder_layers
    names = [tn.cross_attn("decoder", i, "weights") for i in range(n_layers)]
    hits = torch.zeros(n_layers + 1, cfg.n_heads + 1)  # last column: head average; last row unused
    known_total = 0
    for i in range(0, len(triples), batch):
        chunk = triples[i : i + batch]
        outs = model.greedy_batch([" ".join(s) for s, _, _ in chunk])
        exact += sum(o == y for o, (_, y, _) in zip(outs, chunk))
        src, dec_in, _, align = encode_batch(chunk, src_index, tgt_index, model.device)
        rec = Recorder(names=names, whole_batch=True)
        model.net(src, dec_in, src_pad=src == cfg.pad_id, rec=rec)
        known = align >= 0  # (B, t)
        known_total += int(known.sum())
        for li, name in enumerate(names):
            w = rec.tensors[name]  # (B, H, t, n)
            per_head = (w.argmax(-1) == align[:, None]) & known[:, None]  # (B, H, t)
            hits[li, : cfg.n_heads] += per_head.sum((0, 2)).float().cpu()
            avg_hit = (w.mean(1).argmax(-1) == align) & known
            hits[li, cfg.n_heads] += float(avg_hit.sum())
    acc = hits / max(known_total, 1)
    guided = cfg.extra.get("guided_alignment") or {}
    if guided:
        layer = tn.parse(guided["name"]).layer
        head = int(guided["head"])
        scored = f"decoder.{layer}.cross_attn head {head} (trained with guided alignment)"
    else:
        layer, head = n_layers - 1, cfg.n_heads
        scored = f"decoder.{layer}.cross_attn, average over heads"
    per_head = {
        f"decoder.{li}.cross_attn": {
            **{f"head{h}": round(float(acc[li, h]), 4) for h in range(cfg.n_heads)},
            "mean_of_heads": round(float(acc[li, cfg.n_heads]), 4),
        }
        for li in range(n_layers)
    }
    unsupervised = [float(acc[li, h]) for li in range(n_layers) for h in range(cfg.n_heads) if (li, h) != (layer, head)]
    return {
        "exact_match": round(exact / len(triples), 4),
        "alignment_accuracy": round(float(acc[layer, head]), 4),
        "n": len(triples),
        "alignment_scored": scored,
        "best_unsupervised_head": round(max(unsupervised), 4) if unsupervised else None,
        "per_head": per_head,
        "aligned_target_words": known_total,
    }


def format_table(result: Dict) -> str:
    lines = ["cross-attention alignment accuracy (argmax on the known source word):"]
    for layer, row in result["per_head"].items():
        cells = "  ".join(f"{k} {v:.3f}" for k, v in row.items())
        lines.append(f"  {layer}: {cells}")
    return "\n".join(lines)


def evaluate(model, n: Optional[int] = None) -> Dict:
    if model.name != "toy-translate" and model.config.extra.get("task") != "toy":
        raise ValueError(f"eval is defined for toy-translate (a task with known answers), not {model.name}")
    return evaluate_toy(model, n=n or 1000)


def evaluate_steps(folder: Path = TOY_DIR, n: int = 1000, log=print, results: Optional[Dict[int, Dict]] = None,
                   note: Optional[str] = None) -> Dict:
    """Evaluate every saved step (as it loads: float16 files in float32) and write steps/metrics.json.
    `results`: core.toy.evaluate.evaluate_toy(model, n) of some steps, already computed; `note`: where
    the checkpoints come from, when that needs saying (kept in the file, shown by the app)."""
    from .toy_model import load_toy

    folder = Path(folder)
    losses = load_losses(folder) or {}
    ce, al = losses.get("ce") or [], losses.get("align") or []
    cfg = json.loads((folder / "config.json").read_text())
    guided = cfg["extra"]["guided_alignment"]
    g_layer, g_head = tn.parse(guided["name"]).layer, int(guided["head"])
    align_weight = float(cfg["extra"].get("training", {}).get("align_weight", 0.5))
    rows = []
    for step in available_steps(folder):
        res = (results or {}).get(step) or evaluate_toy(load_toy(device="cpu", folder=folder, step=step), n=n)
        i = min(step, len(ce) - 1)  # the final weights had no batch of their own: the last one's loss
        row = {"step": step, "file": str(weights_file(folder, step).relative_to(folder)),
               "dtype": "float32" if step == final_step(folder) else "float16"}
        if 0 <= i < len(ce):
            row.update(loss_step=i, train_loss=round(ce[i] + align_weight * al[i], 6), train_ce=ce[i],
                       train_align=al[i])
        row.update(exact_match=res["exact_match"], alignment_accuracy=res["alignment_accuracy"],
                   best_unsupervised=best_unsupervised(res["per_head"], g_layer, g_head), per_head=res["per_head"])
        rows.append(row)
        log(f"step {step:5d}: loss {row.get('train_loss', float('nan')):.4f}  exact match {row['exact_match']:.3f}  "
            f"alignment {row['alignment_accuracy']:.3f}  best unsupervised {row['best_unsupervised']['accuracy']:.3f}")
    out = {"final_step": final_step(folder), "n_heldout": n, "guided": {"layer": g_layer, "head": g_head},
           "align_weight": align_weight, **({"note": note} if note else {}),
           "chance_alignment": round(chance_alignment(n), 4), "steps": rows}
    path = folder / STEPS_DIR / METRICS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out
