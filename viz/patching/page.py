"""Patching: which activations the output needs (activation patching, core.analysis.patch).

A clean and a corrupted prompt of the same token count, two answer tokens, and what to patch;
the page runs the grid (a progress bar while it runs) and draws `restored` as a layer x position
or layer x head map (viz.patching.figures), with the sanity check that patching the whole residual
stream at layer 0 where the prompts differ restores 1, and the table as CSV. A click on a cell
opens that layer (and head) in Explore.
"""


import streamlit as st

from core.analysis import activation_patching as cp
from core.analysis.token_ids import output_token_id
from viz.patching import figures as pm
from viz.figures.checks import Check
from viz.figures.text import clean_text
from viz.ui import charts, explore_links, models, url_state, url_switches, widgets
from viz.patching import run_panel as patching_run

MAX_TOKENS = 128  # a grid is layers x tokens patched runs: longer prompts are refused with a message
CHECK_TOL = 1e-4  # |restored - 1| allowed for the layer-0 check (float32 through every layer)
WHATS = list(cp.WHATS)

explore_links.follow("patching")  # a cell clicked on the last run opens its head in Explore

widgets.header("patching")
st.caption("Activation patching (Meng et al. 2022; Wang et al. 2022): run the corrupted prompt, put back one activation "
           "from the clean run, and see how much of the clean run's preference for the answer over the wrong token "
           "comes back. restored = (m − m_corrupt) / (m_clean − m_corrupt), m = logit[answer] − logit[wrong] at the "
           "last position: 1 = that activation alone carries the difference, 0 = it carries none of it.")
state = url_state.PageState("patching", fields=("model", "text", "corrupt", "answer", "wrong", "what", "layer", "head"))
allowed = [n for n in models.model_names() if models.model_kind(n) in ("decoder", "encoder-decoder")]
model_name, model, text_col = widgets.model_header(
    state, allowed=allowed, needs="patching measures a next-token logit, so it takes decoders and encoder-decoders")
if model is None:
    st.stop()

decoder = model.kind == "decoder"
default_clean = pm.IOI_CLEAN if decoder else (model.examples[0] if model.examples else "the small dog sees the cat")
default_corrupt = pm.IOI_CORRUPT if decoder else "the small cat sees the dog"
text_key = state.seeded_key("text", default_clean)
corrupt_key = state.seeded_key("corrupt", pm.default_corrupt(st.session_state[text_key])
                               if st.session_state[text_key] != default_clean else default_corrupt)
state.keep_text(corrupt_key)
TOKEN_FIELDS = {"answer": ("answer token", "the model's own choice on the clean prompt"),
                "wrong": ("wrong token", "the corrupted run's choice")}


def _one_token(field: str):
    """A typed token as given, once the model's vocabulary holds it as one token (a ValueError
    says why not); empty: the default."""
    def parse(raw) -> str:
        raw = str(raw)
        if raw:
            output_token_id(model, raw, TOKEN_FIELDS[field][0])
        return raw
    return parse


# a URL's token the model cannot read is replaced by the default with a warning naming it, as on
# Lens and Attribution; one typed into a box is said below, the default used meanwhile
ioi = decoder and st.session_state[text_key] == pm.IOI_CLEAN  # the IOI prompt's own tokens by default
answer_key, wrong_key = (
    state.seeded_key(f, default if ioi else "", parse=_one_token(f),
                     why=lambda raw, exc: str(exc) or "not one token of this model", instead=TOKEN_FIELDS[f][1])
    for f, default in (("answer", pm.IOI_ANSWER), ("wrong", pm.IOI_WRONG)))
what_key = url_switches.option(state, "what", "resid_pre", WHATS)
# a head marked on the grid: the one Explore's "Patch this head" came from (layer=, head= in the URL)
marked = None
given = [f for f in ("layer", "head") if state.qp.get(f) is not None]
if len(given) == 1:
    state.ignored(given[0], "layer and head mark a head together, and the URL gives only one of them")
elif given:
    marked = (url_state.as_int(state.qp["layer"]), url_state.as_int(state.qp["head"]))
    if None in marked or min(marked) < 0:
        for f in given:
            state.ignored(f, "the marked head's layer and head are whole numbers from 0")
        marked = None


