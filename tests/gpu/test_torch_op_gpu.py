"""The torch op on the GPU: cuDNN under torch.compile(fullgraph=True), replayed as a CUDA graph
(mode="reduce-overhead"), outputs in place, bool outputs, views, and opcheck with the CUDA kernel."""

import os
from pathlib import Path

import pytest

from tests.graphs import ATTENTION, BLOCK, PACKED, Block, block_in_torch, block_params

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "examples" / "serve_matmul.cdg"
EMA = ROOT / "examples" / "in_place_update.cdg"
EPILOGUE = ROOT / "examples" / "matmul_epilogue.cdg"
SELECT = ROOT / "examples" / "compare_select.cdg"


def close(got, want, dtype):
    from cudnn_dsl.run.compare import compare

    c = compare("out", got, want, dtype)
    assert c.ok, str(c)


def test_a_compiled_model_runs_cudnn_and_matches_the_reference_for_every_token_count(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(SERVE)
    base = cg.allocate_inputs({"T": 16})
    w, b = base["w"], base["b"]
    model = torch.nn.Sequential(cudnn_dsl.GraphModule(cudnn_dsl.as_torch_op(cg), w=w, b=b), torch.nn.Tanh())
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for t in (16, 48, 256):
        x = cg.allocate_inputs({"T": t}, seed=t)["x"]
        want = cg.reference(x=x, w=w, b=b)["y"]
        y = compiled(x)
        assert y.shape == (1, t, 1024) and y.device.type == "cuda"
        close(y, torch.tanh(want), "bf16")


def test_reduce_overhead_replays_the_op_as_a_cuda_graph(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(EPILOGUE)
    op = cudnn_dsl.as_torch_op(cg)
    ins = cg.allocate_inputs()
    held = {k: v for k, v in ins.items() if k != "a"}
    module = cudnn_dsl.GraphModule(op, **held)
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")

    def step(seed):
        a = cg.allocate_inputs(seed=seed)["a"]
        y, amax = compiled(a)
        want = cg.reference(a=a, **held)
        close(y.clone(), want["y"], "bf16")
        close(amax.clone(), want["amax"], "float")

    from torch._dynamo.utils import counters

    skips = counters["inductor"]["cudagraph_skips"]
    for seed in range(3):  # warm-up, record, first replay
        step(seed)
    assert counters["inductor"]["cudagraph_skips"] == skips, "torch.compile skipped CUDA graphs for the op"
    launched = op.launches
    for seed in range(3, 7):
        step(seed)
    assert op.launches == launched, "the op's kernel ran on the host: no CUDA-graph replay"


def test_the_eager_training_path_on_cuda_is_the_registered_ops(private_store):
    """Eagerly, a training call runs the derived graphs from one autograd Function (torch_op.eager); under a
    dispatch mode it takes the registered augmented forward and backward ops: on cuDNN, the same outputs and
    gradients, and the plain op's kernel never runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import cudnn_dsl

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "cudnn_dsl":
                self.ops.append(func.name())
            return func(*args, **(kwargs or {}))

    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK, split=True))
    params = {k: v.cuda().requires_grad_() for k, v in block_params(5).items()}
    x = torch.randn(4, 8, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    g = torch.randn(4, 8, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(6))
    launched = op.launches

    def run():
        y = op(x, *params.values(), alpha=0.75)
        return y, torch.autograd.grad(y, tuple(params.values()), g)

    y, got = run()
    with Seen() as seen:
        y2, registered = run()
    assert any(n.startswith(f"cudnn_dsl::{op.name}_ad") for n in seen.ops)
    assert op.launches == launched
    torch.testing.assert_close(y, y2, atol=1e-5, rtol=1e-5)
    for a, b in zip(got, registered):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_an_output_in_place_writes_its_input_eagerly_and_compiled(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(EMA)
    op = cudnn_dsl.as_torch_op(cg)
    ins = cg.allocate_inputs()
    before = ins["avg"].clone()
    want = cg.reference(avg=before, w=ins["w"], rate=0.25)["next_avg"]
    assert op(ins["avg"], ins["w"], rate=0.25) is ins["avg"]
    close(ins["avg"], want, "float")

    module = cudnn_dsl.GraphModule(op, avg=before.clone())
    out = torch.compile(module, fullgraph=True)(ins["w"], rate=0.25)
    close(module.avg, want, "float")
    close(out, want, "float")


def test_bool_outputs_are_the_bytes_the_plain_call_writes(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(SELECT)
    ins = cg.allocate_inputs()
    out, clamped = cudnn_dsl.as_torch_op(cg)(ins["a"], ins["b"])
    plain = cg(**ins)
    assert torch.equal(out, plain["out"]) and torch.equal(clamped, plain["clamped"])
    assert torch.equal(cudnn_dsl.unpack_bits(clamped, (8, 64, 64)), cg.reference(**ins)["clamped"])


def test_views_of_one_buffer_through_the_op(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(PACKED)
    qkv = torch.rand(2, 128, 3, 4, 64, device="cuda", dtype=torch.float16) * 2 - 1
    op = cudnn_dsl.as_torch_op(cg)
    got = torch.compile(lambda qkv: op(qkv), fullgraph=True)(qkv)
    assert torch.equal(got, cg(qkv=qkv)["o"])
    close(got, cg.reference(qkv=qkv)["o"], "half")


def test_the_checks_hold_on_every_call(private_store):
    import torch

    import cudnn_dsl
    from cudnn_dsl.run.buffers import BindingError

    cg = cudnn_dsl.compile(SERVE)
    op = cudnn_dsl.as_torch_op(cg)
    ins = cg.allocate_inputs({"T": 32})
    close(op(ins["x"], ins["w"], ins["b"]), cg.reference(**ins)["y"], "bf16")
    flat = torch.zeros(32 * 1024 + 1, device="cuda", dtype=torch.bfloat16)
    misaligned = flat[1:].view(1, 32, 1024)  # the same shape, strides and dtype as the call before
    with pytest.raises(BindingError, match="aligned to 16 bytes"):
        op(misaligned, ins["w"], ins["b"])


def test_the_cuda_kernel_keeps_the_layout_contract_of_the_cpu_and_fake_kernels(private_store):
    """tests/test_torch_op_layout.py's graph and messages: a misplaced input copied with one warning (the result
    cuDNN's on the declared layout), or refused by a strict op with the CPU's BindingError."""
    import warnings

    import torch

    import cudnn_dsl
    from cudnn_dsl.run.buffers import BindingError
    from cudnn_dsl.torch_op.layout import LayoutWarning
    from tests.test_torch_op_layout import COL, WARNING

    x, w = torch.randn(2, 16, 8, device="cuda"), torch.randn(2, 8, 4, device="cuda")
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=COL, seed=1))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        op(x, w)
        y = op(x, w)
    assert [str(g.message) for g in got if issubclass(g.category, LayoutWarning)] == [WARNING]
    close(y, x @ w, "float")
    strict = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=COL, seed=1), strict=True)
    with pytest.raises(BindingError, match=r"^'x': expected strides \[128, 1, 16\], given \[128, 8, 1\]$"):
        strict(x, w)


@pytest.mark.parametrize("split", [False, True], ids=["whole", "in_parts"])
def test_a_call_on_another_stream_moves_every_handle_to_it(private_store, split):
    """The op's launch plan sets a handle's stream only when the current one is another: a call on a side
    stream runs there (right results, each part's handle on that stream), and a call back on the default
    stream moves them back."""
    import torch

    import cudnn_dsl
    from cudnn_dsl.run.parts import Parts
    from tests.graphs import LN_GELU

    cg = cudnn_dsl.compile(text=LN_GELU, split=True) if split else cudnn_dsl.compile(SERVE)
    binding = None if split else {"T": 32}
    op = cudnn_dsl.as_torch_op(cg)
    parts = cg.parts(cg.graph.instance(binding))
    if split and not isinstance(parts, Parts):
        pytest.skip("cuDNN fuses layernorm -> gelu whole here")
    handles = [c.planner.handle for c in parts.compiled if c is not None] if split else [cg.planner.handle]
    side = torch.cuda.Stream()
    for seed, stream in enumerate([torch.cuda.current_stream(), side, torch.cuda.current_stream()]):
        ins = cg.allocate_inputs(binding, seed=seed)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            y = op(*(ins[n] for n in op.tensor_names))
            assert all(h.stream == stream.cuda_stream for h in handles)
        torch.cuda.current_stream().wait_stream(stream)
        close(y, cg.reference(ins)["y"], "bf16")


@pytest.mark.parametrize("source", [SERVE, EMA, SELECT])
def test_opcheck_with_the_cuda_kernel(private_store, source):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(source)
    op = cudnn_dsl.as_torch_op(cg)
    ins = cg.allocate_inputs(dict(cg.graph.instances[0].binding))
    torch.library.opcheck(op.overload, tuple(ins[n] for n in op.tensor_names))


SET_DIM = """
graph set_dim {
  io half
  compute float
  dim N in {2, 4, 8}
  input x : half[N, 64, 128]
  input w : half[1, 128, 64]
  scalar alpha : float = 0.5
  output y = relu(matmul(x, w) * alpha)
}
"""


def test_a_dim_of_a_set_stays_symbolic_and_each_value_runs_its_plan(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(text=SET_DIM)
    op = cudnn_dsl.as_torch_op(cg)
    w = cg.allocate_inputs({"N": 2})["w"]
    f = torch.compile(lambda x, alpha: op(x, w, alpha=alpha), fullgraph=True, dynamic=True)
    for n in (2, 4, 8):
        x = cg.allocate_inputs({"N": n}, seed=n)["x"]
        got = f(x, 0.25)
        assert got.shape == (n, 64, 64)
        close(got, cg.reference(x=x, w=w, alpha=0.25)["y"], "half")


@pytest.mark.parametrize("compiled", [False, True])
def test_a_training_step_through_the_op_matches_torch_autograd(private_store, compiled):
    """The augmented forward and the derived backward as torch ops, on cuDNN: eagerly and under
    torch.compile(fullgraph=True) with inductor, loss and gradients as the same model in plain torch."""
    import torch

    import cudnn_dsl

    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=BLOCK, split=True))  # the norm and its backward's sums: parts
    params = {k: v.cuda() for k, v in block_params(3).items()}
    model, plain = Block(op, params), Block(block_in_torch, params)
    run = torch.compile(model, fullgraph=True) if compiled else model
    launched = op.launches
    for n in (2, 4):
        x = torch.randn(n, 8, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(n))
        loss, want = run(x), plain(x)
        loss.backward()
        want.backward()
        torch.testing.assert_close(loss, want, atol=1e-2, rtol=1e-2)  # cuDNN may round float matmuls as TF32
    assert op.launches == launched  # the training path ran the augmented forward op, not the plain one
    for k, p in model.p.items():
        torch.testing.assert_close(p.grad, plain.p[k].grad, atol=1e-2, rtol=1e-2, msg=k)


def test_attention_through_the_op_trains_with_sdpa_backward(private_store):
    """The op of a whole graph (sdpa; split=False: cuDNN runs it, and the backward, whole) under
    torch.compile(fullgraph=True): its backward op runs sdpa_backward from the saved statistics; gradients as
    torch's own attention's."""
    import torch
    import torch.nn.functional as F

    import cudnn_dsl
    from cudnn_dsl.torch_op.training import grad_ops

    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=ATTENTION, split=False))
    g = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", generator=g, dtype=torch.half) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    do = torch.randn(2, 4, 128, 64, device="cuda", generator=g, dtype=torch.half)
    o = torch.compile(lambda q, k, v: op(q, k, v), fullgraph=True)(*leaves)
    o.backward(do)
    want = F.scaled_dot_product_attention(*want_leaves, is_causal=True)
    want.backward(do)
    torch.testing.assert_close(o, want, atol=2e-2, rtol=2e-2)
    for name, got, w in zip("qkv", leaves, want_leaves):
        torch.testing.assert_close(got.grad, w.grad, atol=2e-2, rtol=2e-2, msg=name)
    d, _, _ = grad_ops(op, ("q", "k", "v")).shape({})
    assert [n.op for n in d.backward.nodes] == ["sdpa_backward"]


def test_a_script_that_trains_through_an_op_exits_cleanly(tmp_path):
    """torch's op registry keeps every op alive past the cuDNN Frontend's module: the ops let their frontend objects
    go at exit, so nothing is reported leaked after the script's last line."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        f"""
import torch, cudnn_dsl
cg = cudnn_dsl.compile({str(ROOT / "examples" / "training" / "resnet_block.cdg")!r})
op = cudnn_dsl.as_torch_op(cg)
inputs = cg.allocate_inputs(dict(cg.graph.instances[0].binding))
args = {{k: v.detach().requires_grad_(k != "x") for k, v in inputs.items()}}
out = op(**args)
(out[0] if isinstance(out, tuple) else out).float().sum().backward()
torch.cuda.synchronize()
print("trained")
"""
    )
    env = {**os.environ, "CUDNN_DSL_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "trained", proc.stdout + proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr[-2000:]
