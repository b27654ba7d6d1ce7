"""Attribution: which input tokens the output depends on, by gradient x input, integrated
gradients and occlusion beside the attention-based pictures (last layer, rollout, flow, value
norms), and which of them is faithful on this sentence (comprehensiveness, sufficiency,
deletion curves). Numbers from core.analysis.input_attribution; figures from viz.attribution.figures.
"""

import streamlit as st

from core.analysis import input_attribution as A
from core.analysis import faithfulness_scores as F
from core.analysis.token_ids import input_token_id, output_token_id
from core.errors import InputError
from viz.attribution import figures as af
from viz.attribution.defaults import DEFAULT_POSITION, DEFAULT_TEXT, STEPS, STEPS_DEFAULT
from viz.attribution import run_panel as attribution_run
from viz.ui import charts, models, registry, url_state, url_switches, widgets

WARN_COMPLETENESS = A.COMPLETE_WITHIN  # integrated gradients' completeness error above which the page warns
# (the computation refines its steps until within it, up to 9 x the steps chosen)

widgets.header("attribution")
st.caption("Attention says where a head looks, not whether that matters for the output. Here gradient-based and "
           "perturbation-based attributions stand beside the attention-based pictures of the same sentence, and "
           "a faithfulness test (DeYoung et al. 2020) says which of them follows what the model does.")
state = url_state.PageState("attribution", fields=("model", "text", "target", "contrast", "baseline", "steps",
                                                   "fix_first", "words", "position", "faithful"))

model_name, model, text_col = widgets.model_header(state)
if model is None:
    st.stop()
if model.kind != "encoder-decoder":  # only a translation has positions to choose from
    state.ignored_if_given("position", f"{model_name} is {'a decoder' if model.kind == 'decoder' else 'an encoder'}: "
                           f"the output explained is {'the next token' if model.kind == 'decoder' else 'the mask'}, "
                           "so there is no translation position to choose")
if model.kind == "encoder" and getattr(model, "mlm_head", None) is None:
    st.info(f"Attribution needs an output: {model_name} is an encoder without an output head (no masked-LM head), "
            "so there is no prediction whose inputs could be weighed. Its attention can be read on Explore and "
            "compared with another model's on Compare.")
    st.page_link(registry.page("compare").file, label="Compare its attention with another model's", icon=":material/compare_arrows:")
    # the user's sentence stays in the URL (and the session) for the next model
    state.end_here(model=model_name, text=st.session_state.get(state.key("text")))

if model.kind == "encoder":
    default_text = f"The capital of France is {getattr(model.tokenizer, 'mask_token', '[MASK]')}."
else:
    default_text = DEFAULT_TEXT.get(model.kind) or (model.examples[0] if model.examples else "the cat sat on the mat")
text_key = state.seeded_key("text", default_text)
with text_col:
    text = widgets.text_box("Sentence", text_key, help=(
        "Decoders: the next token after the text is explained. Encoders with a masked-LM head: the word at the mask. "
        "Encoder-decoders: one word of the translation (pick its position below)."))
url = dict(model=model_name, text=text)

position = None
if model.kind == "encoder-decoder":
    trace = models.get_trace(model_name, text)
    if trace is None:
        state.end_here(**url)
    dec = trace.tokens("target")
    pos_default = DEFAULT_POSITION.get(text, 0) if DEFAULT_POSITION.get(text, 0) < len(dec) else 0
    pos_key = url_state.int_from_url(state, "position", pos_default, 0, len(dec) - 1, of="the translation")
    nxt = dec[1:] + ["<end>"]
    position = st.selectbox("Translation word explained", list(range(len(dec))), key=pos_key,
                            format_func=lambda p: f"{p}: {nxt[p]!r} (after {' '.join(dec[:p + 1])})")
    url["position"] = url_switches.changed(position, pos_default)


@st.cache_resource(max_entries=16, show_spinner=False)
def _top(model_name: str, text: str, position, _model):
    return A.top_targets(_model, text, 10, position)


try:
    tops = _top(model_name, text, position, model)
except (InputError, ValueError) as exc:
    # bad input (an empty text) is a warning saying what to do, as on every page that traces it
    (st.warning if isinstance(exc, InputError) else st.error)(str(exc))
    state.end_here(**url)

