"""core.device's process settings: what they change, measured in this process."""

import gc
import weakref

import core.device


class _Node:
    pass


def test_freeze_heap_hides_the_live_heap_and_still_collects_new_cycles():
    before = len(gc.get_objects())
    try:
        frozen = core.device.freeze_heap()
        assert before > 10_000  # torch and numpy alone hold this many container objects
        assert frozen >= before * 0.9  # what was alive (less the garbage it collected) is frozen
        assert len(gc.get_objects()) < 1_000  # a full collection no longer walks them
        node = _Node()
        node.me = node  # a cycle made after the freeze: reference counting alone cannot free it
        ref = weakref.ref(node)
        del node
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
    assert len(gc.get_objects()) >= before * 0.9
