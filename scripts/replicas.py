"""N replicas of the app behind one load balancer (HAProxy), on this machine: `make replicas N=2`.

    ATTENTION_LAB_REPLICAS=2 python scripts/replicas.py       # http://127.0.0.1:8501, two app processes

What it starts, each in a process of its own that dies with this one (and is stopped by its pid
when this one is stopped: SIGINT or SIGTERM):
- N app processes, `streamlit run app.py` on 127.0.0.1 ports of their own;
- HAProxy on the balancer's port: sticky per browser session (the cookie SERVERID names the
  replica; Streamlit's websocket, /_stcore/stream, stays on the replica that holds the session),
  checking each replica's /_stcore/health every 2 s (three failures take it out); a replica that stops answering is taken out
  and its sessions reconnect to another (`option redispatch`);
- with ATTENTION_LAB_TEXT_STORE=redis, a redis-server on 127.0.0.1 for the text store.

Settings (environment):
- ATTENTION_LAB_REPLICAS: N (default 2).
- ATTENTION_LAB_BALANCER_PORT: where the browser goes (default 8501); ATTENTION_LAB_REPLICA_PORT: the first
  replica's port, the others after it (default: free ports).
- ATTENTION_LAB_MACHINE_BUDGET_MB: the admission gate's budget for the whole machine (default: what one
  process would take, half the memory available now); each replica gets 1/N of it as its
  ATTENTION_LAB_MEMORY_BUDGET_MB, so N replicas never promise more than one process would. Setting
  ATTENTION_LAB_MEMORY_BUDGET_MB instead gives each replica that budget, checked against the machine.
- ATTENTION_LAB_TEXT_STORE: where texts too long for a URL are kept (viz/ui/text_store.py): unset, the
  folder every process of this user on this machine shares; a folder; a redis:// URL; or `redis`, a
  redis-server started here (ATTENTION_LAB_REDIS_PORT, default a free port).
- ATTENTION_LAB_REPLICA_LOGS: the folder for the replicas' and the balancer's logs (default a new
  temporary folder, printed).
Every other ATTENTION_LAB_* setting passes to the replicas as it is.

When everything answers, one line of JSON on stdout says where: {"url", "replicas": [{"name", "port",
"pid", "budget_mb"}], "balancer_pid", "redis", "logs", "machine_budget_mb", "processes": {name: pid}}.
Runs as root or not; installs Debian's haproxy (and redis-server) with apt-get when missing and run
as root. Traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from viz.ui import gate  # noqa: E402 - pure Python: the budget's default, as one process reads it

HEALTH = "/_stcore/health"
START_TIMEOUT = float(os.environ.get("ATTENTION_LAB_REPLICA_START_S", "180"))
STOP_WAIT = 15  # seconds each process has to end after SIGTERM before SIGKILL

HAPROXY_CFG = """# written by scripts/replicas.py
global
    maxconn 2000
    # a link may carry a long text in its address (bench/load_test.py sends whole documents)
    tune.bufsize 262144

defaults
    mode http
    option redispatch
    retries 3
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    timeout http-request 30s
    # a replica busy with a long trace on a loaded machine can take seconds to answer its health check:
    # only a refused connection or three slow answers in a row take it out
    timeout check 10s

frontend app
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    cookie SERVERID insert indirect nocache httponly
    option httpchk GET {health}
    http-check expect status 200
    default-server inter 2s fall 3 rise 2
{servers}
"""


def log(msg: str) -> None:
    print(f"replicas: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when this script dies, however it dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass


def need(tool: str, package: str) -> str:
    """The path of `tool`, installing Debian's `package` first where it is missing and we are root."""
    found = shutil.which(tool) or next((p for p in (f"/usr/sbin/{tool}", f"/usr/bin/{tool}") if os.access(p, os.X_OK)),
                                       None)
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"installing Debian's {package}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", package], env=env, check=False, stdout=subprocess.DEVNULL)
        found = shutil.which(tool) or (f"/usr/sbin/{tool}" if os.access(f"/usr/sbin/{tool}", os.X_OK) else None)
    if found is None:
        raise SystemExit(f"replicas: no {tool}: install Debian's {package} (apt-get install {package})")
    return found


