"""KV cache: which keys a cache policy keeps for each head, how much attention the full model
gave to what it evicted, and what that does to the text's likelihood. Numbers:
core.analysis.evict (through viz.kvcache.run_panel's shared cache); figures: viz.kvcache.figures;
the chosen head's map: the full model's trace, one head and a block of query rows at a time
(core.head_maps).
"""

import math

import numpy as np
import streamlit as st

from core.analysis.evict import POLICIES, SEQUENTIAL, token_ids
from core.errors import InputError
from core import trace_names as tn
from core.head_maps import layer_maps
from core.net.cost import kv_cache_layers
from viz.kvcache import figures as kf
from viz.kvcache import layout as kl
from viz.figures.heatmaps import add_sink_column
from viz.figures.text import clean_text
from viz.ui import charts, downloads, models, url_state, url_switches, widgets
from viz.kvcache import run_panel as kr
from viz.kvcache import state_panel

DEFAULT_TEXT = (
    "Attention lets every token look at the tokens before it. Each row of weights sums to one, and the model "
    "learns which earlier words matter for predicting the next one. A decoder keeps the keys and values of the "
    "tokens it has read in a cache, so that a new token costs one row of attention, not the whole map again. "
    "Past a budget the cache must forget some keys. Which ones it keeps is an attention question: the first "
    "tokens often receive a large share of every row, whatever they say, and a cache that drops them may lose "
    "more than one that drops the middle of the text.")
CHOICES = [p for p in POLICIES if p != "full"]
AUTO_SECONDS = 20.0  # a run expected to take longer waits for a click, with its time said first,
AUTO_TOKENS = 128  # unless the text is this short (a loaded machine inflates the estimate, not a short run)
SWEEP_BUDGETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

widgets.header("kvcache")
st.caption("A decoder keeps the keys and values of what it has read; past a **budget** it evicts some. Pick a policy: "
           "the map greys out, row by row, the keys that the query did not see; the numbers say how much attention "
           "the full model was paying to them and what forgetting them costs the next-token prediction.")
state = url_state.PageState("kvcache", fields=("model", "text", "policy", "budget", "sinks", "recent", "observe",
                                               "cont", "layer", "head", "row"))
allowed = [n for n in models.model_names() if models.model_kind(n) == "decoder" and n != "random"]
if not allowed:
    st.error("The KV cache page reads decoder-only models (smollm2, or a decoder checkpoint under "
             "$ATTENTION_LAB_MODELS), and none is installed here.")
    st.stop()
model_name, model, text_col = widgets.model_header(
    state, allowed=allowed, needs="a KV cache is what a decoder keeps while it reads: pick a decoder-only model "
                                  f"({', '.join(allowed)})")
if model is None:
    st.stop()
if model.kind != "decoder":
    st.error(f"{model_name} is not a decoder-only model; the KV cache page reads decoders ({', '.join(allowed)}).")
    state.end_here(model=model_name, text=st.session_state.get(state.key("text")))  # the sentence stays
text_key = state.seeded_key("text", DEFAULT_TEXT)
with text_col:
    text = widgets.text_box("Text", text_key, help="The policy reads this text as a decoder does, token by token.")

c = st.columns(5)
policy_key = url_switches.option(state, "policy", "streaming", CHOICES)
policy = c[0].selectbox("Policy", CHOICES, key=policy_key, format_func=lambda p: kf.POLICY_LABELS[p])
budget_key = url_state.int_from_url(state, "budget", 64, 1, 8192, of="the keys per query")
budget = int(c[1].number_input("Budget (keys per query)", 1, 8192, key=budget_key, step=1,
                               help="The keys a query attends to, its own included."))
sinks_key = url_state.int_from_url(state, "sinks", 4, 0, 64)
sinks = int(c[2].number_input("Sinks (streaming)", 0, 64, key=sinks_key, step=1,
                              help="StreamingLLM keeps the first tokens as attention sinks."))
recent_key = url_state.int_from_url(state, "recent", 0, 0, 8192)
recent_in = int(c[3].number_input("Recent (H2O; 0: budget // 2)", 0, 8192, key=recent_key, step=1))
observe_key = url_state.int_from_url(state, "observe", 32, 1, 1024)
observe = int(c[4].number_input("Observe (SnapKV)", 1, 1024, key=observe_key, step=1,
                                help="SnapKV scores the prompt by the attention of its last `observe` queries."))