def _token_of(field: str, what: str):
    """A typed token as given, once the model's vocabulary holds it (a ValueError says why not):
    an output token for the target and the contrast, an input token for the baseline."""
    def parse(raw) -> str:
        raw = str(raw)
        if raw:
            (input_token_id if field == "baseline" else output_token_id)(model, raw, what)
        return raw
    return parse


TOKEN_FIELDS = {"target": "target token", "contrast": "contrast token", "baseline": "baseline token"}
INSTEAD = {"target": "the model's top-1", "contrast": "no contrast (the target's logit alone)",
           "baseline": "the default baseline token"}
# a URL's token the model cannot read is replaced by the default (empty) with a warning that names
# it, as on the Lens page; one typed into a box is said below, the default used meanwhile
target_key, contrast_key, baseline_key = (
    state.seeded_key(f, "", parse=_token_of(f, what), why=lambda raw, exc: str(exc) or "not one token of this model",
                     instead=INSTEAD[f])
    for f, what in TOKEN_FIELDS.items())


def _fill(pick_key: str, into: str) -> None:
    chosen = st.session_state.get(pick_key)
    if chosen is not None:
        st.session_state[into] = chosen
        st.session_state[pick_key] = None


options = [tok for _, tok, _ in tops]
probs = {tok: p for _, tok, p in tops}
ids = {tok: i for i, tok, _ in tops}
c = st.columns(3)
with c[0]:
    st.selectbox("Target: the model's top 10", options, index=None, key="attribution.target_pick",
                 placeholder="pick one…", format_func=lambda t: f"{t!r} (id {ids[t]})  p={probs[t]:.3f}",
                 on_change=_fill, args=("attribution.target_pick", target_key))
    target = st.text_input("Target token (empty: the model's top-1)", key=target_key,
                           help="One token exactly as the model spells it, a leading space included (' Mary' and "
                                "'Mary' are two tokens); the one computed is shown with its id below.")
with c[1]:
    st.selectbox("Compared with (f = logit[target] − logit[this])", options, index=None,
                 key="attribution.contrast_pick", placeholder="pick one…", format_func=lambda t: f"{t!r} (id {ids[t]})",
                 on_change=_fill, args=("attribution.contrast_pick", contrast_key))
    contrast = st.text_input("Contrast token (empty: the target's logit alone)", key=contrast_key)
with c[2]:
    baseline = st.text_input("Baseline token (empty: pad, else end of sequence)", key=baseline_key,
                             help="Its embedding replaces a token's: the start of integrated gradients' path, what "
                                  "occlusion puts in a token's place and what the faithfulness test deletes with.")
    steps_key = url_switches.option(state, "steps", STEPS_DEFAULT, STEPS)
    steps = st.select_slider("Integrated gradients: steps", STEPS, key=steps_key)
c2 = st.columns(3)
# decoders read their first token as an attention sink (it collects the attention no other token
# needs): replacing it breaks the pass, so integrated gradients' path and the faithfulness test's
# perturbed inputs leave it in place by default there (on smollm2 the sum converges only so)
fix_default = model.kind == "decoder"
fix_key = url_switches.flag(state, "fix_first", fix_default)
fix_first = c2[0].toggle("Hold the first token fixed", key=fix_key,
                         help="Integrated gradients' path, the deletion curves and the faithfulness test leave token 0 "
                              "(the attention sink of decoders) at its own embedding: on smollm2 this is what makes "
                              "the integral converge (docs/design.md). On by default for decoders.")
words_key = url_switches.flag(state, "words")
words = c2[1].toggle("Read in words", key=words_key, help="A word's score is the sum of its pieces' scores.")
# the faithfulness test runs every method's ranking and 20 random ones through the model (hundreds
# of passes, about twice the scores' time): it runs when asked, and the URL keeps the asking
faithful_key = url_switches.flag(state, "faithful")
faithful = c2[2].toggle("Test which method is faithful", key=faithful_key,
                        help="Comprehensiveness and sufficiency of each method's ranking against 20 random ones "
                             "(DeYoung et al. 2020), and the deletion curves: one batched pass per perturbed input, "
                             "a few hundred in all, so it runs when switched on.")
