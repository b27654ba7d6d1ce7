"""Trace names: the one place that builds and reads the names tensors are recorded under.

Every intermediate of a pass has a stable dotted name (the table in docs/design.md,
"Trace names"). The network records pieces of it under scopes (core/net/recorder.py);
everything that names a whole tensor, or reads one back, goes through the builders and the
parser here, so the contract is spelled once:

    embed.{stack}.{part}                 part: tokens, positions, types, presum_norm, sum, per_layer
    {stack}.{i}.{attn}.{step}            attn: self_attn, cross_attn; step: ATTN_STEPS
    {stack}.{i}.mixer.{step}             a token mixer that is not softmax attention: MIXER_STEPS
    {stack}.{i}.ffn.{hidden|router|out}
    {stack}.{i}.residual{j} | norm{j} | post_norm{j}    j = 1.. (the sub-layers in order)
    {stack}.{i}.out                      the layer's output (the residual stream after it)
    {stack}.{i}.in                       a hook point only: the residual stream entering layer i
    {stack}.final_norm
    logits, probs, topk.ids, topk.probs, last.probs, next.ids, next.probs
    tokens.source, tokens.target, next.tokens    token lists (strings)

`{stack}` is encoder or decoder; layers count from 0.

    tn.attn("decoder", 3, "cross_attn", "weights")   -> 'decoder.3.cross_attn.weights'
    tn.parse("decoder.3.cross_attn.weights")         -> Name(stack='decoder', layer=3,
                                                            part='cross_attn', step='weights')
"""

from __future__ import annotations

from typing import Iterator, List, NamedTuple, Optional, Tuple

STACKS = ("encoder", "decoder")
SELF, CROSS = "self_attn", "cross_attn"
ATTNS = (SELF, CROSS)
FFN = "ffn"

EMBED_PARTS = ("tokens", "positions", "types", "presum_norm", "sum", "per_layer")
# Inside one attention, in the order a pass records them.
ATTN_STEPS = ("q_pre_norm", "k_pre_norm", "q_pre_rope", "k_pre_rope", "latent", "q", "k", "v", "mask",
              "position_bias", "index_scores", "selected", "scale", "scores", "scaled", "capped", "masked", "weights",
              "sink", "value_norms", "heads", "gate", "out")
GATE = "gate"  # an output gate's sigmoid (H x n_q x d_k, Qwen3.5 / Qwen3-Next), applied to heads before W_o
# A token mixer that is not softmax attention (core/net/mixer.py), in the order a pass records them
MIXER = "mixer"
MIXER_STEPS = ("q", "k", "v", "decay", "beta", "weights", "skip", "heads", "filter", "out")
MIXER_PER_HEAD = ("q", "k", "v", "skip", "heads")  # H x n x d_k or d_v
MIXER_PER_STEP = ("decay", "beta")  # H x n
SINK, SCALE = "sink", "scale"  # learned sinks' share (H x n_q, gpt-oss); a scale per query (n_q, Llama 4)
LATENT = "latent"  # multi-head latent attention's compressed kv, what its cache holds (n x r, DeepSeek V3)
SELECTION = ("index_scores", "selected")  # a sparse selection's indexer scores and kept keys (n_q x n_k, DeepSeek V3.2)
MAPS = ("scores", "scaled", "capped", "masked", "weights", "value_norms")  # H x n_q x n_k
QUERY_SIDE = ("q_pre_norm", "q_pre_rope", "q", "heads")  # H x n_q x d_k
KEY_SIDE = ("k_pre_norm", "k_pre_rope", "k", "v")  # H_kv x n_k x d_k (key/value heads)
PER_HEAD = QUERY_SIDE + KEY_SIDE
FFN_STEPS = ("hidden", "router", "out")  # router: a mixture of experts' logits (n x E)
NUMBERED = ("residual", "norm", "post_norm")  # {stack}.{i}.residual{j} etc.
OUT, IN = "out", "in"

