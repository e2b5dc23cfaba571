"""Convolutions whose padding differs at the start and the end of a dim, on the GPU: cuDNN's conv_fprop,
conv_dgrad and conv_wgrad and the derived backward against the independent formulation of
tests/test_conv_padding.py (the image written into a larger zero tensor, convolved without padding) and torch
autograd through it: the same checks the CPU runs on the reference."""

import pytest

from tests import test_conv_padding as padding

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["half", "float"])
def test_each_op_is_the_convolution_of_the_padded_image(dtype):
    padding.check_ops("cuda", dtype)


def test_the_derived_backward_is_autograd_through_the_padded_convolution():
    padding.check_derived_backward("cuda", "half")
