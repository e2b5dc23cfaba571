"""A compiled graph as a torch op, on the CPU: its schema and aliasing, its fake kernel under torch.compile
(fullgraph=True raises on any graph break) and torch.export, symbolic sizes, and opcheck.

On CPU tensors the op's kernel is the graph's PyTorch reference (cudnn_dsl/torch_op/op.py says so); these
tests check the op's plumbing, not cuDNN: tests/gpu/test_torch_op_gpu.py runs cuDNN."""

import warnings
from pathlib import Path

import pytest
import torch

import cudnn_dsl
from cudnn_dsl.run.buffers import BindingError
from dsl.diagnostics import DslError
from tests.graphs import BLOCK, Block, block_in_torch, block_params

ROOT = Path(__file__).resolve().parents[1]

SERVE = ROOT / "examples" / "serve_matmul.cdg"
EMA = ROOT / "examples" / "in_place_update.cdg"

SMALL = """
graph small {
  io half
  compute float
  dim N in {2, 4}
  input x : half[N, 8, 16]
  input w : half[1, 16, 32]
  scalar alpha : float = 0.5
  output y = relu(matmul(x, w) * alpha)
  output m = cmp_gt(y, 0.25)
}
"""

VIEWS = """
graph views {
  buffer table : float[4, 16]
  input lo : float[1, 4, 8] strides [64, 16, 1] in table at 0
  input hi : float[1, 4, 8] strides [64, 16, 1] in table at 8
  input s : float[1, 4, 8]
  output out in hi = lo * s + hi
  output sum = lo + hi
}
"""

STRIDED = """
graph strided {
  dim H in {8, 16}
  input x : half[1, 4, H, H] nhwc
  input w : half[4, 4, 3, 3] nhwc
  output y = conv_fprop(x, w, padding=[1, 1], stride=[2, 2])
}
"""


def serve_inputs(t: int):
    g = torch.Generator().manual_seed(t)
    return (
        torch.randn(1, t, 1024, generator=g).bfloat16(),
        (torch.randn(1, 1024, 1024, generator=g) * 0.03).bfloat16(),
        torch.randn(1, 1, 1024, generator=g).bfloat16(),
    )


def cpu_inputs(cg, binding):
    """Generated inputs on the CPU, where the op's kernel is the reference (on a GPU machine too)."""
    return {k: v.cpu() for k, v in cg.allocate_inputs(binding).items()}


