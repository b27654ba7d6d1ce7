"""`python -m core COMMAND`: the commands of core/cli/commands.py (the contract of docs/design.md)."""

from __future__ import annotations

import sys

from .cli.commands import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
