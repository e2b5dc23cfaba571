"""Memory without a GPU: buffers and their views, outputs in place, explicit uids (0 and on attributes):
the checker's proofs, the binding checks, the reference, the store digest and the ejected scripts."""

import pytest
import torch

from cudnn_dsl.interop.emit import emit_cudnn, emit_torch
from cudnn_dsl.run.buffers import BindingError, check_inputs, outputs_of, snapshot, with_views
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from cudnn_dsl.store.keys import graph_digest
from dsl.diagnostics import DslError
from dsl.pipeline import load, program
from dsl.syntax.parser import parse
from dsl.syntax.printer import fmt_module

# [B, S, 3, H, D] = [2, 8, 3, 2, 16]: Q, K, V as [B, H, S, D] views at 0, H*D and 2*H*D
PACKED = """graph p {
  buffer qkv : float[2, 8, 3, 2, 16]
  input q : float[2, 2, 8, 16] strides [768, 16, 96, 1] in qkv at 0
  input k : float[2, 2, 8, 16] strides [768, 16, 96, 1] in qkv at 32
  input v : float[2, 2, 8, 16] strides [768, 16, 96, 1] in qkv at 64
  output o = sdpa(q, k, v, causal=true)
}
"""

IN_PLACE = """graph ip {
  input x : float[1, 16, 32]
  input b : float[1, 1, 32]
  output x2 in x = x * 2 + b
}
"""


def one(text: str):
    g = program(text=text, file="m.cdg").graphs[0]
    return g, g.instances[0]


def errors(text: str) -> list[str]:
    r = load(text=text, file="m.cdg")
    return [d.message for d in r.diagnostics if d.severity == "error"]


def test_fmt_prints_buffers_views_in_place_and_attribute_uids_canonically():
    messy = (
        "graph g {\n  buffer   b : half[ 4,8 ]\n  input x : half[4, 4] in b strides [8,1]\n"
        "  input s : float[1, 4]\n  output y   in x = relu(x)\n"
        "  output n : float = layernorm(x, s, s, epsilon = 1e-5   uid = 0)\n}\n"
    )
    text = fmt_module(parse(messy))
    assert text == (
        "graph g {\n  buffer b : half[4, 8]\n  input x : half[4, 4] strides [8, 1] in b at 0\n"
        "  input s : float[1, 4]\n  output y in x = relu(x)\n"
        "  output n : float = layernorm(x, s, s, epsilon=1e-5 uid=0)\n}\n"
    )
    assert fmt_module(parse(text)) == text


@pytest.mark.parametrize(
    "offset,ok",
    [(64, True), (68, False)],  # v at 64 ends on the buffer's last element; 4 further reaches past it
)
def test_the_checker_proves_every_view_inside_its_buffer(offset, ok):
    text = PACKED.replace("in qkv at 64", f"in qkv at {offset}")
    found = errors(text)
    if ok:
        assert found == []
    else:
        assert found == [
            f"view 'v' [2, 2, 8, 16] strides [768, 16, 96, 1] at {offset} reaches element 1539 of buffer 'qkv', "
            "which holds 1536"
        ]


@pytest.mark.parametrize("dtype,offset,ok", [("half", 8, True), ("half", 4, False), ("float", 4, True)])
def test_a_view_keeps_16_byte_alignment(dtype, offset, ok):
    text = (
        f"graph r {{\n  buffer rot : {dtype}[16, 16]\n  input lo : {dtype}[16, 8] strides [16, 1] in rot at 0\n"
        f"  input hi : {dtype}[16, 8] strides [16, 1] in rot at {offset}\n  output y = lo * hi\n}}\n"
    )
    found = errors(text)
    assert (found == []) == ok, found
    if not ok:
        assert "not a multiple of 16" in found[0]


def test_a_bool_buffer_is_refused_where_declared():
    # bound bools are bit-packed: a view at an element offset has no byte address (run crashed on it)
    text = (
        "graph bv {\n  buffer mb : bool[2, 4, 128]\n  input a : float[1, 4, 128]\n"
        "  input m : bool[1, 4, 128] in mb at 512\n  output y = binary_select(a, a, m)\n}\n"
    )
    r = load(text=text, file="m.cdg")
    [e] = [d for d in r.diagnostics if d.severity == "error"]
    assert "bit-packed" in e.message and (e.loc.line, e.loc.col) == (2, 15)


