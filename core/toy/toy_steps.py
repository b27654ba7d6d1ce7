"""toy-translate at every stage of its training: the checkpoints saved along the way.

`python -m core.cli.train_toy` keeps the weights after 0, 50, ... 400 updates as float16 files in
assets/toy-translate/steps/ (the final weights stay model.safetensors, float32), every step's
training loss in steps/losses.json, and, for each saved step, the held-out exact match and
the alignment accuracy of every cross-attention head in steps/metrics.json. Load one with
`core.load_model("toy-translate", step=N)`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Optional

from ..loaders.catalog import TOY_DIR
from .. import trace_names as tn

STEPS_DIR = "steps"
LOSSES = "losses.json"
METRICS = "metrics.json"
# The weights saved along the way (float16), besides the final model.safetensors (2500).
# Attention forms in the first 400 updates (loss 5.7 -> 0.1); by then exact match is ~0.9.
# With the float32 final checkpoint they take 23.4 MB (each float16 file is 2.9 MB).
CHECKPOINT_STEPS = (0, 50, 100, 150, 200, 400)
_STEP_FILE = re.compile(r"step-(\d+)\.safetensors")


def step_file(folder: Path, step: int) -> Path:
    return Path(folder) / STEPS_DIR / f"step-{step:05d}.safetensors"


def final_step(folder: Path = TOY_DIR) -> Optional[int]:
    """How many updates the final checkpoint (model.safetensors) had, from its config.json."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
        return int(cfg["extra"]["training"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def available_steps(folder: Path = TOY_DIR) -> List[int]:
    """The training steps that can be loaded: every saved file, and the final step."""
    steps = set()
    d = Path(folder) / STEPS_DIR
    if d.is_dir():
        for p in d.iterdir():
            m = _STEP_FILE.fullmatch(p.name)
            if m:
                steps.add(int(m.group(1)))
    last = final_step(folder)
    if last is not None and (Path(folder) / "model.safetensors").exists():
        steps.add(last)
    return sorted(steps)


def weights_file(folder: Path, step: Optional[int]) -> Path:
    """The checkpoint of `step` (None: the final one); ValueError naming the available steps."""
    folder = Path(folder)
    if step is None:
        return folder / "model.safetensors"
    try:
        n = int(step)
    except (TypeError, ValueError):
        n = -1
    n = n if n >= 0 and str(n) == str(step).strip() else -1
    if n >= 0 and n == final_step(folder):
        return folder / "model.safetensors"
    path = step_file(folder, n) if n >= 0 else None
    if path is None or not path.exists():
        avail = ", ".join(str(s) for s in available_steps(folder)) or "none"
        raise ValueError(f"toy-translate has no checkpoint for training step {step!r}; available steps: {avail}")
    return path


def load_metrics(folder: Path = TOY_DIR) -> Optional[Dict]:
    """steps/metrics.json: {"final_step", "chance_alignment", "steps": [{step, train_loss, exact_match,
    alignment_accuracy, best_unsupervised, per_head, ...}]}; None when missing."""
    path = Path(folder) / STEPS_DIR / METRICS
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_losses(folder: Path = TOY_DIR) -> Optional[Dict]:
    """steps/losses.json: {"steps", "ce": [...], "align": [...]} (one entry per update); None when missing."""
    try:
        return json.loads((Path(folder) / STEPS_DIR / LOSSES).read_text())
    except (OSError, ValueError):
        return None


def chance_alignment(n: int = 1000, seed: int = 12345) -> float:
    """Alignment accuracy of a head whose argmax is a uniformly random source word: the mean,
    over the aligned target words of the held-out set, of 1 / (source length)."""
    from . import toy_task

    total = hits = 0.0
    for s, _, a in toy_task.test_examples(n, seed=seed):
        k = sum(1 for i in a if i >= 0)
        total += k
        hits += k / len(s)
    return hits / total


def best_unsupervised(per_head: Dict[str, Dict[str, float]], guided_layer: int, guided_head: int) -> Dict:
    """The cross-attention head (not the supervised one) with the highest alignment accuracy."""
    best = None
    for layer_name, row in per_head.items():
        layer = tn.layer_of(layer_name)[1]  # "decoder.{i}.cross_attn"
        for key, acc in row.items():
            if not key.startswith("head"):
                continue
            head = int(key[4:])
            if (layer, head) == (guided_layer, guided_head):
                continue
            if best is None or acc > best["accuracy"]:
                best = {"layer": layer, "head": head, "accuracy": acc}
    return best
