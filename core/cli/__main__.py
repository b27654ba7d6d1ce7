"""`python -m core.cli`: the installed `attention-lab` command (core/cli/attention_lab.py)."""

import sys

from .attention_lab import main

sys.exit(main())
