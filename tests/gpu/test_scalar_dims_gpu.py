"""Pass-by-value scalars with declared dims on the GPU: attention whose scale is a [1] host scalar, set per
call, against attention written out by hand (the checks of tests/test_scalar_dims.py)."""

import pytest

from tests import test_scalar_dims as dims

pytestmark = pytest.mark.gpu


def test_the_scale_of_a_declared_scalar_is_the_scale():
    dims.check_scale("cuda")
