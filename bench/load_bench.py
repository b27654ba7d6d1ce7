"""Loading a checkpoint from disk: a randomly initialised Llama-shaped model in bfloat16
safetensors, written by this benchmark to a temporary folder, then loaded by core.load_model.
The first load in a process also pays one-time imports (torch's meta-device machinery, the
tokenizers and safetensors modules), so the load is timed twice.

    python -m bench.load_bench            # ~0.47 B parameters (0.94 GB of bfloat16 on disk)
    python -m bench.load_bench --small    # ~7 M parameters, a quick check that it all runs

Loading and tracing run in a fresh child process, so its peak resident memory (ru_maxrss)
is the loader's and the traces', not the writer's. Printed: parameters, file size, load
time, peak RSS after loading (compare with 4 bytes x parameters for the float32 model
and 2 bytes x parameters for the stored one), trace time at 128 and 1,024 tokens and the
peak RSS after them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {  # Llama-shaped: GQA 4 query heads per key/value head, SwiGLU, untied output
    "full": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=4096, vocab_size=50000),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                  intermediate_size=768, vocab_size=8000),
}
WORDS = ("the river bank was quiet in the morning and the old man walked along the water to the town where "
         "people sold fish bread and fruit from small boats while children ran across the bridge").split()


def write_checkpoint(folder: Path, shape: dict, shard_gb: float = 0.5) -> int:
    """config.json, sharded bfloat16 model-*.safetensors with an index, tokenizer.json; returns parameters."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d, L, h, hkv = shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"], shape["num_key_value_heads"]
    m, v, dk = shape["intermediate_size"], shape["vocab_size"], shape["hidden_size"] // shape["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (h * dk, d), p + "self_attn.k_proj.weight": (hkv * dk, d),
                       p + "self_attn.v_proj.weight": (hkv * dk, d), p + "self_attn.o_proj.weight": (d, h * dk),
                       p + "mlp.gate_proj.weight": (m, d), p + "mlp.up_proj.weight": (m, d),
                       p + "mlp.down_proj.weight": (d, m)})
    gen = torch.Generator().manual_seed(0)
    shard, size, n_shard, weight_map, n_params = {}, 0, 0, {}, 0

    def flush():
        nonlocal shard, size, n_shard
        if shard:
            n_shard += 1
            name = f"model-{n_shard:05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
            shard, size = {}, 0

    for name, s in shapes.items():
        t = torch.ones(s) if len(s) == 1 else torch.randn(s, generator=gen) * 0.02
        shard[name] = t.to(torch.bfloat16)
        size += shard[name].numel() * 2
        n_params += shard[name].numel()
        if size >= shard_gb * 1e9:
            flush()
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "max_position_embeddings": 2048, "tie_word_embeddings": False, "hidden_act": "silu", **shape}
    (folder / "config.json").write_text(json.dumps(cfg))
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([" ".join(WORDS)] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.save(str(folder / "tokenizer.json"))
    return n_params


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
import core
core.device.configure_threads()
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss_mb()
t0 = time.perf_counter()
model = core.load_model(sys.argv[1], device="cpu")
load_s = time.perf_counter() - t0
out = {"rss_import_mb": base, "load_s": load_s, "rss_after_load_mb": rss_mb(), "dtype": str(next(model.net.parameters()).dtype)}
del model
t0 = time.perf_counter()
model = core.load_model(sys.argv[1], device="cpu")  # again: without the one-time imports of a fresh process
out["load_warm_s"] = time.perf_counter() - t0
words = sys.argv[3].split()
model.input_limit = None
for n in (128, 1024):
    ids, k = [], 0
    text = ""
    while len(model.encode(text or "x").ids) < n:  # grow the text to at least n tokens
        text += " " + " ".join(words[k % len(words)] for k in range(k, k + 32)); k += 32
    enc = model.encode(text)
    cut = enc.offsets[n - 1][1]
    text = text[:cut]
    t0 = time.perf_counter()
    tr = model.trace(text)
    w = tr["decoder.0.self_attn.weights"]  # read one map (recomputed from the stored stream)
    out[f"trace_{len(tr.tokens('target'))}_s"] = time.perf_counter() - t0
    out[f"rss_after_trace_{n}_mb"] = rss_mb()
    del tr, w
print(json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a ~7 M-parameter model: checks the benchmark runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    shape = SHAPES["small" if args.small else "full"]
    with tempfile.TemporaryDirectory(prefix="attention-lab-load-") as tmp:
        folder = Path(tmp) / "llama-bench"
        folder.mkdir()
        t0 = time.perf_counter()
        n = write_checkpoint(folder, shape)
        write_s = time.perf_counter() - t0
        disk = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(ROOT), " ".join(WORDS)],
                              capture_output=True, text=True)
        if proc.returncode:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update({"parameters": n, "disk_mb": disk / 2**20, "write_s": write_s,
                "float32_model_mb": 4 * n / 2**20, "bf16_model_mb": 2 * n / 2**20})
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"Llama-shaped checkpoint: {n / 1e6:.1f} M parameters, {res['disk_mb']:.0f} MiB of bfloat16 safetensors "
          f"(written in {write_s:.1f} s)")
    print(f"load:                 {res['load_s']:.2f} s in a fresh process, {res['load_warm_s']:.2f} s the second time "
          f"(computation dtype {res['dtype']})")
    print(f"peak RSS after load:  {res['rss_after_load_mb']:.0f} MiB   (python+torch alone {res['rss_import_mb']:.0f} MiB; "
          f"float32 model {res['float32_model_mb']:.0f} MiB, bf16 model {res['bf16_model_mb']:.0f} MiB)")
    for k in sorted((k for k in res if k.startswith("trace_")), key=lambda k: int(k.split("_")[1])):
        n_tok = k.split("_")[1]
        print(f"trace at {n_tok:>4} tokens: {res[k]:.2f} s")
    for n_tok in (128, 1024):
        print(f"peak RSS after the {n_tok}-token trace: {res[f'rss_after_trace_{n_tok}_mb']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
