"""Browser benchmark scenario on /corpus: the 20,000-point joint scatter redrawn."""

from __future__ import annotations

import os

from bench.browser.page import (LAST, _cpu, _note, _where, choose, collect, longtasks_since,
                                minilm_sentences, timed, wait_chart, wait_idle)
from bench.common import Result, median


def _proc_table() -> dict:
    """pid -> (parent pid, CPU seconds (user + system, all threads), command line) from /proc."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        out[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, cmd)
    return out


def cpu_seconds(server_pid: int) -> dict:
    """CPU seconds so far of the app server, and of this process's Chromium by kind: the page's
    renderer(s) and the GPU process (WebGL, software-rendered by SwiftShader under --disable-gpu).
    Unlike wall time, these do not grow when other jobs want the cores."""
    procs, me = _proc_table(), os.getpid()

    def mine(pid: int) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in procs:
                return False
            pid = procs[pid][0]
        return False

    out = {"server": procs[server_pid][1] if server_pid in procs else float("nan"), "renderer": 0.0, "gpu": 0.0}
    for pid, (_, cpu, cmd) in procs.items():
        if "chrom" in cmd and mine(pid):
            kind = "gpu" if "--type=gpu-process" in cmd else "renderer" if "--type=renderer" in cmd else None
            if kind:
                out[kind] += cpu
    return out


def cpu_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


CORPUS_SENTENCES, CORPUS_SENTENCE_LEN = 500, 20  # pasted: 10,000 minilm tokens -> 20,000 points
# "Colour by" options as the page names them (viz.corpus.figures.COLOR_BY), in the order the scenario cycles
CORPUS_COLOURS = [("position", "position"), ("token", "token (most frequent)"), ("type", "query / key")]
# the joint scatter: two traces (queries, keys) of arg[0] points each, coloured by arg[1], head arg[2]
CORPUS_CHECK = ("e.data.length === 2 && window.__len(e.data[0].x) === arg[0] && window.__len(e.data[1].x) === arg[0] "
                "&& (typeof e.data[0].marker.color === 'string' ? 'type' : e.data[0].marker.colorbar ? 'position' "
                ": 'token') === arg[1] && new RegExp('head ' + arg[2] + ' ').test(window.__title(e))")


def scenario_corpus(page, base_url: str, sentences: list, n_tokens: int, n_reps: int, warm: int,
                    server_pid: int) -> dict:
    """The corpus page's joint scatter of 2 x n_tokens points (queries and keys of one head,
    minilm layer 0): the pasted corpus (`sentences`, all within the page's default of 500) is
    traced and projected once (timed, but not the target: the corpus job + PCA + draw); then
    the target: "Colour by" changes, which reuse the cached corpus job and projection and only
    rebuild the figure and draw it; then returns to a head seen before (its projection cached),
    after one untimed first visit that computes it. Each repetition also records the CPU
    seconds (cpu_seconds) from before the action until the page is idle again."""
    page.goto(f"{base_url}/corpus?model=minilm&layer=0&head=0&projection=pca")
    wait_idle(page, 300_000)
    wait_chart(page, "corpus-scatter", 300_000)  # the bundled corpus first
    colour = page.get_by_role("combobox", name="Colour by", exact=True).input_value()  # gone while the corpus is empty
    mode = {shown: m for m, shown in CORPUS_COLOURS}[colour]
    page.locator(".st-key-corpus-source").get_by_role("radio", name="Paste text", exact=True).check(force=True)
    wait_idle(page)
    box = page.get_by_label("Sentences, one a line", exact=True)
    box.fill("\n".join(sentences))
    t_first = timed(page, lambda: box.press("Control+Enter"), "corpus-scatter", CORPUS_CHECK, [n_tokens, mode, 0],
                    900_000)
    first = dict(LAST)
    wait_idle(page, 900_000)
    t_lt = page.evaluate("() => performance.now()")
    times, bds = [], []
    order = [c for c in CORPUS_COLOURS if c[0] != mode] + [c for c in CORPUS_COLOURS if c[0] == mode]
    for i in range(n_reps + warm):
        mode, shown = order[i % len(order)]
        click = choose(page, "Colour by", shown)
        c0 = cpu_seconds(server_pid)
        t = timed(page, click, "corpus-scatter", CORPUS_CHECK, [n_tokens, mode, 0], 300_000)
        wait_idle(page, 300_000)
        if i >= warm:
            times.append(t)
            bds.append(dict(LAST, cpu=cpu_delta(c0, cpu_seconds(server_pid))))
    colour_tasks = longtasks_since(page, t_lt)
    # head 1's first visit computes its projection (untimed); then heads 0 and 1 in turn, both cached
    heads, hbds = [], []
    for i in range(n_reps + warm + 1):
        h = 1 - i % 2 if i else 1
        click = choose(page, "Head", str(h))
        c0 = cpu_seconds(server_pid)
        t = timed(page, click, "corpus-scatter", CORPUS_CHECK, [n_tokens, mode, h], 300_000)
        wait_idle(page, 300_000)
        if i > warm:
            heads.append(t)
            hbds.append(dict(LAST, cpu=cpu_delta(c0, cpu_seconds(server_pid))))
    return {"first": t_first, "first_breakdown": first, "colour": times, "colour_breakdown": collect(bds),
            "colour_cpu": [b["cpu"] for b in bds], "head_cpu": [b["cpu"] for b in hbds],
            "colour_longest_task": max((d for _, d in colour_tasks), default=0.0) / 1000,
            "head": heads, "head_breakdown": collect(hbds),
            "head_longest_task": max((b["longest_task"] for b in hbds if b.get("longest_task") is not None),
                                     default=None)}


def corpus_rows(model, reps: int, warm: int, page, server, results: list, details: dict, attempt) -> None:
    """The corpus scenario's rows: 20,000 points drawn after a colour change (target 2 s) and
    after a return to a cached head, the longest main-thread task, and the first draw."""
    sents = minilm_sentences(model, CORPUS_SENTENCES, CORPUS_SENTENCE_LEN, seed=15)
    n_tok = sum(len(model.tokenizer.encode(s)) for s in sents)
    n_pts = 2 * n_tok
    names = [(f"corpus: {n_pts:,}-point joint scatter (minilm, one head's queries + keys) drawn after a "
              "'Colour by' change (projection cached: figure built, sent, drawn)", 2.0),
             (f"corpus: {n_pts:,} points drawn after returning to a head whose projection is cached", 2.0),
             (f"corpus: longest main-thread task while the {n_pts:,}-point scatter is redrawn", None),
             (f"corpus: paste {len(sents)} sentences ({n_tok:,} tokens) + Ctrl+Enter -> scatter drawn (corpus job, "
              "PCA and the draw)", None)]
    r = attempt("corpus", names, lambda: scenario_corpus(page, server.url, sents, n_tok, reps, warm, server.proc.pid))
    if not r:
        return
    details["corpus"] = r
    results.append(Result("corpus", names[0][0], median(r["colour"]), "s", 2.0,
                          note=_note(r["colour"]) + _where(r["colour_breakdown"]) + _cpu(r["colour_cpu"])))
    results.append(Result("corpus", names[1][0], median(r["head"]), "s", 2.0,
                          note=_note(r["head"]) + _where(r["head_breakdown"]) + _cpu(r["head_cpu"])))
    results.append(Result("corpus", names[2][0], max(r["colour_longest_task"], r["head_longest_task"] or 0), "s", None,
                          note=f"Chromium's 'longtask' entries: worst over the colour changes "
                               f"{r['colour_longest_task']:.2f} s, over the head returns {r['head_longest_task'] or 0:.2f} s "
                               "(the page cannot react to input during one)"))
    results.append(Result("corpus", names[3][0], r["first"], "s", None,
                          note="one run, after the bundled corpus was drawn" + _where(r["first_breakdown"])))
