"""What heads do, and where attention goes through the layers: pure functions over models and traces.

    import core, core.analysis
    model = core.load_model("smollm2")
    scores = core.analysis.head_scores(model, "The cat sat on the mat.")   # DataFrame, one row per head
    trace = model.trace("The cat sat on the mat.")
    R = core.analysis.rollout(trace, "decoder")   # L x n x n, R[l, i, j]: input token j's share in token i after layer l
    F = core.analysis.flow(trace, "decoder")      # L x n x n, maximum flow from input token j to token i after layer l

Only self-attention maps are read (`{stack}.{i}.self_attn.weights`), one layer at a time, so a
trace that computes attention on access never holds every layer's maps at once.

A layer whose token mixer is not softmax attention (core/net/mixer.py: Gated DeltaNet) is
handled by each analysis in its own way: head scores skip it; the lens, direct logit attribution
(one "mixer" term) and patching (its own points) read it; rollout and flow, score attribution,
circuits, path patching and the KV cache's eviction refuse it with a ValueError saying why.

The analyses, by job: head_scoring.py (what heads do), attention_flow.py (rollout and flow),
joint.py (AttentionViz's joint query-key projection; the corpus job that traces a corpus in
batches is core/cli/corpus_job.py), patching.py (activation patching: which activations the output needs),
lens.py (the logit lens), logit_attribution.py (direct logit attribution).
"""

from .attention_flow import FLOW_SCALE, Heads, flow, mix_residual, rollout
from .activation_patching import patch
from .logit_lens import lens
from .logit_attribution import logit_attribution
from .head_scoring import (
    DEFAULT_SENTENCE,
    REPEAT_LENGTH,
    SCORES,
    head_scores,
    map_scores,
    ordinary_ids,
    repeat_scores,
    repeated_sequence,
    repeated_text,
    top_heads,
)

__all__ = [
    "DEFAULT_SENTENCE",
    "FLOW_SCALE",
    "Heads",
    "REPEAT_LENGTH",
    "SCORES",
    "flow",
    "head_scores",
    "lens",
    "logit_attribution",
    "map_scores",
    "mix_residual",
    "ordinary_ids",
    "patch",
    "repeat_scores",
    "repeated_sequence",
    "repeated_text",
    "rollout",
    "top_heads",
]

from .input_attribution import METHODS as ATTRIBUTION_METHODS, attribute  # noqa: E402
from .faithfulness_scores import faithfulness  # noqa: E402

__all__ += ["ATTRIBUTION_METHODS", "attribute", "faithfulness"]

from .score_attribution import pattern_attribution, score_attribution  # noqa: E402

__all__ += ["pattern_attribution", "score_attribution"]

from .evict import POLICIES as EVICTION_POLICIES, KeptKeys, evict  # noqa: E402

__all__ += ["EVICTION_POLICIES", "KeptKeys", "evict"]

from .circuits import head_circuit, path_patch  # noqa: E402

__all__ += ["head_circuit", "path_patch"]