LOGITS, PROBS = "logits", "probs"
TOPK_IDS, TOPK_PROBS, LAST_PROBS = "topk.ids", "topk.probs", "last.probs"
NEXT_IDS, NEXT_PROBS = "next.ids", "next.probs"
OUTPUTS = ("logits", "probs")  # decoders: n_t x V, computed from the final hidden states
TOPK = ("topk.ids", "topk.probs")  # decoders: the top-k at every position, n_t x k
STEP_NAMES = ("next.ids", "next.probs", "last.probs")  # the prediction at the last position
TOKEN_LISTS = {"tokens.source": "source", "tokens.target": "target", "next.tokens": "next"}  # name -> token set
TOKEN_LIST_NAMES = {v: k for k, v in TOKEN_LISTS.items()}  # token set -> name


# ------------------------------------------------------------------------------ builders
def embed(stack: str, part: str = "sum") -> str:
    """embed.{stack}.{part}: tokens, positions, types, presum_norm, sum (layer 0's input) or
    per_layer (Gemma 4's per-layer inputs)."""
    return f"embed.{stack}.{part}"


def embed_scope(stack: str) -> str:
    """embed.{stack}: the prefix of the embedding's names (a recorder's scope)."""
    return f"embed.{stack}"


def layer(stack: str, i: int) -> str:
    """{stack}.{i}: the prefix every name inside layer i starts with (a recorder's scope)."""
    return f"{stack}.{i}"


def at(stack: str, i: int, local: str) -> str:
    """A name given under its layer ('self_attn.weights', 'residual1', 'out') made whole."""
    return f"{stack}.{i}.{local}"


def local(kind: str, step: str) -> str:
    """A name under its layer: 'self_attn.weights', 'ffn.hidden' (what each_layer takes)."""
    return f"{kind}.{step}"


def sublayer(stack: str, i: int, sub: str, step: str) -> str:
    """{stack}.{i}.{sub}.{step}, sub an attention kind or ffn (a layer's sub-layers in turn)."""
    return f"{stack}.{i}.{sub}.{step}"


def attn(stack: str, i: int, kind: str, step: str) -> str:
    """{stack}.{i}.{kind}.{step}, kind self_attn or cross_attn."""
    return sublayer(stack, i, kind, step)


def self_attn(stack: str, i: int, step: str) -> str:
    return sublayer(stack, i, SELF, step)


def cross_attn(stack: str, i: int, step: str) -> str:
    return sublayer(stack, i, CROSS, step)


def mixer(stack: str, i: int, step: str) -> str:
    """{stack}.{i}.mixer.{step}: a token mixer's q, k, v, decay, beta, weights, skip, heads or out."""
    return sublayer(stack, i, MIXER, step)


def ffn(stack: str, i: int, step: str) -> str:
    """{stack}.{i}.ffn.hidden or .out."""
    return sublayer(stack, i, FFN, step)


def numbered(stack: str, i: int, what: str, j: int) -> str:
    """{stack}.{i}.{what}{j}: what is residual, norm or post_norm; j the sub-layer from 1."""
    return f"{stack}.{i}.{what}{j}"


def residual(stack: str, i: int, j: int) -> str:
    """The stream after sub-layer j (1-based) added its result."""
    return numbered(stack, i, "residual", j)


def norm(stack: str, i: int, j: int) -> str:
    """Sub-layer j's norm: its input (pre-norm) or the normed residual (post-norm)."""
    return numbered(stack, i, "norm", j)


def post_norm(stack: str, i: int, j: int) -> str:
    """Sub-layer j's output normed again before it is added (Gemma 2/3, OLMo 2)."""
    return numbered(stack, i, "post_norm", j)


def out(stack: str, i: int) -> str:
    """{stack}.{i}.out: the residual stream after layer i."""
    return f"{stack}.{i}.{OUT}"


def layer_in(stack: str, i: int) -> str:
    """{stack}.{i}.in: the hook point of the stream entering layer i (not a recorded name)."""
    return f"{stack}.{i}.{IN}"


def final_norm(stack: str) -> str:
    return f"{stack}.final_norm"


