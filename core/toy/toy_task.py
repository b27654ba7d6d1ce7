"""A synthetic translation task with a known word alignment: the bundled teaching model's data.

The source is a small English-like language (lowercase, one space between words, no
punctuation, 3 to 12 words); the target is an invented language with one made-up word per
source word (LEXICON) and a different word order. Because the grammar decides where every
word goes, we know which source word each target word translates, so a trained model's
cross-attention can be checked against the true alignment.

Source grammar (every word belongs to exactly one category, so parsing is deterministic):

    sentence := clause (CONJ clause)*                      CONJ: and, but
    clause   := subject VT object [ADV] [PP]               the small dog sees the cat
              | subject VI [ADV] [PP]                      the old man sleeps near the river
              | IMP1 object [ADV] [PP]                     help the tiny white cat across the road
              | IMP2 [OBJ_PRON] NP [ADV] [PP]              show me the money
    subject  := NP | SUBJ_PRON (he, she, ...)    object := NP | OBJ_PRON (me, you, ...)
    NP       := DET ADJ* NOUN                    PP := PREP NP

sample() draws at most two adjectives per noun, in English order (size, mood, age, colour)
and from different classes; translate() accepts any number, in any order.

Target word order, per clause:
  1. adjectives follow their noun, in mirror order:   DET NOUN ADJ_k ... ADJ_1
  2. prepositions become postpositions:               NP PREP
  3. the verb goes last (subject-object-verb), with the PP and then the adverb before it:
         subject [pronoun] [object] [PP] [ADV] VERB
  4. determiners stay in front of their noun; conjunctions and clause order are kept.
Every target word translates exactly one source word, so the alignment is a permutation.

Worked example:
    source     the small dog sees the cat quickly near the old river
               0   1     2   3    4   5   6       7    8   9   10
    target     le leral robi le bevin le ketur masi ofu manen belmo
    alignment  [0, 2, 1, 4, 5, 8, 10, 9, 7, 6, 3]

sample() can produce about 6 x 10^17 distinct sentences (n_sentences()); is_test() holds out
a fixed ~5% of them by a hash of the source text.
"""

from __future__ import annotations

import hashlib
import random

import torch

SPECIALS = ["<pad>", "<unk>", "<start>", "<end>"]
MIN_LEN, MAX_LEN = 3, 12
TEST_FRACTION = 0.05

DET = "the this that every each my your his our their some no".split()
ADJ_CLASSES = [  # English order: size, mood, age, colour
    "small big tiny huge tall short little".split(),
    "happy sad angry hungry lazy brave clever quiet noisy friendly sleepy kind strange busy".split(),
    "old young new".split(),
    "red blue green black white brown grey yellow golden".split(),
]
ADJ = [a for c in ADJ_CLASSES for a in c]
NOUN = ("dog cat bird horse cow fox wolf bear mouse rabbit duck fish lion tiger owl frog "
        "man woman boy girl child king queen teacher doctor farmer baker friend student sailor "
        "bank river money cash house tree car boat book ball apple key door garden hill road "
        "table letter box bridge park city forest lake").split()
VT = ("sees helps likes finds chases follows watches calls hears feeds carries pushes pulls "
      "takes holds loves knows visits catches bites meets paints wants needs").split()
VI = "sleeps runs walks sings swims jumps waits sits dances laughs cries falls rests plays hides".split()
IMP2 = "show give bring find buy send pass".split()  # imperatives with an optional pronoun: show me X
IMP1 = "help follow call watch catch feed visit carry".split()  # imperatives with one object
ADV = "quickly slowly quietly loudly happily often rarely again today now carefully suddenly".split()
PREP = "near behind under in on at by with across beside".split()
SUBJ_PRON = "he she someone nobody".split()
OBJ_PRON = "me you him us them".split()
CONJ = "and but".split()