class Counting:
    """A torch.compile backend that counts the graphs it is given and runs them as traced."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def test_the_schema_is_the_graphs_inputs_scalars_and_outputs():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=SMALL))
    assert op.schema == "(Tensor x, Tensor w, float alpha=0.5) -> (Tensor, Tensor)"
    assert op.qualname.startswith("cudnn_dsl::small_")
    assert str(op.overload._schema) == f"{op.qualname}{op.schema}"
    assert not any(a.alias_info for a in op.overload._schema.arguments)


def test_an_output_in_place_is_a_mutated_argument_and_the_wrapper_returns_its_memory():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(EMA))
    assert op.schema == "(Tensor(a0!) avg, Tensor w, float rate=0.001) -> ()"
    avg_arg = op.overload._schema.arguments[0]
    assert avg_arg.alias_info.is_write and not op.overload._schema.arguments[1].alias_info
    avg, w = torch.zeros(1, 1024, 1024), torch.ones(1, 1024, 1024)
    out = op(avg, w, rate=0.25)
    assert out is avg
    torch.testing.assert_close(avg, torch.full_like(avg, 0.25))


def test_a_view_written_in_place_makes_its_buffer_the_mutated_argument():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=VIEWS))
    assert op.schema == "(Tensor(a0!) table, Tensor s) -> Tensor"
    table, s = torch.arange(64.0).reshape(4, 16), torch.full((1, 4, 8), 2.0)
    before = table.clone()
    out, total = op(table, s)
    lo, hi = before[:, :8].unsqueeze(0), before[:, 8:].unsqueeze(0)
    torch.testing.assert_close(out, lo * 2 + hi)  # the window on the buffer, as the op wrote it
    torch.testing.assert_close(table[:, 8:], (lo * 2 + hi)[0])
    torch.testing.assert_close(table[:, :8], before[:, :8])
    torch.testing.assert_close(total, lo + hi)  # read before the write, as cuDNN reads it


def test_one_graph_compiled_twice_is_one_op_and_another_graph_of_its_name_is_another():
    a = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=SMALL))
    assert cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=SMALL)) is a
    other = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=SMALL.replace("0.25", "0.5")))
    assert other is not a and other.name.startswith("small_")
    assert cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=SMALL, deterministic=True)) is not a


def test_bool_outputs_are_the_packed_bytes_the_launch_writes():
    cg = cudnn_dsl.compile(text=SMALL)
    ins = cpu_inputs(cg, {"N": 4})
    y, m = cudnn_dsl.as_torch_op(cg)(ins["x"], ins["w"])
    want = cg.reference(**ins)
    assert m.dtype == torch.uint8 and m.shape == ((4 * 8 * 32 + 7) // 8,)
    assert torch.equal(cudnn_dsl.unpack_bits(m, (4, 8, 32)), want["m"])
    torch.testing.assert_close(y, want["y"])


def test_torch_compile_traces_the_op_whole_without_specializing_a_range_dim():
    x, w, b = serve_inputs(16)
    module = cudnn_dsl.GraphModule(cudnn_dsl.as_torch_op(cudnn_dsl.compile(SERVE)), w=w, b=b)
    model = torch.nn.Sequential(module, torch.nn.GELU())
    backend = Counting()
    compiled = torch.compile(model, fullgraph=True, backend=backend, dynamic=True)
    for t in (16, 48, 96):
        x = serve_inputs(t)[0]
        torch.testing.assert_close(compiled(x), model(x))
    assert len(backend.graphs) == 1  # one trace for every T: the fake kernel kept T symbolic
    calls = [n for n in backend.graphs[0].graph.nodes if n.op == "call_function" and "cudnn_dsl" in str(n.target)]
    assert len(calls) == 1
    assert isinstance(calls[0].meta["example_value"].shape[1], torch.SymInt)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fullgraph_compiles_with_the_stock_backends(backend):
    cg = cudnn_dsl.compile(text=SMALL)
    op = cudnn_dsl.as_torch_op(cg)

    def f(x, w):
        y, m = op(x, w, alpha=0.75)
        return y.float().sum(), m

    ins = cpu_inputs(cg, {"N": 2})
    got = torch.compile(f, fullgraph=True, backend=backend)(ins["x"], ins["w"])
    want = f(ins["x"], ins["w"])
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])


def test_aot_eager_keeps_an_in_place_write_to_a_module_buffer():
    w = torch.randn(1, 1024, 1024)
    avg = torch.randn(1, 1024, 1024)
    want = avg + (w - avg) * 0.001
    module = cudnn_dsl.GraphModule(cudnn_dsl.as_torch_op(cudnn_dsl.compile(EMA)), avg=avg.clone())
    out = torch.compile(module, fullgraph=True, backend="aot_eager")(w)
    torch.testing.assert_close(module.avg, want)
    torch.testing.assert_close(out, want)


def test_torch_export_exports_the_op_with_a_symbolic_token_count():
    x, w, b = serve_inputs(32)
    module = cudnn_dsl.GraphModule(cudnn_dsl.as_torch_op(cudnn_dsl.compile(SERVE)), w=w, b=b)
    ep = torch.export.export(module, (x,), dynamic_shapes=(({1: torch.export.Dim("T", min=16, max=4096)},),))
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and "cudnn_dsl" in str(n.target)]
    assert len(calls) == 1
    assert isinstance(calls[0].meta["val"].shape[1], torch.SymInt)
    x64 = serve_inputs(64)[0]
    torch.testing.assert_close(ep.module()(x64), module(x64))


def test_a_graph_whose_outputs_follow_no_affine_rule_specializes_and_still_traces_whole():
    cg = cudnn_dsl.compile(text=STRIDED)
    op = cudnn_dsl.as_torch_op(cg)
    assert op.rules is None  # H -> (H - 1) // 2 + 1
    backend = Counting()
    f = torch.compile(lambda x, w: op(x, w), fullgraph=True, backend=backend, dynamic=True)
    for h in (8, 16):
        ins = cpu_inputs(cg, {"H": h})
        torch.testing.assert_close(f(ins["x"], ins["w"]), cg.reference(**ins)["y"])
    assert len(backend.graphs) == 2


@pytest.mark.parametrize("source", ["small", "views", "ema", "strided"])
def test_opcheck_passes(source):
    cg = {
        "small": lambda: cudnn_dsl.compile(text=SMALL),
        "views": lambda: cudnn_dsl.compile(text=VIEWS),
        "ema": lambda: cudnn_dsl.compile(EMA),
        "strided": lambda: cudnn_dsl.compile(text=STRIDED),
    }[source]()
    op = cudnn_dsl.as_torch_op(cg)
    ins = cpu_inputs(cg, dict(cg.graph.instances[-1].binding))
    args = tuple(ins[n] for n in op.tensor_names) + tuple(0.5 for _ in op.scalars)
    torch.library.opcheck(op.overload, args)


def test_a_wrong_input_is_a_located_error_while_tracing():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(SERVE))
    x, w, b = serve_inputs(16)
    f = torch.compile(lambda x: op(x, w, b), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"'x': expected dtype torch.bfloat16, given torch.float32"):
        f(x.float())
    with pytest.raises(BindingError, match=r"'w': expected shape \[1, 1024, 1024\], given \[1, 1024, 512\]"):
        op(x, w[..., :512], b)


def test_inputs_that_require_grad_get_the_derived_backward():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = {k: v.requires_grad_() for k, v in block_params().items()}
    x = torch.randn(4, 8, 16, requires_grad=True)
    y = op(x, **params, alpha=0.75)
    assert y.requires_grad
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, *params.values()), g)
    ref = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    x2 = x.detach().clone().requires_grad_()
    want_y = block_in_torch(x2, **ref, alpha=0.75)
    want = torch.autograd.grad(want_y, (x2, *ref.values()), g)
    torch.testing.assert_close(y, want_y)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_only_the_inputs_that_require_grad_are_differentiated():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = block_params()
    w = params["w"].requires_grad_()
    x = torch.randn(2, 8, 16)
    op(x, **params).sum().backward()
    assert w.grad is not None and all(t.grad is None for t in (x, params["b"], params["gamma"]))
    names = dir(torch.ops.cudnn_dsl)
    assert op.name + "_ad01000" in names and op.name + "_bw01000" in names  # a pair per set of inputs


def test_fullgraph_training_step_has_no_graph_break_and_autograds_gradients():
    """torch.compile(fullgraph=True) raises on a graph break; the counting backend sees one forward graph
    and AOT autograd's backward calls the derived backward op."""
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = block_params(1)
    model = Block(op, params)
    plain = Block(block_in_torch, params)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    compiled = torch.compile(model, fullgraph=True, backend=backend)
    for step in range(2):  # gradients accumulate over the steps in both
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(step))
        loss, want = compiled(x), plain(x)
        loss.backward()
        want.backward()
        torch.testing.assert_close(loss, want)
    assert len(graphs) == 1
    calls = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function" and "cudnn_dsl" in str(n.target)]
    assert calls == [f"cudnn_dsl.{op.name}_ad01111.default"] * 2  # x wants no gradient
    for k, p in model.p.items():
        torch.testing.assert_close(p.grad, plain.p[k].grad, atol=1e-4, rtol=1e-4, msg=k)


