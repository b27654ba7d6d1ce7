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