def healthy(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url + HEALTH, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def budgets(n: int) -> tuple[list[int], int]:
    """Each replica's gate budget in MiB, and the machine's: 1/N of the machine's budget each."""
    per = os.environ.get(gate.BUDGET_ENV, "").strip()
    machine = int(gate.machine_memory() / 2**20)
    if per:
        per_mb = int(float(per))
        if per_mb * n > machine:
            log(f"warning: {n} replicas x {per_mb} MiB ({gate.BUDGET_ENV}) promise more than the {machine} MiB "
                "available now; set ATTENTION_LAB_MACHINE_BUDGET_MB to share the machine instead")
        return [per_mb] * n, per_mb * n
    raw = os.environ.get("ATTENTION_LAB_MACHINE_BUDGET_MB", "").strip()
    total = int(float(raw)) if raw else int(machine * gate.BUDGET_SHARE)
    return [max(1, total // n)] * n, total


class Arrangement:
    def __init__(self):
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.stopping = False

    def start(self, name: str, cmd: list[str], logfile: Path, env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=open(logfile, "w"),
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self.procs.append((name, proc))
        return proc

    def stop(self) -> None:
        """SIGTERM to each process started, by its pid, then SIGKILL to any still there after STOP_WAIT."""
        self.stopping = True
        for _, p in reversed(self.procs):  # the balancer first: no new connections to replicas going away
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + STOP_WAIT
        for name, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"{name} (pid {p.pid}) did not stop: killed")
                p.kill()
                p.wait()


def main() -> int:
    n = int(os.environ.get("ATTENTION_LAB_REPLICAS", "2"))
    if not 1 <= n <= 64:
        raise SystemExit(f"replicas: ATTENTION_LAB_REPLICAS={n}: give 1 to 64")
    port = int(os.environ.get("ATTENTION_LAB_BALANCER_PORT", "8501"))
    first = os.environ.get("ATTENTION_LAB_REPLICA_PORT", "").strip()
    ports = [int(first) + i for i in range(n)] if first else [free_port() for _ in range(n)]
    logs = Path(os.environ.get("ATTENTION_LAB_REPLICA_LOGS") or tempfile.mkdtemp(prefix="attention-lab-replicas-"))
    logs.mkdir(parents=True, exist_ok=True)
    haproxy = need("haproxy", "haproxy")
    per_mb, total_mb = budgets(n)

    arr = Arrangement()

    def on_signal(signum, _frame):
        if not arr.stopping:
            log(f"{signal.Signals(signum).name}: stopping everything started")
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        store = os.environ.get("ATTENTION_LAB_TEXT_STORE", "").strip()
        redis_url = None
        if store == "redis":
            redis = need("redis-server", "redis-server")
            rport = int(os.environ.get("ATTENTION_LAB_REDIS_PORT") or free_port())
            # persistence off (the texts expire anyway); a bound of its own beside the store's
            arr.start("redis", [redis, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", str(logs), "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"],
                      logs / "redis.log")
            store = redis_url = f"redis://127.0.0.1:{rport}/0"
        secret = secrets.token_hex(16)  # one cookie secret: a session that moves keeps its XSRF cookie valid
        replicas = []
        for i, (p, budget) in enumerate(zip(ports, per_mb)):
            env = {**os.environ, "PYTHONUNBUFFERED": "1", gate.BUDGET_ENV: str(budget),
                   "STREAMLIT_SERVER_COOKIE_SECRET": os.environ.get("STREAMLIT_SERVER_COOKIE_SECRET", secret)}
            # the trace cache counts against the gate's budget; a cache larger than the budget only wastes it
            env["ATTENTION_LAB_TRACE_CACHE_MB"] = str(min(int(os.environ.get("ATTENTION_LAB_TRACE_CACHE_MB", "2048")),
                                                          budget))
            if store:
                env["ATTENTION_LAB_TEXT_STORE"] = store
            cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(p),
                   "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
            proc = arr.start(f"r{i}", cmd, logs / f"r{i}.log", env)
            replicas.append({"name": f"r{i}", "port": p, "pid": proc.pid, "budget_mb": budget})
        servers = "\n".join(f"    server {r['name']} 127.0.0.1:{r['port']} check cookie {r['name']}" for r in replicas)
        cfg = logs / "haproxy.cfg"
        cfg.write_text(HAPROXY_CFG.format(port=port, health=HEALTH, servers=servers), encoding="utf-8")
        checked = subprocess.run([haproxy, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
        if checked.returncode != 0:
            raise SystemExit(f"replicas: HAProxy refused {cfg}: {checked.stdout}{checked.stderr}")
        deadline = time.monotonic() + START_TIMEOUT
        for r, (name, proc) in zip(replicas, [x for x in arr.procs if x[0].startswith("r")]):
            while not healthy(f"http://127.0.0.1:{r['port']}"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (logs / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise SystemExit(f"replicas: {name} did not start (its log, {logs / f'{name}.log'}):\n{tail}")
                time.sleep(0.3)
        balancer = arr.start("haproxy", [haproxy, "-db", "-f", str(cfg)], logs / "haproxy.log")
        url = f"http://127.0.0.1:{port}"
        while not healthy(url):
            if balancer.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"replicas: HAProxy did not start: {(logs / 'haproxy.log').read_text()[-2000:]}")
            time.sleep(0.2)
        print(json.dumps({"url": url, "replicas": replicas, "balancer_pid": balancer.pid, "redis": redis_url,
                          "logs": str(logs), "machine_budget_mb": total_mb,
                          "processes": {name: p.pid for name, p in arr.procs}}), flush=True)
        log(f"{n} replicas behind {url} (HAProxy, sticky by cookie), {per_mb[0]} MiB of gate budget each "
            f"({total_mb} MiB in all); text store: {store or 'the shared folder ~/.cache/attention-lab/texts'}; "
            f"logs in {logs}. Ctrl-C stops everything.")
        seen_dead = set()
        while True:
            for name, p in arr.procs:
                if p.poll() is not None and name not in seen_dead:
                    seen_dead.add(name)
                    log(f"{name} (pid {p.pid}) exited with {p.returncode}")
                    if name in ("haproxy", "redis"):
                        raise SystemExit(f"replicas: {name} exited: stopping everything")
            if len([x for x in seen_dead if x.startswith("r")]) == n:
                raise SystemExit("replicas: every replica has exited")
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping: a second signal must not cut it short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        arr.stop()


if __name__ == "__main__":
    sys.exit(main())
