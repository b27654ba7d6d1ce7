"""The corpus job: every token's per-head query and key vectors over many sentences.

    python -m core corpus --model minilm --input corpus.txt --layers 0,3 --out vectors.parquet [--ray [ADDRESS]]

    result = core.cli.corpus_job.run(model, sentences, layers=[0, 3])
    result.table                       # pyarrow Table, one row per (sentence, layer, head, position)

Sentences are traced in padded batches (shortest first, so a batch holds sentences of
similar length): the core's own forward pass with a Recorder that keeps only the q and k of
the chosen layers, for the whole batch. Rows and columns (the Parquet file's schema):

    sentence_id  int64   0-based index of the sentence among the input's non-blank lines
    position     int32   the token's position in its sentence (special tokens included)
    token        string  the token as the tokenizer wrote it
    layer        int32   layer (counted from 0)
    head         int32   query head
    q            list<float32>  the head's query vector, d_k floats (after RoPE where used)
    k            list<float32>  the key vector the head reads at that position: under grouped-
                                query attention, that of kv head  head // (H / H_kv)

Padding is never a row. Which attention: encoder self-attention for encoders and encoder-
decoders (the source is the corpus), decoder self-attention for decoder-only models (right
padding is invisible to real tokens under the causal mask). Rows are sorted by
(sentence_id, layer, head, position). Sentences the model cannot read (no word it knows)
are skipped and listed in the result.

With Ray (`run_ray`, optional extra `ray`): Ray Data maps the same batch function over
batches of sentences on a cluster (or a local one); each worker loads the model by name once.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ..errors import InputError
from .. import trace_names as tn
from ..net.recorder import Recorder

COLUMNS = ["sentence_id", "position", "token", "layer", "head", "q", "k"]
SORT_KEYS = [("sentence_id", "ascending"), ("layer", "ascending"), ("head", "ascending"), ("position", "ascending")]
BATCH_SIZE = 64  # sentences per forward pass
MAX_BATCH_TOKENS = 4096  # padded tokens per forward pass (keeps memory flat for long lines)


def schema() -> pa.Schema:
    vec = pa.list_(pa.float32())
    return pa.schema([("sentence_id", pa.int64()), ("position", pa.int32()), ("token", pa.string()),
                      ("layer", pa.int32()), ("head", pa.int32()), ("q", vec), ("k", vec)])


@dataclass
class CorpusResult:
    table: pa.Table
    skipped: List[Tuple[int, str]] = field(default_factory=list)  # (sentence_id, why)
    n_sentences: int = 0
    seconds: float = 0.0


def read_sentences(text: str) -> List[str]:
    """One sentence a line; blank lines dropped, surrounding whitespace stripped."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def corpus_hash(sentences: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest()[:16]


def stack_of(model) -> str:
    """The stack whose self-attention the job reads: the encoder's where there is one."""
    return "encoder" if model.config.has_encoder else "decoder"


def n_layers(model) -> int:
    cfg = model.config
    return cfg.n_layers if stack_of(model) == "encoder" or cfg.kind == "decoder" else cfg.n_decoder_layers


def softmax_layers(model) -> List[int]:
    """The layers of the corpus's stack that have softmax attention (queries and keys): a token
    mixer's layer (core/net/mixer.py) has none, unless the attention runs beside it (Falcon-H1)."""
    layers = list(model.net.layers(stack_of(model)))[: n_layers(model)]
    return [i for i, layer in enumerate(layers) if getattr(layer, "self_attn", None) is not None]


def parse_layers(spec, model) -> List[int]:
    """'0,3' / [0, 3] / None (every layer with softmax attention) -> sorted distinct layers,
    checked against the model: a layer that mixes tokens without softmax has no q and k to write."""
    total, attention = n_layers(model), softmax_layers(model)
    if spec is None or spec == "" or spec == "all":
        return attention
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    try:
        layers = sorted({int(str(x).strip()) for x in items if str(x).strip() != ""})
    except ValueError:
        raise InputError(f"layers must be whole numbers separated by commas, not {spec!r}") from None
    bad = [i for i in layers if not 0 <= i < total]
    if bad or not layers:
        raise InputError(f"{model.name} has layers 0-{total - 1}; {bad or spec!r} is not among them")
    mixers = [i for i in layers if i not in attention]
    if mixers:
        many = len(mixers) > 1
        raise InputError(f"{model.name}'s layer{'s' if many else ''} {', '.join(map(str, mixers))} "
                         f"mix{'' if many else 'es'} tokens without softmax attention (a token mixer has no query and key vectors); the layers "
                         f"with softmax attention are {', '.join(map(str, attention)) or 'none'}")
    return layers


