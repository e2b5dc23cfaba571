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


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_moe_grouped_matmuls_reason_holds_no_target_plans_its_wgrad_without_a_gpu(pygraph, target):
    """The frontend's own MoE weight gradient (cudnn.gemm.swiglu_moe's wgrad graph), planned deviceless."""
    from cudnn_dsl.target.library import Target, device_properties, load_cudnn

    cudnn = load_cudnn()

    s, n, k, experts = 256, 128, 64, 4
    dt = cudnn.data_type
    g = pygraph(
        intermediate_data_type=dt.FLOAT,
        compute_data_type=dt.FLOAT,
        device_property=device_properties(Target.named(target)),
    )
    dy = g.tensor(name="doutput", dim=[1, s, n], stride=[s * n, n, 1], data_type=dt.BFLOAT16)
    x = g.tensor(name="token", dim=[1, s, k], stride=[s * k, k, 1], data_type=dt.BFLOAT16)
    offsets = g.tensor(name="first_token_offset", dim=[experts + 1, 1, 1], stride=[1, 1, 1], data_type=dt.INT32)
    dw = g.moe_grouped_matmul_bwd(dy, x, offsets, compute_data_type=dt.FLOAT)
    dw.set_dim([experts, k, n]).set_stride([k * n, 1, k]).set_output(True).set_data_type(dt.BFLOAT16)
    g.validate()
    g.build_operation_graph()
    with pytest.raises(Exception, match="cublasLt"):
        g.create_execution_plans([cudnn.heur_mode.A])
    assert "cuBLASLt" in coverage.LEFT_OUT["moe_grouped_matmul"]
