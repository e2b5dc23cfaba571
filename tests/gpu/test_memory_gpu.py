"""Memory on the GPU: views of one buffer and outputs in place, launched by cuDNN and compared with the
reference; uid 0 and attribute uids in a real plan."""

import pytest

from tests.graphs import PACKED

pytestmark = pytest.mark.gpu

IN_PLACE = """
graph scale_shift {
  input x : half[1, 256, 256]
  input b : half[1, 1, 256]
  output x2 in x = x * 2 + b
}
"""


def test_packed_qkv_sdpa_reads_the_three_views_of_one_buffer(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(PACKED)
    qkv = torch.rand(2, 128, 3, 4, 64, device="cuda", dtype=torch.float16) * 2 - 1
    got = cg(qkv=qkv)["o"]
    q, k, v = (qkv[:, :, i].transpose(1, 2).float() for i in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)
    for r in cg.check(qkv=qkv):
        assert r.ok, str(r)


def test_a_packed_buffer_that_breaks_the_views_assumptions_is_refused(private_store):
    import torch

    import cudnn_dsl
    from cudnn_dsl.run.buffers import BindingError

    cg = cudnn_dsl.compile(PACKED)
    flat = torch.zeros(2 * 128 * 3 * 4 * 64 + 1, device="cuda", dtype=torch.float16)
    with pytest.raises(BindingError, match="aligned to 16 bytes"):
        cg(qkv=flat[1:].view(2, 128, 3, 4, 64))
    with pytest.raises(BindingError, match="bind 'qkv'"):
        cg(q=flat[:65536].view(2, 4, 128, 64))


def test_an_output_in_place_overwrites_its_input_with_the_reference_value(private_store):
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(IN_PLACE)
    ins = cg.allocate_inputs()
    x, before = ins["x"], ins["x"].clone()
    out = cg(**ins)["x2"]
    torch.cuda.synchronize()
    assert out.data_ptr() == x.data_ptr()
    want = cg.reference(x=before, b=ins["b"])["x2"]
    torch.testing.assert_close(x, want, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(x.float(), before.float() * 2 + ins["b"].float(), atol=1e-2, rtol=1e-3)


def test_check_and_run_compare_an_output_in_place_with_the_inputs_before_the_launch(private_store, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import cudnn_dsl

    cg = cudnn_dsl.compile(IN_PLACE)
    for r in cg.check(**cg.allocate_inputs()):
        assert r.ok, str(r)
    path = tmp_path / "ip.cdg"
    path.write_text(IN_PLACE)
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-m", "cudnn_dsl", "run", str(path), "--cuda-graph"], capture_output=True, text=True, cwd=root
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "x2: ok" in p.stdout


def test_uid_zero_and_an_attribute_uid_reach_a_plan_that_runs(private_store):
    import torch

    import cudnn_dsl

    text = """
graph ln {
  io half
  compute float
  input x : half[64, 128, 1, 1] uid=0
  input g : float[1, 128, 1, 1]
  input b : float[1, 128, 1, 1]
  output y : half = layernorm(x, g, b, epsilon=1e-3 uid=1)
}
"""
    cg = cudnn_dsl.compile(text)
    ins = cg.allocate_inputs()
    got = cg(**ins)["y"]
    x = ins["x"].float()
    want = torch.nn.functional.layer_norm(x, x.shape[1:], ins["g"][0], ins["b"][0], eps=1e-3)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


def test_the_ejected_script_of_a_packed_graph_runs_on_its_own(tmp_path, private_store):
    import subprocess
    import sys

    from cudnn_dsl.interop.emit import emit_cudnn
    from dsl.pipeline import program

    g = program(text=PACKED, file="packed.cdg").graphs[0]
    script = tmp_path / "packed_cudnn.py"
    script.write_text(emit_cudnn(g, g.instances[0]))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "o: shape (2, 4, 128, 64)" in p.stdout


def test_tune_checks_its_winner_on_the_inputs_before_the_candidates_overwrote_them(private_store):
    import cudnn_dsl
    from cudnn_dsl.tune.heuristics import tune

    cg = cudnn_dsl.compile(IN_PLACE, iterations=3, warmup=1)
    r = tune(cg, cg.graph.instances[0])
    assert r.winner is not None, r.check
    assert r.check.startswith("x2: ok"), r.check


def test_an_output_in_place_of_an_input_no_op_reads(private_store):
    # acc is a cuDNN tensor no op reads, bound only as y's memory: cuDNN takes the dangling tensor (or
    # this test shows it does not)
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(
        "graph w {\n  input x : float[1, 4, 8]\n  input acc : float[1, 4, 8]\n  output y in acc = relu(x)\n}\n"
    )
    x, acc = torch.randn(1, 4, 8, device="cuda"), torch.zeros(1, 4, 8, device="cuda")
    out = cg(x=x, acc=acc)
    assert out["y"].data_ptr() == acc.data_ptr() and torch.equal(acc, torch.relu(x))


PLACED = """
graph packed_dqkv {
  io half
  compute float
  buffer qkv : half[2, 128, 3, 4, 64]
  buffer dqkv : half[2, 128, 3, 4, 64]
  input q : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in qkv at 0
  input k : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in qkv at 256
  input v : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in qkv at 512
  input o : half[2, 4, 128, 64]
  input do : half[2, 4, 128, 64]
  input stats : float[2, 4, 128, 1]
  dq, dk, dv = sdpa_backward(q, k, v, o, do, stats, causal=true)
  output dq : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in dqkv at 0
  output dk : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in dqkv at 256
  output dv : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in dqkv at 512
}
"""


def test_sdpa_backward_writes_dq_dk_and_dv_into_one_packed_buffer(private_store):
    """The outputs placed in dqkv, as cuDNN writes them, are torch autograd's gradient of the packed qkv."""
    import torch

    import cudnn_dsl

    gen = torch.Generator(device="cuda").manual_seed(4)
    qkv = (torch.rand(2, 128, 3, 4, 64, device="cuda", generator=gen) * 2 - 1).requires_grad_()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    scores = (q @ k.transpose(-1, -2) * 0.125).masked_fill(
        torch.ones(128, 128, device="cuda").triu(1).bool(), float("-inf")
    )
    o = torch.softmax(scores, -1) @ v
    do = torch.rand(o.shape, device="cuda", generator=gen) * 2 - 1
    o.backward(do)
    cg = cudnn_dsl.compile(PLACED)
    dqkv = torch.full_like(qkv, float("nan"), dtype=torch.float16)
    stats = torch.logsumexp(scores, -1, keepdim=True).detach()
    half = {"qkv": qkv.detach().half(), "o": o.detach().half(), "do": do.half(), "stats": stats, "dqkv": dqkv}
    out = cg(**half)
    torch.cuda.synchronize()
    assert out["dv"].data_ptr() == dqkv.data_ptr() + 512 * 2
    torch.testing.assert_close(dqkv.float(), qkv.grad, atol=2e-2, rtol=2e-2)
