"""The lecture notes the app follows, named for a reader.

The notes are five texts (the project keeps them as seeds/000_*.txt ... 004_*.txt, each
beginning with its title). The app cites them by a short name, never by file number: the
word "seed" is kept for random seeds. NOTES lists them in one place (the Lecture notes page).
"""

from __future__ import annotations

from dataclasses import dataclass
import re
from typing import Dict, List


@dataclass(frozen=True)
class Notes:
    number: str  # the file's number in the project's notes folder
    short: str  # how the pages cite them
    title: str  # the title the file begins with
    author: str
    covers: str  # what the app takes from them


NOTES: Dict[str, Notes] = {n.number: n for n in [
    Notes("000", "Bishop ch. 12", "Deep Learning – Foundations and Concepts, Chapter 12: Transformers",
          "notes on C. M. Bishop & H. Bishop's book, by nonlineark (GitHub), March 2025",
          "the “bank” sentences, attention as soft dictionary look-up, tokens as rows"),
    Notes("001", "Chapter 9", "Chapter 9: Transformers", "author not named in the notes",
          "cosine similarity of word vectors (eq. 9.1), post-norm blocks"),
    Notes("002", "Lecture 10", "Lecture 10: Transformer", "author not named in the notes",
          "matrix forms with tokens as columns, masked self-attention and cross-attention"),
    Notes("003", "Transformers handout", "Transformers", "author not named in the notes",
          "the “help me!” example worked by hand, the look-ahead mask B, inference from <start> to <end>"),
    Notes("004", "Missaoui", "Attention and Transformers", "Oualid Missaoui",
          "why scores are scaled by 1/√d_k, positional encodings, the cost of attention"),
]}


@dataclass(frozen=True)
class Concept:
    notes: str  # the number of the notes that teach it
    idea: str
    page: str  # the registry key of the page that shows it (viz/ui/registry.py)
    model: str
    text: str  # the example it opens on
    params: tuple = ()  # more URL values: (name, value) pairs


RIVER = "I swam across the river to get to the other bank."
CASH = "I walked across the road to get cash from the bank."
TOY = "the small dog sees the cat"
IOI = "When Mary and John went to the store, John gave a drink to"

# Each concept of the notes (the map in the notes' own order), the page that shows it on a
# sentence, and the example and model it opens with (English sentences on minilm or smollm2:
# toy-translate reads only its own small vocabulary).
CONCEPTS: List[Concept] = [
    Concept("000", "attention as a weighted sum: a_nm ≥ 0, each row sums to 1", "explore", "minilm", RIVER),
    Concept("000", "the “bank” example: one word, two meanings, two attention rows", "compare", "minilm", RIVER,
            (("text2", CASH), ("word", "bank"))),
    Concept("000", "parameter-free self-attention Y = softmax(X Xᵀ) X", "playground", "toy-translate", TOY,
            (("tab", "free"),)),
    Concept("001", "cosine similarity of word vectors (eq. 9.1)", "compare", "minilm", RIVER, (("text2", CASH),)),
    Concept("001", "queries, keys and values; scores scaled by 1/√d_k; softmax", "inside", "toy-translate", TOY),
    Concept("001", "the post-norm block: LayerNorm(x + attention), then the FFN", "inside", "toy-translate", TOY),
    Concept("001", "hyper-parameters d, d_k, m, H, L: a model's shapes and parameters", "playground", "toy-translate",
            TOY, (("tab", "sizes"),)),
    Concept("002", "tokens as columns: Z = V softmax(Qᵀ K / √p)", "inside", "toy-translate", TOY,
            (("notation", "cols"),)),
    Concept("002", "masked self-attention: M(i, j) = −∞ for j > i", "decoder", "toy-translate", TOY),
    Concept("002", "cross-attention: queries from the decoder, keys and values from the encoder", "explore",
            "toy-translate", TOY, (("attn", "decoder.cross_attn"),)),
    Concept("002", "the sinusoidal positional encoding and its picture", "positions", "toy-translate", TOY),
    Concept("003", "“Show me the money” with d = 4, computed in radians", "positions", "toy-translate",
            "Show me the money"),
    Concept("003", "“help me!” by hand: scores 6 and 4, scaled by 1/√16, softmax", "playground", "toy-translate", TOY,
            (("tab", "hand"),)),
    Concept("003", "inference from <start> to <end>, greedy, and teacher forcing with B", "decoder", "toy-translate",
            TOY),
    Concept("003", "multi-head attention: Concat(h_1..h_h) W^O", "explore", "toy-translate", TOY,
            (("tab", "model"),)),
    Concept("004", "the symmetric first attempt softmax(X U Uᵀ Xᵀ) and why W_q differs from W_k", "playground",
            "toy-translate", TOY, (("tab", "symmetric"),)),
    Concept("004", "why scores are scaled: Var(q·k) = d_k and the softmax saturates", "playground", "toy-translate",
            TOY, (("tab", "scale"),)),
    Concept("004", "the cost of attention, O(N² D) + O(N D²), measured", "playground", "toy-translate", TOY,
            (("tab", "cost"),)),
    Concept("004", "beyond the notes: heads that copy earlier matches (induction)", "heads", "smollm2", IOI),
]


def cite(number: str) -> str:
    return NOTES[number].short


def possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


def cite_list(numbers: List[str]) -> str:
    names = [cite(n) for n in numbers]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


_NUM = r"00[0-4]"


def cite_text(text: str) -> str:
    """Text that cites the notes by file number ("seed 003 eq. 18", "seeds 001/003") with the
    short names instead; any other "seed" (a random seed) is left alone."""
    text = re.sub(r"[Ss]eeds? 000[-–]004", "the lecture notes", text)
    text = re.sub(rf"[Ss]eeds? {_NUM}(?:(?:/|, | and ){_NUM})+",
                  lambda m: cite_list(re.findall(_NUM, m.group(0))), text)
    text = re.sub(rf"[Ss]eed ({_NUM})'s", lambda m: possessive(cite(m.group(1))), text)
    return re.sub(rf"[Ss]eed ({_NUM})", lambda m: cite(m.group(1)), text)
