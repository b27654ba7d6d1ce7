"""viz.compare.figures: words found in traces (pieces included), cosines layer by layer checked
against torch.nn.functional.cosine_similarity on the trace tensors, attention from a word."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import core
from core import trace_names as tn
from core.trace import Trace
from viz.compare import figures as cmp

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here


def _available(name):
    if not core.MODELS[name].available():
        pytest.skip(f"{name}'s weight package is not installed")


def independent_cosines(ta, ia, tb, ib, stack):
    """Cosine per depth straight from the trace tensors (no viz code), pieces averaged."""
    names = [tn.embed(stack, "sum")] + [tn.out(stack, i) for i in range(ta.layers(stack))]
    return [F.cosine_similarity(ta[n][ia].mean(0), tb[n][ib].mean(0), dim=0).item() for n in names]


# ------------------------------------------------------------------ a hand-made trace
def fake_trace(tokens, word_ids, special, offsets, vectors, weights):
    n = len(tokens)
    vectors = torch.as_tensor(vectors, dtype=torch.float32)
    tensors = {"embed.encoder.tokens": vectors[0], "embed.encoder.sum": vectors[0], "encoder.0.out": vectors[1],
               "encoder.0.self_attn.weights": torch.as_tensor(weights, dtype=torch.float32)}
    assert tensors["encoder.0.self_attn.weights"].shape[-1] == n
    meta = {"word_ids": word_ids, "special": special, "offsets": offsets, "kind": "encoder",
            "config": {"positional": "learned"}}
    return Trace(tensors, {"source": tokens}, meta)


TEXT = "Big embeddings, big bank"
TOKENS = ["[CLS]", "big", "em", "##bed", "##ding", "##s", ",", "big", "bank", "[SEP]"]
WORD_IDS = [None, 0, 1, 1, 1, 1, 2, 3, 4, None]
SPECIAL = [True] + [False] * 8 + [True]
OFFSETS = [(0, 0), (0, 3), (4, 6), (6, 9), (9, 13), (13, 14), (14, 15), (16, 19), (20, 24), (0, 0)]


def test_words_of_a_trace_join_pieces_and_keep_specials_apart():
    n = len(TOKENS)
    tr = fake_trace(TOKENS, WORD_IDS, SPECIAL, OFFSETS, torch.randn(2, n, 4), torch.softmax(torch.randn(2, n, n), -1))
    words = cmp.sentence_words(tr, TEXT)
    assert [w.label for w in words] == ["[CLS]", "Big", "embeddings", ",", "big", "bank", "[SEP]"]
    assert [w.special for w in words] == [True, False, False, False, False, False, True]
    emb = cmp.occurrences(words, "Embeddings")  # matched case-insensitively
    assert len(emb) == 1 and emb[0].positions == [2, 3, 4, 5] and emb[0].pieces == ["em", "##bed", "##ding", "##s"]
    assert [w.positions for w in cmp.occurrences(words, "big")] == [[1], [7]]
    assert cmp.occurrences(words, "[CLS]") == [] and cmp.occurrences(words, "river") == []
    assert cmp.context_label(words, cmp.occurrences(words, "big")[1], width=1) == ", [big] bank"


def test_common_words_skip_punctuation_and_specials_and_keep_order():
    n = len(TOKENS)
    tr = fake_trace(TOKENS, WORD_IDS, SPECIAL, OFFSETS, torch.randn(2, n, 4), torch.softmax(torch.randn(2, n, n), -1))
    a = cmp.sentence_words(tr, TEXT)
    other = ["[CLS]", "a", "bank", ",", "em", "##bed", "##ding", "##s", "[SEP]"]
    tr_b = fake_trace(other, [None, 0, 1, 2, 3, 3, 3, 3, None], [True] + [False] * 7 + [True],
                      [(0, 0), (0, 1), (2, 6), (6, 7), (8, 10), (10, 13), (13, 17), (17, 18), (0, 0)],
                      torch.randn(2, 9, 4), torch.softmax(torch.randn(2, 9, 9), -1))
    b = cmp.sentence_words(tr_b, "A bank, embeddings")
    assert cmp.common_words(a, b) == ["embeddings", "bank"]
    assert cmp.normalize("  Café ") == "cafe"


def test_cosine_table_matches_torch_and_the_baseline_leaves_the_word_out():
    torch.manual_seed(0)
    n = len(TOKENS)
    va, vb = torch.randn(2, n, 6), torch.randn(2, n, 6)
    vb[0, 8] = 3 * va[0, 8]  # "bank" in B: the same direction at the input, a different one after layer 0
    w = torch.softmax(torch.randn(2, n, n), -1)
    ta = fake_trace(TOKENS, WORD_IDS, SPECIAL, OFFSETS, va, w)
    tb = fake_trace(TOKENS, WORD_IDS, SPECIAL, OFFSETS, vb, w)
    wa, wb = cmp.sentence_words(ta, TEXT), cmp.sentence_words(tb, TEXT)
    bank_a, bank_b = cmp.occurrences(wa, "bank")[0], cmp.occurrences(wb, "bank")[0]
    table = cmp.cosine_table(ta, bank_a, tb, bank_b, wb)
    assert table["trace name"].tolist() == ["embed.encoder.sum", "encoder.0.out"]
    assert table["where"].tolist() == ["embedding", "layer 0"]
    np.testing.assert_allclose(table["cosine"], independent_cosines(ta, [8], tb, [8], "encoder"), atol=1e-6)
    assert table["cosine"][0] == pytest.approx(1.0, abs=1e-6)
    others = [[1], [2, 3, 4, 5], [7]]  # Big, embeddings, big: not [CLS], ",", [SEP] or bank itself
    for depth, name in enumerate(table["trace name"]):
        expected = np.mean([F.cosine_similarity(ta[name][8], tb[name][p].mean(0), dim=0).item() for p in others])
        assert table["baseline"][depth] == pytest.approx(expected, abs=1e-6)
    # a word of several pieces is the mean of its pieces' vectors
    emb_a, emb_b = cmp.occurrences(wa, "embeddings")[0], cmp.occurrences(wb, "embeddings")[0]
    t2 = cmp.cosine_table(ta, emb_a, tb, emb_b)
    np.testing.assert_allclose(t2["cosine"], independent_cosines(ta, [2, 3, 4, 5], tb, [2, 3, 4, 5], "encoder"),
                               atol=1e-6)
    assert "baseline" not in t2


def test_attention_from_a_word_of_pieces():
    torch.manual_seed(1)
    n = len(TOKENS)
    w = torch.softmax(torch.randn(2, n, n), -1)
    tr = fake_trace(TOKENS, WORD_IDS, SPECIAL, OFFSETS, torch.randn(2, n, 4), w)
    words = cmp.sentence_words(tr, TEXT)
    emb = cmp.occurrences(words, "embeddings")[0]
    row, labels, hi = cmp.attention_from(tr, emb, 0, 1)
    np.testing.assert_allclose(row, w[1, 2:6].mean(0).numpy(), atol=1e-6)  # mean over the query pieces
    assert labels == TOKENS and hi == [2, 3, 4, 5]
    row_w, labels_w, hi_w = cmp.attention_from(tr, emb, 0, None, words)  # mean of heads, read in words
    m = w.mean(0)[2:6].mean(0)
    expected = [m[0], m[1], m[2:6].sum(), m[6], m[7], m[8], m[9]]
    np.testing.assert_allclose(row_w, torch.stack(expected).numpy(), atol=1e-6)
    assert row_w.sum() == pytest.approx(1.0, abs=1e-6)
    assert labels_w[2] == "embeddings" and hi_w == [2]
    assert [t for t, _ in cmp.top_attended(row_w, labels_w, skip=hi_w, k=2)] == \
        [labels_w[i] for i in np.argsort(-row_w) if i != 2][:2]


def test_markdown_escape():
    assert cmp.md_escape("*bank*") == r"\*bank\*"
    assert cmp.md_escape("[x](javascript:y) $a$") == r"\[x\]\(javascript\:y\) \$a\$"


# ------------------------------------------------------------------ real models
def test_minilm_bank_sentences(minilm):
    ta, tb = minilm.trace(cmp.BANK_A), minilm.trace(cmp.BANK_B)
    wa, wb = cmp.sentence_words(ta, cmp.BANK_A), cmp.sentence_words(tb, cmp.BANK_B)
    assert "bank" in cmp.common_words(wa, wb) and "river" not in cmp.common_words(wa, wb)
    bank_a, bank_b = cmp.occurrences(wa, "bank")[0], cmp.occurrences(wb, "bank")[0]
    assert ta.tokens("source")[bank_a.positions[0]] == "bank" == tb.tokens("source")[bank_b.positions[0]]
    table = cmp.cosine_table(ta, bank_a, tb, bank_b, wb)
    expected = independent_cosines(ta, bank_a.positions, tb, bank_b.positions, "encoder")
    assert len(table) == 7
    np.testing.assert_allclose(table["cosine"], expected, atol=1e-6)
    assert table["cosine"][0] == pytest.approx(1.0, abs=1e-6) and table["cosine"].iloc[-1] < 0.95
    assert "same position" in cmp.input_note(ta, bank_a, tb, bank_b, table["cosine"][0])
    # the two "the"s of sentence A are two occurrences
    assert len(cmp.occurrences(wa, "the")) == 2


def test_minilm_word_pieces(minilm):
    a, b = "Tokenization splits embeddings.", "Embeddings are vectors."
    ta, tb = minilm.trace(a), minilm.trace(b)
    wa, wb = cmp.sentence_words(ta, a), cmp.sentence_words(tb, b)
    emb_a, emb_b = cmp.occurrences(wa, "embeddings")[0], cmp.occurrences(wb, "embeddings")[0]
    assert len(emb_a.positions) > 1 and emb_a.pieces == emb_b.pieces and emb_b.label == "Embeddings"
    table = cmp.cosine_table(ta, emb_a, tb, emb_b)
    np.testing.assert_allclose(table["cosine"],
                               independent_cosines(ta, emb_a.positions, tb, emb_b.positions, "encoder"), atol=1e-6)
    note = cmp.input_note(ta, emb_a, tb, emb_b, table["cosine"][0])
    assert "different positions" in note and "token embeddings alone are identical" in note
    assert table["cosine"][0] < 1 - 1e-4
    assert cmp.token_embedding_cosine(ta, emb_a, tb, emb_b) == pytest.approx(1.0, abs=1e-6)


def test_toy_positions_and_stack(toy):
    a, b = "the bank", "the old bank"  # sinusoidal positions: "bank" at 1 and at 2
    ta, tb = toy.trace(a), toy.trace(b)
    assert cmp.stack_of(ta) == "encoder"
    wa, wb = cmp.sentence_words(ta, a), cmp.sentence_words(tb, b)
    bank_a, bank_b = cmp.occurrences(wa, "bank")[0], cmp.occurrences(wb, "bank")[0]
    table = cmp.cosine_table(ta, bank_a, tb, bank_b)
    np.testing.assert_allclose(table["cosine"], independent_cosines(ta, [1], tb, [2], "encoder"), atol=1e-6)
    assert len(table) == 1 + toy.config.n_layers
    assert table["cosine"][0] < 1 - 1e-4
    assert cmp.token_embedding_cosine(ta, bank_a, tb, bank_b) == pytest.approx(1.0, abs=1e-6)
    # the default toy pair puts "bank" at the same position: identical inputs
    ta, tb = toy.trace(cmp.TOY_A), toy.trace(cmp.TOY_B)
    bank_a = cmp.occurrences(cmp.sentence_words(ta, cmp.TOY_A), "bank")[0]
    bank_b = cmp.occurrences(cmp.sentence_words(tb, cmp.TOY_B), "bank")[0]
    assert cmp.cosine_table(ta, bank_a, tb, bank_b)["cosine"][0] == pytest.approx(1.0, abs=1e-6)
    assert ta.meta["unknown"] == [] and tb.meta["unknown"] == []


def test_smollm2_reads_the_decoder():
    _available("smollm2")
    model = core.load_model("smollm2", device="cpu")
    ta, tb = model.trace(cmp.BANK_A), model.trace(cmp.BANK_B)
    assert cmp.stack_of(ta) == "decoder"
    wa, wb = cmp.sentence_words(ta, cmp.BANK_A), cmp.sentence_words(tb, cmp.BANK_B)
    bank_a, bank_b = cmp.occurrences(wa, "bank")[0], cmp.occurrences(wb, "bank")[0]
    assert bank_a.label == " bank" and bank_a.key == "bank"  # byte-level BPE keeps the leading space
    table = cmp.cosine_table(ta, bank_a, tb, bank_b)
    assert table["trace name"].iloc[0] == "embed.decoder.sum" and table["trace name"].iloc[-1] == "decoder.29.out"
    np.testing.assert_allclose(table["cosine"],
                               independent_cosines(ta, bank_a.positions, tb, bank_b.positions, "decoder"), atol=1e-6)
    assert table["cosine"][0] == pytest.approx(1.0, abs=1e-6)
    assert "RoPE" in cmp.input_note(ta, bank_a, tb, bank_b, 1.0)
    row, labels, _ = cmp.attention_from(ta, bank_a, 3, 2)
    np.testing.assert_allclose(row, ta["decoder.3.self_attn.weights"][2, bank_a.positions[0]].numpy(), atol=1e-7)
    assert np.all(row[bank_a.positions[0] + 1:] == 0)  # causal: nothing after the word


def test_figures_carry_the_numbers():
    table = cmp.pd.DataFrame({"depth": [0, 1, 2], "where": ["embedding", "layer 0", "layer 1"],
                              "trace name": ["embed.encoder.sum", "encoder.0.out", "encoder.1.out"],
                              "cosine": [1.0, 0.9, 0.8], "baseline": [0.1, 0.2, 0.3]})
    fig = cmp.cosine_figure(table, "<b>bank</b>", mark_layer=0)
    assert list(fig.data[0].y) == [1.0, 0.9, 0.8] and list(fig.data[1].y) == [0.1, 0.2, 0.3]
    assert "<b>" not in fig.data[0].name  # markup in user text is escaped
    bar = cmp.attention_bar([0.2, 0.5, 0.3], ["a", "<unk>", "a"], highlight=[1])
    assert list(bar.data[0].y) == [0.2, 0.5, 0.3] and list(bar.layout.xaxis.ticktext) == ["a", "&lt;unk&gt;", "a"]
    assert bar.data[0].marker.color[1] == cmp.WORD_COLOUR and bar.data[0].marker.color[0] == cmp.OTHER_COLOUR