LEXICON: dict[str, str] = {
    # determiners
    "the": "le", "this": "ma", "that": "du", "every": "di", "each": "ra", "my": "pe", "your": "ba",
    "his": "mo", "our": "de", "their": "zu", "some": "su", "no": "bu",
    # adjectives (all end in -i)
    "small": "robi", "big": "gapi", "tiny": "zeki", "huge": "mepi", "tall": "duki", "short": "pedi",
    "little": "rusi", "happy": "gidi", "sad": "pari", "angry": "bugi", "hungry": "numi",
    "lazy": "vini", "brave": "roli", "clever": "kevi", "quiet": "fedi", "noisy": "ripi",
    "friendly": "niti", "sleepy": "niri", "kind": "dapi", "strange": "mevi", "busy": "leni",
    "old": "masi", "young": "duri", "new": "vili", "red": "tiri", "blue": "nuvi", "green": "nazi",
    "black": "dini", "white": "tabi", "brown": "tisi", "grey": "roki", "yellow": "tosi",
    "golden": "lani",
    # nouns
    "dog": "leral", "cat": "bevin", "bird": "temol", "horse": "denos", "cow": "kezos",
    "fox": "kolon", "wolf": "fafen", "bear": "sebos", "mouse": "fikan", "rabbit": "mulus",
    "duck": "letus", "fish": "sanul", "lion": "momal", "tiger": "sobe", "owl": "gofar",
    "frog": "radas", "man": "fudis", "woman": "bazes", "boy": "mesir", "girl": "rina",
    "child": "zonol", "king": "kafar", "queen": "tines", "teacher": "bepin", "doctor": "tubur",
    "farmer": "satis", "baker": "leles", "friend": "pules", "student": "vevel", "sailor": "tegul",
    "bank": "labil", "river": "ketur", "money": "nilan", "cash": "dener", "house": "goru",
    "tree": "niva", "car": "menel", "boat": "vidol", "book": "maten", "ball": "faful",
    "apple": "verul", "key": "sifus", "door": "fabas", "garden": "temen", "hill": "bigis",
    "road": "gulis", "table": "mebil", "letter": "suzul", "box": "zufun", "bridge": "pubon",
    "park": "raven", "city": "foras", "forest": "bisus", "lake": "povas",
    # verbs (all end in -o): transitive, intransitive, imperative
    "sees": "belmo", "helps": "barto", "likes": "palto", "finds": "lurzo", "chases": "permo",
    "follows": "nurto", "watches": "pervo", "calls": "kulto", "hears": "folso", "feeds": "nilko",
    "carries": "malmo", "pushes": "valpo", "pulls": "filto", "takes": "ganto", "holds": "felso",
    "loves": "ponso", "knows": "gindo", "visits": "tilpo", "catches": "ponbo", "bites": "mirzo",
    "meets": "kuldo", "paints": "veldo", "wants": "kilgo", "needs": "kenmo",
    "sleeps": "mervo", "runs": "rorpo", "walks": "dilgo", "sings": "manbo", "swims": "sando",
    "jumps": "relmo", "waits": "zanbo", "sits": "lunmo", "dances": "relvo", "laughs": "telgo",
    "cries": "kalko", "falls": "kirko", "rests": "korgo", "plays": "kilmo", "hides": "balvo",
    "show": "perto", "give": "golso", "bring": "sorso", "find": "pirko", "buy": "gilgo",
    "send": "milgo", "pass": "barmo", "help": "meldo", "follow": "sormo", "call": "rermo",
    "watch": "bolgo", "catch": "kolmo", "feed": "lirpo", "visit": "ganko", "carry": "lelpo",
    # adverbs (all end in -en)
    "quickly": "manen", "slowly": "kusen", "quietly": "gepen", "loudly": "vaden",
    "happily": "kafen", "often": "muben", "rarely": "maken", "again": "keden", "today": "ruzen",
    "now": "vesen", "carefully": "tumen", "suddenly": "viten",
    # prepositions (postpositions in the target)
    "near": "ofu", "behind": "itu", "under": "usu", "in": "ebu", "on": "otu", "at": "ufu",
    "by": "uvu", "with": "uru", "across": "azu", "beside": "edu",
    # pronouns and conjunctions
    "he": "ban", "she": "sin", "someone": "mon", "nobody": "san",
    "me": "oka", "you": "ova", "him": "upa", "us": "udo", "them": "iva",
    "and": "ine", "but": "emo",
}

_CATEGORIES = [DET, ADJ, NOUN, VT, VI, IMP2, IMP1, ADV, PREP, SUBJ_PRON, OBJ_PRON, CONJ]
assert sorted(w for c in _CATEGORIES for w in c) == sorted(LEXICON), "categories must partition LEXICON"
assert len(set(LEXICON.values())) == len(LEXICON) and not set(LEXICON.values()) & set(LEXICON)