def test_an_input_only_written_in_place_is_not_warned_unused():
    text = "graph w {\n  input x : float[1, 4, 8]\n  input acc : float[1, 4, 8]\n  output y in acc = relu(x)\n}\n"
    assert [d.message for d in load(text=text, file="m.cdg").diagnostics] == []


def test_views_may_alias_but_inputs_of_their_own_may_not():
    view = (
        "graph a {\n  buffer t : float[16]\n  input x : float[4, 16] strides [0, 1] in t at 0\n"
        "  input y : float[4, 16]\n  output z = x + y\n}\n"
    )
    assert errors(view) == []
    plain = "graph a {\n  input x : float[4, 16] strides [0, 1]\n  input y : float[4, 16]\n  output z = x + y\n}\n"
    assert "alias" in errors(plain)[0]


def test_views_are_inputs_of_the_graph_and_the_buffer_is_what_the_caller_binds():
    g, inst = one(PACKED)
    assert [v.name for v in g.inputs] == ["qkv"]
    assert [v.name for v in g.views] == ["q", "k", "v"]
    assert [v.name for v in g.of_kind("input")] == ["q", "k", "v"]  # each a cuDNN tensor with its uid
    assert inst.type("qkv").strides == (768, 96, 32, 16, 1)


def test_a_view_is_its_buffers_address_plus_offset_times_itemsize():
    g, inst = one(PACKED)
    t = generate_inputs(g, inst, "cpu", seed=3)
    assert set(t) == {"qkv"}  # generated once, for the buffer
    full = with_views(g, inst, t)
    for name, offset in (("q", 0), ("k", 32), ("v", 64)):
        assert full[name].data_ptr() == t["qkv"].data_ptr() + offset * 4
        assert full[name].stride() == (768, 16, 96, 1)
    torch.testing.assert_close(full["k"], t["qkv"][:, :, 1].transpose(1, 2))


def test_the_reference_reads_the_views_of_the_packed_buffer():
    g, inst = one(PACKED)
    qkv = generate_inputs(g, inst, "cpu", seed=1)["qkv"]
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(run_reference(g, inst, {"qkv": qkv}, "cpu")["o"], want)


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda t: t.update(qkv=torch.zeros(2, 8, 3, 2, 8)), "'qkv': expected shape [2, 8, 3, 2, 16]"),
        (lambda t: t.update(qkv=t["qkv"].half()), "'qkv': expected dtype float, given half"),
        (lambda t: t.update(q=t["qkv"][:, :, 0]), "'q' is a view of buffer 'qkv'; bind 'qkv'"),
        (lambda t: t.pop("qkv"), "buffer 'qkv' is not bound"),
        (lambda t: t.update(qkv=torch.zeros(2, 8, 3, 2, 17)[..., 1:]), "strides [768, 96, 32, 16, 1], given"),
        (lambda t: t.update(qkv=torch.zeros(1537)[1:].view(2, 8, 3, 2, 16)), "an address aligned to 16 bytes"),
    ],
)
def test_a_buffer_is_checked_before_cuDNN_sees_its_pointer(change, words):
    g, inst = one(PACKED)
    t = generate_inputs(g, inst, "cpu")
    change(t)
    with pytest.raises(BindingError, match=words.replace("[", r"\[").replace("]", r"\]")):
        check_inputs(g, inst, t, torch.device("cpu"))


def test_an_output_in_place_takes_its_inputs_type_and_the_reference_reads_the_inputs_before_the_launch():
    g, inst = one(IN_PLACE)
    assert g.value("x2").into == "x" and inst.type("x2") == inst.type("x")
    t = generate_inputs(g, inst, "cpu", seed=2)
    before = snapshot(g, t)
    assert before["x"] is not t["x"] and before["b"] is t["b"]  # only what is overwritten is copied
    t["x"].mul_(2).add_(t["b"])  # what the launch does to x
    want = run_reference(g, inst, before, "cpu")["x2"]
    torch.testing.assert_close(t["x"], want)


def test_an_output_in_place_of_a_view_writes_through_the_buffer():
    text = (
        "graph r {\n  buffer qk : float[4, 2, 16]\n  input q : float[1, 4, 16] strides [128, 32, 1] in qk at 0\n"
        "  input c : float[1, 1, 16]\n  output q2 in q = q * c\n}\n"
    )
    g, inst = one(text)
    t = generate_inputs(g, inst, "cpu")
    assert set(snapshot(g, t)) == {"qk", "c"} and snapshot(g, t)["qk"] is not t["qk"]


