"""The home page's path through the lecture notes' ideas: its stops, in the notes' order, and
which model each stop's link opens (`link_target`: the current one where the page applies to
it, else smollm2 or toy-translate, the link saying why). Pure; the page is viz/home/page.py,
each stop's figure viz/home/figures.py.

Each stop names the full page that shows its idea (a key of viz/ui/registry.py), so the path
and the sidebar cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class Stop:
    title: str
    text: str  # a few sentences, Markdown; {placeholders} filled by the page
    page: str  # the registry key of the page that shows it in full
    link: str  # the link's words
    extra: Tuple[Tuple[str, str], ...] = ()  # more pages: (registry key, what it answers)
    params: Tuple[Tuple[str, str], ...] = ()  # extra URL values for the linked page


STOPS: List[Stop] = [
    Stop("Attention is a weighted average",
         "A token's new vector is a **weighted average** of the value vectors of the tokens it looks at: "
         "y_n = Σ_m a_nm v_m, with every weight a_nm ≥ 0 and each row summing to 1 (Bishop ch. 12). "
         "The notes work one example by hand, “help me!”: the query of “help” scores 6 against its own key and "
         "4 against “me!”'s; both scores are divided by √16 = 4, and the softmax turns them into the weights "
         "below. This figure is computed from those numbers, not copied from the notes.",
         "playground", "Do it by hand in the Playground", params=(("tab", "hand"),)),
    Stop("Queries, keys and values, and the scaled scores",
         "Each token is projected three ways: a **query** (what it looks for), a **key** (what it offers) and a "
         "**value** (what it passes on). The score of query i against key j is q_i · k_j, divided by √d_k so "
         "that it does not grow with the vectors' size; a softmax over each row gives the weights. "
         "Below: the scaled scores Q Kᵀ / √d_k of {where}, head 0, on your sentence.",
         "inside", "Follow one head step by step in Inside a head"),
    Stop("Positions",
         "Attention by itself does not know the order of the words: shuffle them and every weight moves with "
         "its word. So the model adds a **positional encoding** to each token's embedding. The notes' "
         "sinusoidal encoding gives position i the values sin(i / 10000^(2j/d)) and cos(...) at each pair of "
         "features: below for the {n} positions of your sentence.",
         "positions", "See the positional encodings in Positions"),
    Stop("The mask, and the decoder one token at a time",
         "A decoder writes its output one token at a time, so a position may only look at the tokens before "
         "it: the **look-ahead mask** adds −∞ above the diagonal, and the softmax gives those keys a weight of "
         "exactly 0. {mask_where}",
         "decoder", "Step through the decoder in the Decoder stepper"),
    Stop("Many heads, many layers",
         "A layer runs several heads side by side, each with its own W_q, W_k and W_v, and concatenates what "
         "they find; the model stacks such layers. Heads differ: below, how spread out each head's attention "
         "is on your sentence (the mean entropy of its rows, in bits: 0 = each token looks at one token).",
         "explore", "See every head of every layer in Explore", params=(("tab", "model"),)),
    Stop("The cost of attention, and attention without softmax",
         "The notes count what attention costs (seed 004): the scores Q Kᵀ and their mix with V take "
         "O(N² D), the projections O(N D²). Past a few thousand tokens the N² term wins, and a decoder's "
         "KV cache grows with every token. Many models of 2025-26 replace attention on most layers with a "
         "**linear mixer** (Gated DeltaNet, Mamba2): each head keeps a state of d_k × d_v numbers, writes each "
         "token into it and reads it with the query, so the cost grows like N and the memory stays fixed. "
         "Such a layer still has an attention matrix, exact and signed, which Explore draws. "
         "Below: one layer's cost at {model}'s width D = {d}, your sentence marked. {memory}",
         "playground", "Measure attention's cost against N and D in the Playground", params=(("tab", "cost"),)),
    Stop("Beyond the notes: what heads do, and what matters",
         "Maps say where a head looks. The research pages ask what that does: which heads look at the previous "
         "token or copy an earlier match (below: the previous-token score of every head on your sentence), "
         "where the answer forms layer by layer, which activations and which input tokens the output needs.",
         "heads", "Which heads do what, in Heads",
         extra=(("lens", "where the prediction forms"), ("patching", "which activations the output needs"),
                ("attribution", "which input tokens the output depends on"))),
]


# The models each linked page applies to (by kind; "encoder+mlm": an encoder with a masked-LM
# head, which has an output to explain). A page not listed applies to every model.
PAGE_KINDS = {
    "decoder": ("decoder", "encoder-decoder"),
    "patching": ("decoder", "encoder-decoder"),
    "lens": ("decoder", "encoder-decoder"),
    "kvcache": ("decoder",),
    "attribution": ("decoder", "encoder-decoder", "encoder+mlm"),
}
WHAT_THEY_NEED = {
    "decoder": "it does not generate text",
    "patching": "it has no next token to restore",
    "lens": "it has no next-token prediction to read layer by layer",
    "kvcache": "it keeps no KV cache (it does not generate text)",
    "attribution": "it has no output to explain",
}
SWITCH_TO = ("smollm2", "toy-translate")  # the models a link switches to, first that fits (smollm2 reads any English)


def fits(page: str, kind: str, has_mlm: bool = False) -> bool:
    """Whether the page applies to a model of this kind."""
    kinds = PAGE_KINDS.get(page)
    return kinds is None or kind in kinds or (has_mlm and kind == "encoder" and "encoder+mlm" in kinds)


def link_target(page: str, model_name: str, kind: str, has_mlm: bool, available: dict) -> Tuple[Optional[str], str]:
    """(the model a link to `page` opens, what its label adds): the current model where the page
    applies to it, else the first of SWITCH_TO that is available (name -> kind) and fits, with
    the reason in words; (None, reason) where none fits."""
    if fits(page, kind, has_mlm):
        return model_name, ""
    why = f"{model_name} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}: {WHAT_THEY_NEED.get(page, 'the page does not apply to it')}"
    other = next((m for m in SWITCH_TO if m in available and m != model_name and fits(page, available[m])), None)
    if other is None:
        return None, f" (not for {model_name}: {why})"
    return other, f", on {other} ({why})"