def _n_tokens(t: str) -> int:
    return len(model.encode(t).ids)


swapped = None
if (st.session_state[corrupt_key] == st.session_state[text_key] and st.session_state[text_key].strip()
        and len(st.session_state[text_key]) <= 4 * MAX_TOKENS * 8):  # a prompt the grid takes (longer: refused below)
    # the same prompt twice restores nothing: offer one that differs in one word (the swap helper's)
    try:
        swapped = pm.swapped_corrupt(st.session_state[text_key], _n_tokens)
    except Exception:  # a text the model cannot read: the pair's own check says why below
        swapped = None
    if swapped is not None:
        st.session_state[corrupt_key] = swapped[0]


def _use_ioi() -> None:
    st.session_state.update({text_key: pm.IOI_CLEAN, corrupt_key: pm.IOI_CORRUPT, answer_key: pm.IOI_ANSWER,
                             wrong_key: pm.IOI_WRONG})


with text_col:
    c = st.columns(2)
    text = widgets.text_box("Clean prompt", text_key, where=c[0],
                            help="The run whose activations are put back." if decoder else
                            "The clean source sentence (the encoder's positions are patched).")
    corrupt = widgets.text_box("Corrupted prompt", corrupt_key, where=c[1],
                               help="Same number of tokens as the clean one; usually one word changed.")

ex = st.columns([1, 3])
if decoder:
    ex[0].button("Indirect object: Mary / John", key="patching-ioi", on_click=_use_ioi, width="stretch",
                 help=f"clean: {pm.IOI_CLEAN!r} → ' Mary'; corrupt: {pm.IOI_CORRUPT!r} → ' John' "
                      "(Wang et al. 2022's indirect-object identification).")
with ex[1].expander("Swap one word of the clean prompt"):
    ws = pm.words(text)
    if ws:
        s = st.columns([2, 2, 1])
        idx = s[0].selectbox("Word (counted from 0)", list(range(len(ws))), format_func=lambda i: f"{i}: {ws[i]}",
                             key="patching.swap_word")
        new = s[1].text_input("Replace with", key="patching.swap_new", placeholder="another word")

        def _swap() -> None:
            if new.strip() and idx is not None and idx < len(ws):
                st.session_state[corrupt_key] = pm.swap_word(text, idx, new.strip())

        s[2].button("Make corrupted", key="patching-swap", on_click=_swap, disabled=not new.strip())
    else:
        st.caption("Type a clean prompt first.")

c = st.columns([1, 1, 2])
answer = c[0].text_input("Answer token", key=answer_key, placeholder="the model's own choice",
                         help="One token, as the tokenizer writes it (a leading space often belongs to it: ' Mary'); "
                              "empty: the model's top prediction on the clean prompt.")
wrong = c[1].text_input("Wrong token", key=wrong_key, placeholder="the corrupted run's choice",
                        help="One token; empty: the model's top prediction on the corrupted prompt (or its second "
                             "choice on the clean one, where both agree).")
what = c[2].radio("Patch", WHATS, key=what_key, horizontal=True, format_func=lambda w: w,
                  help="; ".join(f"{k}: {v}" for k, v in pm.WHAT_LABELS.items()))
typed = {"answer": answer, "wrong": wrong}
for f, value in typed.items():  # a token typed into a box that the model cannot read: said, the default used
    try:
        _one_token(f)(value)
    except ValueError as exc:
        st.warning(f"{str(exc)[:1].upper()}{str(exc)[1:]}: using {TOKEN_FIELDS[f][1]} instead. Type a token of "
                   f"{model_name}'s vocabulary.")
        typed[f] = ""
url = dict(model=model_name, text=text, corrupt=corrupt, answer=answer or None, wrong=wrong or None,
           what=url_switches.changed(what, "resid_pre"), layer=None if marked is None else str(marked[0]),
           head=None if marked is None else str(marked[1]))
