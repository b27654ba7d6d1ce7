"""One token, typed or given by id, as a token id: what patching's answer and wrong tokens, the
lens's target and baseline and attribution's target, contrast and baseline tokens are read with.

    token_id(" Paris", tokenizer, vocab_size, model="smollm2", what="target")

An int (or anything with __index__, a numpy or torch integer) is an id: it must lie in
0 .. vocab_size - 1 (a bool or a float is refused, core/analysis/_checks.py). A string is looked up, in this order:
  1. its display form, as the app shows tokens (tokenizer.vocab: " Paris", "<|endoftext|>"),
     so a token picked from a top-k list or copied from a token chip is read back as that token;
  2. the tokenizer file's own spelling (tokenizer.index: "ĠParis", "▁Paris", "##ing");
  3. the tokenizer's encoding of it, which must be exactly one token (added special tokens
     such as [CLS] not counted) and not the unknown token.
Anything else is a ValueError whose message names the field (`what`), the model and, for a
string of several tokens, its pieces. `output_token_id` and `input_token_id` choose the
tokenizer and the vocabulary of a model's output (the token it predicts) and of its input (the
token whose embedding it reads).
"""

from __future__ import annotations

from typing import Dict, Union

from . import _checks as checks

Token = Union[str, int]


def display_index(tokenizer) -> Dict[str, int]:
    """Display form -> id (the first id where two share one), built once per tokenizer."""
    index = getattr(tokenizer, "_display_index", None)
    if index is None:
        index = {}
        for i, v in enumerate(getattr(tokenizer, "vocab", None) or []):
            index.setdefault(v, i)
        try:
            tokenizer._display_index = index
        except AttributeError:  # a tokenizer that takes no new attributes: built again next time
            pass
    return index


def token_id(token: Token, tokenizer, vocab_size: int, *, model: str = "the model", what: str = "token") -> int:
    """The id of `token` (module docstring) in a vocabulary of `vocab_size` ids; `model` and
    `what` (the field: "target", "answer"...) name it in the error messages."""
    vocab_size = int(vocab_size)
    if not isinstance(token, str):  # an id: a whole number (not True, not 3.0)
        if isinstance(token, float) or token is None or not hasattr(token, "__index__"):
            raise ValueError(f"the {what} must be a token (a string) or its id (a whole number), "
                             f"not {checks.shown(token)}")
        i = checks.whole(token, f"the {what} id")
        if not 0 <= i < vocab_size:
            raise ValueError(f"the {what} id {checks.shown(token)} is outside {model}'s vocabulary "
                             f"(0 to {vocab_size - 1})")
        return i
    s = str(token)
    if not s:
        raise ValueError(f"the {what} is empty: type one token (a leading space often belongs to it)")
    for index in (display_index(tokenizer), getattr(tokenizer, "index", None) or {}):
        if s in index:
            return _in_vocab(int(index[s]), s, vocab_size, model, what)
    try:
        enc = tokenizer.encode(s)
    except Exception as e:  # a tokenizer's own complaint about the string
        raise ValueError(f"the {what} {s!r} is not a token of {model}: {e}") from None
    ids = [i for i, sp in zip(enc.ids, enc.special) if not sp] if len(enc.special) == len(enc.ids) else list(enc.ids)
    unknown = ", ".join(repr(u) for u in enc.unknown)
    if len(ids) != 1:
        pieces = ", ".join(repr(tokenizer.token_str(i)) for i in ids) or "none"
        raise ValueError(f"the {what} {s!r} is {len(ids)} tokens for {model} ({pieces}), not one: type a single "
                         "token (a leading space often belongs to it)"
                         + (f"; {unknown} {'is' if len(enc.unknown) == 1 else 'are'} not in its vocabulary"
                            if unknown else ""))
    if enc.unknown:
        raise ValueError(f"the {what} {s!r} is not in {model}'s vocabulary")
    return _in_vocab(int(ids[0]), s, vocab_size, model, what)


def _in_vocab(i: int, s: str, vocab_size: int, model: str, what: str) -> int:
    if not 0 <= i < vocab_size:  # a tokenizer larger than the model's embedding
        raise ValueError(f"the {what} {s!r} is token {i} of the tokenizer, outside {model}'s vocabulary "
                         f"(0 to {vocab_size - 1})")
    return i


def output_vocab(model) -> int:
    """The size of the vocabulary a model predicts (a decoder's, or an encoder's masked-LM head's)."""
    cfg = model.config
    return int(cfg.tgt_vocab_size if cfg.has_decoder else cfg.src_vocab_size)


def input_vocab(model) -> int:
    """The size of the vocabulary a model reads the text with: the embedding of the stack that
    reads it (the encoder's, a decoder alone's own)."""
    cfg = model.config
    return int(cfg.tgt_vocab_size if model.kind == "decoder" else cfg.src_vocab_size)


def output_token_id(model, token: Token, what: str = "token") -> int:
    """A token the model predicts: the target tokenizer, the output vocabulary."""
    return token_id(token, model.target_tokenizer, output_vocab(model), model=model.name, what=what)


def input_token_id(model, token: Token, what: str = "token") -> int:
    """A token the model reads: the (source) tokenizer, the input vocabulary."""
    return token_id(token, model.tokenizer, input_vocab(model), model=model.name, what=what)