def stored_input(stack: str, i: int) -> str:
    """The stored name of layer i's input: embed.{stack}.sum for layer 0, else {stack}.{i-1}.out."""
    return embed(stack, "sum") if i == 0 else out(stack, i - 1)


def stack_output(trace, stack: str) -> str:
    """The name of a stack's output in `trace`: its final norm where the model has one, else
    the last layer's output (the encoder output cross-attention reads; the decoder's last
    hidden states the logits come from)."""
    name = final_norm(stack)
    return name if name in trace else out(stack, trace.layers(stack) - 1)


def layer_names(stack: str, i: int, local_names) -> List[str]:
    """Whole names of layer i from its names under the layer (Layer.recorded_names())."""
    return [f"{stack}.{i}.{n}" for n in local_names]


# ------------------------------------------------------------------------------ parsing
class Name(NamedTuple):
    """A parsed trace name. stack: encoder | decoder | None (logits, next.*, token lists);
    layer: int or None; part: 'embed', 'self_attn', 'cross_attn', 'mixer', 'ffn', 'block' (the
    residuals, norms, out and the hook point in), 'final_norm', 'output' or 'tokens';
    step: the last piece ('weights', 'residual1', 'sum', 'probs', 'source', ...)."""
    stack: Optional[str]
    layer: Optional[int]
    part: str
    step: str

    def local(self) -> str:
        """The name under its layer ('self_attn.weights', 'residual1'); ValueError outside one."""
        if self.layer is None:
            raise ValueError(f"{str(self)!r} is not inside a layer")
        return self.step if self.part == "block" else f"{self.part}.{self.step}"

    def __str__(self) -> str:
        if self.part == "embed":
            return embed(self.stack, self.step)
        if self.part == "final_norm":
            return final_norm(self.stack)
        if self.part in ("output", "tokens"):
            return self.step if self.part == "output" else TOKEN_LIST_NAMES[self.step]
        return at(self.stack, self.layer, self.local())


def _numbered(step: str) -> bool:
    for base in NUMBERED:
        if step.startswith(base) and step[len(base):].isdigit():
            return True
    return False


def layer_of(name: str) -> Optional[Tuple[str, int]]:
    """(stack, layer) of a name inside a layer ('decoder.3.self_attn.q' -> ('decoder', 3)),
    else None. Structural only (cheap: called for every recorded name)."""
    parts = name.split(".", 2)
    if len(parts) >= 3 and parts[0] in STACKS and parts[1].isdigit():
        return parts[0], int(parts[1])
    return None


def parse(name: str) -> Name:
    """The pieces of a trace name; ValueError for a name that is not one (the message says
    what names look like)."""
    parts = name.split(".")
    where = layer_of(name)
    if where is not None:
        stack, i = where
        rest = parts[2:]
        if len(rest) == 2 and rest[0] in ATTNS and rest[1] in ATTN_STEPS:
            return Name(stack, i, rest[0], rest[1])
        if len(rest) == 2 and rest[0] == FFN and rest[1] in FFN_STEPS:
            return Name(stack, i, FFN, rest[1])
        if len(rest) == 2 and rest[0] == MIXER and rest[1] in MIXER_STEPS:
            return Name(stack, i, MIXER, rest[1])
        if len(rest) == 1 and (rest[0] in (OUT, IN) or _numbered(rest[0])):
            return Name(stack, i, "block", rest[0])
    elif len(parts) == 3 and parts[0] == "embed" and parts[1] in STACKS and parts[2] in EMBED_PARTS:
        return Name(parts[1], None, "embed", parts[2])
    elif len(parts) == 2 and parts[0] in STACKS and parts[1] == "final_norm":
        return Name(parts[0], None, "final_norm", "final_norm")
    elif name in OUTPUTS or name in TOPK or name in STEP_NAMES:
        return Name(None, None, "output", name)
    elif name in TOKEN_LISTS:
        return Name(None, None, "tokens", TOKEN_LISTS[name])
    raise ValueError(f"{name!r} is not a trace name: expected embed.{{stack}}.{{{'|'.join(EMBED_PARTS)}}}, "
                     f"{{stack}}.{{i}}.{{self_attn|cross_attn}}.{{step}}, {{stack}}.{{i}}.mixer.{{step}}, "
                     f"{{stack}}.{{i}}.ffn.{{hidden|router|out}}, "
                     "{stack}.{i}.residual{j}|norm{j}|post_norm{j}|out, {stack}.final_norm, logits, probs, "
                     "topk.*, next.*, last.probs or tokens.*")


