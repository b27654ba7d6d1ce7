"""Loading a 1 B-parameter bfloat16 Gemma-shaped checkpoint (Gemma 3 1B's shape: d = 1152,
26 layers, 4 query heads and 1 key/value head of 256, m = 6912, a 262,144-token tied
embedding; QK-norm and the four norms per layer) written with random weights by this
benchmark, then loaded by core.load_model in a fresh process, beside the 0.47 B Llama-shaped
checkpoint of bench/load_bench.py loaded the same way.

    python -m bench.bench_load_gemma            # both rows (writes ~2.9 GB to a temporary folder)
    python -m bench.bench_load_gemma --small    # ~10 M-parameter shapes: checks that it all runs

The writer builds one tensor at a time and writes shards of at most 0.5 GB with
safetensors (no transformers model in memory). The loader converts bfloat16 to float32
tensor by tensor from the memory-mapped files (core/loaders/checkpoint.py), so the target is
a peak resident memory of at most 1.3 x the float32 weights (python and torch included).
Printed: parameters, file size, load time (fresh process and a second load in it), peak RSS
after the load (the child's VmHWM) and its ratio to the float32 weights' size.
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.load_bench import SHAPES as LLAMA_SHAPES  # noqa: E402
from bench.load_bench import WORDS  # noqa: E402
from bench.load_bench import write_checkpoint as write_llama  # noqa: E402

TARGET_RATIO = 1.3  # peak RSS / float32 weights
GEMMA_SHAPES = {
    "full": dict(hidden_size=1152, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                 intermediate_size=6912, vocab_size=262144),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                  intermediate_size=768, vocab_size=16000),
}


def gemma_tensors(shape: dict) -> dict:
    """{name: shape} of a Gemma 3 (text) checkpoint as Gemma3ForCausalLM saves it (tied output)."""
    d, L, h, hkv, dk = (shape[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "head_dim"))
    m, v = shape["intermediate_size"], shape["vocab_size"]
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(L):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            out[p + n + ".weight"] = (d,)
        out.update({p + "self_attn.q_proj.weight": (h * dk, d), p + "self_attn.k_proj.weight": (hkv * dk, d),
                    p + "self_attn.v_proj.weight": (hkv * dk, d), p + "self_attn.o_proj.weight": (d, h * dk),
                    p + "self_attn.q_norm.weight": (dk,), p + "self_attn.k_norm.weight": (dk,),
                    p + "mlp.gate_proj.weight": (m, d), p + "mlp.up_proj.weight": (m, d),
                    p + "mlp.down_proj.weight": (d, m)})
    return out


def write_gemma(folder: Path, shape: dict, shard_gb: float = 0.5) -> int:
    """config.json, sharded bfloat16 safetensors with an index, tokenizer.json; returns parameters.
    One tensor exists at a time besides the shard being filled (at most shard_gb)."""
    import torch
    from safetensors.torch import save_file

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

    for name, s in gemma_tensors(shape).items():
        if len(s) == 1:  # Gemma stores norm gains as w for a scale of 1 + w
            t = torch.randn(s, generator=gen) * 0.1
        else:
            t = torch.empty(s, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=gen)
        t = t.to(torch.bfloat16)
        if size and size + t.numel() * 2 > shard_gb * 1e9:
            flush()
        shard[name] = t
        size += t.numel() * 2
        n_params += t.numel()
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "rms_norm_eps": 1e-6,
           "max_position_embeddings": 32768, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
           "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
           "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "final_logit_softcapping": None,
           "attn_logit_softcapping": None, **shape}
    (folder / "config.json").write_text(json.dumps(cfg))
    _tokenizer(folder)
    return n_params


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([" ".join(WORDS)] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.save(str(folder / "tokenizer.json"))


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
import torch
import core
core.device.configure_threads()
def rss_mb(field="VmHWM"):
    # the peak (VmHWM) of this process's own memory: ru_maxrss would keep the writer's peak across exec
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss_mb()
t0 = time.perf_counter()
model = core.load_model(sys.argv[1], device="cpu")
load_s = time.perf_counter() - t0
out = {"rss_import_mb": base, "load_s": load_s, "rss_after_load_mb": rss_mb(),
       "dtype": str(next(model.net.parameters()).dtype), "family": model.info.get("family"),
       "parameters_loaded": sum(p.numel() for p in model.net.parameters())}
tr = model.trace("the river bank was quiet")
out["trace_ok"] = bool(torch.isfinite(tr["logits"]).all())
del model, tr
t0 = time.perf_counter()
model = core.load_model(sys.argv[1], device="cpu")  # again: without the one-time imports of a fresh process
out["load_warm_s"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def measure(kind: str, shape: dict) -> dict:
    """Write the checkpoint, load it in a fresh process; the figures as a dict."""
    with tempfile.TemporaryDirectory(prefix=f"attention-lab-{kind}-") as tmp:
        folder = Path(tmp) / f"{kind}-bench"
        folder.mkdir()
        t0 = time.perf_counter()
        n = (write_gemma if kind == "gemma" else write_llama)(folder, shape)
        write_s = time.perf_counter() - t0
        disk = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(ROOT)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    f32 = 4 * n / 2**20
    res.update({"kind": kind, "parameters": n, "disk_mb": disk / 2**20, "write_s": write_s, "float32_model_mb": f32,
                "peak_ratio": res["rss_after_load_mb"] / f32, "target_ratio": TARGET_RATIO})
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="~10 M-parameter shapes: checks the benchmark runs")
    ap.add_argument("--gemma-only", action="store_true", help="skip the Llama row")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    size = "small" if args.small else "full"
    rows = [measure("gemma", GEMMA_SHAPES[size])]
    if not args.gemma_only:
        rows.append(measure("llama", LLAMA_SHAPES[size]))
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'checkpoint':<34} {'params':>8} {'bf16 on disk':>12} {'load (fresh)':>12} {'load (2nd)':>10} "
          f"{'peak RSS':>9} {'f32 weights':>11} {'peak/f32':>8}")
    for r in rows:
        what = "Gemma-3-shaped (tied, QK-norm)" if r["kind"] == "gemma" else "Llama-shaped (untied, GQA)"
        print(f"{what:<34} {r['parameters'] / 1e9:>7.2f}B {r['disk_mb']:>9.0f} MiB {r['load_s']:>10.2f} s "
              f"{r['load_warm_s']:>8.2f} s {r['rss_after_load_mb']:>5.0f} MiB {r['float32_model_mb']:>7.0f} MiB "
              f"{r['peak_ratio']:>7.2f}x")
    g = rows[0]
    print(f"target: peak RSS <= {TARGET_RATIO}x the float32 weights for the Gemma row: "
          f"{'met' if g['peak_ratio'] <= TARGET_RATIO else 'MISSED'} ({g['peak_ratio']:.2f}x; python + torch alone "
          f"{g['rss_import_mb']:.0f} MiB; loaded as {g['family']}, computes in {g['dtype']}, a trace's logits finite: "
          f"{g['trace_ok']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
