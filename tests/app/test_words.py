"""core.tokens.words: word pieces merged back into typed words (SUM over keys, MEAN over queries)."""

import pytest
import torch

from core.tokens.words import merge_attention, trace_words, word_attention, word_groups, word_labels

# [CLS] play ##ing football [SEP]  ->  words: [CLS] | playing | football | [SEP]
WORD_IDS = [None, 0, 0, 1, None]
TOKENS = ["[CLS]", "play", "##ing", "football", "[SEP]"]
TEXT = "Playing football"
OFFSETS = [(0, 0), (0, 4), (4, 7), (8, 16), (0, 0)]


def test_groups_keep_specials_apart_and_join_pieces():
    assert word_groups(WORD_IDS) == [[0], [1, 2], [3], [4]]
    # positions past the metadata (padding added by pad_to) are their own groups
    assert word_groups(WORD_IDS, n=7) == [[0], [1, 2], [3], [4], [5], [6]]
    # a token marked special is alone even if it carries a word id
    assert word_groups([0, 0, 1], special=[True, False, False]) == [[0], [1], [2]]


def test_hand_computed_example():
    a = torch.tensor(
        [
            [0.10, 0.20, 0.30, 0.40, 0.00],
            [0.00, 0.50, 0.25, 0.25, 0.00],
            [0.20, 0.20, 0.20, 0.20, 0.20],
            [0.60, 0.10, 0.10, 0.10, 0.10],
            [0.25, 0.25, 0.00, 0.00, 0.50],
        ]
    )
    w = word_attention(a, WORD_IDS)
    # rows: [CLS]; mean of rows 1, 2 ("playing"); "football"; [SEP]
    # columns: [CLS]; sum of cols 1, 2; "football"; [SEP]
    expected = torch.tensor(
        [
            [0.10, 0.50, 0.40, 0.00],
            [(0.00 + 0.20) / 2, (0.75 + 0.40) / 2, (0.25 + 0.20) / 2, (0.00 + 0.20) / 2],
            [0.60, 0.20, 0.10, 0.10],
            [0.25, 0.25, 0.00, 0.50],
        ]
    )
    assert w.shape == (4, 4)
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(w.sum(-1), torch.ones(4))


def test_rows_still_sum_to_one_for_all_heads():
    torch.manual_seed(0)
    word_ids = [None, 0, 0, 0, 1, 2, 2, 3, None]
    a = torch.softmax(torch.randn(12, 9, 9), dim=-1)
    w = word_attention(a, word_ids)
    assert w.shape == (12, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(12, 6))
    # the total attention mass is the mean over each word's query pieces: column sums differ
    assert not torch.allclose(w.sum(-2), torch.ones(12, 6))


def test_cross_attention_with_different_query_and_key_words():
    a = torch.softmax(torch.randn(3, 4, 5), dim=-1)  # H x n_q x n_k
    q_groups = word_groups([None, 0, 0, 1])
    k_groups = word_groups([None, 0, 1, 1, None])
    w = merge_attention(a, q_groups, k_groups)
    assert w.shape == (3, 3, 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 3))
    torch.testing.assert_close(w[:, 1, 2], (a[:, 1, 2] + a[:, 1, 3] + a[:, 2, 2] + a[:, 2, 3]) / 2)


def test_groups_must_cover_every_position_once():
    a = torch.eye(3)
    with pytest.raises(ValueError):
        merge_attention(a, [[0], [1]])
    with pytest.raises(ValueError):
        merge_attention(a, [[0, 1], [1, 2]])


def test_labels_from_offsets_or_pieces():
    groups = word_groups(WORD_IDS)
    assert word_labels(groups, TOKENS, OFFSETS, TEXT) == ["[CLS]", "Playing", "football", "[SEP]"]
    assert word_labels(groups, TOKENS) == ["[CLS]", "playing", "football", "[SEP]"]


def test_trace_words_reads_the_trace_metadata():
    class FakeTrace:
        meta = {"word_ids": WORD_IDS, "special": [True, False, False, False, True], "offsets": OFFSETS}

        def tokens(self, which="source"):
            return list(TOKENS)

    groups, labels = trace_words(FakeTrace(), TEXT)
    assert groups == [[0], [1, 2], [3], [4]]
    assert labels == ["[CLS]", "Playing", "football", "[SEP]"]
