"""Corpus: one head's queries and keys over a whole corpus (AttentionViz's joint view).

The corpus job (core.cli.corpus_job) runs once per (model, corpus, layer) and is cached; the joint
embedding (core.analysis.joint: AttentionViz's normalisation, then PCA / t-SNE / UMAP) once per head
and projection. Clicking a point opens its sentence in Explore at this layer and head.
"""

import io
import re

import numpy as np
import streamlit as st

import core.cli.corpus_job as cc
import core.analysis.joint as cj
from core.cli.corpus_data import CORPUS_FILE
from viz.corpus import figures as vc
from viz.ui import charts, downloads, explore_links, url_state, widgets

MAX_UPLOAD_BYTES = 1_000_000  # an uploaded or pasted corpus
MAX_SENTENCES = 2_000  # sentences one run reads (more are cut, with a warning)
DEFAULT_SENTENCES = 500
BUNDLED_SENTENCES = 200  # the bundled corpus opens on its first 200 (~1,400 toy tokens: a quick SVG scatter)
MAX_DRAWN_TOKENS = 20_000  # tokens drawn per head (2 points each); more are sampled
MAX_SLOW_TOKENS = 1_000  # tokens t-SNE / UMAP project (2,000 points take ~10 s on 2 CPU cores)
SOURCES = ["Bundled corpus", "Upload a .txt", "Paste text"]


@st.cache_data(max_entries=6, show_spinner=False)
def layer_vectors(model_name: str, corpus_key: str, layer: int, _model, _sentences):
    """The corpus job for one layer: (pyarrow Table, skipped), per (model, corpus hash, layer)."""
    result = cc.run(_model, _sentences, [layer])
    return result.table, result.skipped


@st.cache_data(max_entries=64, show_spinner=False)
def head_embedding(model_name: str, corpus_key: str, layer: int, head: int, projection: str, subset: str,
                   _q, _k):
    """One head's joint embedding, per (model, corpus, layer, head, projection, which tokens)."""
    return cj.joint_embedding(_q, _k, projection)


@st.cache_data(max_entries=6, show_spinner=False)
def layer_heads(model_name: str, corpus_key: str, layer: int, n_heads: int, n_points: int, _table):
    """Every head's PCA joint embedding of the layer's first n_points tokens (the small multiples),
    in one cache entry: a rerun reads it without filtering the layer's table once per head."""
    out = []
    for h in range(n_heads):
        _, q, k = cc.head_vectors(_table, layer, h)
        out.append(cj.joint_embedding(q[:n_points], k[:n_points], "pca"))
    return out


def _parquet(table) -> bytes:
    buf = io.BytesIO()
    cc.write_parquet(table, buf)
    return buf.getvalue()


def _corpus_text() -> str:
    # another corpus starts again from its default number of sentences
    source = st.radio("Corpus", SOURCES, horizontal=True, key="corpus.source",
                      on_change=lambda: st.session_state.pop("corpus.n", None))
    if source == SOURCES[0]:
        st.caption(f"{CORPUS_FILE.name}: the lecture notes' examples and sentences of the toy translation task's "
                   "grammar (assets/corpus/README.md).")
        return CORPUS_FILE.read_text(encoding="utf-8")
    if source == SOURCES[1]:
        f = st.file_uploader("A text file, one sentence a line", type=["txt"], key="corpus.upload")
        if f is None:
            st.info("Choose a .txt file (UTF-8, one sentence a line, up to 1 MB).")
            return ""
        if f.size > MAX_UPLOAD_BYTES:
            st.error(f"{f.name} is {f.size / 1e6:.1f} MB; the page reads corpora up to {MAX_UPLOAD_BYTES / 1e6:.0f} MB. "
                     "Use `python -m core corpus` for larger ones.")
            return ""
        try:
            return f.getvalue().decode("utf-8")
        except UnicodeDecodeError:
            st.error(f"{f.name} is not UTF-8 text: save it as UTF-8, one sentence a line.")
            return ""
    text = st.text_area("Sentences, one a line", key="corpus.paste", height=160)
    if len(text.encode("utf-8")) > MAX_UPLOAD_BYTES:
        st.error(f"The text is over {MAX_UPLOAD_BYTES / 1e6:.0f} MB; paste less, or use `python -m core corpus`.")
        return ""
    return text


