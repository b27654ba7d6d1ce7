"""Many people at once: N browser sessions open Explore on smollm2 with a long text at the same
moment, half of them the same text, against one app server on 127.0.0.1. Bounded in sessions,
tokens and time; traffic to 127.0.0.1 only.

    python -m bench.load_test                      # 12 sessions, 4,000 tokens, the gate's default budget
    python -m bench.load_test --budget-mb 1500     # a tighter budget: jobs wait their turn
    python -m bench.load_test --no-gate            # the budget set far above the machine: what it was before
    python -m bench.load_test --stepper 2          # and 2 decoder-stepper sessions on 1,024-token prompts

It samples the server's resident memory every SAMPLE seconds and checks:
- the server stays up;
- its memory stays within the budget plus what the loaded model and the server hold at rest
  (measured after a warm-up session, before the load);
- every session draws its map (after a visible wait, where it waited);
- with --stepper K, K more sessions open the decoder stepper on smollm2 with a --stepper-tokens prompt
  each (different prompts): each draws its step and shows its step-view and KV-cache checks, passing
  (the checks run a forward pass of their own each, through the same gate);
- a fresh session afterwards draws its map.
Printed (JSON): the budget, the resting and peak memory, each session's time and whether it saw
a wait, how many traces were computed (the gate's admissions, from the server log) against the
number of sessions, and the checks. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from bench.app_server import CHROMIUM, CHROMIUM_ARGS, IDLE_JS, start_app

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT.parent / "shared" / "seeds"
SAMPLE = 0.5
CHART = '.st-key-explore-heatmap[data-stale="false"] .js-plotly-plot .main-svg'
STEP_CHART = '.st-key-decoder-weights[data-stale="false"] .js-plotly-plot .main-svg'
STEP_CHECKS = ("Step view check", "KV-cache check")  # the stepper's checks, as the page words them


def long_text(tokens: int, tag: str) -> str:
    """About `tokens` smollm2 tokens of the lecture notes (English prose), starting with `tag`
    so that different tags are different requests."""
    notes = " ".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(SEEDS.glob("*.txt")))
    notes = re.sub(r"\s+", " ", notes)
    words = notes.split(" ")
    n_words = int(tokens / 1.45)  # smollm2 reads ~1.45 tokens a word of these notes
    while len(words) < n_words:
        words = words + words
    return f"{tag}: " + " ".join(words[:n_words])


class Sampler(threading.Thread):
    def __init__(self, server):
        super().__init__(daemon=True)
        self.server, self.samples, self.stop_flag = server, [], threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            self.samples.append((time.monotonic(), self.server.rss_mib(), self.server.proc.poll() is None))
            time.sleep(SAMPLE)


async def session(browser, url: str, timeout_s: float, stepper: bool = False) -> dict:
    """One browser session: Explore's map drawn, or (stepper) the decoder step's weights drawn and both
    its checks shown (checks_passed: neither says it failed)."""
    ctx = await browser.new_context(viewport={"width": 1400, "height": 1600})
    page = await ctx.new_page()
    t0 = time.monotonic()
    out = {"waited": False, "drawn": False, **({"stepper": True, "checks_passed": False} if stepper else {})}
    try:
        await page.goto(url, timeout=timeout_s * 1000)
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            text = " ".join(await page.locator('[data-testid="stAlertContainer"]').all_inner_texts())
            if stepper and await page.locator(STEP_CHART).count() and all(c in text for c in STEP_CHECKS):
                out["drawn"] = True
                out["checks_passed"] = "failed" not in text and "does not match" not in text
                break
            if not stepper and await page.locator(CHART).count():
                out["drawn"] = True
                break
            if "Waiting:" in text:
                out["waited"] = True
                out.setdefault("first_wait_message", re.sub(r"\s+", " ", text)[:160])
            await asyncio.sleep(0.5)
    except Exception as exc:  # noqa: BLE001 - reported, and the check fails
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    out["seconds"] = round(time.monotonic() - t0, 1)
    await ctx.close()
    return out


async def drive(server_url: str, texts, timeout_s: float, prompts=()):
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        urls = [f"{server_url}/explore?" + urllib.parse.urlencode({"model": "smollm2", "text": t}) for t in texts]
        steppers = [f"{server_url}/decoder?" + urllib.parse.urlencode({"model": "smollm2", "text": t}) for t in prompts]
        results = await asyncio.gather(*(session(browser, u, timeout_s) for u in urls),
                                       *(session(browser, u, timeout_s, stepper=True) for u in steppers))
        fresh = await session(browser, f"{server_url}/explore?model=smollm2&text=" +
                              urllib.parse.quote("A fresh session after the load."), 300)
        await browser.close()
    return results, fresh


def warm(server_url: str) -> None:
    """One short smollm2 session: the model is loaded before the load starts."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = b.new_page()
        pg.goto(f"{server_url}/explore?model=smollm2&text=" + urllib.parse.quote("Warm up the model."))
        pg.wait_for_selector(CHART, timeout=300_000, state="attached")
        pg.wait_for_function(IDLE_JS, timeout=300_000)
        b.close()