def encode(model, sentences: Sequence[str], ids: Optional[Sequence[int]] = None):
    """[(sentence_id, token ids, token strings)] and [(sentence_id, why)] for those skipped."""
    ids = range(len(sentences)) if ids is None else ids
    items, skipped = [], []
    for sid, text in zip(ids, sentences):
        try:
            enc = model.encode(text)
        except InputError as exc:
            skipped.append((int(sid), str(exc)))
            continue
        ids_ = list(enc.ids)
        if model.config.kind == "decoder":
            ids_ = ids_[: model.config.max_len]
        items.append((int(sid), ids_, model.source_strings(enc)[: len(ids_)]))
    return items, skipped


def batches(items, batch_size: int = BATCH_SIZE, max_tokens: int = MAX_BATCH_TOKENS):
    """Items grouped shortest first, at most batch_size sentences and max_tokens padded tokens each."""
    order = sorted(items, key=lambda it: (len(it[1]), it[0]))
    batch: list = []
    for it in order:
        n = len(it[1])  # the longest so far: items come sorted by length
        if batch and (len(batch) >= batch_size or n * (len(batch) + 1) > max_tokens):
            yield batch
            batch = []
        batch.append(it)
    if batch:
        yield batch


@torch.inference_mode()
def vectors_for_batch(model, batch, layers: Sequence[int], stack: Optional[str] = None) -> pa.Table:
    """One padded forward pass over `batch` [(sentence_id, ids, tokens)]: the table's rows for it."""
    stack = stack or stack_of(model)
    cfg = model.config
    lens = torch.tensor([len(ids) for _, ids, _ in batch])
    b, n = len(batch), int(lens.max())
    x = torch.full((b, n), cfg.pad_id, dtype=torch.long)
    for i, (_, ids, _) in enumerate(batch):
        x[i, : len(ids)] = torch.tensor(ids)
    is_pad = torch.arange(n)[None, :] >= lens[:, None]  # (B, n)
    names = {tn.self_attn(stack, l, w) for l in layers for w in ("q", "k")}
    rec = Recorder(names=names, whole_batch=True)
    x, is_pad_dev = x.to(model.device), is_pad.to(model.device)
    if stack == "encoder":
        model.net.encode(x, is_pad_dev, rec=rec)  # padding keys masked out of every row
    else:
        model.net.decode(x, rec=rec)  # causal: a real token never sees the padding after it
    group = cfg.n_heads // cfg.n_kv_heads
    got = _recorded(rec)
    q = torch.stack([got[tn.self_attn(stack, l, "q")] for l in layers], 1)  # (B, L, H, n, d_k)
    k = torch.stack([got[tn.self_attn(stack, l, "k")] for l in layers], 1)  # (B, L, Hkv, n, d_k)
    k = k.repeat_interleave(group, dim=2)  # (B, L, H, n, d_k): the kv head each query head reads
    q, k = q.float().cpu().numpy(), k.float().cpu().numpy()
    n_l, n_h, d_k = q.shape[1], q.shape[2], q.shape[-1]
    keep = np.broadcast_to((~is_pad.numpy())[:, None, None, :], (b, n_l, n_h, n))  # rows in (B, L, H, n) order
    shape = (b, n_l, n_h, n)
    sid = np.broadcast_to(np.array([s for s, _, _ in batch], dtype=np.int64)[:, None, None, None], shape)[keep]
    lay = np.broadcast_to(np.array(layers, dtype=np.int32)[None, :, None, None], shape)[keep]
    head = np.broadcast_to(np.arange(n_h, dtype=np.int32)[None, None, :, None], shape)[keep]
    pos = np.broadcast_to(np.arange(n, dtype=np.int32)[None, None, None, :], shape)[keep]
    toks = np.full((b, n), "", dtype=object)
    for i, (_, _, t) in enumerate(batch):
        toks[i, : len(t)] = t
    tok = np.broadcast_to(toks[:, None, None, :], shape)[keep]
    qv, kv = q[keep].reshape(-1), k[keep].reshape(-1)  # rows x d_k, flattened
    offsets = pa.array(np.arange(0, qv.size + 1, d_k, dtype=np.int32))
    cols = [pa.array(sid), pa.array(pos), pa.array(tok, type=pa.string()), pa.array(lay), pa.array(head),
            pa.ListArray.from_arrays(offsets, pa.array(qv)), pa.ListArray.from_arrays(offsets, pa.array(kv))]
    return pa.Table.from_arrays(cols, schema=schema())


def _recorded(rec) -> dict:
    """The recorder's tensors by name (its `tensors`, else `entries()`)."""
    got = getattr(rec, "tensors", None)
    return got if got else dict(rec.entries())


