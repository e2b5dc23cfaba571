"""The coverage table accounts for every forward op of the frontend's pygraph, and claims only what
the registry has."""

import pytest

from cudnn_dsl.interop import coverage
from dsl.ops import OPS


@pytest.fixture(scope="module")
def pygraph():
    from cudnn_dsl.target.library import load_cudnn

    return load_cudnn().pygraph


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_every_op_of_the_frontend_is_spelled_or_has_a_reason(pygraph, backward):
    unaccounted = [op for op, cdg, why in coverage.rows(pygraph, backward) if not cdg and not why]
    assert not unaccounted, f"cudnn.pygraph has ops the coverage tables do not account for: {unaccounted}"


def test_the_table_claims_only_registry_ops_and_each_lowers_to_a_frontend_op(pygraph):
    forward, backward = coverage.pygraph_ops(pygraph)
    for op, cdg, _ in coverage.rows(pygraph) + coverage.rows(pygraph, backward=True):
        assert all(c in OPS for c in cdg), (op, cdg)
    missing = {p: ops for p, ops in coverage.spellings().items() if p not in forward + backward}
    assert not missing, f"registry ops that lower to no op of cudnn.pygraph: {missing}"


def test_a_reason_is_given_only_for_an_op_the_registry_lacks(pygraph):
    spelled = coverage.spellings()
    left_out = set(coverage.LEFT_OUT) | set(coverage.LEFT_OUT_BACKWARD)
    assert not left_out & set(spelled), "an op in the registry still has a 'left out' reason"
    stale = left_out | coverage.GRAPH_METHODS
    assert stale <= set(dir(pygraph)), f"reasons for names cudnn.pygraph no longer has: {stale - set(dir(pygraph))}"


def test_backward_ops_have_a_table_of_their_own(pygraph):
    text = coverage.table(pygraph)
    _, backward = coverage.pygraph_ops(pygraph)
    assert "sdpa_backward" in backward and "conv_fprop" not in backward
    forward_part, backward_part = text.split("Backward ops (gradients):")
    rows = [line.split("`")[1] for line in forward_part.splitlines() if line.startswith("| `")]
    assert rows and not any(coverage.is_backward(r) for r in rows)
    rows = [line.split("`")[1] for line in backward_part.splitlines()[4:] if line.startswith("| `")]
    assert rows == backward
    assert "| `sdpa_backward` | `sdpa_backward` | – |" in backward_part


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_the_count_is_of_the_table(pygraph, backward):
    n, m = coverage.count(pygraph, backward)
    assert m == len(coverage.rows(pygraph, backward)) and 0 < n <= m