LINEAR = """
graph linear {
  io bf16
  compute float
  input x : bf16[4, 8, 16]
  input w : bf16[1, 16, 32]
  input b : bf16[1, 1, 32]
  output y = matmul(x, w) + b
}
"""


def test_a_bf16_bias_gradient_summed_in_float_reaches_autograd_in_bf16():
    """The derived backward sums b's gradient in float; the backward op returns it in b's dtype, its fake kernel
    says so (opcheck), and AOT autograd hands the bf16 parameter a bf16 gradient, as eager autograd does; w's is
    written in bf16 by one matmul."""
    from cudnn_dsl.torch_op.training import grad_ops

    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=LINEAR))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 16, generator=gen).bfloat16()
    w, b = (torch.randn(s, generator=gen).bfloat16().requires_grad_() for s in ((1, 16, 32), (1, 1, 32)))
    g = torch.randn(4, 8, 32, generator=gen).bfloat16()
    torch.compile(lambda x, w, b: op(x, w, b), fullgraph=True, backend="aot_eager")(x, w, b).backward(g)
    w0, b0 = (t.detach().float().requires_grad_() for t in (w, b))
    (x.float() @ w0 + b0).backward(g.float())
    for got, want in ((w.grad, w0.grad), (b.grad, b0.grad)):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, atol=2e-2 * want.abs().max().item(), rtol=1e-2)
    ops = grad_ops(op, ("w", "b"))
    kept = [x]  # the backward reads x (flattened and transposed), no other forward value
    assert ops.kept == ("x",)
    got = ops.backward_op(kept, [g], [])
    assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16]  # grad_w, grad_b (in wrt order)
    d = ops.shape(())[0]
    assert d.backward.instances[0].type(dict(d.grads)["b"]).dtype == "float"
    torch.library.opcheck(ops.backward_op, (kept, [g], []), test_utils=("test_schema", "test_faketensor"))