typed = {"target": target, "contrast": contrast, "baseline": baseline}
for f, value in typed.items():  # a token typed into a box that the model cannot read: said, the default used
    try:
        _token_of(f, TOKEN_FIELDS[f])(value)
    except ValueError as exc:
        st.warning(f"{str(exc)[:1].upper()}{str(exc)[1:]}: using {INSTEAD[f]} instead. Type a token of "
                   f"{model_name}'s vocabulary, or pick one from the list.")
        typed[f] = ""
url.update(target=target or None, contrast=contrast or None, baseline=baseline or None,
           steps=url_switches.changed(steps, STEPS_DEFAULT), fix_first=url_switches.flag_url(fix_first, fix_default),
           words=url_switches.flag_url(words), faithful=url_switches.flag_url(faithful))
state.publish(**url)
state.show_messages()


if contrast:  # f = logit[target] - logit[contrast] of one token is 0 whatever the input: nothing to explain
    try:
        same = output_token_id(model, contrast, "contrast token") == (
            output_token_id(model, target, "target token") if target else tops[0][0])
    except ValueError:
        same = False  # the computation below says what is wrong with the token
    if same:
        st.warning(f"The target and the contrast are the same token ({contrast!r}, id "
                   f"{output_token_id(model, contrast)}): f = logit[target] − logit[contrast] is 0 for every input, so "
                   "every method would score every token 0. Choose another contrast, or clear it to explain the "
                   "target's logit alone.")
        st.stop()

bar = st.progress(0.0, text="Attributing…")


def _progress(f: float, what: str) -> None:
    bar.progress(min(1.0, max(0.0, f)), text=f"Computing: {af.label(what) if what in af.LABELS else what}…")


try:
    # the fields as typed or picked: a leading or trailing space belongs to the token (' Mary' is
    # not 'Mary'), so nothing is stripped; an empty field takes the page's default
    asked = (model_name, text, typed["target"], typed["contrast"], typed["baseline"], steps, fix_first, position)
    info, frames, setup = attribution_run.compute(*asked, model, _progress)
except (InputError, ValueError) as exc:
    bar.empty()
    mixers = any(k.get("mixer", "softmax") != "softmax" for k in model.layer_kinds())
    (st.info if mixers and "mixes tokens with" in str(exc) else st.error)(  # a view that does not apply to mixers
        ("**Attention-based attribution reads softmax attention**: " if mixers else "") + str(exc))
    st.stop()
bar.empty()

f_text = (f"logit[{info['target']!r}]" + (f" − logit[{info['contrast']!r}]" if info["contrast"] is not None else ""))
ids_text = f"target id {info['target_id']}" + (f", contrast id {info['contrast_id']}" if info["contrast"] is not None
                                               else "")
where = {"decoder": "at the next position", "encoder": "at the mask",
         "encoder-decoder": f"at decoder position {position}"}[model.kind]
st.markdown(f"Explained: **f = {f_text}** ({ids_text}) {where}. Baseline: the embedding of **{info['baseline']!r}** "
            f"(id {info['baseline_id']}); positions stay.")

ig = frames["integrated_gradients"]
err = ig.attrs["completeness_error"]
used = int(ig.attrs["steps"])
steps_text = (f"{used} steps: {steps} chosen, tripled until within {WARN_COMPLETENESS:.0%}" if used != steps
              else f"{steps} steps")
st.caption(f"Integrated gradients' completeness: the scores sum to {ig['score'].sum():.4g}, f(x) − f(baseline) = "
           f"{ig.attrs['f_x'] - ig.attrs['f_baseline']:.4g}; completeness error **{err:.1%}** "
           f"({steps_text}{', first token fixed' if fix_first else ''}).")
if err > WARN_COMPLETENESS:
    higher = next((s for s in STEPS if s > steps), None)
    st.warning(f"Integrated gradients is not complete here: its scores miss f(x) − f(baseline) by {err:.1%} "
               f"(above {WARN_COMPLETENESS:.0%}) even at {used} steps ({steps} chosen, tripled while above "
               f"{WARN_COMPLETENESS:.0%}), so they are not yet the integral they stand for: the path crosses a region "
               "where the output changes too sharply for this many steps. Raise the steps"
               + ("" if fix_first else " or hold the first token fixed on the path") + ".")
    if higher is not None:
        st.button(f"Raise the steps to {higher}", key="attribution.raise",
                  on_click=lambda: st.session_state.__setitem__(steps_key, higher))

