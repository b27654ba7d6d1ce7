"""core.analysis.token_ids reads a token given as an id or as one token's text, the same way for
patching, the lens and attribution: checked here against the bundled models' tokenizers read
directly (their encode, vocab and index)."""

import numpy as np
import pytest
import torch

import core.analysis as ca
from core.analysis.token_ids import input_token_id, output_token_id, token_id

DEVICE = "cpu"


def _plain_ids(tok, text):
    """The tokenizer's ids of `text` without the special tokens it adds ([CLS], [SEP])."""
    enc = tok.encode(text)
    return [i for i, sp in zip(enc.ids, enc.special) if not sp]


@pytest.fixture(scope="module", params=["toy", "minilm", "smollm2"])
def model(request):
    return request.getfixturevalue(request.param)


def test_ids_in_range_are_taken_as_given_and_others_refused(model):
    tok, v = model.target_tokenizer, len(model.target_tokenizer)
    for i in (0, 1, v - 1):
        for given in (i, np.int64(i), torch.tensor(i)):
            assert token_id(given, tok, v) == i and type(token_id(given, tok, v)) is int
    for bad in (-1, v, v + 1000):
        with pytest.raises(ValueError, match=rf"the target id {bad} is outside {model.name}'s vocabulary \(0 to {v - 1}\)"):
            token_id(bad, tok, v, model=model.name, what="target")


def test_every_display_form_reads_back_as_its_token(model):
    """The form the app shows every token in (tokenizer.vocab) gives that token back, or the
    first token shown the same way (byte pieces shown as the same hex)."""
    tok = model.target_tokenizer
    shown = tok.vocab
    for i in range(0, len(shown), max(1, len(shown) // 4000)):
        got = token_id(shown[i], tok, len(shown))
        assert shown[got] == shown[i] and got <= i, (i, shown[i], got)


@pytest.mark.parametrize("name, text", [("smollm2", " Paris"), ("smollm2", "Paris"), ("smollm2", " Mary"),
                                        ("minilm", "paris"), ("minilm", "Paris"), ("toy", "robi"), ("toy", "Robi")])
def test_a_one_token_string_is_the_tokenizers_token(request, name, text):
    """A string the tokenizer makes one (non-special) token of is that token."""
    m = request.getfixturevalue(name)
    ids = _plain_ids(m.target_tokenizer, text)
    assert len(ids) == 1
    assert output_token_id(m, text) == ids[0]


def test_a_display_form_the_tokenizer_would_split_is_still_found(smollm2):
    """A lone byte piece of an emoji is shown as hex (⟨f0 9f…⟩): typed or picked, that form is the
    piece, though encoding the hex text makes many tokens. The file's own spelling works too."""
    tok = smollm2.target_tokenizer
    emoji = _plain_ids(tok, "😀")
    assert len(emoji) > 1
    first = tok.token_str(emoji[0])
    assert first.startswith("⟨") and len(_plain_ids(tok, first)) > 1
    assert tok.vocab[output_token_id(smollm2, first)] == first
    assert output_token_id(smollm2, "ĠParis") == tok.index["ĠParis"] == _plain_ids(tok, " Paris")[0]


@pytest.mark.parametrize("name, text", [("smollm2", " Mary had a little lamb"), ("minilm", "the cat sat"),
                                        ("toy", "le leral robi")])
def test_a_string_of_several_tokens_names_its_pieces(request, name, text):
    m = request.getfixturevalue(name)
    tok = m.target_tokenizer
    ids = _plain_ids(tok, text)
    pieces = ", ".join(repr(tok.token_str(i)) for i in ids)
    with pytest.raises(ValueError) as err:
        output_token_id(m, text, "answer token")
    assert str(err.value).startswith(f"the answer token {text!r} is {len(ids)} tokens for {m.name} ({pieces}), not one")


def test_an_unknown_word_is_refused_not_read_as_unk(toy, minilm):
    for m, text in ((toy, "chat"), (minilm, "😀")):
        enc = m.target_tokenizer.encode(text)
        assert enc.unknown, "the tokenizer itself marks it unknown"
        with pytest.raises(ValueError, match=rf"the target token {text!r} is not in {m.name}'s vocabulary"):
            output_token_id(m, text, "target token")
    with pytest.raises(ValueError, match=r"2 tokens .* 'chien' is not in its vocabulary"):
        output_token_id(toy, "le chien")
    with pytest.raises(ValueError, match="is empty"):
        output_token_id(toy, "")


def test_the_vocab_size_and_the_tokenizers_own_errors():
    class Tok:
        vocab = ["a", "b", "c"]
        index = {"a": 0, "b": 1, "c": 2}

        def encode(self, text):
            raise ValueError("cannot read that")

    assert token_id("b", Tok(), 3) == 1
    with pytest.raises(ValueError, match=r"'c' is token 2 of the tokenizer, outside m's vocabulary \(0 to 1\)"):
        token_id("c", Tok(), 2, model="m")
    with pytest.raises(ValueError, match="'z' is not a token of m: cannot read that"):
        token_id("z", Tok(), 3, model="m")


def test_input_and_output_tokens_and_the_analyses_agree(smollm2, minilm, toy):
    """The three analyses read a token the same way: as token_id does."""
    assert input_token_id(smollm2, " the") == output_token_id(smollm2, " the") == _plain_ids(smollm2.tokenizer, " the")[0]
    assert input_token_id(minilm, "[PAD]") == minilm.tokenizer.index["[PAD]"]
    # toy-translate reads English and writes its own language: each side with its own tokenizer
    assert input_token_id(toy, "dog") == _plain_ids(toy.tokenizer, "dog")[0] != toy.tokenizer.index["<unk>"]
    assert output_token_id(toy, "robi") == toy.target_tokenizer.index["robi"]
    with pytest.raises(ValueError, match="not in toy-translate's vocabulary"):
        output_token_id(toy, "dog")
    tr = smollm2.trace("The capital of France is")
    paris = output_token_id(smollm2, " Paris")
    assert (ca.lens(tr, target=" Paris", positions=[-1]).target_id == paris).all()
    assert ca.logit_attribution(tr, " Paris").attrs["target_id"] == paris
    with pytest.raises(ValueError, match="the target token ' Paris France' is 2 tokens"):
        ca.logit_attribution(tr, " Paris France")
    with pytest.raises(ValueError, match="the baseline token ' Paris France' is 2 tokens"):
        ca.logit_attribution(tr, " Paris", baseline=" Paris France")
    with pytest.raises(ValueError, match="the target token ' Paris France' is 2 tokens"):
        ca.lens(tr, target=" Paris France")