EXAMPLES = [
    "the small dog sees the cat",
    "show me the money",
    "the old man sleeps near the river",
    "she finds the cash in the bank",
    "help the tiny white cat across the road",
    "the clever fox chases the small rabbit quickly",
    "the farmer feeds the hungry cow and the dog sleeps",
    "the young teacher walks slowly across the old bridge",
]


def source_vocab() -> list[str]:
    return SPECIALS + sorted(LEXICON)


def target_vocab() -> list[str]:
    return SPECIALS + sorted(LEXICON.values())


# ----------------------------------------------------------------------------- translation

_SETS = {name: frozenset(words) for name, words in [
    ("DET", DET), ("ADJ", ADJ), ("NOUN", NOUN), ("VT", VT), ("VI", VI), ("IMP2", IMP2),
    ("IMP1", IMP1), ("ADV", ADV), ("PREP", PREP), ("SUBJ_PRON", SUBJ_PRON),
    ("OBJ_PRON", OBJ_PRON), ("CONJ", CONJ)]}
_SETS["VERB"] = _SETS["VT"] | _SETS["VI"]


def translate(src_words: list[str]) -> tuple[list[str], list[int]]:
    """Target words and alignment (alignment[j] = index of the source word target word j translates)."""
    words = list(src_words)
    if not words:
        raise ValueError("cannot translate an empty sentence")
    for k, w in enumerate(words):
        if w not in LEXICON:
            raise ValueError(f"unknown word {w!r} at position {k} in {' '.join(words)!r}")
    i = 0

    def take(cat, expected=None):  # [index] of the next word if it is in cat, else [] (or raise)
        nonlocal i
        if i < len(words) and words[i] in _SETS[cat]:
            i += 1
            return [i - 1]
        if expected:
            got = repr(words[i]) if i < len(words) else "the end of the sentence"
            raise ValueError(f"expected {expected} at position {i} but got {got} in {' '.join(words)!r}")
        return []

    def np(expected="a determiner"):  # DET ADJ* NOUN -> DET NOUN ADJ* (mirrored)
        det, adjs = take("DET", expected), []
        while a := take("ADJ"):
            adjs += a
        return det + take("NOUN", "an adjective or a noun") + adjs[::-1]

    def clause():
        subj, pron, obj = [], [], []
        if verb := take("IMP2"):
            pron, obj = take("OBJ_PRON"), np("a pronoun or a determiner")
        elif verb := take("IMP1"):
            obj = take("OBJ_PRON") or np("a pronoun or a determiner")
        else:
            subj = take("SUBJ_PRON") or np("a subject (pronoun or determiner) or an imperative verb")
            verb = take("VERB", "a verb")
            if words[verb[0]] in _SETS["VT"]:
                obj = take("OBJ_PRON") or np("an object (pronoun or determiner)")
        adv = take("ADV")
        pp = take("PREP")
        if pp:
            pp = np() + pp
        return subj + pron + obj + pp + adv + verb

    order = clause()
    while conj := take("CONJ"):
        order += conj + clause()
    if i < len(words):
        raise ValueError(f"unexpected {words[i]!r} at position {i} in {' '.join(words)!r}")
    return [LEXICON[words[k]] for k in order], order


# ----------------------------------------------------------------------------- sampling

def _np(rng: random.Random) -> list[str]:
    classes = sorted(rng.sample(range(len(ADJ_CLASSES)), rng.choice((0, 1, 1, 2))))
    det = "the" if rng.random() < 0.4 else rng.choice(DET)
    return [det] + [rng.choice(ADJ_CLASSES[c]) for c in classes] + [rng.choice(NOUN)]


def _clause(rng: random.Random) -> list[str]:
    kind = rng.choice(("vt", "vt", "vt", "vi", "vi", "imp1", "imp2"))
    obj = [rng.choice(OBJ_PRON)] if rng.random() < 0.15 else _np(rng)
    if kind == "imp1":
        words = [rng.choice(IMP1)] + obj
    elif kind == "imp2":
        words = [rng.choice(IMP2)] + ([rng.choice(OBJ_PRON)] if rng.random() < 0.5 else []) + _np(rng)
    else:
        subj = [rng.choice(SUBJ_PRON)] if rng.random() < 0.15 else _np(rng)
        words = subj + ([rng.choice(VT)] + obj if kind == "vt" else [rng.choice(VI)])
    if rng.random() < 0.3:
        words.append(rng.choice(ADV))
    if rng.random() < 0.4:
        words += [rng.choice(PREP)] + _np(rng)
    return words


