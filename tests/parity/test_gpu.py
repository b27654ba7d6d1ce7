"""On a CUDA GPU: the core there against the CPU and against independent implementations.

Run where CUDA is present (`pytest -m gpu`), skipped with "no CUDA device" elsewhere:
- the parity suite's key comparisons (tests/parity/test_core_parity.py) on the GPU: our random
  encoder-decoder against torch.nn.Transformer, our attention function against PyTorch's
  F.scaled_dot_product_attention, in float64;
- one trace per bundled model (toy-translate, minilm, smollm2) loaded with device="cuda":
  it ran there (the trace's meta says so, no CPU fallback), and every stored tensor, every
  layer's attention weights and the logits match the same trace on the CPU;
- minilm and smollm2 on the GPU against transformers on the GPU (eager attention,
  output_attentions), as tests/parity/test_minilm.py and tests/parity/test_smollm2.py do on the CPU.

Float32 on the GPU (TF32 off, PyTorch's default for matmuls) differs from the CPU by
rounding only; the tolerances below leave room for that and for nothing else.
"""

import importlib.util
import os

import pytest
import torch
import torch.nn as nn

import core
from core import Recorder, causal_mask, scaled_dot_product_attention
from core.toy import toy_task

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

DEVICE = "cuda"  # conftest's toy / minilm / smollm2 fixtures load there for this module
TOL64 = 1e-5  # float64, as tests/parity/test_core_parity.py
MAPS_TOL = 1e-4  # attention weights (in [0, 1]), float32
LOGITS_TOL = 1e-3  # logits (|x| up to ~30), float32
REL_TOL = 1e-4  # any other tensor: max |gpu - cpu| / max |cpu|

SRC = "the small dog sees the cat"
CASES = {  # model fixture -> (text, target for teacher forcing or None)
    "toy": (SRC, " ".join(toy_task.translate(SRC.split())[0])),
    "minilm": ("I swam across the river to get to the other bank.", None),
    "smollm2": ("The capital of France is", None),
}
NAMES = {"toy": "toy-translate", "minilm": "minilm", "smollm2": "smollm2"}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double().cpu() - b.detach().double().cpu()).abs().max().item()


# ------------------------------------------------------------------ parity (float64) on the GPU
def test_encoder_decoder_matches_nn_transformer_on_cuda():
    from test_core_parity import _random_pair

    cfg, ours, ref = _random_pair(0)
    ours, ref = ours.to(DEVICE), ref.to(DEVICE)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, cfg.src_vocab_size, (3, 7), generator=g).to(DEVICE)
    tgt = torch.randint(4, cfg.tgt_vocab_size, (3, 5), generator=g).to(DEVICE)
    rec = Recorder()
    with torch.no_grad():
        logits = ours(src, tgt)
        ours(src[:1], tgt[:1], rec=rec)
        x_src, x_tgt = ours.src_embed(src), ours.tgt_embed(tgt)
        mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64, device=DEVICE)
        ref_out = ref(x_src, x_tgt, tgt_mask=mask)
        ref_mem = ref.encoder(x_src)
        ref_logits = ours.out_proj(ref_out)
    assert logits.device.type == "cuda"
    assert _max_diff(ours.encode(src), ref_mem) < TOL64
    assert _max_diff(logits, ref_logits) < TOL64
    # the traced (explicit) path on the GPU gives the same numbers as the fused one
    assert _max_diff(rec.tensors["decoder.1.out"], ref_out[0]) < TOL64
    assert _max_diff(rec.tensors["encoder.1.out"], ref_mem[0]) < TOL64
    assert _max_diff(rec.tensors["logits"], ref_logits[0]) < TOL64


@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_function_matches_sdpa_on_cuda(with_mask):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, dtype=torch.float64, generator=g).to(DEVICE) for _ in range(3))
    mask = causal_mask(5, dtype=torch.float64).to(DEVICE) if with_mask else None
    rec = Recorder()
    out = scaled_dot_product_attention(q, k, v, mask, record=lambda n, t: rec(n, t))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.device.type == "cuda"
    assert _max_diff(out, ref) < TOL64
    w = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5 + (0 if mask is None else mask), dim=-1)
    assert _max_diff(rec.tensors["weights"], w[0]) < TOL64  # the recorder keeps the first batch item


# ------------------------------------------------------------------ one trace on the GPU against the CPU
@pytest.fixture(scope="module")
def on_cpu():
    """The same bundled model loaded on the CPU (once per module)."""
    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = core.load_model(name, device="cpu")
        return loaded[name]

    return get