def _finish(tables: List[pa.Table]) -> pa.Table:
    if not tables:
        return schema().empty_table()
    return pa.concat_tables(tables).sort_by(SORT_KEYS).combine_chunks()


def run(model, sentences: Sequence[str], layers=None, *, batch_size: int = BATCH_SIZE,
        max_tokens: int = MAX_BATCH_TOKENS, progress: Optional[Callable[[int, int], None]] = None) -> CorpusResult:
    """The corpus job in this process. progress(done, total) is called after every batch."""
    t0 = time.perf_counter()
    layers = parse_layers(layers, model)
    items, skipped = encode(model, sentences)
    tables, done = [], 0
    for batch in batches(items, batch_size, max_tokens):
        tables.append(vectors_for_batch(model, batch, layers))
        done += len(batch)
        if progress is not None:
            progress(done, len(items))
    return CorpusResult(_finish(tables), skipped, len(sentences), time.perf_counter() - t0)


# ------------------------------------------------------------------ Ray
_WORKER_MODELS: dict = {}


def _ray_batch(batch, model_name: str, model_kwargs: dict, layers: List[int]) -> pa.Table:
    """Ray Data's batch function: loads the model once per worker process, then one padded pass."""
    from ..registry import load_model

    key = (model_name, repr(sorted(model_kwargs.items())))
    if key not in _WORKER_MODELS:
        _WORKER_MODELS.clear()
        _WORKER_MODELS[key] = load_model(model_name, **model_kwargs)
    model = _WORKER_MODELS[key]
    items, _ = encode(model, [str(t) for t in batch["text"]], [int(i) for i in batch["sentence_id"]])
    tables = [vectors_for_batch(model, b, layers) for b in batches(items, len(items) or 1)]
    return pa.concat_tables(tables) if tables else schema().empty_table()


def run_ray(model_name: str, sentences: Sequence[str], layers=None, *, address: Optional[str] = None,
            model_kwargs: Optional[dict] = None, batch_size: int = BATCH_SIZE, init_kwargs: Optional[dict] = None,
            model=None) -> CorpusResult:
    """The corpus job on Ray Data: ray.data.from_items(sentences).map_batches(...) over batches
    of `batch_size` sentences. `address` is a cluster's (None or "local": a local Ray started
    here). Every worker needs this package and the model's weights installed."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'attention-lab[ray]'") from None
    from ..registry import load_model

    t0 = time.perf_counter()
    model_kwargs = dict(model_kwargs or {})
    model = model or load_model(model_name, device="cpu", **model_kwargs)
    layers = parse_layers(layers, model)
    _, skipped = encode(model, sentences)  # the driver reports what the workers will skip
    if not ray.is_initialized():
        ray.init(address=None if address in (None, "", "local") else address, **(init_kwargs or {}))
    # shortest first (by characters), so that a batch pads little
    order = sorted(range(len(sentences)), key=lambda i: (len(sentences[i]), i))
    ds = ray.data.from_items([{"sentence_id": i, "text": sentences[i]} for i in order])
    ds = ds.map_batches(_ray_batch, batch_size=batch_size, batch_format="numpy",
                        fn_kwargs={"model_name": model_name, "model_kwargs": model_kwargs, "layers": layers})
    tables = [t for t in ray.get(list(ds.to_arrow_refs())) if t.num_rows]
    tables = [t.cast(schema()) for t in tables]
    return CorpusResult(_finish(tables), skipped, len(sentences), time.perf_counter() - t0)


# ------------------------------------------------------------------ files and reading
def write_parquet(table: pa.Table, path) -> None:
    pq.write_table(table, path)


def read_parquet(path) -> pa.Table:
    return pq.read_table(path)


def head_vectors(table: pa.Table, layer: int, head: int):
    """(rows, Q, K) of one head: rows a pandas DataFrame (sentence_id, position, token), Q and K
    numpy arrays (rows x d_k, float32) in the same order."""
    import pyarrow.compute as pc

    sel = table.filter(pc.and_(pc.equal(table["layer"], layer), pc.equal(table["head"], head)))
    rows = sel.select(["sentence_id", "position", "token"]).to_pandas()
    return rows, _matrix(sel["q"]), _matrix(sel["k"])


def _matrix(col) -> np.ndarray:
    col = col.combine_chunks()
    if len(col) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    flat = col.flatten().to_numpy()
    return flat.reshape(len(col), -1)


class ProgressBar:
    """A plain text progress bar on stderr: [#####.....] 420/1218 sentences, 12.3 s."""

    def __init__(self, stream=sys.stderr, width: int = 30):
        self.stream, self.width, self.t0 = stream, width, time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        filled = int(self.width * done / max(total, 1))
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} sentences, "
                          f"{time.perf_counter() - self.t0:.1f} s")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()
