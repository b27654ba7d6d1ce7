"""The recall task's sequences: every query key's answer is the value that followed the same key in
the context, the targets sit at the query keys only, and a seed gives the same sequences."""

import random

import torch

from core.toy import recall_task as rt


def test_every_query_answers_from_its_context_key():
    rng = random.Random(3)
    for n in (1, 5, 16):
        ex = rt.make_example(n, rng)
        assert len(ex.tokens) == 4 * n
        assert len(set(ex.tokens[0:2 * n:2])) == n  # distinct keys
        for q, k, a in zip(ex.query_positions, ex.answer_key_positions, ex.answers):
            assert ex.tokens[q] == ex.tokens[k] and k < 2 * n <= q
            assert ex.tokens[k + 1] == a == ex.tokens[q + 1]


def test_targets_only_at_query_keys():
    ids, tgt = rt.batch(6, 4, random.Random(0))
    on = tgt != -100
    assert on.sum(1).tolist() == [6] * 4
    assert bool((on[:, :12] == 0).all())  # nothing is asked inside the context
    rows, cols = torch.nonzero(on, as_tuple=True)
    assert torch.equal(tgt[rows, cols], ids[rows, cols + 1])


def test_accuracy_counts_right_answers_and_is_seeded():
    index = {w: i for i, w in enumerate(rt.vocab())}

    def oracle(ids):  # looks the key up in the context: always right
        out = torch.zeros(*ids.shape, len(index))
        for b in range(ids.shape[0]):
            row = ids[b].tolist()
            for p in range(len(row) // 2, len(row), 2):
                out[b, p, row[row.index(row[p]) + 1]] = 1
        return out

    def first_value(ids):  # answers every query with the first value seen: right only by chance
        out = torch.zeros(*ids.shape, len(index))
        out[:, :, ids[0, 1]] = 1
        return out

    assert rt.accuracy(oracle, 8, 32, seed=1) == 1.0
    assert rt.accuracy(first_value, 8, 32, seed=1) < 0.5
    a, b = rt.batch(4, 3, random.Random(7)), rt.batch(4, 3, random.Random(7))
    assert torch.equal(a[0], b[0])


def test_the_pages_words_follow_the_curves():
    """The sentence Start here and the Playground print under the curves is read from the numbers:
    a curve that stays at or above the threshold holds, one that drops says from where to where."""
    from viz.figures.recall import curve_words

    words = curve_words({"mamba2": {2: 1.0, 16: 0.62, 8: 0.8}, "softmax": {2: 1.0, 16: 0.995}})
    assert words == ("softmax attention holds (99.5% at 16 pairs); "
                     "Mamba2 falls from 100.0% at 2 pairs to 62.0% at 16.")
    assert curve_words({"gated_delta": {2: 0.99, 4: 0.98}}, hold=0.95) == "Gated DeltaNet holds (98.0% at 4 pairs)."
    assert curve_words({}) == ""


def test_the_training_script_writes_what_the_loader_reads(tmp_path):
    """core.cli.train_recall, a few steps per mixer: each folder holds safetensors, its config and
    its metrics (the steps it ran, the held-out curve over PAIR_COUNTS); load_recall reads it back
    to the same weights; without --steps each mixer gets the recipe's own (STEPS)."""
    from safetensors.torch import load_file

    from core.cli import train_recall
    from core.toy import recall_model

    done = train_recall.main(["--mixers", "softmax,mamba2", "--steps", "2", "--out", str(tmp_path)])
    assert set(done) == {"softmax", "mamba2"}
    for mixer, meta in done.items():
        assert meta["steps"] == 2
        assert [int(k) for k in meta["accuracy"]] == list(rt.PAIR_COUNTS)
        assert all(0.0 <= a <= 1.0 for a in meta["accuracy"].values())
        model = recall_model.load_recall(mixer, device="cpu", folder=tmp_path)
        assert model.info["steps"] == 2 and model.net.cfg.max_len == 4 * rt.MAX_PAIRS
        saved = load_file(str(tmp_path / mixer / "model.safetensors"))
        assert all(torch.equal(saved[k], v) for k, v in model.net.state_dict().items())
    assert train_recall.STEPS["softmax"] < train_recall.STEPS["gated_delta"] == train_recall.STEPS["mamba2"]
