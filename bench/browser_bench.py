"""Browser benchmark: the app in headless Chromium (Playwright), on a warm server.

    python -m bench.browser_bench [--reps 10] [--long-reps 5] [--no-keep-freed-memory] [--json]
                                  [--only SCENARIO ...]   # e.g. --only corpus
                                  [--page PAGE ...]       # first_load: e.g. --page inside
                                  [--screenshots DIR]     # smollm2_8k: its three views as PNG

Each figure is the median over repetitions, measured in the page from the user's action
(the keydown of Enter, the pointerdown of a click, as the page's own event timestamps) to
the first moment the chart `.st-key-<key>[data-stale="false"] .js-plotly-plot` holds the
new figure: a different plotly data object than before the action, which also passes a
check that it is the new data (the typed tokens on the x axis, "head h" in the title, 72
maps, one more decoder row...). The page is polled every animation frame.

1. sentence: type a new 20-token sentence (minilm: [CLS] + 18 words + [SEP]) + Ctrl+Enter on
   /explore -> the heatmap shows its tokens; also toy-translate (20 words), the app's default;
2. model view: click the tab "Model view (all layers × heads)" -> the 72-map grid (minilm,
   6 layers x 12 heads, 20 tokens, tiled into one heatmap by viz.figures.grid) is drawn;
3. head: choose another head in the "Head" selectbox -> the heatmap's title says that head;
4. decoder step: press "Next" on /decoder (toy-translate, inference) -> "decoder-weights"
   shows one more row (the target's figure); also reported: until all five of the step's
   charts hold their new figures;
   decoder in the browser: the stepper's "Step in the browser" toggle on, a click on the
   all-steps figure's slider at the next step -> its title names that step (the figure
   restyles itself: no Streamlit run, which the page's script state confirms; also on the
   smollm2 run below);
   floor: the same press of Next on bench/floor/app.py, a bare Streamlit fragment with no
   chart and with five plain heatmaps of the decoder's sizes (values in the cells, no model,
   none of the app's code), each on its own server: what Streamlit and plotly.js cost on this
   machine, under the decoder's figure;
5. long input: 512 minilm tokens + Ctrl+Enter -> the heatmap is drawn; then the model view tab ->
   the grid; then a head change at 512 tokens; the page's longest main-thread task
   (PerformanceObserver 'longtask') while the 512-token views update tells whether the page
   stays responsive;
6. corpus: /corpus with 500 pasted sentences of 20 minilm tokens (10,000 tokens: the joint
   scatter of one head's queries and keys has 20,000 points; the page reads 2,000 sentences,
   1 MB, and draws up to 20,000 tokens). The paste + Ctrl+Enter runs the corpus job and the
   PCA (one run, reported, not the target). The target, "20,000 points drawn in <= 2 s once
   the projection is ready", is timed on changes that reuse the cached job and projection:
   "Colour by" (position, token, query / key in turn) and a return to a head seen before;
   each until the scatter holds 2 x 10,000 points in that colouring and head. Also reported:
   the longest main-thread task, and CPU seconds per redraw of the server, Chromium's
   renderer and its GPU process (WebGL runs in software under --disable-gpu), which load on
   the shared machine does not stretch as it does wall time.
7. first load (bench/browser/firstload.py): each page (/, explore, inside, positions, decoder,
   compare, heads, corpus, playground, notes) opened afresh -> usable (Streamlit's run ended,
   nothing stale or a grey skeleton, the first chart drawn), timed from the navigation's start;
   beside it bench/floor opened with as many plain heatmaps as the page mounted. The row is the
   ratio page / floor (target 2x), which load on the shared machine cancels out of; the note
   has both times, every chart drawn, the script's end and the longest main-thread task.
   Repetitions: a third of --reps (at least one).
8. smollm2_8k (bench/browser/long8k.py; not in --quick): 8,000 smollm2 tokens (~195 sentences)
   + Ctrl+Enter on /explore -> the traced pass (timed from its progress bar's first layer to
   "Done"), one head's map (an overview of pooled blocks), then the model view tab, then the
   Long document tab's span view; the target is the longest main-thread task during those three
   views (<= 0.5 s). One run (minutes); --screenshots DIR saves each view.

The scenarios live in bench/browser/ (one module per page, shared helpers in page.py); this
module runs them and prints the rows.

The server runs `python -m bench.serve run app.py` (streamlit run, after
core.device.keep_freed_memory(), which the app calls too), one torch thread, no file watcher.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.app_server import CHROMIUM, launch
from bench.browser.corpus import corpus_rows
from bench.browser.decoder import SLIDER_STEP_AT_JS, scenario_decoder, scenario_decoder_browser, scenario_decoder_long  # noqa: F401
from bench.browser.firstload import FIRST_LOAD_PAGES, first_load_rows
from bench.browser.explore import scenario_head, scenario_long, scenario_model_view, scenario_sentence
from bench.browser.floor import FLOOR_CHARTS, scenario_floor
from bench.browser.long8k import scenario_smollm2_8k, smol_document
from bench.browser.page import (HELPERS_JS, INIT_JS, _note, _slider_note, _where, collect, expected_ticks,
                                minilm_sentences, start_server, toy_sentences, wait_chart, wait_idle)
from bench.common import ROOT, Result, median, text_of


SCENARIOS = ("sentence", "model_view", "head", "decoder", "decoder_browser", "floor", "decoder_long", "toy", "long", "corpus",
             "first_load", "smollm2_8k")


def run(reps: int = 10, long_reps: int = 5, keep_freed: bool = True, quick: bool = False, app_root=None,
        only=None, pages=None, shots=None) -> dict:
    """Every scenario, or those named in `only` (SCENARIOS), on one warm server and browser."""
    import core

    def want(name: str) -> bool:
        return not only or name in only

    warm = 1
    results, details = [], {"reps": reps, "long_reps": long_reps, "keep_freed_memory": keep_freed}
    if not Path(CHROMIUM).exists():
        results.append(Result("browser", "all browser figures", None, "s", note=f"Chromium not found at {CHROMIUM}"))
        return {"results": [r.to_dict() for r in results], "details": details}
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        results.append(Result("browser", "all browser figures", None, "s", note="playwright is not installed"))
        return {"results": [r.to_dict() for r in results], "details": details}

    minilm = core.load_model("minilm", device="cpu")
    sents = minilm_sentences(minilm, reps + warm + 1)
    ticks = [expected_ticks(minilm.tokenizer.encode(s).tokens) for s in sents]
    server = start_server(keep_freed=keep_freed, root=Path(app_root) if app_root else ROOT)

    def attempt(section, names_targets, fn):
        """Run one scenario; on failure record 'not measured' rows with the reason."""
        try:
            return fn()
        except Exception as exc:  # a page being rewritten must not sink the other figures
            reason = f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:200]}"
            for name, target in names_targets:
                results.append(Result(section, name, None, "s", target, note=f"failed: {reason}"))
            details.setdefault("errors", []).append(f"{names_targets[0][0]}: {reason}")
            try:
                page.screenshot(path=str(Path(server.log).parent / f"failure-{len(details['errors'])}.png"))
            except Exception:
                pass
            return None

    try:
        with sync_playwright() as p:
            browser = launch(p)
            ctx = browser.new_context(viewport={"width": 1400, "height": 1600})
            ctx.add_init_script(INIT_JS)
            page = ctx.new_page()
            page.add_init_script(HELPERS_JS)
            # warm the server: both models loaded, plotly's bundle in the browser cache
            for url in (f"{server.url}/explore", f"{server.url}/explore?model=minilm&text=warm+up"):
                for _ in range(2):
                    try:
                        page.goto(url)
                        wait_idle(page, 300_000)
                        wait_chart(page, "explore-heatmap", 300_000)
                        break
                    except Exception:
                        continue
            details["server_rss_mib_warm"] = server.rss_mib()

            def timed_row(scenario: str, detail: str, name: str, target: float, run_it) -> None:
                """One target row from a scenario that returns (times, breakdowns)."""
                if not want(scenario):
                    return
                r = attempt("browser", [(name, target)], run_it)
                if r:
                    t, b = r
                    details[detail] = {"times": t, "breakdown": collect(b)}
                    results.append(Result("browser", name, median(t), "s", target, note=_note(t) + _where(collect(b))))

            timed_row("sentence", "sentence_minilm", "type a new 20-token sentence + Ctrl+Enter -> heatmap (minilm)", 0.5,
                      lambda: scenario_sentence(page, server.url, "minilm", sents, ticks, warm))
            timed_row("model_view", "model_view", "minilm model view: 72 maps drawn after the tab click (20 tokens)",
                      1.5, lambda: scenario_model_view(page, reps, warm, 72))
            timed_row("head", "head", "change the head -> heatmap (minilm, 20 tokens)", 0.3,
                      lambda: scenario_head(page, reps, warm))

            if want("decoder"):
                name = "decoder step: Next -> decoder-weights (toy-translate)"
                dec = attempt("browser", [(name, 0.3)], lambda: scenario_decoder(
                    page, server.url, "the small happy dog sees the old cat near the quiet river", reps, warm))
                if dec is not None:
                    details["decoder"] = dec
                    if "error" in dec:
                        results.append(Result("browser", name, None, "s", 0.3, note=dec["error"]))
                    else:
                        results.append(Result("browser", name, median(dec["times"]), "s", 0.3,
                                              note=_note(dec["times"]) + _where(dec["breakdown"])))
                        results.append(Result("browser", "decoder step: Next -> all five of the step's charts redrawn "
                                              "(mask, masked scores, weights, cross-attention, next token)",
                                              median(dec["all_charts"]), "s", None, note=_note(dec["all_charts"])))

            if want("decoder_browser"):
                name = "decoder step in the browser: the all-steps figure's slider -> the next step (toy-translate)"
                r = attempt("browser", [(name, 0.3)], lambda: scenario_decoder_browser(
                    page, server.url, "the small happy dog sees the old cat near the quiet river", reps, warm))
                if r:
                    t, b = r
                    details["decoder_browser"] = {"times": t, "breakdown": collect(b)}
                    results.append(Result("browser", name, median(t), "s", 0.3, note=_slider_note(t, b)))

            if want("floor"):
                names = [("floor: a Streamlit fragment rerun, no chart (bench/floor: Next -> its step line changes)", None),
                         (f"floor: the same fragment with {FLOOR_CHARTS} plain heatmaps, values in the cells, no model "
                          "(Next -> the third chart redrawn)", None)]
                fl = attempt("browser", names, lambda: scenario_floor(browser, reps, warm))
                if fl:
                    details["floor"] = fl
                    results.append(Result("browser", names[0][0], median(fl["none"]), "s", None, note=_note(fl["none"])))
                    results.append(Result("browser", names[1][0], median(fl["charts"]), "s", None,
                                          note=_note(fl["charts"]) + f"; all {FLOOR_CHARTS} redrawn after "
                                               f"{median(fl['all_charts']):.3f} s (median)"))

            if want("decoder_long") and core.MODELS["smollm2"].available():
                name = "decoder step: Next -> next-token chart (smollm2, 1,024-token prompt, 64 new tokens)"

                def long_decoder():
                    from bench.common import PASSAGE

                    smol = core.load_model("smollm2", device="cpu")
                    text = PASSAGE * 40
                    text = text[: smol.tokenizer.encode(text).offsets[1023][1]]
                    return scenario_decoder_long(page, server.url, text, reps, warm)

                dl = attempt("browser", [(name, 0.3), ("decoder step in the browser (smollm2, 1,024-token prompt)", 0.3)],
                             long_decoder)
                if dl is not None:
                    details["decoder_long"] = dl
                    results.append(Result("browser", name, median(dl["times"]), "s", 0.3,
                                          note=_note(dl["times"]) + f"; its weights map (in blocks) redrawn after "
                                               f"{median(dl['weights']):.3f} s (median)" + _where(dl["breakdown"])))
                    results.append(Result("browser", "decoder step in the browser: the all-steps figure's slider -> "
                                          "the next step (smollm2, 1,024-token prompt, each step's last 48 rows)",
                                          median(dl["browser"]), "s", 0.3, note=_slider_note(dl["browser"], dl["browser_breakdown"])))

            if want("toy") and not quick:
                name = "type a new 20-word sentence + Ctrl+Enter -> heatmap (toy-translate, greedy translation included)"

                def toy_run():
                    toys = toy_sentences(reps + warm + 1)
                    toy = core.load_model("toy-translate", device="cpu")
                    tticks = [expected_ticks(toy.tokenizer.encode(s).tokens) for s in toys]
                    return scenario_sentence(page, server.url, "toy-translate", toys, tticks, warm)

                r = attempt("browser", [(name, 0.5)], toy_run)
                if r:
                    t, b = r
                    details["sentence_toy"] = {"times": t, "breakdown": collect(b)}
                    results.append(Result("browser", name, median(t), "s", 0.5, note=_note(t) + _where(collect(b))))

            if want("long"):
                base = text_of(minilm, 512).split()
                longs = []
                for i in range(long_reps + warm):
                    w = list(base)
                    w[i + 1], w[i + 5] = w[i + 5], w[i + 1]
                    longs.append(" ".join(w))
                names = [("512 tokens + Ctrl+Enter -> one head's map drawn (minilm)", 3.0),
                         ("512 tokens: model view tab -> 72-map grid drawn", 3.0),
                         ("512 tokens: change the head -> heatmap", None),
                         ("512 tokens: longest main-thread task while the views update (responsive: <= 0.5 s)", 0.5)]
                lg = attempt("long input", names, lambda: scenario_long(page, server.url, longs, warm))
                if lg:
                    bd = lg["breakdown"]
                    results.append(Result("long input", names[0][0], median(lg["map"]), "s", 3.0,
                                          note=_note(lg["map"]) + _where(bd["map"])))
                    results.append(Result("long input", names[1][0], median(lg["grid"]), "s", 3.0,
                                          note=_note(lg["grid"]) + _where(bd["grid"])))
                    results.append(Result("long input", names[2][0], median(lg["head"]), "s", None,
                                          note=_note(lg["head"]) + _where(bd["head"])))
                    results.append(Result("long input", names[3][0], max(lg["longest_task"]), "s", 0.5,
                                          note="worst over the repetitions of Chromium's 'longtask' entries from the Enter "
                                               "to the head change (the page cannot react to input during one)"))
                    details["long"] = lg

            if want("smollm2_8k") and not quick and core.MODELS["smollm2"].available():
                names = [("smollm2, 8,000 tokens: longest main-thread task once the trace is done, over the map, the "
                          "model view and the span view (responsive: <= 0.5 s)", 0.5)]
                # Enter -> one head's map (the trace included), model view tab -> its maps, Long document -> spans
                r8 = attempt("long input", names, lambda: _smollm2_8k(page, server.url, shots))
                if r8:
                    results.extend(_rows_8k(r8, names[0]))
                    details["smollm2_8k"] = r8

            if want("first_load"):
                first_load_rows(page, server, max(1, reps // 3), warm, results, details, attempt,
                                pages=[p for p in FIRST_LOAD_PAGES if not pages or p in pages])

            if want("corpus"):
                corpus_rows(minilm, reps, warm, page, server, results, details, attempt)
            details["server_rss_mib_end"] = server.rss_mib()
            details["exceptions_on_page"] = page.locator('[data-testid="stException"]').count()
            browser.close()
    finally:
        server.stop()
    return {"results": [r.to_dict() for r in results], "details": details}


def _smollm2_8k(page, url: str, shots) -> dict:
    """The smollm2_8k scenario on a tall viewport (its screenshots, if asked, go to `shots`)."""
    import core

    text = smol_document(core.load_model("smollm2", device="cpu"))
    size = page.viewport_size
    page.set_viewport_size({"width": 1400, "height": 2400})
    try:
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
        return scenario_smollm2_8k(page, url, text, Path(shots) if shots else None)
    finally:
        page.set_viewport_size(size)


def _said_ratio(r: dict):
    """The expected time the page's warning stated ("about 58 s", "about 1.2 minutes") over the
    traced pass's time; None without either."""
    import re

    m = re.search(r"take about ([0-9.]+) (s|minutes)", r.get("warning") or "")
    if not m or not r.get("trace"):
        return None
    return float(m.group(1)) * (60 if m.group(2) == "minutes" else 1) / r["trace"]