widgets.header("corpus")
state = url_state.PageState("corpus", fields=("model", "layer", "head", "projection"))
model_name, model, top_col = widgets.model_header(state)
if model is None:
    st.stop()

with top_col:
    text = _corpus_text()
if re.search(r"[\x00-\x08\x0b-\x1f]", text):
    text = re.sub(r"[\x00-\x08\x0b-\x1f]", " ", text)
    st.warning("Control characters in the corpus were replaced by spaces.")
sentences = cc.read_sentences(text)
if not sentences:
    st.warning("The corpus is empty: choose the bundled corpus, upload a .txt file or paste sentences, one a line.")
    state.end_here(model=model_name)
if len(sentences) > MAX_SENTENCES:
    st.warning(f"The corpus has {len(sentences):,} sentences; the page reads the first {MAX_SENTENCES:,} "
               "(`python -m core corpus` reads any number).")
    sentences = sentences[:MAX_SENTENCES]

n_layers, n_heads = cc.n_layers(model), model.config.n_heads
c = st.columns([1, 1, 1, 1, 1.4])
softmax_layers = cc.softmax_layers(model)  # a token mixer's layer has no softmax queries and keys to place
if not softmax_layers:
    st.info(f"**The corpus view reads softmax attention's queries and keys**, and {model_name} has none: every layer "
            "mixes tokens with a token mixer (Explore and Inside a head show it).")
    st.stop()
layer_key = url_state.int_from_url(state, "layer", softmax_layers[0], 0, n_layers - 1, of=model_name)
if st.session_state[layer_key] not in softmax_layers:
    st.session_state[layer_key] = softmax_layers[0]
head_key = url_state.int_from_url(state, "head", 0, 0, n_heads - 1, of=model_name)
proj_key = state.seeded_key("projection", "pca", valid=lambda v: v in cj.PROJECTIONS,
                      why=f"projections: {', '.join(cj.PROJECTIONS)}")
layer = c[0].selectbox("Layer", softmax_layers, key=layer_key,
                       help="The layers with softmax attention (a token mixer's layers have no queries and keys here).")
head = c[1].selectbox("Head", list(range(n_heads)), key=head_key)
projection = c[2].selectbox("Projection", list(cj.PROJECTIONS), key=proj_key, format_func=cj.PROJECTIONS.get,
                            help="PCA: instant, linear. t-SNE and UMAP: local neighbourhoods, on a sample of "
                                 f"{MAX_SLOW_TOKENS:,} tokens; UMAP compiles its code on first use (up to a minute).")
color_by = c[3].selectbox("Colour by", list(vc.COLOR_BY), key="corpus.color", format_func=vc.COLOR_BY.get)
default_n = BUNDLED_SENTENCES if st.session_state.get("corpus.source", SOURCES[0]) == SOURCES[0] else DEFAULT_SENTENCES
st.session_state.setdefault("corpus.n", min(default_n, len(sentences)))
st.session_state["corpus.n"] = max(1, min(st.session_state["corpus.n"], len(sentences)))
n_use = c[4].slider("Sentences", 1, len(sentences), key="corpus.n") if len(sentences) > 1 else 1
state.show_messages()
state.publish(model=model_name, layer=layer, head=head, projection=projection)
sentences = sentences[:n_use]
key = cc.corpus_hash(sentences)
stack = cc.stack_of(model)

try:
    with st.spinner(f"Tracing {len(sentences):,} sentences ({model_name}, layer {layer})…"):
        table, skipped = layer_vectors(model_name, key, layer, model, tuple(sentences))
