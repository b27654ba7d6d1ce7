"""AttentionModel.steps on toy-translate: each step is the decoder on a prefix, and it agrees with
teacher forcing on the same prefix and with the batched greedy decoding that `python -m core eval`
scores.

Step t (from 1) runs the decoder on <start> y_1 .. y_{t-1} and chooses y_t. Under teacher forcing
on the generated target the decoder sees <start> y_1 .. y_k at once; the look-ahead mask makes its
first t rows the same computation as step t, so both the step (a view of one traced pass) and those
rows must agree to float precision with the decoder run on the step's prefix alone, in its own pass. None of these
tests depends on what the checkpoint translates to, only on the decoding being consistent.
"""

import pytest
import torch

import core
from core import trace_names as tn
from core.toy import toy_task

TOL = 1e-5
EXAMPLE = "the small dog sees the cat"


@pytest.fixture(scope="module")
def model():
    return core.load_model("toy-translate", device="cpu")


def sentences():
    return [EXAMPLE] + [" ".join(src) for src, _, _ in toy_task.test_examples(6)]


@pytest.fixture(scope="module")
def runs(model):
    """(text, steps, teacher-forced trace on the generated target) per sentence."""
    out = []
    for text in sentences():
        steps = model.steps(text)
        gen = [s.meta["chosen"] for s in steps]
        body = gen[:-1] if steps[-1].meta["ended"] else gen
        full = model.trace(text, target=" ".join(body))
        out.append((text, steps, full))
    return out


def test_step_metadata_counts_from_one(runs):
    for text, steps, _ in runs:
        n = len(steps)
        assert n >= 1, text
        assert [s.meta["step"] for s in steps] == list(range(1, n + 1))
        for s in steps:
            assert s.meta["n_steps"] == n
            assert s.meta["prefix_len"] == 1  # <start>
            assert s.meta["mode"] == "step"
            # step t runs on t decoder inputs: <start> y_1 .. y_{t-1}
            assert len(s.tokens("target")) == s.meta["step"]
            assert s.tokens("target")[0] == "<start>"


def test_each_step_appends_the_previous_choice(runs):
    for text, steps, _ in runs:
        for prev, cur in zip(steps, steps[1:]):
            assert cur.tokens("target") == prev.tokens("target") + [prev.meta["chosen"]], text


def test_each_step_equals_its_prefix_run_alone(model, runs):
    """Self-attention weights, cross-attention weights and logits of step t (a view of the steps'
    one pass), and the first t rows of the teacher-forced pass on the generated target, equal the
    decoder run on step t's prefix alone, in a forward pass of its own."""
    for text, steps, full in runs:
        assert full.meta["mode"] == "teacher-forcing"
        n_layers = full.layers("decoder")
        assert n_layers >= 1
        for s in steps:
            n = len(s.tokens("target"))
            assert full.tokens("target")[:n] == s.tokens("target"), text
            alone = model.trace_decoder_input(text, s.meta["target_ids"])
            assert alone.tokens("target") == s.tokens("target") and alone.meta["target_ids"] == s.meta["target_ids"]
            for i in range(n_layers):
                for kind in ("self_attn", "cross_attn"):
                    name = f"decoder.{i}.{kind}.weights"
                    ref = alone[name]
                    assert ref.shape[1] == n, (text, name)
                    for got in (s[name], full[name][:, :n, :] if kind == "cross_attn" else full[name][:, :n, :n]):
                        assert got.shape == ref.shape, (text, name)
                        assert torch.allclose(got, ref, atol=TOL, rtol=0), (text, s.meta["step"], name,
                                                                            float((got - ref).abs().max()))
                # beyond the prefix, the teacher-forced rows put exactly zero weight (masked)
                assert torch.all(full[tn.self_attn("decoder", i, "weights")][:, :n, n:] == 0)
            # logits reach |20|: float32 keeps ~7 digits, so compare relative to their scale
            scale = float(alone["logits"].abs().max())
            for got in (s["logits"], full["logits"][:n]):
                diff = float((got - alone["logits"]).abs().max())
                assert diff <= TOL * max(1.0, scale), (text, s.meta["step"], diff, scale)
            assert int(alone["logits"][-1].argmax()) == s.meta["chosen_id"]