@pytest.mark.parametrize("fixture", list(CASES))
def test_trace_on_cuda_matches_the_cpu(request, on_cpu, fixture):
    gpu = request.getfixturevalue(fixture)  # skips when the weight package is not installed
    assert gpu.device.type == "cuda"
    cpu = on_cpu(NAMES[fixture])
    text, target = CASES[fixture]
    tg, tc = gpu.trace(text, target=target), cpu.trace(text, target=target)
    assert tg.meta["device"].startswith("cuda") and "fallback" not in tg.meta, tg.meta.get("fallback")
    assert tc.meta["device"] == "cpu"
    assert tg.token_sets == tc.token_sets
    assert tg.stored_names() == tc.stored_names() and list(tg) == list(tc)

    for name in tc.stored_names():  # the fused pass's stored tensors
        a, b = tg[name], tc[name]
        assert a.device.type == "cpu" and a.shape == b.shape, name  # a trace holds CPU tensors
        if a.dtype in (torch.long, torch.int64, torch.int32):
            continue  # top-k ids: compared through their probabilities below
        scale = max(b.abs().max().item(), 1.0)
        assert _max_diff(a, b) / scale < REL_TOL, (name, _max_diff(a, b), scale)

    maps = 0
    for stack in tc.stacks():  # every layer's attention weights, recomputed on each device
        for kind in tc.attention_kinds(stack):
            suffix = f"{kind}.weights"
            for i, (wg, wc) in enumerate(zip(tg.each_layer(stack, [suffix]), tc.each_layer(stack, [suffix]))):
                d = _max_diff(wg[suffix], wc[suffix])
                assert d < MAPS_TOL, f"{stack}.{i}.{suffix}: GPU and CPU differ by {d:.2e}"
                maps += 1
    assert maps == sum(tc.layers(s) * len(tc.attention_kinds(s)) for s in tc.stacks()) > 0

    if "logits" in tc:
        d = _max_diff(tg["logits"], tc["logits"])
        assert d < LOGITS_TOL, f"logits differ by {d:.2e}"
        assert tg["next.ids"].tolist()[:3] == tc["next.ids"].tolist()[:3]
        assert _max_diff(tg["next.probs"], tc["next.probs"]) < MAPS_TOL
    # the check the Inside page shows: the re-run layer's output against the stored one
    stack = tc.stacks()[-1]
    last = tg.layers(stack) - 1
    scale = max(tg[f"{stack}.{last}.out"].abs().max().item(), 1.0)
    assert _max_diff(tg.recomputed(f"{stack}.{last}.out"), tg[f"{stack}.{last}.out"]) / scale < REL_TOL


# ------------------------------------------------------------------ against transformers on the GPU
def test_minilm_on_cuda_matches_transformers_on_cuda(minilm):
    from transformers import BertModel

    ref = BertModel.from_pretrained(str(core.loaders.minilm.model_dir()), attn_implementation="eager").eval().to(DEVICE)
    text = CASES["minilm"][0]
    trace = minilm.trace(text)
    ids = torch.tensor([minilm.tokenizer.encode(text).ids], device=DEVICE)
    with torch.inference_mode():
        out = ref(ids, output_attentions=True)
    assert trace.meta["device"].startswith("cuda") and len(out.attentions) == 6
    for i, ref_w in enumerate(out.attentions):
        d = _max_diff(trace[f"encoder.{i}.self_attn.weights"], ref_w[0])
        assert d < MAPS_TOL, f"layer {i}: attention weights differ by {d:.2e}"
    d = _max_diff(trace["encoder.5.out"], out.last_hidden_state[0])
    assert d < MAPS_TOL, f"last hidden state differs by {d:.2e}"


def test_smollm2_on_cuda_matches_transformers_on_cuda(smollm2):
    pytest.importorskip("gguf")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder; never reach for the Hub
    from transformers import AutoConfig, LlamaForCausalLM

    from core.loaders import smollm2_files

    path = smollm2_files.gguf_path()
    folder, name = str(path.parent), path.name
    if importlib.util.find_spec("accelerate") is not None:
        ref = LlamaForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32,
                                               attn_implementation="eager")
    else:  # as tests/parity/test_smollm2.py's reference: transformers' own GGUF reader, no accelerate
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
        cfg._attn_implementation = "eager"
        ref = LlamaForCausalLM(cfg)
        parsed = load_gguf_checkpoint(os.path.join(folder, name), return_tensors=True, model_to_load=ref)
        missing, unexpected = ref.load_state_dict(parsed["tensors"], strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    ref = ref.float().eval().to(DEVICE)
    assert ref.config._attn_implementation == "eager"

    text = CASES["smollm2"][0]
    trace = smollm2.trace(text)
    ids = smollm2.tokenizer.encode(text).ids
    with torch.inference_mode():
        out = ref(torch.tensor([ids], device=DEVICE), output_attentions=True, use_cache=False)
    assert trace.meta["device"].startswith("cuda") and len(out.attentions) == 30
    d = _max_diff(trace["logits"], out.logits[0])
    assert d < LOGITS_TOL, f"logits differ by {d:.2e}"
    for i, ref_w in enumerate(out.attentions):
        d = _max_diff(trace[f"decoder.{i}.self_attn.weights"], ref_w[0])
        assert d < MAPS_TOL, f"layer {i}: attention weights differ by {d:.2e}"