def test_the_variant_pack_gives_each_uid_its_buffer():
    """run.launch.Layout, which every launch packs with: a view is its window on the bound buffer, an output
    in place its input's memory (here a view's), a scalar left out the lowering's host tensor and one given a
    CPU tensor of its value, kept while the value stays; the positional and by-name forms agree."""
    from cudnn_dsl.run.launch import Layout, arguments
    from cudnn_dsl.target.memory import empty, host_scalar

    text = (
        "graph r {\n  buffer qk : float[4, 2, 16]\n  input q : float[1, 4, 16] strides [128, 32, 1] in qk at 16\n"
        "  input c : float[1, 1, 16]\n  scalar s : float = 0.5\n  output q2 in q = q * c * s\n"
        "  output y = c + s\n}\n"
    )
    g, inst = one(text)
    host = {g.value("s").uid: host_scalar(0.5, "float"), 99: torch.zeros(1)}  # 99: a constant of the lowering
    layout = Layout(g, inst, host)
    t = generate_inputs(g, inst, "cpu")
    y = empty(inst.type("y"), "cpu")
    pack = dict(zip(layout.uids, layout.named(t, {"y": y})))
    assert len(pack) == len(layout.uids) == 6 and pack[99] is host[99] and pack[g.value("y").uid] is y
    assert pack[g.value("c").uid] is t["c"] and pack[g.value("s").uid] is host[g.value("s").uid]
    q = pack[g.value("q").uid]
    assert q.data_ptr() == t["qk"].data_ptr() + 16 * 4 and q.stride() == (128, 32, 1)
    q2 = pack[g.value("q2").uid]
    assert q2.data_ptr() == q.data_ptr() and q2.stride() == q.stride()  # in place: the view's own window
    names, scalars = arguments(g)
    values = [t[n] for n in names] + [0.25 for _ in scalars]
    given = dict(zip(layout.uids, layout.buffers(values, [y])))
    assert given[g.value("s").uid].item() == 0.25 and given[g.value("q").uid].data_ptr() == q.data_ptr()
    again = dict(zip(layout.uids, layout.buffers(values, [y])))
    assert again[g.value("s").uid] is given[g.value("s").uid]  # the same value: its tensor reused
    assert host[g.value("s").uid].item() == 0.5  # a tensor a launch was given is never written over


def test_a_batchnorm_style_running_stat_is_written_back_into_its_input():
    text = (
        "graph s {\n  input x : half[8, 4, 2, 2]\n  input mean : float[1, 4, 1, 1]\n"
        "  output next_mean in mean = mean * 0.9 + reduction(x, mode=avg) * 0.1\n}\n"
    )
    found = errors(text)
    # the output takes its input's dtype (float, not the io's), so running stats in float stay float
    assert not any("in place" in m for m in found), found


def test_uid_zero_is_a_uid_and_attributes_take_uids():
    text = (
        "graph n {\n  input x : float[4, 6, 1, 1] uid=0\n  input g : float[1, 6, 1, 1]\n"
        "  output y = layernorm(x, g, g, epsilon=1e-3 uid=7)\n  output z = rmsnorm(x, g)\n}\n"
    )
    g, inst = one(text)
    assert g.value("x").uid == 0
    assert g.nodes[0].uids == (("epsilon", 7),)
    script = emit_cudnn(g, inst)
    assert "uid=0)" in script
    assert "const_uid7 = g.tensor(name='const_uid7', dim=[1, 1, 1, 1]" in script
    assert "uid=7)" in script
    # the other constant is numbered past every uid in use, the attribute's included
    assert "const_uid8 = g.tensor(" in script


def test_the_digest_covers_where_tensors_live():
    packed, inst = one(PACKED)
    spelled, inst2 = one(PACKED.replace("  input k", "  # the same graph, spelled otherwise\n  input k"))
    assert graph_digest(packed, inst) == graph_digest(spelled, inst2)
    apart_text = PACKED.replace("  buffer qkv : float[2, 8, 3, 2, 16]\n", "").replace(" in qkv at 0", "")
    apart, inst3 = one(apart_text.replace(" in qkv at 32", "").replace(" in qkv at 64", ""))
    assert graph_digest(packed, inst) != graph_digest(apart, inst3)  # same cuDNN tensors, other memory
    ip, inst4 = one(IN_PLACE)
    out_of_place, inst5 = one(IN_PLACE.replace(" in x", ""))
    assert graph_digest(ip, inst4) != graph_digest(out_of_place, inst5)