def _rows_8k(r: dict, target_row) -> list:
    """The smollm2_8k rows: the longest task (target) and each time (info)."""
    def fmt(x):
        return "-" if x is None else f"{x:.2f} s"

    longest = max(x for x in (r["map_longest_task"], r["model_view_longest_task"], r["spans_longest_task"]) if x is not None)
    pre = "smollm2, 8,000 tokens: "
    return [
        Result("long input", target_row[0], longest, "s", target_row[1],
               note=f"Chromium's 'longtask' entries: map {fmt(r['map_longest_task'])} (from the trace's end), model view "
                    f"{fmt(r['model_view_longest_task'])}, spans {fmt(r['spans_longest_task'])} (from the click); one run; load average "
                    f"{r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after (2 cores)"),
        Result("long input", pre + "the server's traced pass (the page's progress bar, first layer to done)", r["trace"], "s",
               None, note=f"Enter -> trace done {fmt(r['trace_from_enter'])}; one run"),
        Result("long input", pre + "the page's time warning: the time it said / the traced pass's", _said_ratio(r), "x",
               None, note=f"it said: {(r.get('warning') or 'no warning').strip()[:160]}"),
        Result("long input", pre + "one head's map (overview of pooled blocks) drawn after the trace is done",
               r["map_after_trace"], "s", None, note=f"Ctrl+Enter -> map {fmt(r['enter_to_map'])}" + _where(r["map_breakdown"])),
        Result("long input", pre + "model view tab -> its maps drawn", r["model_view"], "s", None,
               note="one run" + _where(r["model_view_breakdown"])),
        Result("long input", pre + f"Long document tab -> span view drawn ({r['n_spans']} x {r['n_spans']} sentences)",
               r["spans"], "s", None, note="one run" + _where(r["spans_breakdown"])),
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--long-reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-keep-freed-memory", action="store_true")
    ap.add_argument("--app-root", default=None, help="serve the app.py of another checkout (e.g. with a change wired in)")
    ap.add_argument("--only", action="append", choices=SCENARIOS, metavar="SCENARIO",
                    help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}")
    ap.add_argument("--page", action="append", choices=FIRST_LOAD_PAGES, dest="pages",
                    help="first_load: open only this page (repeatable)")
    ap.add_argument("--screenshots", default=None, metavar="DIR", help="smollm2_8k: save its three views here (PNG)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    reps, long_reps = (3, 1) if args.quick else (args.reps, args.long_reps)
    res = run(reps, long_reps, keep_freed=not args.no_keep_freed_memory, quick=args.quick, app_root=args.app_root,
              only=args.only, pages=args.pages, shots=args.screenshots)
    if args.json:
        print(json.dumps(res, default=str))
        return
    for r in res["results"]:
        v = "-" if r["value"] is None else f"{r['value']:.3f}"
        print(f"[{r['status']:>12}] {r['name']}: {v} {r['unit']} (target {r['target']})  {r['note']}")


if __name__ == "__main__":
    main()