except Exception as exc:
    st.error(f"The model could not run on this corpus: {exc}")
    st.stop()
if skipped:
    st.warning(f"{len(skipped)} sentence(s) have no word {model_name} reads and were left out "
               f"(first: line {skipped[0][0] + 1}).")
rows, q, k = cc.head_vectors(table, layer, head)
if rows.empty:
    st.warning("No tokens to show: no sentence of the corpus could be read.")
    st.stop()

cap = MAX_SLOW_TOKENS if projection != "pca" else MAX_DRAWN_TOKENS
subset = "all"
if len(rows) > cap:
    subset = f"sample{cap}"
    keep = np.sort(np.random.default_rng(0).choice(len(rows), cap, replace=False))
    st.info(f"{len(rows):,} tokens: {cj.PROJECTIONS[projection]} is run on a fixed random sample of {cap:,} "
            f"({2 * cap:,} points)" + (", so that it takes seconds, not minutes." if projection != "pca" else "."))
    rows, q, k = rows.iloc[keep].reset_index(drop=True), q[keep], k[keep]
try:
    with st.spinner(f"{cj.PROJECTIONS[projection]} of {2 * len(rows):,} points…"):
        xy = head_embedding(model_name, key, layer, head, projection, subset, q, k)
except cj.ProjectionUnavailable as exc:
    st.error(str(exc))
    st.stop()

where = "encoder self-attention" if stack == "encoder" else "decoder self-attention"
fig = vc.joint_scatter(xy, rows, color_by=color_by,
                       title=f"{model_name} · {where} · layer {layer} · head {head} · {cj.PROJECTIONS[projection]} "
                             f"of {len(rows):,} queries and {len(rows):,} keys")
event = charts.chart(fig, "corpus-scatter", on_select="rerun", selection_mode="points", width="stretch")
st.caption("Queries and keys of one head, projected together after AttentionViz's normalisation: queries scaled "
           "by a and keys by 1/a (no dot product changes), the keys moved onto the queries' centroid (each query's "
           "scores shift by one constant, which softmax ignores), a chosen so that both have the same mean norm. "
           "A query lands near the keys it attends to. Hover a point for its token in its sentence; click it to "
           "open the sentence in Explore at this layer and head.")
picked = vc.picked_point(event.selection.points if event else None, rows)
if picked is not None and 0 <= picked["sentence_id"] < len(sentences):
    st.switch_page(explore_links.EXPLORE, query_params=explore_links.explore_params(
        model_name, sentences[picked["sentence_id"]], stack, layer, head))


def _pick_head() -> None:
    sel = st.session_state.get("corpus-heads")
    h = vc.picked_head((sel or {}).get("selection", {}).get("points", []) if sel else [])
    if h is not None:
        st.session_state[head_key] = h


def _remember_heads_open() -> None:
    st.session_state["corpus.heads.open"] = bool(st.session_state.get("corpus.heads"))


# Computed and drawn only while open (its label names the layer, so whether it is open is kept
# under corpus.heads.open across a change of layer).
heads_box = st.expander(f"Every head of layer {layer} (PCA; click a panel to choose its head)",
                        expanded=st.session_state.setdefault("corpus.heads.open", False), key="corpus.heads",
                        on_change=_remember_heads_open)
if heads_box.open:
    with heads_box:
        cap_small = min(len(rows), 5_000)
        heads_xy = layer_heads(model_name, key, layer, n_heads, cap_small, table)
        charts.chart(vc.head_multiples(heads_xy, cap_small, title=f"layer {layer}: {n_heads} heads"),
                     "corpus-heads", on_select=_pick_head, selection_mode="points", width="stretch")

st.download_button("Download this layer's vectors (Parquet)", downloads.later(_parquet, table), file_name=
                   f"{model_name}-L{layer}-vectors.parquet", mime="application/octet-stream", on_click="ignore",
                   key="corpus-dl")