def test_greedy_trace_is_teacher_forcing_on_its_own_output(model, runs):
    """model.trace(text) (greedy) has the same decoder input and logits as the explicit target."""
    for text, steps, full in runs[:3]:
        greedy = model.trace(text)
        assert greedy.meta["mode"] == "greedy"
        assert greedy.tokens("target") == full.tokens("target")
        assert torch.allclose(greedy["logits"], full["logits"], atol=TOL, rtol=0)


def test_masked_weights_exactly_zero_above_diagonal(runs):
    for text, steps, _ in runs:
        for s in steps:
            n = len(s.tokens("target"))
            above = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
            for i in range(s.layers("decoder")):
                mask = s[tn.self_attn("decoder", i, "mask")]
                assert mask.shape == (n, n)
                assert torch.all(torch.isneginf(mask[above]))
                assert torch.all(mask[~above] == 0)
                masked = s[tn.self_attn("decoder", i, "masked")]
                assert torch.all(torch.isneginf(masked[:, above]))
                assert torch.all(torch.isfinite(masked[:, ~above]))
                w = s[tn.self_attn("decoder", i, "weights")]
                assert torch.all(w[:, above] == 0), (text, s.meta["step"], i)  # exactly 0, not just small
                assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)


def test_chosen_token_is_argmax_of_last_row(model, runs):
    for text, steps, _ in runs:
        for s in steps:
            last = s["logits"][-1]
            assert int(last.argmax()) == s.meta["chosen_id"]
            assert model.target_strings([s.meta["chosen_id"]])[0] == s.meta["chosen"]
            assert s.tokens("next")[0] == s.meta["chosen"]
            p = s["next.probs"]
            assert torch.all(p[:-1] >= p[1:])  # top-k, best first
            assert torch.allclose(p[0], torch.softmax(last, -1).max(), atol=1e-6)


def test_steps_match_batched_greedy_decoding(model, runs):
    """The steps' tokens are exactly what core eval's greedy_batch decodes (one sentence and all at once)."""
    texts = [t for t, _, _ in runs]
    batched = model.greedy_batch(texts)
    for (text, steps, _), together in zip(runs, batched):
        gen = [s.meta["chosen"] for s in steps]
        out = gen[:-1] if steps[-1].meta["ended"] else gen
        alone = model.greedy_batch([text])[0]
        assert out == alone, text
        assert out == together, text
        assert model.generate(text)[0] == out


def test_generation_ends_with_end_token(model, runs):
    for text, steps, _ in runs:
        last = steps[-1]
        assert last.meta["ended"] is True, f"{text!r} ran to the maximum length"
        assert last.meta["chosen"] == "<end>"
        assert last.meta["chosen_id"] == model.end_id
        assert all(s.meta["chosen"] != "<end>" for s in steps[:-1])
        assert len(steps) <= model.max_new_tokens


def test_maximum_length_stops_without_end(model):
    full = model.steps(EXAMPLE)
    assert len(full) >= 3
    cut = model.steps(EXAMPLE, max_new_tokens=2)
    assert len(cut) == 2
    assert all(s.meta["ended"] is False and s.meta["n_steps"] == 2 for s in cut)
    assert [s.meta["chosen"] for s in cut] == [s.meta["chosen"] for s in full[:2]]
    for a, b in zip(cut, full):  # views of passes of different lengths: the same rows, to float rounding
        assert torch.allclose(a["decoder.0.self_attn.weights"], b["decoder.0.self_attn.weights"], atol=1e-6, rtol=0)


def test_steps_reject_empty_text(model):
    with pytest.raises(core.InputError):
        model.steps("   ")
