"""Attention sinks and the attention scale as a tensor on the GPU, each graph compiled whole (split=False),
against the independent formulation of tests/test_sdpa_sink.py (the sink as one more logit in each row's
softmax) and torch autograd through it: the same checks the CPU runs on the reference."""

import pytest

from tests import test_sdpa_sink as sink

pytestmark = pytest.mark.gpu


def test_the_serving_example_is_attention_with_its_sink():
    sink.check_serving_example("cuda")


def test_a_sink_with_a_band_padding_and_grouped_heads():
    sink.check_sink_with_padding("cuda")


@pytest.mark.parametrize("form", sink.SCALES)
def test_a_scale_set_per_call_is_the_float_scale(form):
    sink.check_scale_set_per_call("cuda", form)


@pytest.mark.parametrize("scale", [0.125, 0.25])
def test_the_training_examples_derived_backward_is_autograd_through_the_sink(scale):
    sink.check_training_example("cuda", scale)
