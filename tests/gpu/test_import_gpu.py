"""A graph from a real cuDNN Frontend log, imported, runs on the GPU and matches its PyTorch reference."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

LOG = Path(__file__).resolve().parents[1] / "fixtures" / "frontend_log.txt"


def _imported():
    from cudnn_dsl.interop.fe_import import to_cdg, verify
    from dsl.pipeline import program

    cdg, graphs = to_cdg(LOG.read_text(), str(LOG), name="from_log")
    prog = program(text=cdg, file="from_log.cdg")
    verify(prog, graphs)  # a located DslError where the log and the .cdg disagree
    return cdg, [g.name for g in prog.graphs]


@pytest.mark.parametrize("index,ops", [(0, ["conv_fprop", "mul", "add", "relu"]), (1, ["matmul", "add"])])
def test_graph_from_a_frontend_log_matches_reference(index, ops, private_store):
    import cudnn_dsl

    cdg, names = _imported()
    cg = cudnn_dsl.compile(text=cdg, graph=names[index])
    assert [n.op for n in cg.graph.nodes] == ops
    results = cg.check(**cg.allocate_inputs())
    assert results, "the graph has outputs to compare"
    for r in results:
        assert r.ok, str(r)
