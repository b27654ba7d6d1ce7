"""trace.model: the model that made a trace, explicit (analyses read its weights there instead
of reaching through trace.runner.model); None for a trace loaded from a file."""

import pytest

import core.analysis as ca
from core.trace import Trace


def test_model_is_the_one_that_traced_and_none_from_a_file(toy, tmp_path):
    tr = toy.trace("the small dog sees the cat")
    assert tr.model is toy and tr.model is tr.runner.model
    step = toy.steps("the small dog sees the cat", max_new_tokens=2)[0]
    assert step.model is toy  # a step view (Trace.prefix) shares its base's model
    path = tmp_path / "t.npz"
    tr.save(path)
    loaded = Trace.load(path)
    assert loaded.model is None and loaded.runner is None
    with pytest.raises(ValueError, match="without its model"):
        ca.lens(loaded)
