"""The page registry: every page of the sidebar, once.

app.py builds the navigation (its sections and order) from PAGES; every page prints its
heading and its one-line question through `header`; the tests read the same list for the
hostile-input, URL round-trip and model-switch matrices, so a page added here is in all of
them. A page joins the app by one entry below (docs/design.md, "To add a page").

No Streamlit here: the entries are plain data, read by app.py, the pages and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

SECTIONS = ("Learn", "Explore", "Research")
HOME = "home"  # the page at /


@dataclass(frozen=True)
class PageSpec:
    key: str  # URL path and the prefix of its widget keys ("lens" -> /lens, "lens.text")
    title: str  # the sidebar's label
    heading: str  # the page's own title
    question: str  # one line under the heading: what the page answers
    section: str  # one of SECTIONS
    icon: str
    main_chart: Optional[str] = None  # the chart every test waits on (None: the page draws tables)
    text_box: Optional[str] = None  # its main text box's label (None: no free text)
    params: Dict[str, str] = field(default_factory=dict)  # URL values the tests open it with
    reads_url: bool = True  # False: a page with no state (no model, no sentence) to keep in the URL

    @property
    def file(self) -> str:
        return f"viz/{self.key}/page.py"

    @property
    def default(self) -> bool:
        """The page at / (its URL path is empty)."""
        return self.key == HOME


PAGES: List[PageSpec] = [
    # Learn: the notes' ideas, one at a time; the path through them is the home page, at /
    PageSpec("home", "Start here", "Attention, step by step",
             "What does attention do, in the lecture notes' order, on a sentence of your own?",
             "Learn", ":material/route:", "home-fig", "Sentence"),
    PageSpec("inside", "Inside a head", "Inside a head",
             "How does one head turn a sentence into weights, step by step, formula by formula?",
             "Learn", ":material/functions:", "inside-weights-fig", "Sentence"),
    PageSpec("positions", "Positions", "Positional encoding",
             "How does the model know where each word is?",
             "Learn", ":material/waves:", "positions-model-pe", "Sentence"),
    PageSpec("decoder", "Decoder stepper", "Decoder stepper",
             "How does a decoder write one token at a time behind its look-ahead mask?",
             "Learn", ":material/skip_next:", "decoder-weights", "Source sentence"),
    PageSpec("playground", "Playground", "Playground",
             "What does attention compute by hand, and what does it cost?",
             "Learn", ":material/science:", "playground-pfree", "Sentence, used by tabs 2, 3 and 5",
             params={"tab": "free"}),
    PageSpec("notes", "Lecture notes", "Lecture notes",
             "Which lecture notes do the pages follow, and where is each idea shown?",
             "Learn", ":material/menu_book:", reads_url=False),
    # Explore: look at a sentence
    PageSpec("explore", "Explore", "Explore attention",
             "Where does each head of each layer look, on your sentence?",
             "Explore", ":material/grid_on:", "explore-heatmap", "Sentence"),
    PageSpec("compare", "Compare", "Compare: one word, two sentences",
             "How does one word's attention and meaning change with its sentence?",
             "Explore", ":material/compare_arrows:", "compare-attn-a", "Sentence A"),
    PageSpec("corpus", "Corpus", "Queries and keys over a corpus",
             "Where do one head's queries and keys sit, over a whole corpus?",
             "Explore", ":material/scatter_plot:"),
    # Research: what matters, and why
    PageSpec("heads", "Heads", "Which heads do what",
             "Which heads look at the previous token, the first token, or copy an earlier match?",
             "Research", ":material/psychology:", "heads-compare", "Sentence"),
    PageSpec("lens", "Lens", "Where the prediction forms",
             "In which layer does the prediction form, and which heads write it?",
             "Research", ":material/stacks:", "lens-grid", "Sentence"),
    PageSpec("patching", "Patching", "Which activations the output needs",
             "Which activations, put back from a clean run, restore the answer?",
             "Research", ":material/healing:", "patching-map", "Clean prompt"),
    PageSpec("kvcache", "KV cache", "The KV cache and attention sinks",
             "Which keys does a KV cache keep under each policy, and what does forgetting the rest cost?",
             "Research", ":material/memory:", "kvcache-map", "Text"),
    PageSpec("circuits", "Circuits", "Which heads make a head attend",
             "Which earlier heads make this head attend where it does, and does patching confirm it?",
             "Research", ":material/account_tree:", "circuits-graph", "Sentence"),
    PageSpec("attribution", "Attribution", "Which input tokens the output depends on",
             "Which input tokens does the output depend on, and which method says so faithfully?",
             "Research", ":material/insights:", "attribution-text", "Sentence"),
]

BY_KEY: Dict[str, PageSpec] = {p.key: p for p in PAGES}


def page(key: str) -> PageSpec:
    return BY_KEY[key]


def by_section() -> Dict[str, List[PageSpec]]:
    """The sidebar's sections in order, each with its pages in order."""
    return {s: [p for p in PAGES if p.section == s] for s in SECTIONS}


def with_text() -> List[PageSpec]:
    """The pages that take free text (the hostile-input matrix runs on these)."""
    return [p for p in PAGES if p.text_box]


def with_chart() -> List[PageSpec]:
    return [p for p in PAGES if p.main_chart]