recent = None if recent_in == 0 else recent_in
cont_key = state.seeded_key("cont", " The cache then reads the rest of the text with what it kept.")
cont = ""
if policy == "snapkv":
    cont = st.text_input("Continuation (SnapKV reads it after compressing the text)", key=cont_key)
url = dict(model=model_name, text=text, policy=url_switches.changed(policy, "streaming"),
           budget=url_switches.changed(budget, 64), sinks=url_switches.changed(sinks, 4),
           recent=url_switches.changed(recent_in, 0), observe=url_switches.changed(observe, 32),
           cont=cont or None if policy == "snapkv" else None)
state.publish(**url)
state.show_messages()

clean, notes = clean_text(text)
for m in notes:
    st.warning(m)
try:
    ids, tokens, n_prompt = token_ids(model, clean, cont if policy == "snapkv" else None)
except InputError as exc:
    st.warning(str(exc))
    st.stop()
enc = model.encode(clean)
if enc.truncated:
    st.warning(f"The input was cut to the model's maximum of {model.max_input_tokens} tokens "
               f"({enc.truncated} tokens dropped).")
n = len(ids)
if policy == "snapkv" and n_prompt >= n:
    st.warning("SnapKV reads a continuation after the text: type one (it needs at least one token within the "
               "model's length).")
    st.stop()
layout = kl.layout_table(model.config, n)  # the cache per token as MHA, GQA and MLA of the same sizes
with st.expander(f"Cache size: {kl.own_kind(model.config)} against the other layouts", expanded=True):
    own = layout[layout["this model"]].iloc[0]
    cached = kv_cache_layers(model.config)
    shared = sum(j is not None for j in (model.config.kv_source or []))
    mixers = model.config.n_layers - len(cached) - shared
    why = [f"{mixers} keep{'s' if mixers == 1 else ''} a token mixer's fixed state instead (below)"] if mixers else []
    why += [f"{shared} read{'s' if shared == 1 else ''} an earlier layer's keys and values"] if shared else []
    st.caption(f"{model_name} caches {int(own['numbers'])} numbers a position and layer ({own['kind']}: "
               f"{own['formula']}), {int(own['bytes_per_token']):,} bytes a token over the {len(cached)} "
               f"layer{'s' if len(cached) != 1 else ''} that keep{'s' if len(cached) == 1 else ''} a cache, in "
               f"float32: {int(own['document_bytes']) / 2**10:,.1f} KiB for this text's {n:,} tokens. "
               + (f"Of its other layers, {' and '.join(why)}. " if why else "")
               + (f"With its own layers' sizes (a sparse selection's indexer keys, a head size per layer kind), "
                  f"the cache here keeps {layout.attrs['own_bytes_per_token']:,} bytes a token. "
                  if layout.attrs["own_bytes_per_token"] != int(own["bytes_per_token"]) else "")
               + "The same model (same d, H, L and head sizes) with each other layout:")
    st.dataframe(layout, hide_index=True, key="kvcache-layout-table")
    charts.chart(kl.layout_figure(layout, n), key="kvcache-layout", name=f"kvcache-layout-{model_name}", width="stretch")
if policy == "streaming" and budget <= sinks:
    st.warning(f"StreamingLLM's budget ({budget}) must be above its sinks ({sinks}): the window needs a key at least.")
    st.stop()

state_panel.show(model, n)  # a model with token mixers: their fixed state against the cache

# ------------------------------------------------------------------ the run (a time estimate first)
args = dict(sinks=sinks, recent=recent, observe=observe, continuation=cont or None)
df = kr.cached(model_name, clean, policy, budget, **args)
if df is None:
    secs = kr.estimate(model, n, policy)
    said = kr.seconds_text(secs) if math.isfinite(secs) else "a while"
    kind = "token by token over the KV cache" if policy in SEQUENTIAL else "in one pass with the cache's mask"
    if not (secs <= AUTO_SECONDS or n <= AUTO_TOKENS):
        st.info(f"{kf.POLICY_LABELS[policy]} over {n:,} tokens runs {kind} and the full model once: {said} on "
                f"{model.device.type.upper()}. It starts when you ask.")
        if not st.button(f"Run {policy} at budget {budget} ({said})", key="kvcache-run", type="primary"):
            st.stop()
    # the map below reads the full model's trace of this text: traced first, it stands for evict's full-model pass
    ref_trace = models.get_trace(model_name, clean, target=cont if policy == "snapkv" else None, notes=False)
    df = kr.run(model, model_name, clean, policy, budget, label=f"{policy} at budget {budget} ({said})",
                trace=ref_trace, **args)
    if df is None:
        st.stop()

