"""toy-translate at every saved training step: the checkpoints load, attention goes from
chance to the alignment, exact match rises, the final step is the shipped model bit for bit,
and the figures and the CLI read them."""

import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import core
from core.toy import toy_steps, toy_task
from core.__main__ import main as cli
from core.toy.evaluate import evaluate_toy
from core.registry import TOY_DIR
from viz.figures import training as tv

# sha256 of assets/toy-translate/model.safetensors as shipped (commit 026bec4): the final step must stay it
SHIPPED_SHA256 = "e9196859c7618d744c4f7c52c9bd989affbab1b23d798f7a01b19bcea1775734"


@pytest.fixture(scope="module")
def steps():
    return toy_steps.available_steps()


@torch.inference_mode()
def teacher_forced_scores(model, triples, batch: int = 250):
    """(exact match, alignment accuracy of the guided head) by one teacher-forced pass, written
    apart from core.toy.evaluate: greedy decoding reproduces the reference exactly iff, fed the
    reference prefix, the model's argmax is the next reference token at every position
    (<end> included); a head hits a target word when its row's argmax is the aligned source word."""
    src_ids, tgt_ids = model.tokenizer.index, model.target_tokenizer.index
    start, end = tgt_ids["<start>"], tgt_ids["<end>"]
    exact = hits = aligned = 0
    for i in range(0, len(triples), batch):
        chunk = triples[i: i + batch]
        n = max(len(s) for s, _, _ in chunk)
        t = max(len(y) for _, y, _ in chunk) + 1
        src = torch.zeros(len(chunk), n, dtype=torch.long)
        dec = torch.zeros(len(chunk), t, dtype=torch.long)
        for b, (s, y, _) in enumerate(chunk):
            src[b, : len(s)] = torch.tensor([src_ids[w] for w in s])
            dec[b, : len(y) + 1] = torch.tensor([start] + [tgt_ids[w] for w in y])
        rec = core.Recorder(names=["decoder.1.cross_attn.weights"], whole_batch=True)
        logits = model.net(src, dec, src_pad=src == 0, rec=rec)
        w = rec.tensors["decoder.1.cross_attn.weights"][:, 0]  # (B, t, n)
        for b, (s, y, a) in enumerate(chunk):
            want = [tgt_ids[x] for x in y] + [end]
            exact += logits[b, : len(want)].argmax(-1).tolist() == want
            for j, src_pos in enumerate(a):
                if src_pos >= 0:
                    aligned += 1
                    hits += int(w[b, j, : len(s)].argmax()) == src_pos
    return exact / len(triples), hits / aligned


@pytest.fixture(scope="module")
def scores(steps):
    """teacher_forced_scores of every saved step on core.toy.evaluate's 1000 held-out sentences."""
    triples = toy_task.test_examples(1000, seed=12345)
    return {s: teacher_forced_scores(core.load_model("toy-translate", device="cpu", step=s), triples) for s in steps}


def test_every_saved_step_loads(steps):
    final = toy_steps.final_step()
    assert final == 2500 and steps == sorted(set(toy_steps.CHECKPOINT_STEPS) | {final})
    for s in steps:
        model = core.load_model("toy-translate", device="cpu", step=s)
        assert model.info["step"] == s and model.info["steps"] == steps
        stored = load_file(str(toy_steps.weights_file(TOY_DIR, s)))
        assert all(v.dtype == (torch.float32 if s == final else torch.float16) for v in stored.values())
        state = model.net.state_dict()
        for k, v in stored.items():  # float16 values are exact in float32
            assert torch.equal(state[k], v.float()), (s, k)
        trace = model.trace("the small dog sees the cat")
        assert trace["decoder.1.cross_attn.weights"].shape[-1] == 6
    size = sum(p.stat().st_size for p in (TOY_DIR / toy_steps.STEPS_DIR).iterdir()) + (TOY_DIR / "model.safetensors").stat().st_size
    print(f"checkpoints of {len(steps)} steps: {size / 1e6:.1f} MB")
    assert size <= 25e6


def test_final_step_is_the_shipped_model_bit_for_bit(steps):
    path = TOY_DIR / "model.safetensors"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHIPPED_SHA256
    final = core.load_model("toy-translate", device="cpu", step=steps[-1]).net.state_dict()
    default = core.load_model("toy-translate", device="cpu").net.state_dict()
    for k, v in load_file(str(path)).items():
        assert v.dtype == torch.float32
        assert torch.equal(final[k], v) and torch.equal(default[k], v), k


def test_alignment_from_chance_to_the_alignment(steps, scores):
    chance = toy_steps.chance_alignment(1000)
    first, last = scores[steps[0]][1], scores[steps[-1]][1]
    print(f"alignment accuracy of the guided head: chance {chance:.3f}, step 0 {first:.3f}, final {last:.3f}")
    assert steps[0] == 0 and abs(first - chance) < 0.05
    assert last >= 0.99


def test_exact_match_rises_over_the_saved_steps(steps, scores):
    seq = [scores[s][0] for s in steps]
    print("held-out exact match by step:", ", ".join(f"{s}: {e:.3f}" for s, e in zip(steps, seq)))
    assert seq[0] == 0.0 and seq[-1] >= 0.99
    assert all(b >= a - 0.005 for a, b in zip(seq, seq[1:])), seq  # rises (no drop beyond 5 sentences in 1000)
    assert len(set(seq)) >= 4  # through intermediate stages, not a jump