def sample(rng: random.Random) -> tuple[list[str], list[str], list[int]]:
    """One (source words, target words, alignment) triple, 3 to 12 source words."""
    while True:
        words = _clause(rng)
        while rng.random() < 0.25:
            words += [rng.choice(CONJ)] + _clause(rng)
        if MIN_LEN <= len(words) <= MAX_LEN:
            return (words, *translate(words))


def is_test(src_words) -> bool:
    """Stable ~5% held-out split by a hash of the source text."""
    h = hashlib.sha256(" ".join(src_words).encode()).digest()
    return int.from_bytes(h[:8], "big") < TEST_FRACTION * 2**64


def train_examples(n: int, seed: int = 0) -> list[tuple[list[str], list[str], list[int]]]:
    """n triples outside the test split (repeats possible), deterministic given the seed."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        ex = sample(rng)
        if not is_test(ex[0]):
            out.append(ex)
    return out


def test_examples(n: int = 1000, seed: int = 12345) -> list[tuple[list[str], list[str], list[int]]]:
    """n distinct triples from the test split, deterministic given the seed."""
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        ex = sample(rng)
        key = " ".join(ex[0])
        if key not in seen and is_test(ex[0]):
            seen.add(key)
            out.append(ex)
    return out


def n_sentences(max_len: int = MAX_LEN) -> int:
    """How many distinct source sentences sample() can produce (3..max_len words)."""
    def mul(a, b):  # polynomials in sentence length, as {length: count}
        out = {}
        for i, x in a.items():
            for j, y in b.items():
                if i + j <= max_len:
                    out[i + j] = out.get(i + j, 0) + x * y
        return out

    def add(*ps):
        out = {}
        for p in ps:
            for k, v in p.items():
                out[k] = out.get(k, 0) + v
        return out

    one = lambda n: {1: n}  # noqa: E731
    sizes = [len(c) for c in ADJ_CLASSES]
    pairs = sum(a * b for k, a in enumerate(sizes) for b in sizes[k + 1:])
    np = mul(mul(one(len(DET)), {0: 1, 1: len(ADJ), 2: pairs}), one(len(NOUN)))
    tail = mul({0: 1, 1: len(ADV)}, add({0: 1}, mul(one(len(PREP)), np)))
    subj, obj = add(one(len(SUBJ_PRON)), np), add(one(len(OBJ_PRON)), np)
    clause = mul(add(mul(mul(subj, one(len(VT))), obj), mul(subj, one(len(VI))),
                     mul(one(len(IMP1)), obj), mul(mul(one(len(IMP2)), {0: 1, 1: len(OBJ_PRON)}), np)), tail)
    total, sent = {}, clause
    while sent:
        total = add(total, sent)
        sent = mul(mul(sent, one(len(CONJ))), clause)
    return sum(v for k, v in total.items() if k >= MIN_LEN)


def encode_batch(triples, src_index, tgt_index, device="cpu"):
    """Pad a list of (source, target, alignment) into tensors.

    src (B, n); dec_in (B, t) = <start> y_1..y_T; dec_out (B, t) = y_1..y_T <end> (-100 pad);
    align (B, t) = source index of the word each decoder position predicts (-1: none).
    """
    b = len(triples)
    n = max(len(s) for s, _, _ in triples)
    t = max(len(y) for _, y, _ in triples) + 1
    src = torch.zeros(b, n, dtype=torch.long)
    dec_in = torch.zeros(b, t, dtype=torch.long)
    dec_out = torch.full((b, t), -100, dtype=torch.long)
    align = torch.full((b, t), -1, dtype=torch.long)
    start, end = tgt_index["<start>"], tgt_index["<end>"]
    for i, (s, y, a) in enumerate(triples):
        src[i, : len(s)] = torch.tensor([src_index[w] for w in s])
        ids = [tgt_index[w] for w in y]
        dec_in[i, : len(ids) + 1] = torch.tensor([start] + ids)
        dec_out[i, : len(ids) + 1] = torch.tensor(ids + [end])
        align[i, : len(a)] = torch.tensor(a)
    return src.to(device), dec_in.to(device), dec_out.to(device), align.to(device)
