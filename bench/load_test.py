"""Many people at once: N browser sessions open Explore on smollm2 with a long text at the same
moment, half of them the same text, against one app server on 127.0.0.1. Bounded in sessions,
tokens and time; traffic to 127.0.0.1 only.

    python -m bench.load_test                      # 12 sessions, 4,000 tokens, the gate's default budget
    python -m bench.load_test --budget-mb 1500     # a tighter budget: jobs wait their turn
    python -m bench.load_test --no-gate            # the budget set far above the machine: what it was before
    python -m bench.load_test --stepper 2          # and 2 decoder-stepper sessions on 1,024-token prompts
    python -m bench.load_test --sessions 20 --replicas 2 --kill-one-after 60
                                                   # 2 replicas behind HAProxy (scripts/replicas.py), one killed
    python -m bench.load_test --url http://127.0.0.1:8501   # a server or balancer already running

It samples the server's resident memory every SAMPLE seconds and checks:
- the server stays up;
- its memory stays within the budget plus what the loaded model and the server hold at rest
  (measured after a warm-up session, before the load);
- every session draws its map (after a visible wait, where it waited);
- with --stepper K, K more sessions open the decoder stepper on smollm2 with a --stepper-tokens prompt
  each (different prompts): each draws its step and shows its step-view and KV-cache checks, passing
  (the checks run a forward pass of their own each, through the same gate);
- a fresh session afterwards draws its map.
Through the balancer (--replicas N): the same sessions go through scripts/replicas.py's HAProxy to N
replicas sharing a redis-server text store, the machine's budget split between them; it samples every
replica's memory, records which replica served each session (its SERVERID cookie), opens the link one
replica made from a browser pinned to another, and with --kill-one-after S kills one replica S
seconds into the load (after the stored texts' links are made): its sessions must reconnect to a
survivor and, reloaded, draw their text's map again there, and new sessions and existing links must
work through the survivors.
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
from bench.common import status_kib

ROOT = Path(__file__).resolve().parent.parent
# the lecture notes beside the checkout (../shared/seeds), or beside the folder of worktrees it is one of
SEEDS = next((d for d in (ROOT.parent / "shared" / "seeds", ROOT.parent.parent / "shared" / "seeds") if d.is_dir()),
             ROOT.parent / "shared" / "seeds")
SAMPLE = 0.5
CHART = '.st-key-explore-heatmap[data-stale="false"] .js-plotly-plot .main-svg'
STEP_CHART = '.st-key-decoder-weights[data-stale="false"] .js-plotly-plot .main-svg'
STEP_CHECKS = ("Step view check", "KV-cache check")  # the stepper's checks, as the page words them


def long_text(tokens: int, tag: str) -> str:
    """About `tokens` smollm2 tokens of the lecture notes (English prose), starting with `tag`
    so that different tags are different requests."""
    notes = " ".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(SEEDS.glob("*.txt")))
    notes = re.sub(r"\s+", " ", notes).strip()
    if not notes:
        raise SystemExit(f"load_test: no lecture notes in {SEEDS} to build long texts from")
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


async def _replica(ctx) -> str:
    """The replica the balancer pins this browser to (HAProxy's SERVERID cookie); "" without one."""
    return next((c["value"] for c in await ctx.cookies() if c["name"] == "SERVERID"), "")


async def session(browser, url: str, timeout_s: float, killed: "asyncio.Event | None" = None,
                  pin: str = "", text: str = "", fill: bool = False, made: "asyncio.Event | None" = None,
                  stepper: bool = False) -> dict:
    """One browser opens `url` and waits for the map. `pin`: the balancer's cookie set first (this replica).
    `fill`: `text` is pasted into the box (a text too long for the URL: the app keeps it in the text store
    and its link carries a key). `killed`: once set (a replica was killed), a session that was on the dead
    replica must reconnect to another and draw the map again with its whole `text` in the box.
    `stepper`: the decoder step's weights drawn and both its checks shown (checks_passed: neither says
    it failed), instead of Explore's map."""
    ctx = await browser.new_context(viewport={"width": 1400, "height": 1600})
    if pin:
        await ctx.add_cookies([{"name": "SERVERID", "value": pin, "url": url}])
    page = await ctx.new_page()
    t0 = time.monotonic()
    out = {"waited": False, "drawn": False, **({"stepper": True, "checks_passed": False} if stepper else {})}
    try:
        await page.goto(url, timeout=timeout_s * 1000)
        out["replica"] = await _replica(ctx)
        if fill:
            box = page.locator(".st-key-explore-text textarea").first
            await box.fill(text, timeout=timeout_s * 1000)
            await box.press("Control+Enter")
            await page.wait_for_function("() => location.search.includes('text_key=')", timeout=timeout_s * 1000)
            out["link"] = page.url
            out["link_made_s"] = round(time.monotonic() - t0, 1)
        if made is not None:
            made.set()
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            if killed is not None and killed.is_set() and "moved_to" not in out:
                now = await _replica(ctx)
                if now != out["replica"] and now:
                    # reconnected: Streamlit's frontend keeps showing the old page and runs it on the survivor at
                    # the next input; the user reloads, and the page runs there from its URL
                    out["moved_to"], out["drawn"] = now, False
                    await page.reload(timeout=timeout_s * 1000)
            if stepper:
                said = " ".join(await page.locator('[data-testid="stAlertContainer"]').all_inner_texts())
                if await page.locator(STEP_CHART).count() and all(c in said for c in STEP_CHECKS):
                    out["drawn"] = True
                    out["checks_passed"] = "failed" not in said and "does not match" not in said
                    out.setdefault("drawn_s", round(time.monotonic() - t0, 1))
                    break
            elif await page.locator(CHART).count():
                out["drawn"] = True
                out.setdefault("drawn_s", round(time.monotonic() - t0, 1))
                if "moved_to" in out:
                    out.setdefault("redrawn_s", round(time.monotonic() - t0, 1))
                if killed is None or killed.is_set() and (out.get("moved_to") or out["replica"] not in killed.dead):
                    break
            text_seen = " ".join(await page.locator('[data-testid="stAlertContainer"]').all_inner_texts())
            if "Waiting:" in text_seen:
                out["waited"] = True
                out.setdefault("first_wait_message", re.sub(r"\s+", " ", text_seen)[:160])
            await asyncio.sleep(0.5)
        out.setdefault("link", page.url)
        if not out["drawn"]:  # what the page said when the session gave up, and whether it was connected
            said = " ".join(await page.locator('[data-testid="stAlertContainer"]').all_inner_texts())
            out["last_message"] = re.sub(r"\s+", " ", said)[:200]
            out["status_widget"] = re.sub(r"\s+", " ", " ".join(
                await page.locator('[data-testid="stStatusWidget"]').all_inner_texts()))[:120]
            out["replica_at_end"] = await _replica(ctx)
        if text:
            out["text_whole"] = await page.locator(".st-key-explore-text textarea").first.input_value() == text
    except Exception as exc:  # noqa: BLE001 - reported, and the check fails
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    if made is not None:
        made.set()
    out["seconds"] = round(time.monotonic() - t0, 1)
    await ctx.close()
    return out


class Kill(asyncio.Event):
    """Set when a replica has been killed; `dead` names it."""

    def __init__(self):
        super().__init__()
        self.dead: set = set()


STORED = "".join(f"Line {i}: the small dog sees the cat near the old river bank.\n" for i in range(1000))[:50_000]


async def drive(server_url: str, texts, timeout_s: float, kill=None, replicas=(), prompts=()):
    """The sessions at once, then a fresh one. `kill`: (seconds, fn) where fn() kills a replica and
    returns its name; called that many seconds into the load. `replicas` (their names, behind a
    balancer): beside the load, one session pinned to each replica pastes a 50,000-character text
    (toy-translate: cheap to draw) too long for its URL, so its link names the text store; after the load
    each such link is opened by a browser pinned to another replica. Returns the load's sessions, the
    fresh session, the stored-text sessions and the cross-replica link checks. `prompts`: a decoder-stepper
    session on smollm2 each, beside the load (their results follow the load's)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        urls = [f"{server_url}/explore?" + urllib.parse.urlencode({"model": "smollm2", "text": t}) for t in texts]
        killed = Kill() if kill else None

        made = [asyncio.Event() for _ in replicas]

        async def killer():  # S seconds into the load, once the stored texts' links exist
            await asyncio.gather(*(e.wait() for e in made))
            await asyncio.sleep(kill[0])
            killed.dead.add(await asyncio.to_thread(kill[1]))
            killed.set()

        jobs = [session(browser, u, timeout_s, killed, text=t) for u, t in zip(urls, texts)]
        jobs += [session(browser, f"{server_url}/decoder?" + urllib.parse.urlencode({"model": "smollm2", "text": t}),
                         timeout_s, stepper=True) for t in prompts]
        jobs += [session(browser, f"{server_url}/explore?model=toy-translate", timeout_s, killed, pin=r,
                         text=STORED, fill=True, made=e) for r, e in zip(replicas, made)]
        if kill:
            jobs.append(killer())
        done = await asyncio.gather(*jobs)
        n_load = len(urls) + len(prompts)
        results, stored = done[:n_load], done[n_load:n_load + len(replicas)]
        fresh = await session(browser, f"{server_url}/explore?model=smollm2&text=" +
                              urllib.parse.quote("A fresh session after the load."), 300)
        links = []
        alive = [r for r in replicas if not killed or r not in killed.dead]
        for r in stored:  # a link one replica made, opened by a browser pinned to another (a survivor)
            if "text_key=" not in r.get("link", ""):
                links.append({"made_on": r.get("replica"), "drawn": False, "error": "no link with a key"})
                continue
            other = next((a for a in alive if a != r.get("replica")), alive[0] if alive else "")
            out = await session(browser, r["link"], 600, pin=other, text=STORED)
            out.update(made_on=r.get("replica"), opened_on=out.get("replica"))
            links.append(out)
        await browser.close()
    return results, fresh, stored, links


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


class PidSampler(threading.Thread):
    """Resident memory of each replica (by pid) every SAMPLE seconds: {name: [MiB, ...]}."""

    def __init__(self, pids: dict):
        super().__init__(daemon=True)
        self.pids, self.samples, self.stop_flag = pids, {n: [] for n in pids}, threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            for name, pid in self.pids.items():
                kib = status_kib("VmRSS", pid)
                if kib >= 0:
                    self.samples[name].append(kib / 1024)
            time.sleep(SAMPLE)


def start_replicas(n: int, env: dict, logs: Path):
    """scripts/replicas.py with N replicas and its own redis-server; (its process, its JSON line)."""
    import os
    import subprocess

    from bench.app_server import free_port

    full = {**os.environ, **env, "ATTENTION_LAB_REPLICAS": str(n), "ATTENTION_LAB_BALANCER_PORT": str(free_port()),
            "ATTENTION_LAB_TEXT_STORE": "redis", "ATTENTION_LAB_REPLICA_LOGS": str(logs)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "replicas.py")], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=open(logs / "replicas.err", "w"), text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    if not line.strip():
        proc.wait(timeout=60)
        raise RuntimeError(f"scripts/replicas.py did not start: {(logs / 'replicas.err').read_text()[-2000:]}")
    return proc, json.loads(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--budget-mb", type=int, default=None,
                    help="the gate's budget (default: the app's own); with --replicas, the machine's, split between them")
    ap.add_argument("--no-gate", action="store_true", help="a budget far above the machine: no job ever waits")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a session may take")
    ap.add_argument("--stepper", type=int, default=0, help="decoder-stepper sessions beside them (0 to 4)")
    ap.add_argument("--stepper-tokens", type=int, default=1024, help="each stepper session's prompt (tokens)")
    ap.add_argument("--calibrate", action="store_true", help="the gate's estimate against a measured trace, and exit")
    ap.add_argument("--server-log", default="", help="keep the server's log (the gate's admissions and waits) here")
    ap.add_argument("--replicas", type=int, default=0, help="N replicas behind HAProxy (scripts/replicas.py)")
    ap.add_argument("--kill-one-after", type=float, default=None,
                    help="with --replicas: kill one replica this many seconds into the load")
    ap.add_argument("--url", default="", help="drive a server or balancer already running (no memory figures)")
    args = ap.parse_args(argv)
    if args.calibrate:
        return calibrate()
    if args.replicas:
        return main_replicas(args)
    sessions = max(2, min(args.sessions, 24))
    env = {}
    if args.no_gate:
        env["ATTENTION_LAB_MEMORY_BUDGET_MB"] = str(10**7)
    elif args.budget_mb:
        env["ATTENTION_LAB_MEMORY_BUDGET_MB"] = str(args.budget_mb)
    shared = long_text(args.tokens, "Shared document")
    texts = [shared if i % 2 == 0 else long_text(args.tokens, f"Document {i}") for i in range(sessions)]
    prompts = [long_text(args.stepper_tokens, f"Prompt {i}") for i in range(max(0, min(args.stepper, 4)))]
    if args.url:
        warm(args.url)
        t0 = time.monotonic()
        results, fresh, _, _ = asyncio.run(drive(args.url.rstrip("/"), texts, args.timeout))
        report = {"url": args.url, "sessions": sessions, "tokens": args.tokens, "wall_s": round(time.monotonic() - t0, 1),
                  "slowest_session_s": max(r.get("drawn_s", r["seconds"]) for r in results),
                  "sessions_that_saw_a_wait": sum(r["waited"] for r in results),
                  "fresh_session_s": fresh["seconds"], "sessions_detail": results,
                  "checks": {"every session drew its map": all(r["drawn"] for r in results),
                             "a fresh session afterwards works": fresh["drawn"]}}
        print(json.dumps(report, indent=1))
        return 0 if all(report["checks"].values()) else 1
    with tempfile.TemporaryDirectory() as tmp:
        server = start_app(ROOT, Path(tmp), env=env, timeout=180)
        try:
            warm(server.url)
            time.sleep(1.0)
            rest = server.rss_mib()
            sampler = Sampler(server)
            sampler.start()
            t0 = time.monotonic()
            results, fresh, _, _ = asyncio.run(drive(server.url, texts, args.timeout, prompts=prompts))
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
        "wall_s": round(wall, 1), "slowest_session_s": max(r.get("drawn_s", r["seconds"]) for r in results),
        "sessions_that_saw_a_wait": sum(r["waited"] for r in results), "traces_computed": admitted,
        "traces_that_waited": waited, "fresh_session_s": fresh["seconds"],
        "sessions_detail": results, "checks": checks,
    }
    print(json.dumps(report, indent=1))
    return 0 if all(checks.values()) else 1


def main_replicas(args) -> int:
    """The load through scripts/replicas.py's balancer: N replicas, the machine's budget split, one
    killed with --kill-one-after."""
    import os
    import signal

    sessions = max(2, min(args.sessions, 40))
    env = {}
    if args.budget_mb:
        env["ATTENTION_LAB_MACHINE_BUDGET_MB"] = str(args.budget_mb)
    shared = long_text(args.tokens, "Shared document")
    texts = [shared if i % 2 == 0 else long_text(args.tokens, f"Document {i}") for i in range(sessions)]
    with tempfile.TemporaryDirectory() as tmp:
        proc, info = start_replicas(args.replicas, env, Path(tmp))
        pids = {r["name"]: r["pid"] for r in info["replicas"]}
        try:
            for _ in range(2 * args.replicas):  # round robin: every replica loads the model before the load
                warm(info["url"])
            time.sleep(1.0)
            rest = {n: status_kib("VmRSS", pid) / 1024 for n, pid in pids.items()}
            sampler = PidSampler(pids)
            sampler.start()

            def kill_one() -> str:
                name = sorted(pids)[0]
                os.kill(pids[name], signal.SIGKILL)
                return name

            kill = (args.kill_one_after, kill_one) if args.kill_one_after is not None else None
            t0 = time.monotonic()
            results, fresh, stored, links = asyncio.run(drive(info["url"], texts, args.timeout, kill=kill,
                                                              replicas=sorted(pids)))
            wall = time.monotonic() - t0
            sampler.stop_flag.set()
            sampler.join()
            logs = {n: (Path(tmp) / f"{n}.log").read_text(errors="replace") for n in [*pids, "haproxy"]
                    if (Path(tmp) / f"{n}.log").exists()}  # the balancer's: a replica marked down, and why
            if args.server_log:
                Path(args.server_log).write_text("\n".join(f"==> {n}\n{t}" for n, t in logs.items()), encoding="utf-8")
            dead = {n for n, pid in pids.items() if status_kib("VmRSS", pid) < 0}
            command_up = proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            stopped = proc.wait(timeout=120) == 0
    per = {}
    for n in pids:
        budget = re.findall(r"gate: budget (\d+) MiB", logs[n])
        peak = max(sampler.samples[n], default=float("nan"))
        per[n] = {"budget_mib": int(budget[-1]) if budget else None, "resting_rss_mib": round(rest[n]),
                  "peak_rss_mib": round(peak), "peak_above_resting_mib": round(peak - rest[n]),
                  "sessions_served": sum(r.get("replica") == n for r in results),
                  "traces_computed": sum(int(x.replace(",", "")) >= args.tokens // 2
                                         for x in re.findall(r"gate: admitted smollm2, (\d[\d,]*) tokens", logs[n])),
                  "killed": n in dead}
    moved = [r for r in results + stored if r.get("moved_to")]
    on_dead = [r for r in results + stored if r.get("replica") in dead]
    checks = {
        "the command kept serving": command_up,
        "the survivors stayed up": all(not v["killed"] for n, v in per.items() if n not in dead) and
        len(dead) == (1 if kill else 0),
        "every replica within its budget + resting": all(v["budget_mib"] is not None and
                                                         v["peak_above_resting_mib"] <= v["budget_mib"]
                                                         for v in per.values() if not v["killed"]),
        "every session drew its map": all(r["drawn"] for r in results),
        "every session's box holds its whole text": all(r.get("text_whole") for r in results + stored),
        "a fresh session afterwards works": fresh["drawn"],
        # one link made on each replica, each opened by a browser pinned to another (a survivor, after a kill)
        "links open whole, one on a replica that did not make it": bool(links) and all(
            x["drawn"] and x.get("text_whole") for x in links) and any(x["made_on"] != x["opened_on"] for x in links),
        "stopping the command stopped everything": stopped,
    }
    if kill:
        checks["the killed replica's sessions reconnected to a survivor"] = bool(on_dead) and all(
            r.get("moved_to") and r["drawn"] and r.get("text_whole") for r in on_dead)
    report = {
        "replicas": args.replicas, "sessions": sessions, "tokens": args.tokens, "distinct_texts": len(set(texts)),
        "machine_budget_mib": info["machine_budget_mb"], "per_replica": per, "wall_s": round(wall, 1),
        "slowest_session_s": max(r.get("drawn_s", r["seconds"]) for r in results),
        "sessions_that_saw_a_wait": sum(r["waited"] for r in results),
        "killed": sorted(dead), "sessions_on_the_killed_replica": len(on_dead), "sessions_moved": len(moved),
        "slowest_moved_session_redrawn_s": max((r.get("redrawn_s", r["seconds"]) for r in moved), default=None),
        "fresh_session_s": fresh["seconds"], "fresh_session_replica": fresh.get("replica"),
        "links": [{k: x.get(k) for k in ("made_on", "opened_on", "drawn", "text_whole", "seconds")} for x in links],
        "stored_text_sessions": [{k: v for k, v in r.items() if k != "link"} for r in stored],
        "sessions_detail": [{k: v for k, v in r.items() if k != "link"} for r in results], "checks": checks,
    }
    print(json.dumps(report, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
