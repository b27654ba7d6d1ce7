"""The shipped recall models (assets/recall/<mixer>/) reproduce the accuracy curve their training
run wrote beside them, from the weights alone; the softmax model recalls every pair."""

import pytest
import torch

from core.toy import recall_model, recall_task

MIXERS = recall_model.available()


@pytest.mark.parametrize("mixer", MIXERS)
def test_shipped_weights_reproduce_the_training_curve(mixer):
    model = recall_model.load_recall(mixer, device="cpu")
    with torch.inference_mode():
        got = recall_task.curve(lambda ids: model.net(None, ids))
    want = recall_task.shipped_curves()[mixer]
    assert set(got) == set(want)
    for n in want:  # 256 sequences of n queries each: one answer is 1/(256 n); argmax ties may differ by a few
        assert abs(got[n] - want[n]) <= 0.01, (mixer, n, got[n], want[n])


def test_softmax_recalls_every_pair():
    assert "softmax" in MIXERS
    assert min(recall_task.shipped_curves()["softmax"].values()) >= 0.99


def test_a_missing_mixer_names_what_is_shipped(tmp_path):
    with pytest.raises(Exception, match="train it with"):
        recall_model.load_recall("softmax", folder=tmp_path)