def _module(script: str) -> dict:
    env = {"__name__": "emitted"}
    exec(compile(script, "emitted.py", "exec"), env)  # noqa: S102 - the emitted script, not user text
    return env


def test_the_ejected_scripts_bind_the_views_as_run_does():
    g, inst = one(PACKED)
    env = _module(emit_cudnn(g, inst))
    buffers = env["make_buffers"](device="cpu")
    assert env["INPUTS"] == ["qkv"]
    assert buffers["v"].data_ptr() == buffers["qkv"].data_ptr() + 64 * 4
    qkv = generate_inputs(g, inst, "cpu", seed=4)["qkv"]
    (got,) = _module(emit_torch(g, inst))["reference"](qkv)
    torch.testing.assert_close(got, run_reference(g, inst, {"qkv": qkv}, "cpu")["o"])
    ip, ip_inst = one(IN_PLACE)
    b = _module(emit_cudnn(ip, ip_inst))["make_buffers"](device="cpu")
    assert b["x2"] is b["x"]


def test_a_dump_holds_the_buffer_and_reruns_on_it(tmp_path):
    from cudnn_dsl.debug import dump

    src = tmp_path / "p.cdg"
    src.write_text(PACKED)
    g, inst = program(src).graphs[0], program(src).graphs[0].instances[0]
    inputs = generate_inputs(g, inst, "cpu", seed=5)
    want = run_reference(g, inst, inputs, "cpu")
    dump.write(tmp_path / "d", src, g, inst, inputs, want)
    again = dump.read_tensors(tmp_path / "d", g, inst, "inputs")
    assert set(again) == {"qkv"}
    assert torch.equal(run_reference(g, inst, again, "cpu")["o"], want["o"])
    script = (tmp_path / "d" / "p.cudnn.py").read_text()
    assert "buffers['k'] = buffers['qkv'].as_strided([2, 2, 8, 16], [768, 16, 96, 1], 32)" in script


def test_a_dump_that_cannot_eject_its_scripts_writes_nothing(tmp_path, monkeypatch):
    from cudnn_dsl.debug import dump
    from cudnn_dsl.interop import emit

    src = tmp_path / "p.cdg"
    src.write_text(PACKED)
    g = program(src).graphs[0]
    inst = g.instances[0]
    inputs = generate_inputs(g, inst, "cpu", seed=5)

    def refuse(graph, inst):
        raise ValueError("cannot trace")

    monkeypatch.setattr(emit, "emit_torch", refuse)
    with pytest.raises(ValueError):
        dump.write(tmp_path / "d", src, g, inst, inputs, None)
    assert not (tmp_path / "d").exists()


def test_program_errors_do_not_reach_the_runtime():
    with pytest.raises(DslError):
        program(text=PACKED.replace("at 64", "at 65"), file="m.cdg")


def _packed_in_place(k_offset: int) -> str:
    return (
        PACKED.replace("in qkv at 32", f"in qkv at {k_offset}")
        .replace("  output o = sdpa(q, k, v, causal=true)\n", "  input c : float[1, 1, 1, 16]\n")
        .replace("}\n", "  output q2 in q = q * c\n  output o = sdpa(q, k, v)\n}\n")
    )


def test_an_output_in_place_of_a_view_is_proved_apart_from_the_other_views():
    assert errors(_packed_in_place(32)) == []  # Q written in place; K and V interleave with it, never share
    assert errors(_packed_in_place(16)) == ["output 'q2' in place of 'q' overwrites elements that view 'k' reads"]


def test_a_view_that_partly_overlaps_itself_is_legal_but_warned_about():
    r = load(text=PACKED.replace("strides [768, 16, 96, 1] in qkv at 0", "strides [96, 16, 96, 1] in qkv at 0"))
    assert not r.errors
    assert any("view 'q' reads elements twice: axes 0 and 2 overlap" in d.message for d in r.diagnostics)


def test_the_api_binds_the_buffer_by_name():
    import cudnn_dsl

    cg = cudnn_dsl.compile(PACKED)
    assert list(cg.inputs) == ["qkv"] and cg.inputs["qkv"].shape == (2, 8, 3, 2, 16)
    ins = cg.allocate_inputs()
    assert set(ins) == {"qkv"}
    qkv = ins["qkv"]
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(cg.reference(qkv=qkv)["o"], want)


