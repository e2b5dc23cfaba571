"""The coverage table accounts for every forward op of the frontend's pygraph, and claims only what
the registry has."""

import pytest

from cudnn_dsl import coverage
from dsl.ops import OPS


@pytest.fixture(scope="module")
def pygraph():
    from cudnn_dsl.backend import load_cudnn

    return load_cudnn().pygraph


def test_every_forward_op_of_the_frontend_is_spelled_or_has_a_reason(pygraph):
    unaccounted = [op for op, cdg, why in coverage.rows(pygraph) if not cdg and not why]
    assert not unaccounted, f"cudnn.pygraph has forward ops the coverage table does not account for: {unaccounted}"


def test_the_table_claims_only_registry_ops_and_each_lowers_to_a_frontend_op(pygraph):
    forward, _ = coverage.pygraph_ops(pygraph)
    for op, cdg, _ in coverage.rows(pygraph):
        assert all(c in OPS for c in cdg), (op, cdg)
    missing = {p: ops for p, ops in coverage.spellings().items() if p not in forward}
    assert not missing, f"registry ops that lower to no forward op of cudnn.pygraph: {missing}"


def test_a_reason_is_given_only_for_an_op_the_registry_lacks(pygraph):
    forward, _ = coverage.pygraph_ops(pygraph)
    spelled = coverage.spellings()
    assert not set(coverage.LEFT_OUT) & set(spelled), "an op in the registry still has a 'left out' reason"
    stale = set(coverage.LEFT_OUT) | set(coverage.PENDING) | coverage.GRAPH_METHODS
    assert stale <= set(dir(pygraph)), f"reasons for names cudnn.pygraph no longer has: {stale - set(dir(pygraph))}"
    assert not set(coverage.LEFT_OUT) & set(coverage.PENDING)


def test_backward_ops_are_listed_on_one_line_not_in_the_table(pygraph):
    text = coverage.table(pygraph)
    _, backward = coverage.pygraph_ops(pygraph)
    assert "sdpa_backward" in backward and "conv_fprop" not in backward
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert not any(coverage.is_backward(r.split("`")[1]) for r in rows)
    assert text.splitlines()[-1].startswith("Backward ops: the next issue")


def test_the_count_is_of_the_table(pygraph):
    n, m = coverage.count(pygraph)
    assert m == len(coverage.rows(pygraph)) and 0 < n <= m