a = df.attrs
m = st.columns(4)
m[0].metric("Perplexity, full cache", f"{a['perplexity_full']:.3f}")
m[1].metric(f"Perplexity, {policy}", f"{a['perplexity']:.3f}", delta=f"{a['perplexity'] - a['perplexity_full']:+.3f}",
            delta_color="inverse")
m[2].metric("Mean KL(full ‖ policy)", f"{df['kl'].mean():.4f} nats")
m[3].metric("Attention mass lost", f"{df['mass_lost'].mean():.3f}")
if policy == "snapkv" and a["observe"] != observe:
    st.caption(f"SnapKV observed the prompt's last {a['observe']} queries, not {observe}: the observed queries' keys "
               f"stay in the cache, which holds budget − 1 = {budget - 1} keys (and the prompt's {n_prompt} at most).")
st.download_button("Per position (CSV)", downloads.csv_later(df), key="kvcache-csv",
                   file_name=f"kvcache-{model_name}-{policy}-{budget}.csv", mime="text/csv", on_click="ignore")

# ------------------------------------------------------------------ the chosen head's map
st.subheader("The chosen head's map, evicted keys greyed out")
L, H = model.config.n_layers, model.config.n_heads
h = st.columns(3)
layer_key = url_state.int_from_url(state, "layer", 0, 0, L - 1, of=model_name)
layer = int(h[0].number_input("Layer", 0, L - 1, key=layer_key, step=1))
head_key = url_state.int_from_url(state, "head", 0, 0, H - 1, of=model_name)
head = int(h[1].number_input("Head", 0, H - 1, key=head_key, step=1))
row_key = url_state.int_from_url(state, "row", 0, 0, max(0, n - 1), of="this text's positions")
r0 = int(h[2].number_input(f"First query row (a block of {kf.MAP_ROWS})", 0, max(0, n - 1), key=row_key, step=64)) \
    if n > kf.MAP_ROWS else 0
url.update(layer=url_switches.changed(layer, 0), head=url_switches.changed(head, 0), row=url_switches.changed(r0, 0))
state.publish(**url)
state.show_messages()
r1 = min(n, r0 + kf.MAP_ROWS)
trace = models.get_trace(model_name, clean, target=cont if policy == "snapkv" else None, notes=False)
if trace is not None:
    w, _ = layer_maps(trace, "decoder", layer).tile(head, r0, r1)
    w = w.float().cpu().numpy()[:, :r1]
    kept = a["kept"](layer, head, rows=np.arange(r0, r1))[:, :r1]
    st.caption(f"Layer {layer}, head {head} (kv head {head // a['kept'].group}): the full model's attention weights "
               f"for query rows {r0}–{r1 - 1}; grey cells are keys that {policy}'s cache had evicted when that query "
               f"read, or that the layer's own sliding window no longer reached (the full model's weight on each is "
               f"in its hover).")
    kept_fig = kf.kept_map(w, kept, trace.tokens("target"), r0,
                           title=f"{policy} at budget {budget}: layer {layer}, head {head}")
    sink_name = tn.attn("decoder", layer, tn.SELF, "sink")
    if sink_name in trace:  # learned sinks (gpt-oss): the row's share that no key owns, and no cache slot holds
        add_sink_column(kept_fig, trace[sink_name][head][r0:r1])
        st.caption("The column **sink**, right of the red line, is the head's learned sink: the share of each row "
                   "that no key owns, so no cache slot holds it and no policy evicts it.")
    charts.chart(kept_fig,
                 key="kvcache-map", name=f"kvcache-{model_name}-{policy}-{budget}-L{layer}H{head}", width="stretch")

# ------------------------------------------------------------------ mass lost and loss along the text
left, right = st.columns(2)
with left:
    charts.chart(kf.mass_heatmap(a["mass_lost_heads"]), key="kvcache-mass", name=f"kvcache-mass-{policy}-{budget}",
                 width="stretch")