if swapped is not None and corrupt == swapped[0]:
    st.info(f"Patching compares two prompts that differ in one word, and no different corrupted prompt was given "
            "(the same sentence twice leaves nothing to restore). So this page made one from yours: word "
            f"{swapped[1]}, {swapped[2]!r}, is swapped for {swapped[3]!r}, which keeps the number of tokens the same. "
            "Edit the corrupted prompt above to choose another change.")
state.show_messages()

# ------------------------------------------------------------------ the pair
text, said = clean_text(text)  # as every page: control characters become spaces, with a word on it
corrupt, said_corrupt = clean_text(corrupt)
for msg in dict.fromkeys(said + said_corrupt):
    st.warning(msg)
try:
    pair = cp.prepare(model, text, corrupt)
except ValueError as exc:
    st.warning(str(exc))
    state.end_here(**url)
for which, n_cut in zip(("clean", "corrupted"), pair.cut):
    if n_cut:  # the model reads its first tokens: say how many went, never cut silently
        st.warning(f"The {which} prompt was cut to the model's maximum of {model.max_input_tokens} tokens "
                   f"({n_cut} tokens dropped from its end).")
if len(pair.clean_ids) > MAX_TOKENS:
    st.warning(f"The clean prompt has {len(pair.clean_ids)} tokens: the grid is one patched run per layer and token, "
               f"so the page patches prompts of up to {MAX_TOKENS} tokens. Shorten it.")
    state.end_here(**url)
if not pair.same_length:
    st.error(f"Clean and corrupted prompts must have the same number of tokens: the clean one has "
             f"{len(pair.clean_ids)}, the corrupted one {len(pair.corrupt_ids)}. Change words for words that the "
             "tokenizer splits the same way (see both tokenisations below).")
    widgets.token_chips(pair.tokens, title=f"clean: {len(pair.tokens)} tokens")
    widgets.token_chips(pair.corrupt_tokens, title=f"corrupted: {len(pair.corrupt_tokens)} tokens")
    state.end_here(**url)
try:
    pair.check()
except ValueError as exc:
    st.info(f"{str(exc)[0].upper()}{str(exc)[1:]}. Type a corrupted prompt, or swap one word above.")
    state.end_here(**url)

with st.expander(f"{len(pair.tokens)} tokens each; they differ at position"
                 f"{'s' if len(pair.differ) > 1 else ''} {', '.join(map(str, pair.differ))}"):
    widgets.token_chips(pair.tokens, title="clean")
    widgets.token_chips(pair.corrupt_tokens, title="corrupted")


# ------------------------------------------------------------------ answer and wrong tokens
auto_a, auto_w, why = patching_run.default_tokens(model, model_name, pair, text, corrupt)
try:
    answer_id = output_token_id(model, typed["answer"], "answer token") if typed["answer"] else auto_a
    wrong_id = output_token_id(model, typed["wrong"], "wrong token") if typed["wrong"] else auto_w
except ValueError as exc:
    st.error(f"{exc}.")
    state.end_here(**url)
if answer_id is None:
    state.end_here(**url)
if not typed["answer"] or not typed["wrong"]:
    st.caption(f"Measuring {model.alternative_strings([answer_id])[0]!r} against "
               f"{model.alternative_strings([wrong_id])[0]!r}" + (f": {why}." if why and not typed["answer"] and not typed["wrong"] else "."))
elif not decoder:
    st.caption(f"Measured at the decoder position after {' '.join(pair.decoder_tokens)}: the first where the two "
               "greedy translations differ.")
state.publish(**url)


# ------------------------------------------------------------------ the grid (kept per session)
try:
    df, chk = patching_run.grid(model, model_name, text, corrupt, answer_id, wrong_id, what)
except ValueError as exc:
    st.error(f"{exc}.")
    state.end_here(**url)

m_clean, m_corrupt = df.attrs["clean_metric"], df.attrs["corrupt_metric"]
k = st.columns(3)
k[0].metric("m on the clean prompt", f"{m_clean:.3f}")
k[1].metric("m on the corrupted prompt", f"{m_corrupt:.3f}")
k[2].metric("patched runs", f"{df.attrs['runs']:,}", help="Cells whose clean and corrupted values are equal (in a "
            "decoder: every position before the first difference) restore 0 without a run.")
