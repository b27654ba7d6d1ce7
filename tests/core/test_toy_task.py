import random

import pytest

from core.toy import toy_task as tt


def test_vocabularies():
    src, tgt = tt.source_vocab(), tt.target_vocab()
    assert src[:4] == tgt[:4] == ["<pad>", "<unk>", "<start>", "<end>"] == tt.SPECIALS
    assert len(src) - 4 >= 110 and len(src) == len(set(src)) and src == tt.source_vocab()
    assert src[4:] == sorted(src[4:]) and tgt[4:] == sorted(tgt[4:])
    assert len(tgt) == len(set(tgt)) == len(src)  # one distinct target word per source word
    assert not set(tgt[4:]) & set(src[4:])
    for w in "bank river money cash show me the help dog cat small sees".split():
        assert w in tt.LEXICON
    assert len(tt.ADJ) >= 25 and len(tt.NOUN) >= 35 and len(tt.VT) >= 20


def test_sample_is_deterministic():
    a = [tt.sample(random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    assert tt.train_examples(50, seed=3) == tt.train_examples(50, seed=3)
    assert tt.train_examples(50, seed=3) != tt.train_examples(50, seed=4)
    assert tt.test_examples(20, seed=1) == tt.test_examples(20, seed=1)


def test_samples_are_consistent():
    rng, tgt_vocab = random.Random(0), set(tt.target_vocab())
    lengths = set()
    for _ in range(3000):
        src, tgt, align = tt.sample(rng)
        lengths.add(len(src))
        assert tt.MIN_LEN <= len(src) <= tt.MAX_LEN
        assert all(w in tgt_vocab for w in tgt)
        assert len(tgt) == len(align)
        assert sum(a >= 0 for a in align) >= 0.9 * len(tgt)
        assert sorted(align) == list(range(len(src)))  # a permutation: every word aligned once
        for t, a in zip(tgt, align):
            assert tt.LEXICON[src[a]] == t
        assert tt.translate(src) == (tgt, align)
    assert lengths == set(range(tt.MIN_LEN, tt.MAX_LEN + 1))


def test_reordering_hand_checked():
    src = "the small dog sees the cat".split()
    tgt, align = tt.translate(src)
    assert tgt == ["le", "leral", "robi", "le", "bevin", "belmo"]  # the dog small the cat sees
    assert align == [0, 2, 1, 4, 5, 3]
    assert tgt.index(tt.LEXICON["small"]) == tgt.index(tt.LEXICON["dog"]) + 1  # adjective after noun
    assert tgt[-1] == tt.LEXICON["sees"]  # verb last

    # two adjectives mirror, the PP becomes a postposition before the adverb and the verb
    src = "the big red ball falls quickly under the table".split()
    tgt, align = tt.translate(src)
    assert [src[a] for a in align] == "the ball red big the table under quickly falls".split()

    src = "show me the money".split()
    assert [src[a] for a in tt.translate(src)[1]] == "me the money show".split()

    src = "the cat sleeps and the dog runs".split()  # each clause is verb-final, order kept
    assert [src[a] for a in tt.translate(src)[1]] == "the cat sleeps and the dog runs".split()


def test_examples_translate():
    assert "the small dog sees the cat" in tt.EXAMPLES and len(tt.EXAMPLES) >= 6
    for s in tt.EXAMPLES:
        src = s.split()
        assert tt.MIN_LEN <= len(src) <= tt.MAX_LEN and " ".join(src) == s
        tgt, align = tt.translate(src)
        assert [tt.LEXICON[src[a]] for a in align] == tgt


def test_split_is_disjoint_and_stable():
    train = {" ".join(s) for s, _, _ in tt.train_examples(3000, seed=0)}
    test = tt.test_examples()
    keys = [" ".join(s) for s, _, _ in test]
    assert len(test) == 1000 and len(set(keys)) == 1000
    assert all(tt.is_test(s) for s, _, _ in test)
    assert not any(tt.is_test(s.split()) for s in train)
    assert not train & set(keys)
    rng = random.Random(99)
    frac = sum(tt.is_test(tt.sample(rng)[0]) for _ in range(4000)) / 4000
    assert 0.03 < frac < 0.07
    assert tt.is_test("the small dog sees the cat".split()) == tt.is_test(["the", "small", "dog", "sees", "the", "cat"])


def test_sentence_space_is_huge():
    assert tt.n_sentences() > 10**8
    assert tt.n_sentences(max_len=3) == len(set(_all_three_word_sentences()))


def _all_three_word_sentences():
    # brute force over short structures to cross-check n_sentences(max_len=3)
    out = []
    np2 = [[d, n] for d in tt.DET for n in tt.NOUN]
    for v in tt.VI:
        out += [s + [v] for s in np2]
        out += [[p, v, a] for p in tt.SUBJ_PRON for a in tt.ADV]
    out += [[p, v, o] for p in tt.SUBJ_PRON for v in tt.VT for o in tt.OBJ_PRON]
    out += [[v] + s for v in tt.IMP1 + tt.IMP2 for s in np2]
    out += [[v, o, a] for v in tt.IMP1 for o in tt.OBJ_PRON for a in tt.ADV]
    for s in out:
        tt.translate(s)  # all parse
    return [" ".join(s) for s in out]


@pytest.mark.parametrize("bad", [
    [], ["the"], ["the", "dog"], "the dog sees".split(), "dog sees the cat".split(),
    "the small sees the cat".split(), "the dog sees the cat the".split(),
    "the dog flies".split(), "sees the dog the cat".split(), "the dog sleeps the cat".split(),
    "the dog sleeps and".split(), "help".split(), "show me me the cat".split(),
    "the dog sleeps near".split(), ["The", "dog", "sleeps"],
])
def test_translate_rejects_garbage(bad):
    with pytest.raises(ValueError):
        tt.translate(bad)