def test_dynamic_sizes_retrace_the_training_path_per_size_and_opcheck_passes():
    """The derived graphs are per shape: the fake kernels specialize on the sizes, and a new size retraces."""
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK))
    params = block_params(2)
    model, plain = Block(op, params), Block(block_in_torch, params)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for n in (2, 4, 2):
        x = torch.randn(n, 8, 16)
        loss, want = compiled(x), plain(x)
        loss.backward()
        want.backward()
        torch.testing.assert_close(loss, want)
    for k, p in model.p.items():
        torch.testing.assert_close(p.grad, plain.p[k].grad, atol=1e-4, rtol=1e-4, msg=k)
    from cudnn_dsl.torch_op.training import grad_ops

    forward = getattr(torch.ops.cudnn_dsl, grad_ops(op, ("x", "w", "b", "gamma", "beta")).name).default
    args = [torch.randn(2, 8, 16)] + list(block_params().values())
    torch.library.opcheck(forward, tuple(t.requires_grad_() for t in args) + (0.5,))


def test_the_no_grad_path_is_the_plain_op():
    x, w, b = serve_inputs(16)
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(SERVE))
    assert not op.overload(x, w.requires_grad_(), b).requires_grad  # the plain op is not differentiable
    with torch.no_grad():
        assert not op(x, w, b).requires_grad
    assert op(x, w, b).requires_grad


def test_a_graph_written_in_place_or_without_a_vjp_says_so():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(EMA))
    with pytest.raises(NotImplementedError, match="writes an input in place; its torch op has no backward"):
        op(torch.zeros(1, 1024, 1024), torch.ones(1, 1024, 1024, requires_grad=True))
    text = "graph m {\n  input a : float[1, 4, 8]\n  input b : float[1, 4, 8]\n"
    text += "  output y = slice(a * b, start=[0, 0, 0], end=[1, 4, 4])\n}\n"
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=text))
    with pytest.raises(DslError, match="slice has no derived backward"):
        op(torch.ones(1, 4, 8), torch.ones(1, 4, 8, requires_grad=True))


def test_graph_module_holds_state_and_refuses_a_name_the_graph_lacks():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(SERVE))
    x, w, b = serve_inputs(16)
    m = cudnn_dsl.GraphModule(op, w=torch.nn.Parameter(w, requires_grad=False), b=b)
    assert [n for n, _ in m.named_parameters()] == ["w"] and [n for n, _ in m.named_buffers()] == ["b"]
    torch.testing.assert_close(m(x), op(x, w, b))
    with pytest.raises(BindingError, match="has no input bias"):
        cudnn_dsl.GraphModule(op, bias=b)


def test_the_benchs_custom_op_twin_has_the_ops_schema_and_kernels():
    from bench.torch_op import custom_op_twin

    cg = cudnn_dsl.compile(EMA)
    op = cudnn_dsl.as_torch_op(cg)
    twin = custom_op_twin(op, "cudnn_dsl_test_twin", kernel=op.cpu_kernel)
    avg, w = torch.zeros(1, 1024, 1024), torch.ones(1, 1024, 1024)
    assert twin(avg, w, 0.5) is None
    torch.testing.assert_close(avg, torch.full_like(avg, 0.5))
    torch.library.opcheck(twin, (avg, w, 0.5))


def test_a_name_python_reserves_is_an_argument_with_an_underscore():
    text = "graph kw {\n  input self : float[1, 4, 8]\n  input lambda : float[1, 4, 8]\n"
    cg = cudnn_dsl.compile(text=text + "  output out = self + lambda\n}\n")
    op = cudnn_dsl.as_torch_op(cg)
    assert op.schema == "(Tensor self_, Tensor lambda_) -> Tensor"
    a, b = torch.ones(1, 4, 8), torch.full((1, 4, 8), 2.0)
    torch.testing.assert_close(op(self=a, **{"lambda": b}), a + b)
    torch.testing.assert_close(op(a, b), a + b)
    torch.library.opcheck(op.overload, (a, b))


def test_a_weight_gradient_over_the_batch_takes_a_saved_operand_laid_out_otherwise_on_the_cpu():
    """The backward reads x flattened and transposed; an x that is no such view is copied into one, through both
    training paths (each warns once, of the forward's input: the backward's copy is its own)."""
    from cudnn_dsl.torch_op.autograd import differentiable
    from cudnn_dsl.torch_op.layout import LayoutWarning

    text = "graph mm {\n  input x : float[2, 4, 8]\n  input w : float[1, 8, 16]\n  output y = matmul(x, w)\n}\n"
    x = torch.randn(2, 8, 4).transpose(1, 2)
    want = (x.transpose(1, 2) @ torch.ones(2, 4, 16)).sum(0, keepdim=True)
    f = differentiable(text=text)
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=text))
    for run in (lambda w: f(x=x, w=w)["y"], lambda w: op(x, w)):
        w = torch.randn(1, 8, 16, requires_grad=True)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            run(w).sum().backward()
        assert sum(issubclass(g.category, LayoutWarning) for g in got) == 1
        torch.testing.assert_close(w.grad, want)
