"""The installed `attention-lab` command: `run` (the app), `trace`, `models`, `eval`.

`trace`, `models` and `eval` are `python -m core`'s commands (core/cli/commands.py). `run` starts
the Streamlit app on the app.py that sits beside the `core` package: the repository's in a
checkout or an editable install, the one `pip install .` puts in site-packages otherwise.
Streamlit replaces the process (core never imports streamlit), with the settings of the
repository's .streamlit/config.toml passed as flags, so the app behaves the same from any
working directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from . import commands as core_cli

# .streamlit/config.toml as flags (tests/test_cli.py keeps the two equal).
STREAMLIT_SETTINGS = {
    "browser.gatherUsageStats": False,
    "server.headless": True,
    "server.address": "127.0.0.1",
    "server.enableXsrfProtection": True,
    "server.maxUploadSize": 1,
    "server.runOnSave": False,
    "server.fileWatcherType": "none",
    "client.showErrorDetails": "none",
    "client.toolbarMode": "minimal",
    "theme.base": "light",
}


def app_path() -> Path:
    """app.py: beside the `core` package (repository root, or site-packages)."""
    return Path(__file__).resolve().parents[2] / "app.py"


def _flag_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def streamlit_command(port: Optional[int] = None, extra: Optional[List[str]] = None) -> List[str]:
    """The command line that `attention-lab run` executes."""
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_path())]
    for key, value in STREAMLIT_SETTINGS.items():
        cmd.append(f"--{key}={_flag_value(value)}")
    if port is not None:
        cmd.append(f"--server.port={port}")
    return cmd + list(extra or [])


def cmd_run(args) -> int:
    app = app_path()
    if not app.is_file():
        raise RuntimeError(f"the app's entry point {app} is missing; reinstall the package (pip install .)")
    cmd = streamlit_command(args.port, args.streamlit_args)
    print(f"Attention Lab on http://{STREAMLIT_SETTINGS['server.address']}:{args.port or 8501}  (Ctrl+C stops it)",
          file=sys.stderr)
    if os.name == "posix":
        os.execv(cmd[0], cmd)  # streamlit takes this process's place: signals reach it directly
    try:  # pragma: no cover - Windows
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0


def _add_run(sub) -> dict:
    what = "start the app (Streamlit) and serve it on http://127.0.0.1:PORT"
    r = sub.add_parser("run", help=what, description=what)
    r.add_argument("--port", type=int, default=None, help="port to serve on (default 8501)")
    r.add_argument("streamlit_args", nargs="*", metavar="STREAMLIT_FLAG",
                   help="further flags for `streamlit run`, after --, e.g. -- --server.address=0.0.0.0")
    return {"run": cmd_run}


def main(argv=None) -> int:
    """Entry point of the `attention-lab` console script."""
    return core_cli.main(argv, prog="attention-lab", extend=_add_run)


if __name__ == "__main__":
    sys.exit(main())