rows = {}
for m, df in frames.items():
    if words:
        rows[m] = af.word_scores(df["score"].to_numpy(), info["tokens"], info["word_ids"], info["special"])
    else:
        rows[m] = (df["score"].to_numpy(), info["tokens"])
notes = {"integrated_gradients": f"completeness error {err:.1%}"}
st.subheader("The sentence, coloured by each method")
st.caption("One row per method, each with its own colour scale: red-blue (diverging about 0) for the signed "
           "scores of gradient × input, integrated gradients and occlusion, white-red for the attention-based ones "
           "(never negative). Hover a token for its score." + (" Words: the sum of their pieces." if words else ""))
charts.chart(af.coloured_text(rows, A.SIGNED, notes=notes), key="attribution-text", width="stretch",
             name=f"{model_name}-attribution")
st.download_button("Scores (CSV)", af.scores_csv(frames), file_name=f"{model_name}-attribution.csv",
                   mime="text/csv", key="attribution-csv", on_click="ignore", icon=":material/download:")

st.subheader("Which picture is faithful")
if not faithful:
    st.info("Switch on **Test which method is faithful** above to rank the methods against random rankings "
            f"(comprehensiveness, sufficiency and the deletion curves): {setup.n} tokens take a few hundred "
            "batched passes, about twice the scores' time.")
    st.stop()
bar = st.progress(0.0, text="Testing faithfulness…")
try:
    table = attribution_run.table(*asked, setup, frames, _progress)
except (InputError, ValueError) as exc:
    bar.empty()
    st.error(str(exc))
    st.stop()
bar.empty()
n_draws = table.attrs["draws"]
r_sd = float(table["random_sd"].iloc[0])
st.caption("Comprehensiveness: how much p(target) drops when a method's top 10–50% of tokens are replaced by the "
           "baseline embedding (higher is better). Sufficiency: how much it drops when all but those are replaced "
           f"(lower is better). Ranked by their difference; ranks written 2= are ties (equal at four decimals), not an "
           f"order. Random is {n_draws} seeded random rankings: its row is their mean, and ± is the standard deviation "
           f"of its difference over the draws ({r_sd:.4f}). A method whose margin over random is within "
           f"{F.NOISE_SDS:g} of those standard deviations is indistinguishable from random on this sentence."
           + (" The first token stays in place in every perturbed input, as on integrated gradients' path."
              if fix_first else ""))
methods_only = table[table["method"] != "random"]
if (methods_only["verdict"] == "indistinguishable from random").all():
    st.warning(f"On this sentence no method is distinguishable from random ({n_draws} random draws, difference "
               f"{float(table.loc[table['method'] == 'random', 'difference'].iloc[0]):.4f} ± {r_sd:.4f}): the order "
               "below says nothing about which method follows the model. Typically one or two tokens carry the whole "
               "prediction, so any ranking that puts one of them first scores the same; try another sentence"
               + ("" if fix_first else ", or hold the first token fixed") + ".")
elif methods_only["tied"].any():
    st.info("Some methods tie (the same rank, written =): their rankings replace the same tokens first, so the test "
            "cannot tell them apart.")
# a static table: its cells wrap, so every column (the verdict last) fits the page at any width
with st.container(key="attribution-table"):
    st.table(af.table_for_display(table).style.format({c: "{:.4f}" for c in ("comprehensiveness", "sufficiency",
                                                                              "difference")}), hide_index=True)
st.download_button("Faithfulness table (CSV)", table.to_csv(index=False), file_name=f"{model_name}-faithfulness.csv",
                   mime="text/csv", key="attribution-table-csv", on_click="ignore", icon=":material/download:")
charts.chart(af.deletion_figure(F.curves_frame(table), info["target"], order=list(table["method"]),
                                random_sd=table.attrs["random_curve_sd"]),
             key="attribution-curves", width="stretch", name=f"{model_name}-deletion-curves")
