"""The large sizes of three checks whose test runs at a smaller size with the same paths (the
test says which thresholds make the path): each part prints its figures and fails (exit 1)
where the check fails.

    python -m bench.bench_large_checks --part pooled    # smollm2's pooled maps at 8,000 tokens
    python -m bench.bench_large_checks --part stepper   # the decoder stepper with a 1,024-token prompt
    python -m bench.bench_large_checks --part memory    # one server over 200 sentences

- pooled: trace.pooled of two heads of layers 0, 15 and 29 at 8,000 tokens (the model's context,
  where RoPE's angles are largest) against transformers' sdpa Llama tile by tile
  (tests/parity/test_smollm2.py runs 1,000 tokens).
- stepper: the Decoder page through AppTest with a 1,024-token smollm2 prompt: the page's time,
  no exception, maps in blocks whose rows sum to 1, Next moves one step
  (tests/app/test_app_decoder.py runs 160 tokens with the long-input thresholds lowered).
- memory: tests/core/test_load.py's memory bound with 200 sentences and a 32 MB trace cache
  (the test runs fewer sentences and a smaller cache, which fills as early)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench.common import ROOT


def pooled_against_transformers(model, reference, n: int, size: int = 128, layers=(0, 15, 29), heads=(0, 7)) -> float:
    """max |trace.pooled - reference| over `heads` of `layers` for n tokens of bench.common.PASSAGE:
    transformers' LlamaForCausalLM (sdpa, so no layer's maps are ever whole) runs the same ids,
    hooks catch the inputs of those layers, and its own input_layernorm, q_proj / k_proj
    (un-permuted by its GGUF loader), rotary embedding ("half" layout) and a float64 softmax
    give `size` query rows at a time, block-averaged."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from bench.common import PASSAGE

    ids = model.tokenizer.encode(PASSAGE * (n // 20 + 10)).ids[:n]
    assert len(ids) == n
    tensors, _, runner = model._run_traced(None, ids)
    trace = model._finish(tensors, {"source": model.target_strings(ids)},
                          {"model": "smollm2", "config": model.config.to_dict()}, runner)
    ours = {i: trace.pooled(f"decoder.{i}.self_attn.weights", size=size, heads=heads) for i in layers}

    caught = {}
    hooks = [reference.model.layers[i].register_forward_pre_hook(
        lambda mod, args, kwargs, i=i: caught.__setitem__(i, (args[0] if args else kwargs["hidden_states"]).detach()),
        with_kwargs=True) for i in layers]
    impl = reference.config._attn_implementation
    reference.config._attn_implementation = "sdpa"
    try:
        with torch.inference_mode():
            reference.model(torch.tensor([ids]), use_cache=False)
    finally:
        reference.config._attn_implementation = impl
        for h in hooks:
            h.remove()
    nb = -(-n // size)
    worst = 0.0
    with torch.inference_mode():
        pos = torch.arange(n)[None]
        for i in layers:
            layer = reference.model.layers[i]
            x = layer.input_layernorm(caught[i])
            attn = layer.self_attn
            q = attn.q_proj(x).view(1, n, -1, 64).transpose(1, 2)
            k = attn.k_proj(x).view(1, n, -1, 64).transpose(1, 2)
            cos, sin = reference.model.rotary_emb(x, pos)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            q, k = q[0].double(), k[0].double()
            for j, h in enumerate(heads):
                g = h // (q.shape[0] // k.shape[0])
                sums = torch.zeros(nb, nb, dtype=torch.float64)
                for r0 in range(0, n, size):
                    r1 = min(n, r0 + size)
                    s = q[h, r0:r1] @ k[g].T / 8.0
                    s = s.masked_fill(torch.arange(n)[None, :] > torch.arange(r0, r1)[:, None], float("-inf"))
                    w = torch.softmax(s, dim=-1)
                    w = torch.nn.functional.pad(w, (0, nb * size - n)).view(r1 - r0, nb, size).sum(-1)
                    sums[r0 // size] = w.sum(0)
                widths = torch.tensor([min(size, n - b * size) for b in range(nb)], dtype=torch.float64)
                ref = sums / (widths[:, None] * widths[None, :])
                worst = max(worst, (ours[i][j].double() - ref).abs().max().item())
    print(f"pooled at {n} tokens, layers {layers}, heads {heads}: max|ours - transformers tile-wise| {worst:.2e}")
    return worst


def _pooled() -> bool:
    sys.path.insert(0, str(ROOT / "tests"))
    import core
    from hf_builders import smollm2_llama

    model = core.load_model("smollm2", device="cpu")
    t0 = time.perf_counter()
    worst = pooled_against_transformers(model, smollm2_llama(), n=8000)
    print(f"pooled parity at 8,000 tokens: {time.perf_counter() - t0:.0f} s, max |diff| {worst:.2e} (bound 1e-5)")
    return worst < 1e-5


def _stepper() -> bool:
    import numpy as np
    from streamlit.testing.v1 import AppTest
    from streamlit.util import calc_hash

    import core
    from bench.common import PASSAGE
    from viz.decoder import figures as decoder_figures

    model = core.load_model("smollm2", device="cpu")
    text = PASSAGE * 40
    text = text[: model.tokenizer.encode(text).offsets[1023][1]]
    assert len(model.encode(text)) == 1024
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900)
    at._page_hash = calc_hash("decoder")  # the first page by its hash: tests/conftest.py open_first says why
    for k, v in dict(model="smollm2", text=text, layer="3", head="1").items():
        at.query_params[k] = v
    t0 = time.perf_counter()
    at.run()
    first = time.perf_counter() - t0
    import json

    z = None
    for e in at.get("plotly_chart"):
        if e.proto.id.endswith("decoder-weights"):
            z = np.array(json.loads(e.proto.spec)["data"][0]["z"], dtype=float)
    ok = not at.exception and z is not None and z.shape[0] <= decoder_figures.MAX_SIDE and np.allclose(z.sum(1), 1.0, atol=1e-4)
    t0 = time.perf_counter()
    at.button(key="decoder-btn-next").click().run(timeout=300)
    nxt = time.perf_counter() - t0
    ok = ok and not at.exception and at.query_params["step"] in ("2", ["2"])
    print(f"stepper with a 1,024-token prompt: first run {first:.0f} s, Next {nxt:.0f} s, "
          f"checks {'pass' if ok else 'FAIL'}")
    return ok


def _memory() -> bool:
    import subprocess

    env = {**os.environ, "ATTENTION_LAB_LOAD_SENTENCES": "200", "ATTENTION_LAB_LOAD_CACHE_MB": "32"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                        "tests/core/test_load.py::test_memory_is_bounded_over_many_sentences"], cwd=ROOT, env=env)
    return r.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("pooled", "stepper", "memory"), required=True)
    args = ap.parse_args()
    ok = {"pooled": _pooled, "stepper": _stepper, "memory": _memory}[args.part]()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