CALIBRATE = """
import sys
import core
from bench.common import status_kib
from bench.load_test import long_text
import core.device
from viz.ui import gate
core.device.keep_freed_memory()  # as the app runs (viz.ui.models.setup_process): freed memory kept for speed
m = core.load_model("smollm2", device="cpu")
m.trace("warm up")
text = long_text(int(sys.argv[1]), "calibration")
n = len(m.tokenizer.encode(text).ids)
core.device.release_freed_memory()  # the server at rest: what earlier passes freed handed back
before = status_kib("VmRSS") / 1024
trace = m.trace(text)
peak = status_kib("VmHWM") / 1024
print(n, round(peak - before), round(gate.trace_bytes(m.config, n) / 2**20))
"""


def calibrate(lengths=(1200, 4000)) -> int:
    """A smollm2 trace's peak memory above the loaded model (VmHWM in a fresh child per length)
    against the gate's estimate from shapes (viz.ui.gate.trace_bytes)."""
    import subprocess

    rows = []
    for n in lengths:
        out = subprocess.run([sys.executable, "-c", CALIBRATE, str(n)], cwd=ROOT, capture_output=True, text=True,
                             timeout=900).stdout.split()
        tokens, measured, estimate = (int(x) for x in out[-3:])
        rows.append({"tokens": tokens, "measured_peak_above_model_mib": measured, "estimate_mib": estimate,
                     "estimate_over_measured": round(estimate / max(1, measured), 2)})
    print(json.dumps(rows, indent=1))
    return 0 if all(r["estimate_over_measured"] >= 1 for r in rows) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--budget-mb", type=int, default=None, help="the gate's budget (default: the app's own)")
    ap.add_argument("--no-gate", action="store_true", help="a budget far above the machine: no job ever waits")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a session may take")
    ap.add_argument("--stepper", type=int, default=0, help="decoder-stepper sessions beside them (0 to 4)")
    ap.add_argument("--stepper-tokens", type=int, default=1024, help="each stepper session's prompt (tokens)")
    ap.add_argument("--calibrate", action="store_true", help="the gate's estimate against a measured trace, and exit")
    ap.add_argument("--server-log", default="", help="keep the server's log (the gate's admissions and waits) here")
    args = ap.parse_args(argv)
    if args.calibrate:
        return calibrate()
    sessions = max(2, min(args.sessions, 24))
    env = {}
    if args.no_gate:
        env["ATTENTION_LAB_MEMORY_BUDGET_MB"] = str(10**7)
    elif args.budget_mb:
        env["ATTENTION_LAB_MEMORY_BUDGET_MB"] = str(args.budget_mb)
    shared = long_text(args.tokens, "Shared document")
    texts = [shared if i % 2 == 0 else long_text(args.tokens, f"Document {i}") for i in range(sessions)]
    prompts = [long_text(args.stepper_tokens, f"Prompt {i}") for i in range(max(0, min(args.stepper, 4)))]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_app(ROOT, Path(tmp), env=env, timeout=180)
        try:
            warm(server.url)
            time.sleep(1.0)
            rest = server.rss_mib()
            sampler = Sampler(server)
            sampler.start()
            t0 = time.monotonic()
            results, fresh = asyncio.run(drive(server.url, texts, args.timeout, prompts))
            wall = time.monotonic() - t0
            sampler.stop_flag.set()
            sampler.join()
            log = server.log.read_text(errors="replace")
            if args.server_log:
                Path(args.server_log).write_text(log, encoding="utf-8")
            alive = server.proc.poll() is None
        finally:
            server.stop()
    budget = re.findall(r"gate: budget (\d+) MiB", log)
    budget_mib = int(budget[-1]) if budget else None
    # the load's own traces (the warm-up's and the fresh session's are a few tokens)
    explore = [r for r in results if not r.get("stepper")]
    steppers = [r for r in results if r.get("stepper")]
    admitted = sum(int(n.replace(",", "")) >= args.tokens // 2 and int(n.replace(",", "")) != args.stepper_tokens
                   for n in re.findall(r"gate: admitted smollm2, (\d[\d,]*) tokens", log))
    checks_admitted = len(re.findall(r"gate: admitted smollm2 (?:step|KV-cache) check", log))
    waited = len(re.findall(r"gate: admitted .* after waiting", log))
    peak = max((r for _, r, _ in sampler.samples if r == r), default=float("nan"))
    distinct = len(set(texts))
    checks = {
        "server stayed up": alive and all(up for _, _, up in sampler.samples),
        "memory within budget + resting": budget_mib is not None and peak <= rest + budget_mib,
        "every session drew its map": all(r["drawn"] for r in explore),
        "every stepper session drew its step and its checks passed": all(r["drawn"] and r["checks_passed"]
                                                                         for r in steppers),
        "a fresh session afterwards works": fresh["drawn"],
        # identical requests in flight share one computation; a trace dropped from the cache to make room
        # for another job is computed again when asked again, so the count can pass the distinct texts
        "identical requests shared computations": admitted < sessions,
    }
    report = {
        "sessions": sessions, "tokens": args.tokens, "distinct_texts": distinct, "budget_mib": budget_mib,
        "stepper_sessions": len(prompts), "stepper_tokens": args.stepper_tokens if prompts else None,
        "stepper_checks_admitted": checks_admitted,
        "resting_rss_mib": round(rest), "peak_rss_mib": round(peak), "peak_above_resting_mib": round(peak - rest),
        "wall_s": round(wall, 1), "slowest_session_s": max(r["seconds"] for r in results),
        "sessions_that_saw_a_wait": sum(r["waited"] for r in results), "traces_computed": admitted,
        "traces_that_waited": waited, "fresh_session_s": fresh["seconds"],
        "sessions_detail": results, "checks": checks,
    }
    print(json.dumps(report, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
