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


@pytest.mark.parametrize("mixer", MIXERS)
def test_predictions_and_maps_are_the_models(mixer):
    """recall_model.predictions reads the trace's top token at each query: the argmax of the
    net's own logits; layer_map is the layer's recorded map (a mixer's signed A, heads = A v)."""
    import random

    model = recall_model.load_recall(mixer, device="cpu")
    ex = recall_task.make_example(6, random.Random(11))
    trace = model.trace(ex.text())
    ids = torch.tensor([[recall_task.vocab().index(t) for t in ex.tokens]])
    with torch.inference_mode():
        top = model.net(None, ids)[0].argmax(-1)
    assert recall_model.predictions(trace, ex) == [recall_task.vocab()[int(top[p])] for p in ex.query_positions]
    for layer in range(2):
        maps, signed = recall_model.layer_map(trace, layer)
        assert signed == (layer in trace.mixer_layers("decoder"))
        n = len(ex.tokens)
        assert maps.shape[-2:] == (n, n) and torch.all(maps.triu(1) == 0)  # causal
        if not signed:
            torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    with pytest.raises(ValueError, match="out of range"):
        recall_model.layer_map(trace, 2)
    with pytest.raises(ValueError, match="not of this example"):
        recall_model.predictions(trace, recall_task.make_example(6, random.Random(12)))