with right:
    charts.chart(kf.sink_heatmap(a["sink_scores"], max(1, sinks)), key="kvcache-sinks",
                 name=f"kvcache-sinks-{model_name}", width="stretch")
learned = kf.learned_sink_table(trace, a["sink_scores"]) if trace is not None else None
if learned is not None:  # gpt-oss: a sink logit per head that no key owns, beside StreamingLLM's first tokens
    st.subheader("A learned sink beside StreamingLLM's sinks")
    st.caption(f"{model_name}'s heads each have a learned sink: a logit in the softmax that no key owns, so a row "
               "can park its attention there instead of on the first tokens. Per layer: the learned sink's share "
               f"of a row beside the full model's attention on the first {max(1, sinks)} token(s).")
    charts.chart(kf.learned_sink_figure(learned, max(1, sinks)), key="kvcache-learned-sink",
                 name=f"kvcache-learned-sink-{model_name}", width="stretch")
    st.markdown(kf.learned_sink_verdict(learned, max(1, sinks)))
st.subheader("Where forgetting hurts")
charts.chart(kf.loss_figure(df), key="kvcache-loss", name=f"kvcache-loss-{policy}-{budget}", width="stretch")
st.caption("Each token shaded by the loss the policy adds when it predicts the next one: log p_full − log p_policy "
           "(red: worse than the full cache, blue: better).")
charts.chart(kf.loss_text_figure(df), key="kvcache-text", name=f"kvcache-text-{policy}-{budget}", width="stretch")

# ------------------------------------------------------------------ sinks removed
st.subheader("What removing the sinks does")
if budget > sinks and sinks > 0 and policy in ("window", "streaming"):
    other = "window" if policy == "streaming" else "streaming"
    od = kr.run(model, model_name, clean, other, budget, trace=trace, **args)
    if od is not None:
        win, stream = (df, od) if policy == "window" else (od, df)
        st.dataframe(kf.sinks_effect(win, stream), hide_index=True, key="kvcache-sinks-table")
else:
    st.caption("Shown for the window and StreamingLLM policies with at least one sink: the same budget with the first "
               f"{sinks} token(s) kept and without them.")

# ------------------------------------------------------------------ perplexity against budget
st.subheader("Perplexity against budget, every policy")
budgets = [b for b in SWEEP_BUDGETS if b < n and b > sinks] or [max(sinks + 1, min(n - 1, 8))]
sweep_policies = ["window", "streaming"]  # SnapKV scores a continuation only: not on this scale
with_seq = st.checkbox("Include H2O and TOVA (token by token: slow)", key="kvcache.sweep_seq")
if with_seq:
    sweep_policies += ["h2o", "tova"]
todo = [(p, b) for p in sweep_policies for b in budgets if kr.cached(model_name, clean, p, b, **args) is None]
total = sum(kr.estimate(model, n, p) for p, _ in todo)
if todo and not st.button(f"Compute {len(todo)} runs ({kr.seconds_text(total) if math.isfinite(total) else 'a while'})",
                          key="kvcache-sweep"):
    st.caption(f"Budgets {', '.join(map(str, budgets))} for {', '.join(sweep_policies)}: each is a run as above, "
               "over the whole text (SnapKV, which scores its continuation only, is left out).")
else:
    bar = st.progress(0.0, text="sweep")
    results = {}
    for k, (p, b) in enumerate([(p, b) for p in sweep_policies for b in budgets]):
        got = kr.run(model, model_name, clean, p, b, bar=bar, label=f"{k + 1}/{len(sweep_policies) * len(budgets)} "
                     f"{p} at {b}", trace=trace, **args)
        if got is not None:
            results[(p, b)] = got
    bar.empty()
    if results:
        table = kf.sweep_table(results)
        charts.chart(kf.ppl_figure(table, float(table["perplexity_full"].iloc[0])), key="kvcache-ppl", name=f"kvcache-ppl-{model_name}",
                     width="stretch")
        st.download_button("The sweep (CSV)", downloads.csv_later(table), key="kvcache-sweep-csv",
                           file_name=f"kvcache-sweep-{model_name}.csv", mime="text/csv", on_click="ignore")
