"""Hugging Face checkpoint folders (config.json + *.safetensors + tokenizer.json) in our core.

    model = core.load_model("/path/to/my-bert")           # a folder
    model = core.load_model("/path/to/model.gguf")        # llama / qwen2 / qwen3 / phi3 GGUF (core/loaders/gguf_file.py)
                                                          # gemma / gemma2 / gemma3 GGUF (core/loaders/gguf_gemma.py)
                                                          # gpt-oss GGUF (core/loaders/gguf_gpt_oss.py)

load_path sends a .gguf file to core/loaders/gguf_file.py and a folder to load_folder, which reads
config.json's model_type: bert, roberta, distilbert, gpt2, llama, mistral and qwen2 here, and
the families of core/loaders/families (qwen3, olmo2, gpt_neox, phi3);
marian, bart and t5 in core/loaders/hf_seq2seq.py (loaded from here when that module is present).
Anything else gets a CheckpointError naming the supported families. The pieces:

    core/loaders/families/         one module per family: config.json -> ModelConfig, weight table
    core/loaders/hf_config.py      config reading the families share (activations, RoPE, Llama's config)
    core/loaders/hf_weights.py     build_net: the network filled from the checkpoint by a family's table
    core/loaders/masked_lm.py      an encoder's masked-LM head; HFModel.fill_mask
    core/loaders/hf_tokenizer.py   tokenizer.json as our tokenizer
    core/loaders/local_models.py   the folders and .gguf files the app lists
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from ..api import AttentionModel
from . import families
from .checkpoint import CheckpointError, open_checkpoint, read_config
from ..device import pick_device
from .hf_tokenizer import HFTokenizer
from .hf_weights import Progress, build_net
from .masked_lm import EXAMPLES, HFModel, human_size, local_model  # noqa: F401 (re-exported)

FAMILIES = tuple(dict.fromkeys(("bert", "roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2")
                               + families.model_types()))  # every one read by a module of core/loaders/families
SEQ2SEQ = ("marian", "bart", "t5")
SUPPORTED = FAMILIES + SEQ2SEQ


def supported_families() -> tuple:
    """The families a folder may hold: the encoders and decoders read here, and the
    encoder-decoders (marian, bart, t5) that core/loaders/hf_seq2seq.py reads."""
    return SUPPORTED


def unsupported(family: str) -> CheckpointError:
    return CheckpointError(
        f"model_type {family!r} is not supported; supported families: {', '.join(supported_families())} "
        "(folders with config.json and *.safetensors) and GGUF files of the llama, qwen2, qwen3, phi3 and smollm3 architectures"
    )


def _ids_from(hf: dict, key: str) -> Optional[int]:
    v = hf.get(key)
    if isinstance(v, list):
        v = v[0] if v else None
    return int(v) if v is not None else None


def load_folder(folder, device=None, name: Optional[str] = None, progress: Progress = None) -> AttentionModel:
    """A Hugging Face checkpoint folder as an AttentionModel (see the module docstring)."""
    folder = Path(folder)
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    say("reading config.json")
    hf = read_config(folder)
    family = hf.get("model_type")
    if family in SEQ2SEQ:
        from .hf_seq2seq import load as load_seq2seq

        return load_seq2seq(folder, pick_device(device))
    if family not in FAMILIES:
        raise unsupported(family)
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder.name}: no tokenizer.json in the folder (it is needed to turn text into tokens)")
    ckpt = open_checkpoint(folder)
    say(f"reading {len(ckpt.names())} tensors ({', '.join(ckpt.dtypes())} -> float32)")
    try:
        net, head = build_net(family, hf, ckpt, progress)
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}, which a {family} model needs") from None
    say("reading tokenizer.json")
    cfg = net.cfg
    tok = HFTokenizer(folder / "tokenizer.json", max_len=cfg.max_len)
    n = sum(p.numel() for p in net.parameters())
    start = end = None
    if cfg.kind == "encoder":
        start = tok.index.get("[CLS]", tok.index.get("<s>"))
        end = tok.index.get("[SEP]", tok.index.get("</s>"))
    else:
        end = _ids_from(hf, "eos_token_id")
    model = local_model(name or folder.name, net, tok, device, f"{family} checkpoint from {folder.name}", folder,
                        family, n, t0, cfg.kind, start_id=start, end_id=end, dtypes=ckpt.dtypes(),
                        masked_lm=head is not None)
    model.mlm_head = head
    if head is not None and tok.mask_token:
        model.examples = [f"The capital of France is {tok.mask_token}."] + model.examples
    say("ready")
    return model


def load_path(path, device=None, name: Optional[str] = None, progress: Progress = None) -> AttentionModel:
    """A folder (config.json + safetensors) or a .gguf file, as an AttentionModel."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        from . import gguf_gemma  # gemma / gemma2 / gemma3 files: core/loaders/gguf_gemma.py

        arch = gguf_gemma.architecture(path)
        if arch in gguf_gemma.ARCHS:
            return gguf_gemma.load_gguf(path, device=device, name=name, progress=progress)
        if arch == "gpt-oss":
            from .gguf_gpt_oss import load_gguf as load_gpt_oss  # core/loaders/gguf_gpt_oss.py

            return load_gpt_oss(path, device=device, name=name, progress=progress)
        from .gguf_file import load_gguf

        return load_gguf(path, device=device, name=name, progress=progress)
    if path.is_dir():
        return load_folder(path, device=device, name=name, progress=progress)
    if path.is_file() and path.suffix in (".bin", ".pt", ".pth", ".ckpt"):
        raise CheckpointError(f"{path.name}: pickle weights are never loaded; convert them to safetensors")
    raise CheckpointError(f"{path}: neither a checkpoint folder nor a .gguf file")
