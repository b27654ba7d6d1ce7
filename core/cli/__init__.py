"""The commands and jobs: what runs from a shell, kept apart from core.analysis's pure analyses.

commands.py (`python -m core`: models, trace, eval, corpus, faithfulness), attention_lab.py
(the installed `attention-lab` command: those plus `run`, the app), corpus_job.py (a corpus
traced in batches, in-process or on Ray), faithfulness_job.py (the faithfulness table over a
corpus), evict_job.py (the KV-cache perplexity sweep over documents), train_toy.py
(`python -m core.cli.train_toy`: trains the toy model) and corpus_data.py
(`python -m core.cli.corpus_data`: the bundled corpus). core.cli imports core.analysis, never
the reverse.
"""

from .attention_lab import main

__all__ = ["main"]
