"""Reading Hugging Face checkpoint folders: config.json and *.safetensors, never pickle.

Small helpers shared by the loaders of every family (core/loaders/hf.py, core/loaders/hf_seq2seq.py):

    read_config(folder)                     -> dict from config.json (clear error if absent/bad)
    safetensors_files(folder)               -> the weight files (sharded: from the index)
    open_checkpoint(folder)                 -> Checkpoint: lazy, memory-mapped tensors by name
    check_tensors(ckpt, needed, optional)   -> raise CheckpointError naming missing / unused ones
    check_shape(name, tensor, shape)        -> raise CheckpointError naming a mismatched tensor
    CheckpointError                         -> the one error type, with a message a user can act on

A folder with only pytorch_model.bin (or *.pt / *.ckpt) gets a CheckpointError telling the
user to convert it to safetensors: pickle is never loaded here.

Memory: each file is memory-mapped; `Checkpoint.get(name, dtype)` converts one tensor
straight from the mapped bytes (bfloat16/float16 -> float32 by default) and then releases
the pages it read from the process (madvise DONTNEED: they stay in the page cache, not in the
process's resident memory), so the peak is the float32 model plus one tensor in the stored
dtype, not the stored model and its float32 copy at once.
"""

from __future__ import annotations

import json
import mmap
import struct
import warnings
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import torch

PICKLE_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX_NAME = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as it is; the message says what is wrong and how to fix it."""


def read_config(folder) -> dict:
    """config.json of a checkpoint folder as a dict (CheckpointError if missing or not JSON)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{Path(folder).name}: no config.json in the folder, so the model family is unknown")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{Path(folder).name}: config.json is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{Path(folder).name}: config.json does not hold an object")
    return cfg


def convert_hint(folder, auto_class: str = "AutoModel") -> str:
    """The message for a folder whose weights are only in a pickle-based format; auto_class is
    the transformers class that reads the whole model (heads included) for the conversion."""
    return (
        f"{Path(folder).name}: the weights are only in pytorch_model.bin (a pickle file, which this app never "
        "loads because unpickling can run code). Convert it to safetensors once, where you trust the file, e.g. "
        f"in Python with transformers: {auto_class}.from_pretrained(folder).save_pretrained(folder, "
        "safe_serialization=True)"
    )