def test_a_result_of_several_is_marked_in_place_after_the_fact():
    text = (
        "graph s {\n  input q : float[1, 2, 8, 4]\n  input k : float[1, 2, 8, 4]\n  input v : float[1, 2, 8, 4]\n"
        "  input lse : float[1, 2, 8, 1]\n  o, st = sdpa(q, k, v, stats=true)\n  output o\n  output st in lse\n}\n"
    )
    g, inst = one(text)
    assert g.value("st").into == "lse" and inst.type("st") == inst.type("lse")


# ---- how a buffer is drawn -----------------------------------------------------------------------

DRAWN = """graph d {
  buffer t : float[2, 8] init=uniform(2, 3)
  input a : float[2, 4] strides [8, 1] in t at 0
  input b : float[2, 4] strides [8, 1] in t at 4
  output y = a + b
}
"""


def test_a_buffers_init_draws_it_whole_in_run_and_in_the_ejected_script():
    from tests.test_emit import run_module

    g, inst = one(DRAWN)
    assert str(g.value("t").init) == "uniform(2, 3)" and g.value("a").init is None
    t = generate_inputs(g, inst, "cpu", seed=3)["t"]
    assert 2 <= t.min() and t.max() < 3  # the default, uniform(-1, 1), reaches neither
    script = run_module(emit_cudnn(g, inst))["make_buffers"](device="cpu", seed=3)
    assert torch.equal(script["t"], t)
    assert "buffer t : float[2, 8] init=uniform(2, 3)" in fmt_module(parse(DRAWN, "d.cdg"))


@pytest.mark.parametrize(
    "old, new, culprit, message",
    [
        (
            "in t at 0\n",
            "in t at 0 init=randn\n",
            "init=randn",
            "a view is drawn with its buffer: put init= on buffer 't'",
        ),
        ("uniform(2, 3)\n", "uniform(2, 3) nhwc\n", "nhwc", "a buffer takes init= only"),
        ("uniform(2, 3)\n", "full(1) init=full(2)\n", "init=full(2)", "init given twice"),
        ("uniform(2, 3)\n", "randint(0.5, 2)\n", "0.5", "init: randint: lo and hi must be integers"),
    ],
)
def test_init_on_a_view_or_a_bad_spec_on_a_buffer_is_a_located_error(old, new, culprit, message):
    text = DRAWN.replace(old, new, 1)
    [error] = [d for d in load(text=text, file="d.cdg").diagnostics if d.severity == "error"]
    line = next(k for k, row in enumerate(text.splitlines(), 1) if new.strip() in row)
    col = text.splitlines()[line - 1].rindex(culprit) + 1
    assert (error.loc.line, error.loc.col) == (line, col) and error.message.startswith(message), error


@pytest.mark.parametrize("command", ["run", "emit"])
def test_init_flag_on_a_view_names_its_buffer(command):
    from pathlib import Path

    from tests.cli_util import run_cli

    p = run_cli(command, Path(__file__).parents[1] / "examples" / "rope_in_place.cdg", "--init", "q1=randn")
    assert p.returncode == 2, p.stderr
    assert "--init q1=randn: 'q1' is a view, drawn with its buffer: name buffer 'q'" in p.stderr


def test_input_flag_on_a_fifo_says_it_is_not_a_regular_file(tmp_path):
    import os
    from pathlib import Path

    from tests.cli_util import run_cli

    fifo = tmp_path / "x.pt"
    os.mkfifo(fifo)
    p = run_cli("run", Path(__file__).parents[1] / "examples" / "conv_bias_relu.cdg", "--input", f"x={fifo}")
    assert p.returncode == 2 and f"--input x: {fifo} is not a regular file (a FIFO)" in p.stderr, p.stderr


# sdpa_backward writing dQ, dK and dV into one packed buffer, as the frontend's samples lay them out
PLACED = """graph pb {
  buffer qkv : float[2, 8, 3, 2, 16]
  buffer dqkv : float[2, 8, 3, 2, 16]
  input q : float[2, 2, 8, 16] strides [768, 16, 96, 1] in qkv at 0
  input k : float[2, 2, 8, 16] strides [768, 16, 96, 1] in qkv at 32
  input v : float[2, 2, 8, 16] strides [768, 16, 96, 1] in qkv at 64
  input o : float[2, 2, 8, 16]
  input do : float[2, 2, 8, 16]
  input stats : float[2, 2, 8, 1]
  dq, dk, dv = sdpa_backward(q, k, v, o, do, stats, causal=true)
  output dq : float[2, 2, 8, 16] strides [768, 16, 96, 1] in dqkv at 0
  output dk : float[2, 2, 8, 16] strides [768, 16, 96, 1] in dqkv at 32
  output dv : float[2, 2, 8, 16] strides [768, 16, 96, 1] in dqkv at 64
}
"""


