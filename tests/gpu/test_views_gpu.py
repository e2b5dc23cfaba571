"""Views, folded casts and shared parts on the GPU: the transformer block's forward split into cuDNN parts and
views, matching the reference whole, bound and replayed; a reshape into an output written by the part before
it, with no copy; its derived backward's views (tests/test_views.py holds the deviceless half)."""

from pathlib import Path

import pytest

from tests.graphs import MM_RESHAPE
from tests.helpers import Copies, check_grads

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("private_store")]

TRANSFORMER = "examples/training/transformer_block.cdg"

# a chain of two views into an output
CHAIN = (
    "graph chain {\n  io half\n  input a : half[4, 64, 128]\n  input b : half[4, 128, 32]\n"
    "  m : float = matmul(a, b)\n  r = reshape(m, shape=[4, 64, 4, 8])\n"
    "  output y : float = reshape(r, shape=[4, 2048])\n}\n"
)


def _split(text: str):
    import cudnn_dsl
    from cudnn_dsl.run.parts import Parts

    cg = cudnn_dsl.compile(text=text, split=True)
    parts = cg.parts(cg.graph.instances[0])
    assert isinstance(parts, Parts), "cuDNN took it whole"
    return cg, parts


def _matches(cg, outputs, before) -> None:
    import torch

    from cudnn_dsl.run.compare import compare_outputs

    torch.cuda.synchronize()
    got = {k: v.clone() for k, v in outputs.items()}
    comps = compare_outputs(cg.graph, cg.graph.instances[0], got, cg.reference(before), cg.options)
    assert all(c.ok for c in comps), [str(c) for c in comps]


def test_the_transformer_forward_runs_as_cudnn_parts_and_views_and_matches():
    from cudnn_dsl.run.buffers import restore, snapshot

    cg, parts = _split(Path(TRANSFORMER).read_text())
    c = parts.partition.counts
    assert (c.launches, c.views, c.fallbacks) == (6, 4, 0) and c.graphs < c.launches, parts.lines
    assert len(parts.executables()) == c.graphs  # one build per distinct graph
    ins = cg.allocate_inputs()
    assert all(r.ok for r in cg.check(ins)), "plain call"
    bound = cg.bind(ins)
    for _ in range(2):
        before = snapshot(cg.graph, ins)
        bound.run()
        _matches(cg, bound.outputs, before)
    before = snapshot(cg.graph, ins)
    replay = cg.capture(ins)
    restore(ins, before)
    replay.replay()
    _matches(cg, replay.bound.outputs, before)


@pytest.mark.parametrize("text", [MM_RESHAPE, CHAIN], ids=["one_view", "chain_of_two"])
def test_a_reshape_into_an_output_is_written_there_by_the_part_before_it(text):
    import torch

    cg, parts = _split(text)
    assert parts.partition.counts.views >= 1 and not parts.partition.fallbacks, parts.lines
    ins = cg.allocate_inputs()
    out = torch.empty(cg.outputs["y"].shape, dtype=torch.float32, device=cg.device)
    bound = cg.bind(ins, {"y": out})
    with Copies() as copies:
        bound.run()
    assert copies.count == 0  # the matmul wrote y's memory: no copy for a view
    assert bound.outputs["y"].data_ptr() == out.data_ptr()
    _matches(cg, bound.outputs, ins)


def test_the_transformer_backward_runs_through_its_views_and_matches_autograd():
    # bk's gradient is zero (a key bias shifts a row's scores alike): what comes back is rounding noise
    check_grads(Path(TRANSFORMER).read_text(), "cuda", frozen=("bk",))