def safetensors_files(folder, auto_class: str = "AutoModel") -> List[Path]:
    """The *.safetensors files of a folder: those named by model.safetensors.index.json when it
    exists (sharded checkpoints), else every *.safetensors file. CheckpointError when there are
    none (with the convert message if pickle weights are there instead)."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{folder.name}: {INDEX_NAME} is not a valid index ({exc})") from None
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if Path(n).name != n or not n.endswith(".safetensors")]
        if bad:
            raise CheckpointError(f"{folder.name}: {INDEX_NAME} names files outside the folder: {bad[:3]}")
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(f"{folder.name}: shards named in {INDEX_NAME} are missing: {', '.join(missing)}")
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if any((folder / n).exists() for n in PICKLE_NAMES) or any(
        p.suffix in PICKLE_SUFFIXES for p in folder.iterdir() if p.is_file()
    ):
        raise CheckpointError(convert_hint(folder, auto_class))
    raise CheckpointError(f"{folder.name}: no *.safetensors weights in the folder")


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class _Mapped:
    """One safetensors file mapped read-only: a tensor is converted from the mapped bytes and
    the pages it touched are then dropped from the process (they stay in the page cache)."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack("<Q", self.mm[:8])
        self.header = json.loads(bytes(self.mm[8:8 + n]))
        self.base = 8 + n

    def tensor(self, name: str, dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
        """The tensor converted to `dtype` (None: a copy as stored); None where this reader does
        not know its dtype (the caller then uses safetensors' own)."""
        info = self.header.get(name)
        stored = _DTYPES.get(info.get("dtype")) if info else None
        if stored is None:
            return None
        begin, end = (self.base + o for o in info["data_offsets"])
        if end == begin:
            return torch.empty(info["shape"], dtype=dtype or stored)
        with memoryview(self.mm)[begin:end] as view, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the mapping is read-only; it is copied before anyone writes
            raw = torch.frombuffer(view, dtype=stored).reshape(info["shape"])
            out = raw.to(dtype) if dtype is not None and dtype != stored else raw.clone()
            del raw
        if hasattr(self.mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            start = begin - begin % mmap.PAGESIZE
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        return out


class Checkpoint:
    """The tensors of one checkpoint folder, by name, read lazily from memory-mapped files.

    `names()` lists every stored tensor; `get(name, dtype=torch.float32)` reads one and
    converts it; `used` records the names read (for check_tensors' list of unused ones).
    """

    def __init__(self, files: Sequence[Path]):
        from safetensors import safe_open

        self.files = list(files)
        self._handles = []
        self._maps: Dict[int, _Mapped] = {}
        self._where: Dict[str, int] = {}
        for path in self.files:
            try:
                h = safe_open(str(path), framework="pt", device="cpu")
            except Exception as exc:  # header damaged, truncated file, not safetensors
                raise CheckpointError(f"{path.name}: cannot be read as safetensors ({exc})") from None
            self._handles.append(h)
            for name in h.keys():
                self._where.setdefault(name, len(self._handles) - 1)
        self.used: set = set()

    def names(self) -> List[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def dtypes(self) -> Dict[str, int]:
        """Count of stored tensors per dtype name ("BF16": 120, ...)."""
        out: Dict[str, int] = {}
        for name, i in self._where.items():
            dt = self._handles[i].get_slice(name).get_dtype()
            out[dt] = out.get(dt, 0) + 1
        return out

    def shape(self, name: str) -> List[int]:
        if name not in self._where:
            raise CheckpointError(f"the checkpoint lacks the tensor {name!r}")
        return list(self._handles[self._where[name]].get_slice(name).get_shape())

    def get(self, name: str, dtype: Optional[torch.dtype] = torch.float32) -> torch.Tensor:
        """One tensor, converted to `dtype` (None: as stored). CheckpointError if absent."""
        if name not in self._where:
            raise CheckpointError(f"the checkpoint lacks the tensor {name!r}")
        i = self._where[name]
        try:
            if i not in self._maps:
                self._maps[i] = _Mapped(self.files[i])
            t = self._maps[i].tensor(name, dtype)
            if t is None:  # a dtype the mapped reader does not know: safetensors' own reader
                t = self._handles[i].get_tensor(name)
        except Exception as exc:
            raise CheckpointError(f"the tensor {name!r} cannot be read ({exc})") from None
        self.used.add(name)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)  # the stored-dtype copy is freed when this returns
        return t

    def n_parameters(self) -> int:
        n = 0
        for name in self._where:
            shape = self.shape(name)
            k = 1
            for s in shape:
                k *= s
            n += k
        return n


def open_checkpoint(folder, auto_class: str = "AutoModel") -> Checkpoint:
    """A Checkpoint over the folder's safetensors files (see safetensors_files)."""
    return Checkpoint(safetensors_files(folder, auto_class))


def check_tensors(ckpt: Checkpoint, needed: Iterable[str], optional: Iterable[str] = (), ignore=None, where: str = "") -> None:
    """Raise CheckpointError if a needed tensor is absent, or a stored tensor is neither needed,
    optional nor matched by `ignore` (a compiled regex): a checkpoint never loads with a
    silently random or silently dropped layer. The message names the tensors."""
    needed = list(needed)
    known = set(needed) | set(optional)
    missing = [n for n in needed if n not in ckpt]
    extra = [n for n in ckpt.names() if n not in known and not (ignore is not None and ignore.match(n))]
    prefix = f"{where}: " if where else ""
    if missing:
        raise CheckpointError(f"{prefix}the checkpoint lacks {len(missing)} tensor(s): {_names(missing)}")
    if extra:
        raise CheckpointError(f"{prefix}the checkpoint holds tensor(s) this architecture does not use: {_names(extra)}")


def check_shape(name: str, tensor: torch.Tensor, shape: Sequence[int]) -> None:
    """Raise CheckpointError if `tensor` (stored as `name`) does not have `shape`."""
    if list(tensor.shape) != list(shape):
        raise CheckpointError(
            f"the tensor {name!r} has shape {list(tensor.shape)} but config.json implies {list(shape)}"
        )


def _names(names: List[str], k: int = 6) -> str:
    return ", ".join(names[:k]) + (f" ... ({len(names) - k} more)" if len(names) > k else "")