def is_name(name: str) -> bool:
    try:
        parse(name)
    except ValueError:
        return False
    return True


def is_map(name: str) -> bool:
    """An H x n_q x n_k attention map (scores, scaled, capped, masked, weights, value_norms), or a
    token mixer's implicit attention (mixer.weights)."""
    p = name.rsplit(".", 2)
    return len(p) == 3 and ((p[1] in ATTNS and p[2] in MAPS) or (p[1] == MIXER and p[2] == "weights"))


# ------------------------------------------------------------------------------ what a trace keeps
def is_stored(name: str) -> bool:
    """What a traced pass keeps (core/trace.py): O(n d) tensors only. The embeddings, every
    layer's output, each attention's (and token mixer's) per-head output, the final norms, and
    the decoder's top-k and last distribution; every other name is computed when it is read."""
    if name.startswith(("embed.", "topk.", "next.")) or name == "last.probs":
        return True
    if name.endswith(".final_norm"):
        return True
    tail = name.rsplit(".", 2)
    return (len(tail) == 3 and tail[2] == OUT and tail[1].isdigit()) or (
        len(tail) == 3 and tail[1] in ATTNS + (MIXER,) and tail[2] == "heads")


def decoder_rows(name: str, x, t: int):
    """The part of a decoder-side tensor that belongs to the first t decoder positions (a
    decoder step's view, core.trace.Trace.prefix); the encoder side is returned whole."""
    if not (name.startswith(("decoder.", "embed.decoder.")) or name in OUTPUTS or name in TOPK):
        return x
    last = name.rsplit(".", 1)[-1]
    if f".{MIXER}." in name:
        if last == "filter":  # a short convolution's taps (d x K): no positions
            return x
        if last == "weights":
            return x[:, :t, :t]
        return x[:, :t] if last in MIXER_PER_HEAD or last in MIXER_PER_STEP else x[:t]
    if f".{SELF}." in name:
        if last == "mask" or last in SELECTION:
            return x[:t, :t]
        if last in MAPS or last == "position_bias":
            return x[:, :t, :t]
        return x[:, :t] if last in PER_HEAD or last == SINK else x[:t]
    if f".{CROSS}." in name:
        if last == "mask":
            return x[:t]
        if last in KEY_SIDE:
            return x  # the encoder's positions
        return x[:, :t] if last in MAPS or last in PER_HEAD else x[:t]
    return x[:t]


# ------------------------------------------------------------------------------ every name
def attention_names(stack: str, i: int, kind: str, steps=ATTN_STEPS) -> Iterator[str]:
    for s in steps:
        yield attn(stack, i, kind, s)


def patterns() -> List[str]:
    """Every name this module knows, with {stack}, {i}, {attn} and {j} as placeholders: the
    list docs/design.md's table must cover (tests/core/test_trace_names.py)."""
    out = [f"embed.{{stack}}.{p}" for p in EMBED_PARTS]
    out += [f"{{stack}}.{{i}}.{{attn}}.{s}" for s in ATTN_STEPS]
    out += [f"{{stack}}.{{i}}.mixer.{s}" for s in MIXER_STEPS]
    out += [f"{{stack}}.{{i}}.ffn.{s}" for s in FFN_STEPS]
    out += [f"{{stack}}.{{i}}.{b}{{j}}" for b in NUMBERED]
    out += ["{stack}.{i}.out", "{stack}.{i}.in", "{stack}.final_norm"]
    out += list(OUTPUTS) + list(TOPK) + list(STEP_NAMES) + list(TOKEN_LISTS)
    return out