@pytest.mark.slow
def test_metrics_json_agrees_with_an_independent_scoring(steps, scores):
    """metrics.json (core.toy.evaluate: greedy decoding) against the teacher-forced scoring above,
    every step; and core.toy.evaluate itself re-run on the last step (its 1,000 greedy decodes
    are the test's cost: one step shows the file is that function's output)."""
    metrics = toy_steps.load_metrics()
    assert [r["step"] for r in metrics["steps"]] == steps and metrics["n_heldout"] == 1000
    for r in metrics["steps"]:
        em, al = scores[r["step"]]
        assert abs(r["exact_match"] - em) <= 0.002 and abs(r["alignment_accuracy"] - al) <= 0.002, (r["step"], em, al)
    losses = toy_steps.load_losses()
    assert len(losses["ce"]) == losses["steps"] == steps[-1]
    for r in metrics["steps"]:
        i = min(r["step"], steps[-1] - 1)
        assert r["train_loss"] == pytest.approx(losses["ce"][i] + 0.5 * losses["align"][i], abs=2e-6)
    for s in steps[-1:]:  # a trained step decodes fast (it stops at <end>)
        fresh = evaluate_toy(core.load_model("toy-translate", device="cpu", step=s), n=1000)
        row = next(r for r in metrics["steps"] if r["step"] == s)
        assert abs(row["exact_match"] - fresh["exact_match"]) <= 0.002
        assert abs(row["alignment_accuracy"] - fresh["alignment_accuracy"]) <= 0.002
        best = row["best_unsupervised"]
        acc = {(li, h): v for li in range(3) for h, v in enumerate(
            fresh["per_head"][f"decoder.{li}.cross_attn"][f"head{k}"] for k in range(4))}
        del acc[(1, 0)]
        assert acc[(best["layer"], best["head"])] >= max(acc.values()) - 0.002
    assert metrics["chance_alignment"] == round(toy_steps.chance_alignment(1000), 4)


def test_unknown_step_lists_the_available_ones(steps):
    for bad in (7, -1, "x", 99999):
        with pytest.raises(ValueError) as err:
            core.load_model("toy-translate", device="cpu", step=bad)
        assert ", ".join(str(s) for s in steps) in str(err.value)
    with pytest.raises(ValueError, match="only toy-translate"):
        core.load_model("random", step=0)


def test_cli_eval_at_a_step(capsys, steps):
    assert cli(["eval", "--model", "toy-translate", "--step", str(steps[1]), "--n", "50", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = evaluate_toy(core.load_model("toy-translate", device="cpu", step=steps[1]), n=50)
    assert out["step"] == steps[1] and out["exact_match"] == direct["exact_match"]
    assert out["alignment_accuracy"] == direct["alignment_accuracy"]
    assert cli(["eval", "--model", "toy-translate", "--step", "7"]) == 2
    assert "available steps: " + ", ".join(str(s) for s in steps) in capsys.readouterr().err


def test_chance_alignment_is_the_mean_inverse_length():
    triples = toy_task.test_examples(50, seed=3)
    words = [(len(s), sum(a >= 0 for a in al)) for s, _, al in triples]
    expected = sum(k / n for n, k in words) / sum(k for _, k in words)
    assert toy_steps.chance_alignment(50, seed=3) == pytest.approx(expected)


# ------------------------------------------------------------------ figures
def test_alignment_cells_and_hits_agree_with_evaluate():
    """viz.figures.training's outlined cells and argmax hits on one sentence = core.toy.evaluate's scoring."""
    model = core.load_model("toy-translate", device="cpu", step=0)
    s, y, a = toy_task.test_examples(1, seed=5)[0]
    trace = model.trace(" ".join(s), target=" ".join(y))
    w = trace["decoder.1.cross_attn.weights"][0]
    cells = tv.aligned_cells(len(trace.tokens("target")), a)
    assert cells == [(j, i) for j, i in enumerate(a) if i >= 0]
    hits, total = tv.argmax_hits(w, cells)
    independent = sum(int(w[j].argmax()) == a[j] for j in range(len(a)) if a[j] >= 0)
    assert (hits, total) == (independent, sum(i >= 0 for i in a))
    fig = tv.alignment_map(w, trace.tokens("target"), trace.tokens("source"), cells)
    boxes = [(round((sh.y0 + sh.y1) / 2), round((sh.x0 + sh.x1) / 2)) for sh in fig.layout.shapes if sh.name == "alignment"]
    assert boxes == cells
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float), w.numpy(), atol=1e-7)


def test_training_curve_marks_the_step():
    metrics, losses = toy_steps.load_metrics(), toy_steps.load_losses()
    fig = tv.training_curve(metrics, 200, losses)
    vlines = [sh for sh in fig.layout.shapes if sh.x0 == sh.x1]
    assert [v.x0 for v in vlines] == [200]
    by_name = {t.name: t for t in fig.data}
    em = by_name["held-out exact match"]
    assert list(em.x) == [r["step"] for r in metrics["steps"]] and list(em.y) == [r["exact_match"] for r in metrics["steps"]]
    loss = by_name["training loss (mean of 25 updates)"]
    total = np.asarray(losses["ce"]) + 0.5 * np.asarray(losses["align"])
    assert loss.y[100] == pytest.approx(total[76:101].mean())
