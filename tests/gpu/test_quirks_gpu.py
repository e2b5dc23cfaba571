"""The graphs cuDNN 9.19 ran wrong as one graph (cudnn_dsl/target/quirks.py), run split on the H200: every
output matches the reference; with splitting off, the located refusal naming the row."""

import pytest

from tests.graphs import DEFECTS, defect_text
from tests.test_quirks import ROW_OF

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_split_the_graph_runs_right(case, private_store):
    import cudnn_dsl
    from dsl.diagnostics import DslError

    body, words = DEFECTS[case]
    text = defect_text(body)
    cg = cudnn_dsl.compile(text=text, split=True)
    results = cg.check(cg.allocate_inputs(seed=3))
    assert results and all(c.mismatches == 0 for c in results), results
    with pytest.raises(DslError, match=rf"quirk {ROW_OF[case]}\): .*{words}"):
        cudnn_dsl.compile(text=text, split=False)(cg.allocate_inputs(seed=3))