def test_an_output_placed_in_a_buffer_is_one_written_over_a_view_of_it():
    longhand = PLACED.replace(
        "  dq, dk, dv",
        "".join(
            f"  input d{x}_view : float[2, 2, 8, 16] strides [768, 16, 96, 1] in dqkv at {32 * i}\n"
            for i, x in enumerate("qkv")
        )
        + "  dq, dk, dv",
    )
    for x in "qkv":
        longhand = longhand.replace(
            f"output d{x} : float[2, 2, 8, 16] strides [768, 16, 96, 1] in dqkv at {32 * 'qkv'.index(x)}",
            f"output d{x} in d{x}_view",
        )
    short, long_ = one(PLACED)[0], one(longhand)[0]
    assert short == long_  # the IR holds one form: the view the checker declares, named after the output
    assert [(o.name, short.value(o.into).view) for o in short.outputs] == [
        ("dq", ("dqkv", 0)),
        ("dk", ("dqkv", 32)),
        ("dv", ("dqkv", 64)),
    ]
    assert [b.name for b in short.inputs] == ["qkv", "dqkv", "o", "do", "stats"]  # the caller binds the buffers


def test_outputs_placed_in_one_buffer_hold_the_gradient_of_the_packed_buffer():
    """dQ, dK, dV written where a launch writes them (outputs_of: their windows on dqkv) are torch autograd's
    gradient of the packed qkv, through torch's views (the reference's numbers; cuDNN's: the GPU twin)."""

    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 8, 3, 2, 16, generator=gen, requires_grad=True)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    scores = (q @ k.transpose(-1, -2) * 0.25).masked_fill(torch.ones(8, 8).triu(1).bool(), float("-inf"))
    o = torch.softmax(scores, -1) @ v
    do = torch.randn(o.shape, generator=gen)
    o.backward(do)
    g, inst = one(PLACED)
    dqkv = torch.full_like(qkv, float("nan"))  # every element is written
    stats = torch.logsumexp(scores, -1, keepdim=True).detach()
    t = {"qkv": qkv.detach(), "o": o.detach().contiguous(), "do": do, "stats": stats, "dqkv": dqkv}
    check_inputs(g, inst, t, torch.device("cpu"))
    windows = outputs_of(g, inst, t, "cpu")
    assert windows["dk"].data_ptr() == dqkv.data_ptr() + 32 * 4 and windows["dk"].stride() == (768, 16, 96, 1)
    for name, value in run_reference(g, inst, t, "cpu").items():
        windows[name].copy_(value)
    torch.testing.assert_close(dqkv, qkv.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("dqkv at 32", "dqkv at 0", "output 'dq' in 'dqkv' at 0 overwrites elements that output 'dk' writes"),
        ("dqkv at 64", "dqkv at 6000", "output 'dv' [2, 2, 8, 16] strides [768, 16, 96, 1] at 6000 reaches element"),
        ("dqkv at 32", "dqkv at 33", "output 'dk' at 33 starts 132 bytes into 'dqkv', not a multiple of 16"),
        ("dk : float[2, 2, 8, 16] strides [768, 16, 96, 1] in dqkv", "dk in dqkv", "output 'dk' placed in buffer"),
        (
            "dk : float[2, 2, 8, 16] strides [768, 16, 96, 1] in dqkv at 32",
            "dk : float[2, 2, 8, 16] strides [768, 16, 96, 1] in qkv at 32",
            "output 'dk' in 'qkv' at 32 overwrites elements that view 'k' reads",
        ),
        ("in dqkv at 0", "in dqvk at 0", "unknown buffer 'dqvk' (did you mean 'dqkv'?)"),
        ("dv : float", "dv : half", "output 'dv' is half but buffer 'dqkv' is float"),
    ],
)
def test_an_output_placed_in_a_buffer_is_proved_inside_it_and_apart_from_the_other_views(old, new, message):
    found = errors(PLACED.replace(old, new))
    assert any(m.startswith(message) for m in found), found
