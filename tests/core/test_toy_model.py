"""The bundled toy-translate model: held-out quality, trace invariants, CLI and API contracts."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import core
from core.toy import toy_task
from core.registry import TOY_DIR
from conftest import ROOT

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here


def test_checkpoint_is_safetensors_and_small():
    path = TOY_DIR / "model.safetensors"
    assert path.exists() and path.stat().st_size <= 10 * 2**20
    assert sum(p.stat().st_size for p in TOY_DIR.iterdir()) <= 10 * 2**20


def test_held_out_exact_match_and_alignment(toy):
    from core.toy.evaluate import evaluate_toy

    result = evaluate_toy(toy, n=1000)
    print(json.dumps(result))
    assert result["n"] == 1000
    assert result["exact_match"] >= 0.97
    assert result["alignment_accuracy"] >= 0.80


def test_test_set_is_never_trained_on():
    # the trainer draws through _sample_train, which rejects held-out sentences
    import random

    from core.cli.train_toy import _sample_train

    rng = random.Random(0)
    assert not any(toy_task.is_test(_sample_train(rng)[0]) for _ in range(3000))
    assert all(toy_task.is_test(s) for s, _, _ in toy_task.test_examples(200))


def _check_weights(trace):
    names = [n for n in trace.names() if n.endswith(".weights")]
    assert names
    for name in names:
        w = trace[name].double()
        mask = trace[name.replace(".weights", ".mask")]
        assert (w >= 0).all(), name
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-6), name
        blocked = torch.isneginf(mask).expand_as(w)
        assert (w[blocked] == 0).all(), name  # exactly zero, not merely small
        if name.startswith("decoder") and ".self_attn." in name:
            assert (w.triu(1) == 0).all(), name
            assert torch.isneginf(mask.triu(1)[mask.triu(1) != 0]).all()


@pytest.mark.parametrize("text", ["the small dog sees the cat", "show me the money", "help the tiny white cat across the road"])
def test_every_weights_tensor_is_a_distribution(toy, text):
    _check_weights(toy.trace(text))


def test_padding_mask_view(toy):
    trace = toy.trace("the small dog sees the cat", pad_to=10)
    assert trace.tokens("source")[-4:] == ["<pad>"] * 4
    mask = trace["encoder.0.self_attn.mask"]
    assert torch.isneginf(mask[:, 6:]).all() and (mask[:, :6] == 0).all()
    _check_weights(trace)
    # padding changes nothing for the real tokens: same translation, same real-token weights
    plain = toy.trace("the small dog sees the cat")
    assert trace.tokens("target") == plain.tokens("target")
    w_pad = trace["encoder.2.self_attn.weights"][:, :6, :6]
    assert (w_pad - plain["encoder.2.self_attn.weights"]).abs().max() < 1e-5


def test_translation_examples(toy):
    for sentence in toy_task.EXAMPLES:
        src = sentence.split()
        expected, _ = toy_task.translate(src)
        out, ended = toy.generate(sentence)
        assert ended and out == expected, (sentence, out, expected)


def test_batched_greedy_equals_single(toy):
    sentences = [" ".join(s) for s, _, _ in toy_task.test_examples(24, seed=7)]
    batched = toy.greedy_batch(sentences)
    for s, b in zip(sentences, batched):
        single, _ = toy.generate(s)
        assert single == b


def test_unknown_words_are_reported_not_fatal(toy):
    trace = toy.trace("the small zebra sees the cat!")
    assert trace.meta["unknown"] == ["zebra"]
    assert "<unk>" in trace.tokens("source")
    assert trace.meta["dropped"] == ["!"]
    with pytest.raises(core.InputError):
        toy.trace("   ")
    with pytest.raises(core.InputError):
        toy.trace("?!")


def test_teacher_forcing_target(toy):
    src = "the small dog sees the cat".split()
    tgt, _ = toy_task.translate(src)
    trace = toy.trace(" ".join(src), target=" ".join(tgt))
    assert trace.tokens("target") == ["<start>"] + tgt
    assert trace.meta["mode"] == "teacher-forcing"
    assert trace["next.tokens"][0] == "<end>"


def test_device_override(monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_DEVICE", "cpu")
    assert core.pick_device().type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            core.pick_device("cuda")


REQUIRED = ["tokens.source", "tokens.target", "embed.encoder.tokens", "embed.encoder.positions", "embed.encoder.sum",
            "embed.decoder.tokens", "embed.decoder.positions", "embed.decoder.sum", "logits", "probs",
            "next.tokens", "next.probs"]
PER_ATTN = ["q", "k", "v", "scores", "scaled", "mask", "masked", "weights", "heads", "out"]
PER_LAYER = ["residual1", "norm1", "ffn.hidden", "ffn.out", "residual2", "norm2", "out"]


@pytest.mark.slow
def test_cli_trace_writes_design_names(tmp_path):
    out = tmp_path / "run.npz"
    env = {**os.environ, "ATTENTION_LAB_DEVICE": "cpu"}
    res = subprocess.run([sys.executable, "-m", "core", "trace", "--model", "toy-translate", "--text",
                          "the small dog sees the cat", "--out", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    z = np.load(out)
    names = set(z.files)
    expected = set(REQUIRED)
    for i in range(3):
        expected |= {f"encoder.{i}.self_attn.{n}" for n in PER_ATTN} | {f"encoder.{i}.{n}" for n in PER_LAYER}
        expected |= {f"decoder.{i}.{a}.{n}" for a in ("self_attn", "cross_attn") for n in PER_ATTN}
        expected |= {f"decoder.{i}.{n}" for n in PER_LAYER + ["residual3", "norm3"]}
    assert expected <= names, sorted(expected - names)
    assert list(z["tokens.source"]) == "the small dog sees the cat".split()
    n = 6
    assert z["encoder.0.self_attn.weights"].shape == (4, n, n)
    assert z["encoder.0.self_attn.q"].shape == (4, n, 32)
    t = len(z["tokens.target"])
    assert z["decoder.0.cross_attn.weights"].shape == (4, t, n)
    assert z["decoder.0.ffn.hidden"].shape == (t, 512)
    loaded = core.Trace.load(out)
    assert torch.equal(loaded["decoder.2.cross_attn.weights"], torch.from_numpy(z["decoder.2.cross_attn.weights"]))


@pytest.mark.slow
def test_cli_models_and_eval_errors(tmp_path):
    res = subprocess.run([sys.executable, "-m", "core", "models"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0
    lines = res.stdout.strip().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == list(core.MODELS)
    res = subprocess.run([sys.executable, "-m", "core", "trace", "--model", "nope", "--text", "x"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "unknown model" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_cli_eval_prints_one_json_line():
    res = subprocess.run([sys.executable, "-m", "core", "eval", "--model", "toy-translate", "--n", "200"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "ATTENTION_LAB_DEVICE": "cpu"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert {"exact_match", "alignment_accuracy", "n"} <= set(result) and result["n"] == 200
    assert "decoder.0.cross_attn" in res.stderr  # the per-layer/head table