if abs(m_clean - m_corrupt) < 1e-6:
    st.warning("The clean and corrupted prompts give the same m, so there is nothing to restore: choose answer and "
               "wrong tokens that the two prompts tell apart.")

# the sanity check: two values computed apart (the patched run through the grid's batched runs,
# and the clean run's own metric), compared with a stated tolerance; it can fail
check = Check(f"patching the whole residual stream entering layer 0 at the position"
              f"{'s' if len(pair.differ) > 1 else ''} where the prompts differ "
              f"({', '.join(map(str, pair.differ))}) restores {chk['restored']:.6f} (the patched run's m "
              f"{chk['patched_metric']:.5f}, the clean run's {chk['clean_metric']:.5f}): it must be 1, since the "
              "patched input is then the clean input",
              abs(chk["restored"] - 1.0), CHECK_TOL)
if abs(m_clean - m_corrupt) >= 1e-6:
    (st.success if check.ok else st.error)(check.text())

stack = df.attrs["stack"]
where = "decoder" if decoder else "encoder"
title = f"restored · {pm.WHAT_LABELS[what]} · {where}"
tokens = pair.tokens


def _open() -> None:
    sel = st.session_state.get("patching-map")
    pts = (sel or {}).get("selection", {}).get("points", []) if sel else []
    picked = pm.cell_pick(pts[0]) if pts else None
    if picked is not None:
        layer, head, _ = picked
        explore_links.open_next_run("patching", explore_links.explore_params(model_name, text, stack, layer, head))


st.caption("Rows are layers, columns " + ("heads (each patched at every position)" if what == "head" else
           "positions, labelled with the clean prompt's tokens") + ". Red restores the clean preference, blue pushes "
           "towards the corrupted one. Click a cell to open that layer" + (" and head" if what == "head" else "")
           + " in Explore on the clean prompt.")
show_mark = marked if what == "head" and marked is not None and (df["layer"] == marked[0]).any() and (
    df["head"] == marked[1]).any() else None
if marked is not None and show_mark is None:  # a mark the grid has no cell for: each field named
    why = (f"layer {marked[0]}, head {marked[1]} is no head of {model_name}'s grid (layers 0–{int(df['layer'].max())}, "
           f"heads 0–{int(df['head'].max())})" if what == "head" else
           "the marked head is drawn on the grid of heads (Patch: head), and this grid patches " + what)
    for f in ("layer", "head"):
        state.ignored_if_given(f, why)
    state.show_messages()
if marked is not None and show_mark is None and what != "head":
    st.caption(f"L{marked[0]}H{marked[1]}, the head from Explore, is marked on the heads grid: choose Patch: head.")
if show_mark is not None:
    cell = df[(df["layer"] == show_mark[0]) & (df["head"] == show_mark[1])]["restored"]
    st.caption(f"Outlined: **L{show_mark[0]}H{show_mark[1]}**, the head from Explore: restored "
               f"{float(cell.iloc[0]):.3f}." if len(cell) else f"Outlined: L{show_mark[0]}H{show_mark[1]}.")
charts.chart(pm.restored_heatmap(df, None if what == "head" else tokens, title=title, what=what, selected=show_mark), key="patching-map",
             on_select=_open, selection_mode="points", width="stretch", name=f"patching-{model_name}-{what}")
top = pm.top_cells(df, 5)
low = pm.bottom_cells(df, 5)


def _cell(r) -> str:
    return (f"L{r.layer}H{r.head}: {r.restored:.3f}" if what == "head" else
            f"{pm.row_label(r.layer, what)} {tokens[r.position]!r} ({r.position}): {r.restored:.3f}")


st.caption("Most restoring: " + " · ".join(_cell(r) for r in top.itertuples()) + ".")
st.caption("Most against the answer (pushing towards the corrupted run's): "
           + (" · ".join(_cell(r) for r in low.itertuples()) if len(low) else "none below 0") + ".")
st.download_button("Download the table (CSV)", df.to_csv(index=False).encode(), file_name=f"patching-{model_name}-{what}.csv",
                   mime="text/csv", key="patching-csv", icon=":material/download:")
with st.expander("The table"):
    st.dataframe(df, hide_index=True, width="stretch")
