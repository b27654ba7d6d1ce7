"""The models on disk the app offers: every checkpoint folder or .gguf file one level inside
the folders of $ATTENTION_LAB_MODELS, described from headers alone (nothing is loaded).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from . import families
from .checkpoint import CheckpointError, open_checkpoint, read_config
from .hf import SEQ2SEQ, human_size, supported_families, unsupported


@dataclass
class LocalModel:
    name: str  # folder or file name, as the picker shows it
    path: Path
    family: str  # model_type / GGUF architecture ("?" when unreadable)
    size: str  # parameter count ("124M") or file size ("12 MB")
    problem: Optional[str] = None  # why it will not load, when that is known without loading

    @property
    def kind(self) -> str:
        """encoder / decoder / encoder-decoder by family ("?" when unknown)."""
        if self.family in ("bert", "roberta", "distilbert"):
            return "encoder"
        if self.family in ("gpt2", "llama", "mistral", "qwen2", "gpt_neox", "phi3", "qwen3", "olmo2",
                           "gemma3"):  # gemma3: a GGUF architecture
            return "decoder"
        if self.family in families.MODULES:  # a family module's KIND (default: decoder)
            return getattr(families.module(self.family), "KIND", "decoder")
        return "encoder-decoder" if self.family in SEQ2SEQ else "?"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.family}, {self.size})"


def describe(path: Path) -> Optional[LocalModel]:
    """A LocalModel for a folder or a .gguf file, reading only headers; None if it is neither."""
    path = Path(path)
    try:
        if path.is_file() and path.suffix.lower() == ".gguf":
            from .gguf_file import describe_gguf

            family, n = describe_gguf(path)
            return LocalModel(path.name, path, family, human_size(n))
        if not path.is_dir() or not (path / "config.json").is_file():
            return None
    except OSError:
        return None
    try:
        family = str(read_config(path).get("model_type", "?"))
    except CheckpointError as exc:
        return LocalModel(path.name, path, "?", "?", str(exc))
    problem = None if family in supported_families() else str(unsupported(family))
    try:
        n = open_checkpoint(path).n_parameters()
        return LocalModel(path.name, path, family, human_size(n), problem)
    except CheckpointError as exc:
        return LocalModel(path.name, path, family, "?", problem or str(exc))


def discover(roots: str, taken=()) -> Dict[str, LocalModel]:
    """Every model folder or .gguf file one level inside the folders of `roots` (separated by
    os.pathsep, like PATH), by name; a name already taken (registry or an earlier folder)
    gets a suffix "-2", "-3", .... Hidden entries are skipped."""
    out: Dict[str, LocalModel] = {}
    used = set(taken)
    for root in [r for r in (roots or "").split(os.pathsep) if r.strip()]:
        root_path = Path(root).expanduser()
        try:
            entries = sorted(root_path.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            found = describe(entry)
            if found is None:
                continue
            name, k = found.name, 2
            while name in used:
                name, k = f"{found.name}-{k}", k + 1
            found.name = name
            used.add(name)
            out[name] = found
    return out
