"""The Inside page's names in one place, kept so that `from viz import pipeline` keeps
working: a step is viz/step.py's, the step lists and their formulas are in viz/steps.py
and viz/head_steps.py, the numerical checks in
viz/checks.py, the pictures in viz/step_figures.py, and the block reduction they share
with every other figure in viz/reduce.py."""

from viz.checks import Check, head_checks, max_abs_diff, residual_checks, row_sum_error, softmax_rows  # noqa: F401
from viz.reduce import block_means as _block_means  # noqa: F401
from viz.step_figures import (  # noqa: F401
    MAX_CELLS_DRAWN, MAX_TOKENS_DRAWN, MIN_FEATURES_DRAWN, SHOW_VALUES_UP_TO, TOKEN_AXES, colour_limit, drawn_matrix,
    step_figure,
)
from viz.step import COLS, KIND_TEXT, NOTATIONS, ROWS, Step, kv_head, mask_kind  # noqa: F401
from viz.steps import groups, layer_input_name, layer_steps, memory_name, shapes_table, steps_by_key, sublayers  # noqa: F401
