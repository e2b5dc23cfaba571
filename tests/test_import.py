"""`cudnn-dsl import`: the cuDNN Frontend's graph JSON (and its logs) back to .cdg, with no GPU.

The round trip goes through the real frontend: every example, at every shape, is serialized by the cuDNN
Frontend itself (`emit --format fe-json`: lowered and planned for an H200 without a device), imported, and
compared with the original.
"""

import json
import os
import re
import stat
import struct
import threading
from pathlib import Path

import pytest
from cli_util import run_cli

from cudnn_dsl.build.lower import cudnn_dims, left_to_offsets
from cudnn_dsl.interop.fe_import import to_cdg, verify
from cudnn_dsl.interop.fe_nodes import IMPORTED, NOT_CARRIED, NOT_IMPORTED
from dsl.ops import OPS
from dsl.pipeline import program
from dsl.syntax.parser import parse
from dsl.syntax.printer import fmt_module

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.cdg"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: the frontend's bias and scale are its pointwise ADD and MUL: its JSON cannot tell them from add and mul
SAME_CALL = {"bias": "add", "scale": "mul"}
#: a number literal is a pass-by-value tensor to the frontend, as a scalar is: it imports as a scalar
SAME_KIND = {"const": "scalar"}


def test_every_registry_op_is_imported_or_says_why_not():
    """Whoever adds an op to dsl/ops/ adds the frontend node it comes from to cudnn_dsl/interop/fe_nodes.py
    (a NODES row naming the op, or a POINTWISE mode), or says in NOT_IMPORTED why none does."""
    missing = sorted(set(OPS) - set(IMPORTED) - set(NOT_IMPORTED))
    assert not missing, f"no import mapping (cudnn_dsl/interop/fe_nodes.py) for {missing}"
    assert not set(IMPORTED) & set(NOT_IMPORTED)
    assert set(IMPORTED) | set(NOT_IMPORTED) <= set(OPS), "a mapping names an op the registry does not have"
    assert all(why for why in NOT_IMPORTED.values())


def test_examples_use_what_the_json_cannot_carry():
    """The every-example round trip below covers the drops NOT_CARRIED lists: some example has each."""
    used = {what for path in EXAMPLES for g in program(path).graphs for what, names in _not_carried(g).items() if names}
    assert used == {"buffer", "in-place output", "range dim", "init", "batch stride left to offsets"}


#: attributes and optional inputs no CASES graph spells, and why
UNSPELLED = {
    ("sdpa_fp8", "causal_bottom_right"): "the H200 plans no bottom-right FP8 attention (Blackwell only), and "
    "the frontend writes its JSON only when planning; it shares _sdpa_band with sdpa, whose case has it",
    ("sdpa_fp8_backward", "causal_bottom_right"): "as sdpa_fp8's: Blackwell-only in FP8 (sdpa_fp8_bwd.h)",
}


def test_every_attribute_and_optional_input_is_in_a_case():
    """Whoever adds an attribute or optional input to an imported op spells it in a CASES graph of that op (so its
    import is tested through the frontend), or says in UNSPELLED why not."""
    from dsl.ops import COMMON_ATTRS

    common = {a.name for a in COMMON_ATTRS}
    missing = []
    for op in sorted(IMPORTED):
        texts = [c[0] if isinstance(c, tuple) else c for c in CASES.get(op, [])]
        names = [a.name for a in OPS[op].attrs if a.name not in common] + list(OPS[op].optional)
        missing += [(op, n) for n in names if (op, n) not in UNSPELLED and not any(f"{n}=" in t for t in texts)]
    assert not missing, f"spell these in CASES (tests/test_import.py): {missing}"


def test_every_reduction_mode_is_imported():
    from cudnn_dsl.interop.fe_nodes import REDUCTION
    from dsl.ops import REDUCTION_MODES

    assert sorted(REDUCTION.values()) == sorted(REDUCTION_MODES)


def test_frontend_names_become_names_the_grammar_takes():
    from cudnn_dsl.interop.fe_import import ident

    grammar = (ROOT / "dsl" / "syntax" / "grammar.lark").read_text()
    keywords = set(re.findall(r'"([a-z]+)"', grammar)) | {"io", "intermediate", "compute"}
    used = set()
    names = [ident(n, used) for n in [*sorted(keywords), "conv_fprop.0::Y", "::Y", "0", "", "x", "x", "a b"]]
    assert names[-7:] == ["conv_fprop_0_Y", "Y", "t0", "t", "x", "x_2", "a_b"]
    text = "graph g {\n" + "".join(f"  input {n} : half[1]\n" for n in names)
    text += "  output y = " + " + ".join(names) + "\n}\n"
    assert len(program(text=text, file="names.cdg").graphs[0].inputs) == len(names)  # names, none a keyword


# ---- the round trip, every example at every shape --------------------------------------------------------


def _cases():
    for path in EXAMPLES:
        for g in program(path).graphs:
            for inst in g.instances:
                yield pytest.param(path, g.name, inst.binding, id=f"{path.stem}:{g.name}:{inst.label or 'static'}")


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    return Target.named("h200")


def _f32(x):
    return struct.unpack("f", struct.pack("f", x))[0] if isinstance(x, float) else x


def _listing(graph, inst) -> list:
    """One shape of a graph with every name replaced by its position: what tells two graphs apart, names aside.
    Values the frontend keeps as float32 (attributes, scalars) compare as float32."""
    index = {}

    def ref(name):
        return None if name is None else index[name]

    flat, left = _flat_offsets(graph, inst), left_to_offsets(graph, inst)

    def desc(v):
        t = inst.type(v.name)
        shape, strides = ((t.shape[0], 1, 1, 1), (1, 1, 1, 1)) if v.name in flat else (t.shape, t.strides)
        if v.name in left:  # the JSON holds the batch stride cuDNN gets, which the offsets replace
            strides = tuple(cudnn_dims(t, True)[1])
        return (
            SAME_KIND.get(v.kind, v.kind),
            v.uid,
            t.dtype,
            shape,
            strides,
            _f32(v.scalar),
            v.dims or shape,
        )  # the dims cuDNN gets a scalar at

    out = []
    for v in sorted(graph.of_kind("input", "scalar", "const"), key=lambda v: v.uid):
        index[v.name] = len(index)
        out.append(desc(v))
    for i, node in enumerate(graph.nodes):
        attrs = {k: tuple(map(_f32, v)) if isinstance(v, tuple) else _f32(v) for k, v in inst.attrs(i).items()}
        for o in node.outputs:
            index[o] = len(index)
        outs = [desc(graph.value(o)) for o in node.outputs]
        scalars = [(a, ref(name)) for a, name in node.scalars]
        out.append((SAME_CALL.get(node.op, node.op), [ref(x) for x in node.inputs], attrs, scalars, node.compute, outs))
    return out


def _flat_offsets(graph, inst) -> set[str]:
    """The 1-D ragged offsets: the frontend holds them as [B+1, 1, 1, 1], the form cuDNN takes, and they import so."""
    from cudnn_dsl.run.indices import ragged_offsets

    return {name for name in ragged_offsets(graph, inst) if len(inst.type(name).shape) == 1}


def _graph_calls(script: str) -> list[str]:
    """The frontend graph calls of an `emit --format cudnn` script (not the planning options, which are the
    file's and not the graph's), with the graph's name and float32-equal numbers made alike."""
    body = script[script.index("g = cudnn.pygraph(") : script.index("    g.validate()")]
    body = re.sub(r"name='[^']*', intermediate_data_type", "name=G, intermediate_data_type", body, count=1)
    for alias, op in SAME_CALL.items():
        body = body.replace(f"g.{alias}(", f"g.{op}(")
    return [re.sub(r"\d+\.\d+(e-?\d+)?", lambda m: repr(_f32(float(m.group()))), line) for line in body.splitlines()]


def _not_carried(graph) -> dict:
    """What a graph says that its frontend JSON does not carry (fe_nodes.NOT_CARRIED): a round trip drops it."""
    return {
        "buffer": [b.name for b in graph.buffers],
        "in-place output": [v.name for v in graph.in_place],
        "range dim": [s.name for s in graph.symbols],
        "init": [v.name for v in graph.values if v.init is not None],
        "batch stride left to offsets": sorted(left_to_offsets(graph, graph.instances[0])),
    }


@pytest.mark.parametrize("path,graph_name,binding", list(_cases()))
def test_emit_fe_json_then_import_is_the_same_graph(path, graph_name, binding, h200):
    """What the JSON carries comes back: every cuDNN tensor (kind, uid, dtype, dims, strides, scalar value), every
    op with its canonical attributes and compute type, the frontend calls, and the JSON itself. What it does not
    (NOT_CARRIED: buffers and views, in-place outputs, range dims, init=, options) is dropped: the imported graph
    has none, and is the original at this one shape with views as plain inputs."""
    from cudnn_dsl.interop.emit import emit_cudnn
    from cudnn_dsl.interop.fe_export import frontend_json

    g = program(path).graph(graph_name)
    inst = g.instance(dict(binding))
    fe = frontend_json(g, inst, h200)
    cdg, imported = to_cdg(fe, f"{path.stem}.json", name=graph_name)

    assert fmt_module(parse(cdg, "imported.cdg")) == cdg  # canonical: `fmt --check` clean
    back = program(text=cdg, file="imported.cdg")
    verify(back, imported)
    g2 = back.graphs[0]
    inst2 = g2.instances[0]
    assert set(_not_carried(g)) <= set(NOT_CARRIED)
    assert not any(_not_carried(g2).values())  # dropped, as documented
    assert _listing(g2, inst2) == _listing(g, inst)  # the same graph, up to names
    if not _flat_offsets(g, inst):  # 1-D offsets are made at rank 3 and set to rank 4: other calls, one graph
        assert _graph_calls(emit_cudnn(g2, inst2)) == _graph_calls(emit_cudnn(g, inst))  # the same frontend calls
    again = json.loads(frontend_json(g2, inst2, h200))
    assert _graph_json(again) == _graph_json(json.loads(fe))  # and the frontend serializes the same graph


def _graph_json(j: dict) -> dict:
    j.pop("gid")  # the frontend numbers the graphs of a process
    return j


def test_cli_round_trip_writes_a_canonical_file_and_never_overwrites(tmp_path):
    example = ROOT / "examples" / "matmul_epilogue.cdg"
    fe = tmp_path / "mm.json"
    p = run_cli("emit", example, "--format", "fe-json")
    assert p.returncode == 0, p.stderr
    fe.write_text(p.stdout)
    out = tmp_path / "mm.cdg"
    p = run_cli("import", fe, "-o", out)
    assert p.returncode == 0, p.stderr
    assert "1 graph imported" in p.stderr
    text = out.read_text()
    assert "scalar alpha : float[1, 1, 1] = 0.5 uid=4" in text  # the scalar, by value, with its dims
    assert "reduction(y, mode=amax)" in text
    assert run_cli("fmt", "--check", out).returncode == 0
    assert run_cli("check", out).returncode == 0

    out.write_text("keep me\n")
    p = run_cli("import", fe, "-o", out)
    assert p.returncode == 2 and "exists; pass --force" in p.stderr
    assert out.read_text() == "keep me\n"
    assert run_cli("import", fe, "-o", out, "--force").returncode == 0
    assert out.read_text() == text
    assert run_cli("import", fe, "--force").returncode == 2  # --force without -o


def test_emit_still_writes_the_json_of_a_graph_cudnn_declines(tmp_path):
    """The JSON matters most in a bug report about a refusal: emit writes it (taken before planning), says why
    it exits 1, and import reads it back. (cuDNN 9.28 has no engine for a standalone inference batch norm.)"""
    cdg = tmp_path / "bn.cdg"
    cdg.write_text(CASES["batchnorm_inference"][0][0])
    p = run_cli("emit", cdg, "--format", "fe-json")
    assert p.returncode == 1
    assert "cuDNN create_execution_plans failed" in p.stderr and "taken before planning" in p.stderr
    fe = tmp_path / "bn.json"
    fe.write_text(p.stdout)
    p = run_cli("import", fe)
    assert p.returncode == 0, p.stderr
    assert "batchnorm_inference(x, mean, inv_var, gamma, beta)" in p.stdout


# ---- the other formats: a real frontend log, and version 1.0 ----------------------------------------------


def test_a_real_frontend_log_imports_every_graph_it_holds(tmp_path):
    """tests/fixtures/frontend_log.txt: CUDNN_FRONTEND_LOG_INFO=1 output of two graphs built with the frontend
    directly (tests/fixtures/make_frontend_log.py). Its graph JSON is written at validation, before the frontend
    infers the intermediates' dims: the language infers them, and the verification compares what the log has."""
    p = run_cli("import", FIXTURES / "frontend_log.txt")
    assert p.returncode == 0, p.stderr
    prog = program(text=p.stdout, file="log.cdg")
    conv, mm = prog.graphs
    assert [n.op for n in conv.nodes] == ["conv_fprop", "mul", "add", "relu"]
    assert [n.op for n in mm.nodes] == ["matmul", "add"]
    x = conv.instances[0].type("X")
    assert (x.dtype, x.shape, x.strides) == ("half", (8, 64, 32, 32), (65536, 1, 2048, 64))
    out = conv.outputs[0]
    assert (out.name, out.uid, conv.instances[0].type(out.name).shape) == ("relu_0_OUT_0", 8, (8, 128, 32, 32))
    assert conv.instances[0].attrs(0) == {
        "pre_padding": (1, 1),
        "post_padding": (1, 1),
        "stride": (1, 1),
        "dilation": (1, 1),
    }
    out = tmp_path / "log.cdg"
    out.write_text(p.stdout)
    p = run_cli("check", "--target", "h200", out)  # and cuDNN plans both for an H200
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(" plans for NVIDIA H200") == 2


def test_a_graph_pasted_into_a_bug_report_is_found(tmp_path, mm_json):
    """`print(graph)` writes the JSON with indentation; pasted among other text, it is still found."""
    report = tmp_path / "issue.txt"
    report.write_text(f"cuDNN says no engine for this graph:\n\n{mm_json}\nwith cuDNN 9.19 on an H200.\n")
    p = run_cli("import", report)
    assert p.returncode == 0, p.stderr
    assert "output amax : float[1, 1, 1] strides [1, 1, 1] uid=9 = reduction(y, mode=amax)" in p.stdout


def test_standard_input(monkeypatch, mm_json):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(mm_json))
    p = run_cli("import", "-", "--name", "mm")
    assert p.returncode == 0, p.stderr
    assert "graph mm {" in p.stdout


def test_version_1_json_keys_tensors_by_name():
    """Frontends before 2.0 wrote 'tensors' as an object keyed by name (or uid) and named tensors in nodes."""
    p = run_cli("import", FIXTURES / "frontend_v1.json")
    assert p.returncode == 0, p.stderr
    g = program(text=p.stdout, file="v1.cdg").graphs[0]
    assert [(v.name, v.uid) for v in g.inputs] == [("w", 1), ("x", 2), ("b", 3)]
    assert [n.op for n in g.nodes] == ["conv_fprop", "add", "relu"]
    assert g.instances[0].attrs(0)["stride"] == (2, 2)
    assert g.instances[0].type("y").shape == (1, 64, 104, 104)


# ---- what cannot be imported: located errors, nothing written ---------------------------------------------


@pytest.fixture(scope="module")
def mm_json(h200):
    from cudnn_dsl.interop.fe_export import frontend_json

    g = program(ROOT / "examples" / "matmul_epilogue.cdg").graphs[0]
    return frontend_json(g, g.instances[0], h200)


def _import_error(tmp_path, text: str, *flags) -> str:
    src = tmp_path / "g.json"
    src.write_text(text)
    out = tmp_path / "g.cdg"
    p = run_cli("import", src, "-o", out, *flags)
    assert p.returncode == 1, p.stdout + p.stderr
    assert not out.exists()
    assert "Traceback" not in p.stderr
    return p.stderr.replace(str(src), "g.json")


def _edit(text: str, fn) -> str:
    j = json.loads(text)
    fn(j)
    return json.dumps(j, indent=1)


def test_bad_json_is_located(tmp_path):
    err = _import_error(tmp_path, '{"json_version": "2.0",\n "nodes": [,]}\n')
    assert err.startswith('g.json:2:12: error: not valid JSON: Expecting value\n   "nodes": [,]}\n             ^\n')


def test_truncated_json_says_so(tmp_path, mm_json):
    err = _import_error(tmp_path, mm_json[: len(mm_json) // 2])
    assert "error: the file ends before its JSON is complete (is it truncated?)" in err


def test_truncated_log_says_which_line(tmp_path):
    log = (FIXTURES / "frontend_log.txt").read_text()
    cut = log.index('"tensors"')  # in the middle of the first graph's line
    line = log.count("\n", 0, cut) + 1
    err = _import_error(tmp_path, log[:cut])
    assert err.startswith(f"g.json:{line}:")
    assert "this log line ends before its JSON is complete (is it truncated?)" in err


def test_wrong_version_names_the_versions_read(tmp_path, mm_json):
    err = _import_error(tmp_path, _edit(mm_json, lambda j: j.update(json_version="3.1")))
    assert err.startswith('g.json:1:1: error: json_version "3.1": this importer reads the frontend\'s graph JSON')
    assert "versions 1.0 and 2.0" in err


def _node(j, name):
    return next(n for n in j["nodes"] if n["name"] == name)


def test_unknown_node_is_named_and_located(tmp_path, mm_json):
    text = _edit(mm_json, lambda j: _node(j, "y").update(tag="RESAMPLE"))
    err = _import_error(tmp_path, text)
    line = text.count("\n", 0, text.index('"tag": "RESAMPLE"')) + 1
    assert err == (
        f"g.json:{line}:4: error: node 'y' (RESAMPLE, nodes[3]): the language has no op for frontend nodes of "
        'type RESAMPLE\n     "tag": "RESAMPLE"\n     ^\n'
    )


def test_unknown_pointwise_mode_is_an_error(tmp_path, mm_json):
    err = _import_error(tmp_path, _edit(mm_json, lambda j: _node(j, "y").update(mode="ATAN2")))
    assert "node 'y' (POINTWISE, nodes[3]): pointwise mode ATAN2 has no op in the language" in err


def test_a_setting_the_language_lacks_is_an_error(tmp_path, mm_json):
    err = _import_error(tmp_path, _edit(mm_json, lambda j: _node(j, "y").update(relu_upper_clip="40C00000")))
    assert "node 'y' (POINTWISE, nodes[3]): relu_upper_clip=\"40C00000\" has no spelling in the language" in err


def test_padding_whose_sides_differ_imports_as_pre_and_post_padding(tmp_path):
    """The frontend's JSON pads each side of its own (pre_padding, post_padding); sides alike are `padding`."""
    v1 = (FIXTURES / "frontend_v1.json").read_text()
    src = tmp_path / "g.json"
    src.write_text(_edit(v1, lambda j: j["nodes"][0].update(pre_padding=[0, 0])))
    p = run_cli("import", src)
    assert p.returncode == 0, p.stderr
    assert "conv_fprop(x, w, pre_padding=[0, 0], post_padding=[1, 1], stride=[2, 2]" in p.stdout
    g = program(text=p.stdout, file="v1.cdg").graphs[0]
    assert g.instances[0].attrs(0)["pre_padding"] == (0, 0) and g.instances[0].attrs(0)["post_padding"] == (1, 1)
    assert "conv_fprop(x, w, padding=[1, 1]" in run_cli("import", FIXTURES / "frontend_v1.json").stdout


@pytest.mark.parametrize(
    "case,edit,words",
    [
        (
            "sdpa-0",
            {"max_total_seq_len_q": 256},
            "max_total_seq_len_q (the packed rows' bound, a backward field): the language's sdpa lacks it",
        ),
        ("sdpa-0", {"is_mxfp8": True}, "is_mxfp8=true has no spelling in the language"),
        ("batchnorm-0", {"peer_stats": [9]}, "peer_stats (statistics across GPUs)"),
        ("concatenate-0", {"in_place_index": 0}, "in_place_index (writing into one of its inputs)"),
        ("layernorm-0", {"forward_phase": "NOT_SET"}, "forward_phase NOT_SET"),
    ],
)
def test_a_setting_of_a_new_node_the_language_lacks_is_an_error(tmp_path, h200, case, edit, words):
    from cudnn_dsl.interop.fe_export import frontend_json

    op, i = case.split("-")
    text, unplanned = (CASES[op][int(i)], False) if isinstance(CASES[op][int(i)], str) else CASES[op][int(i)]
    g = program(text=text, file="c.cdg").graphs[0]
    fe = frontend_json(g, g.instances[0], h200, plans=not unplanned)
    err = _import_error(tmp_path, _edit(fe, lambda j: j["nodes"][-1].update(edit)))
    assert words in err, err


def test_a_scalar_without_its_value_asks_for_it(tmp_path, mm_json):
    def drop(j):
        next(t for t in j["tensors"] if t["name"] == "alpha")["pass_by_value"] = None

    text = _edit(mm_json, drop)
    err = _import_error(tmp_path, text)
    assert "tensor 'alpha' is passed by value, and the JSON does not hold its value" in err
    assert "give it with --scalar alpha=VALUE" in err
    src = tmp_path / "g.json"
    p = run_cli("import", src, "--scalar", "alpha=0.25")
    assert p.returncode == 0 and "scalar alpha : float[1, 1, 1] = 0.25 uid=4" in p.stdout
    assert run_cli("import", src, "--scalar", "alpha=x").returncode == 2
    p = run_cli("import", src, "--scalar", "alpha=1", "--scalar", "beta=1")
    assert (
        p.returncode == 2 and "--scalar beta: " in p.stderr and "has no pass-by-value tensor of that name" in p.stderr
    )


def test_an_epsilon_bound_at_launch_is_asked_for(tmp_path, h200):
    from cudnn_dsl.interop.fe_export import frontend_json

    g = program(ROOT / "examples" / "layernorm.cdg").graph("rmsnorm")
    j = json.loads(frontend_json(g, g.instances[0], h200))
    eps = next(t for t in j["tensors"] if t["is_pass_by_value"])
    eps["pass_by_value"] = None  # as in a log of a graph whose epsilon the caller binds at launch
    err = _import_error(tmp_path, json.dumps(j, indent=1))
    assert (
        f"node 'y' (RMS_NORM, nodes[0]): the JSON does not hold the value of its EPSILON (tensor '{eps['name']}'" in err
    )
    p = run_cli("import", tmp_path / "g.json", "--scalar", f"{eps['name']}=1e-6")
    assert p.returncode == 0, p.stderr
    assert "rmsnorm(x, gamma, epsilon=1e-06)" in p.stdout


def test_not_a_graph_at_all(tmp_path):
    err = _import_error(tmp_path, "hello\nno graph here\n")
    assert "no cuDNN Frontend graph found" in err


def _set_dims(name, dims):
    def edit(j):
        next(t for t in j["tensors"] if t["name"] == name)["dim"] = dims

    return edit


def test_a_graph_that_does_not_check_is_not_written(tmp_path, mm_json):
    # the output's dims in the JSON disagree with its op: the language's checker says so, at the JSON's field
    err = _import_error(tmp_path, _edit(mm_json, _set_dims("y", [16, 512, 256])))
    assert re.search(r"g\.json:\d+:\d+: error: tensor 'y': output 'y' is declared \[16, 512, 256\]", err), err
    assert "the graph imported from g.json does not check (above); nothing written" in err


def test_an_import_that_is_not_the_same_graph_is_not_written(tmp_path, mm_json):
    # an intermediate's dims, which the .cdg file does not spell: the comparison with the JSON finds them
    err = _import_error(tmp_path, _edit(mm_json, _set_dims("matmul_0", [16, 512, 256])))
    assert re.search(
        r"g\.json:\d+:\d+: error: tensor 'matmul_0': dim \[16, 512, 256\] contradicts its graph: node 'matmul_0' "
        r"\(MATMUL, nodes\[0\]\) makes \[16, 512, 512\]",
        err,
    ), err
    assert "the imported graph is not the one g.json describes (above); nothing written" in err


# ---- every op the import tables produce, through the real frontend ----------------------------------------


def _graph(body: str, io: str = "half") -> str:
    return f"graph t {{\n  io {io}\n  compute float\n{body}\n}}\n"


_MM = "  input a : half[4, 64, 64]\n  input b : half[4, 64, 32]\n"
_SDPA = "".join(f"  input {n} : half[2, 4, 128, 64]\n" for n in "qkv")
_NORM = "  input x : bf16[512, 256, 1, 1]\n  input gamma : float[1, 256, 1, 1]\n  input beta : float[1, 256, 1, 1]\n"
_IN = "  input x : half[8, 64, 16, 16] nhwc\n  input gamma : float[1, 64, 1, 1]\n  input beta : float[1, 64, 1, 1]\n"
_BN = "".join(f"  input {n} : float[1, 64, 1, 1] nhwc\n" for n in ("mean", "inv_var", "gamma", "beta"))
_DX = "  input dx0 : half[4, 64, 32]\n"
_NORM_BWD = (
    "  input dy : bf16[512, 256, 1, 1]\n  input x : bf16[512, 256, 1, 1]\n  input gamma : float[1, 256, 1, 1]\n"
    "  input m : float[512, 1, 1, 1]\n  input iv : float[512, 1, 1, 1]\n"
)
_RMS_BWD = _NORM_BWD.replace("  input m : float[512, 1, 1, 1]\n", "")
_CHANNEL_BWD = (
    "  input dy : half[8, 64, 16, 16] nhwc\n  input x : half[8, 64, 16, 16] nhwc\n"
    "  input gamma : float[1, 64, 1, 1] nhwc\n  input m : float[%s, 64, 1, 1] nhwc\n"
    "  input iv : float[%s, 64, 1, 1] nhwc\n"
)
_SDPA_BWD = (
    _SDPA
    + "".join(f"  input {n} : half[2, 4, 128, 64]\n" for n in ("o", "do"))
    + ("  input st : float[2, 4, 128, 1]\n")
)
_SDPA_BWD_OUT = "\n  output dq\n  output dk\n  output dv"
#: the backward ops, as CASES below
_BACKWARD_CASES = {
    "relu_backward": [
        _graph(
            _MM + _DX + "  output y : float = relu_backward(matmul(a, b), dx0, lower_clip=0.5, upper_clip=2, "
            "negative_slope=0.1)"
        ),
        _graph(_MM + _DX + "  output y : float = relu_backward(matmul(a, b), dx0, upper_clip=6)"),
    ],
    "leaky_relu_backward": [
        _graph(_MM + _DX + "  output y : float = leaky_relu_backward(matmul(a, b), dx0, slope=0.2)")
    ],
    "swish_backward": [_graph(_MM + _DX + "  output y : float = swish_backward(matmul(a, b), dx0, beta=2)")],
    "rope_backward": [
        (
            _graph(
                "  input dy : half[2, 4, 128, 64]\n  input f : float[128, 1, 1, 32]\n"
                "  output dx = rope_backward(dy, f, rope_dim=32, output_scale=2)"
            ),
            True,
        )
    ],
    "layernorm_backward": [
        _graph(
            _NORM_BWD + "  dx, dg, db = layernorm_backward(dy, x, gamma, m, iv)\n  output dx\n  output dg : float\n"
            "  output db : float",
            "bf16",
        )
    ],
    "rmsnorm_backward": [
        _graph(_RMS_BWD + "  dx, dg = rmsnorm_backward(dy, x, gamma, iv)\n  output dx\n  output dg : float", "bf16"),
        _graph(
            _RMS_BWD + "  dx, dg, db = rmsnorm_backward(dy, x, gamma, iv, dbias=true)\n  output dx\n"
            "  output dg : float\n  output db : float",
            "bf16",
        ),
    ],
    "batchnorm_backward": [
        _graph(
            _CHANNEL_BWD % (1, 1) + "  dx, dg, db = batchnorm_backward(dy, x, gamma, m, iv)\n  output dx\n"
            "  output dg : float\n  output db : float"
        )
    ],
    "instancenorm_backward": [
        _graph(
            _CHANNEL_BWD % (8, 8) + "  dx, dg, db = instancenorm_backward(dy, x, gamma, m, iv)\n  output dx\n"
            "  output dg : float\n  output db : float"
        )
    ],
    "adalayernorm_backward": [
        _graph(
            "  input dy : half[8, 128, 256]\n  input x : half[8, 128, 256]\n  input gamma : float[8, 1, 256]\n"
            "  input m : float[8, 128, 1]\n  input iv : float[8, 128, 1]\n"
            "  dx, dg, db = adalayernorm_backward(dy, x, gamma, m, iv)\n  output dx\n  output dg : float\n"
            "  output db : float"
        )
    ],
    "sdpa_backward": [
        _graph(_SDPA_BWD + "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, causal=true)" + _SDPA_BWD_OUT),
        (
            _graph(
                _SDPA_BWD + "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, diagonal_alignment=bottom_right, "
                "left_bound=32, right_bound=16, scale=0.125)" + _SDPA_BWD_OUT
            ),
            False,
        ),
        (
            _graph(
                _SDPA_BWD + "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, causal_bottom_right=true, "
                "sliding_window_length=64)" + _SDPA_BWD_OUT
            ),
            False,
        ),
        _graph(
            _SDPA_BWD + "  input bias : half[1, 4, 128, 128]\n"
            "  dq, dk, dv, db = sdpa_backward(q, k, v, o, do, st, bias=bias, dbias=true)"
            + _SDPA_BWD_OUT
            + "\n  output db"
        ),
        _graph(
            _SDPA_BWD
            + "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, causal=true, alibi=true, deterministic=true)"
            + _SDPA_BWD_OUT
        ),
        (
            _graph(
                _SDPA_BWD + "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
                "  input bias : half[1, 4, 128, 128]\n  input dm : half[2, 4, 128, 128]\n"
                "  input ds : float[1, 1, 1, 1]\n  input dsi : float[1, 1, 1, 1]\n"
                "  dq, dk, dv = sdpa_backward(q, k, v, o, do, st, bias=bias, seq_len_q=lq, seq_len_kv=lkv, "
                "dropout_mask=dm, dropout_scale=ds, dropout_scale_inv=dsi)" + _SDPA_BWD_OUT
            ),
            False,
        ),
        _graph(
            _SDPA_BWD + "  input sink : float[1, 4, 1, 1]\n  scalar sc : float = 0.125 uid=30\n"
            "  dq, dk, dv, dsink = sdpa_backward(q, k, v, o, do, st, sink_token=sink, attn_scale=sc, causal=true, "
            "left_bound=64, dsink=true)" + _SDPA_BWD_OUT + "\n  output dsink"
        ),
    ],
}
_FP8_BWD_FACTORS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "l", "m")
"""sdpa_fp8_backward's twelve factors, as CASES names them"""
_FP8_BWD_ARGS = ", ".join(_FP8_BWD_FACTORS)

#: op -> graphs that use it, with attributes away from their defaults where the op has any; True: the frontend
#: finds no engine for it here, so its JSON is taken before planning
CASES = {
    "matmul": [_graph(_MM + "  output c = matmul(a, b)")],
    "leaky_relu": [_graph(_MM + "  output y : float = leaky_relu(matmul(a, b), slope=0.2)")],
    "swish": [_graph(_MM + "  output y : float = swish(matmul(a, b) * 0.125, beta=2)")],
    "conv_fprop": [
        _graph(
            "  input x : half[4, 32, 17, 17] nhwc\n  input w : half[64, 8, 3, 3] nhwc\n"
            "  output y = relu(conv_fprop(x, w, padding=[2, 2], stride=[2, 2], dilation=[2, 2]))"
        ),
        _graph(
            "  input x : half[4, 32, 17, 16] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
            "  output y = relu(conv_fprop(x, w, pre_padding=[1, 0], post_padding=[2, 1], stride=[2, 1]))"
        ),
    ],
    "conv_wgrad": [
        (
            _graph(
                "  input x : half[4, 32, 16, 16] nhwc\n  input dy : half[4, 64, 8, 8] nhwc\n"
                "  output dw : float = conv_wgrad(x, dy, padding=[1, 1], stride=[2, 2], dilation=[1, 1], filter=[3, 3])"
            ),
            True,
        ),
        _graph(
            "  input x : half[4, 32, 16, 16] nhwc\n  input dy : half[4, 64, 16, 16] nhwc\n"
            "  output dw : float = conv_wgrad(x, dy, padding=[1, 1])"
        ),
        _graph(
            "  input x : half[4, 32, 17, 16] nhwc\n  input dy : half[4, 64, 9, 15] nhwc\n"
            "  output dw : float = conv_wgrad(x, dy, pre_padding=[1, 0], post_padding=[2, 1], stride=[2, 1], "
            "filter=[3, 3])"
        ),
    ],
    "reduction": [
        _graph(_MM + "  y = matmul(a, b)\n  output s : float[4, 64, 1] = reduction(y, mode=sum, axes=[2])"),
        _graph(_MM + "  y = matmul(a, b)\n  output m : float[1, 1, 1] = reduction(y, mode=max)"),
    ],
    "sdpa": [
        _graph(_SDPA + "  output o = sdpa(q, k, v)"),
        _graph(_SDPA + "  output o = sdpa(q, k, v, diagonal_alignment=bottom_right, left_bound=32, right_bound=16)"),
        _graph(_SDPA + "  output o = sdpa(q, k, v, causal_bottom_right=true, sliding_window_length=64)"),
        _graph(_SDPA + "  output o = sdpa(q, k, v, diagonal_alignment=bottom_right)"),
        _graph(_SDPA + "  output o = sdpa(q, k, v, alibi=true, causal=true)"),
        _graph(
            _SDPA + "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
            "  o, st = sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, causal=true, stats=true)\n  output o\n  output st"
        ),
        _graph(
            _SDPA + "  input dm : half[2, 4, 128, 128]\n  input ds : float[1, 1, 1, 1]\n"
            "  o, st = sdpa(q, k, v, dropout_mask=dm, dropout_scale=ds, stats=true)\n  output o\n  output st"
        ),
        _graph(
            _SDPA + "  input seed : int64[1, 1, 1, 1]\n  input offset : int64[1, 1, 1, 1]\n"
            "  o, st, m = sdpa(q, k, v, dropout_seed=seed, dropout_offset=offset, dropout_probability=0.125, "
            "stats=true)\n  output o\n  output st\n  output m"
        ),
        _graph(
            "  input q : half[2, 4, 128, 64]\n  input kc : half[32, 4, 64, 64]\n  input vc : half[32, 4, 64, 64]\n"
            "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
            "  input tk : int32[2, 1, 4, 1]\n  input tv : int32[2, 1, 4, 1]\n"
            "  o, st = sdpa(q, kc, vc, seq_len_q=lq, seq_len_kv=lkv, page_table_k=tk, page_table_v=tv, causal=true, "
            "stats=true, max_seq_len_kv=200)\n  output o\n  output st"
        ),
        _graph(
            "  input q : half[2, 4, 128, 64] strides [32768, 64, 256, 1]\n"
            "  input k : half[2, 4, 128, 64] strides [32768, 64, 256, 1]\n"
            "  input v : half[2, 4, 128, 64] strides [32768, 64, 256, 1]\n"
            "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n  input rq : int64[3, 1, 1, 1]\n"
            "  input rk : int64[3, 1, 1, 1]\n  input rs : int32[3, 1, 1, 1]\n"
            "  o, st = sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, causal=true, stats=true, ragged_q=rq, ragged_k=rk, "
            "ragged_v=rk, ragged_o=rq, ragged_stats=rs)\n  output o\n  output st"
        ),
        _graph(
            _SDPA + "  input bias : half[1, 4, 128, 128]\n  o, st = sdpa(q, k, v, bias=bias, scale=0.125, causal=true, "
            "stats=true)\n  output o\n  output st : float"
        ),
        _graph(
            _SDPA + "  input sink : float[1, 4, 1, 1]\n  scalar sc : float = 0.125 uid=30\n"
            "  o, st = sdpa(q, k, v, sink_token=sink, attn_scale=sc, causal=true, left_bound=64, stats=true)\n"
            "  output o\n  output st"
        ),
    ],
    "batchnorm_inference": [
        (
            _graph(
                "  input x : half[8, 64, 16, 16] nhwc\n"
                + _BN
                + "  output y = batchnorm_inference(x, mean, inv_var, gamma, beta)"
            ),
            True,
        )
    ],
    "transpose": [(_graph(_MM + "  y = matmul(a, b)\n  output z : float = transpose(y, perm=[0, 2, 1])"), True)],
    "slice": [
        (_graph(_MM + "  y = matmul(a, b)\n  output z : float = slice(y, start=[0, 1, 0], end=[4, 32, 32])"), True)
    ],
    "reshape": [(_graph(_MM + "  y = matmul(a, b)\n  output z : float = reshape(y, shape=[4, 32, 64])"), True)],
    "relu": [
        _graph(_MM + "  output y : float = relu(matmul(a, b), lower_clip=0.5, upper_clip=2, negative_slope=0.1)"),
        _graph(_MM + "  output y : float = relu(matmul(a, b), upper_clip=6)"),
    ],
    "gen_index": [_graph(_MM + "  output y : int32 = gen_index(matmul(a, b), axis=1)")],
    "binary_select": [
        _graph(_MM + "  input m : bool[4, 64, 32]\n  output y = binary_select(matmul(a, b), 1.0, logical_not(m))")
    ],
    "logical_not": [_graph(_MM + "  output y = logical_not(cmp_gt(matmul(a, b), 0.5))")],
    "logical_and": [
        _graph(_MM + "  input m : bool[4, 64, 32]\n  output y = logical_and(cmp_ge(matmul(a, b), 0.5), m)")
    ],
    "logical_or": [_graph(_MM + "  input m : bool[4, 64, 32]\n  output y = logical_or(m, cmp_le(matmul(a, b), 0.5))")],
    "concatenate": [
        (
            _graph("  input a : half[4, 64, 64]\n  input b : half[4, 32, 64]\n  output y = concatenate(a, b, axis=1)"),
            True,
        )
    ],
    "conv_dgrad": [
        _graph(
            "  input dy : half[4, 64, 16, 16] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
            "  output dx = conv_dgrad(dy, w, padding=[1, 1])"
        ),
        (
            _graph(
                "  input dy : half[4, 64, 8, 8] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
                "  output dx = conv_dgrad(dy, w, padding=[1, 1], stride=[2, 2], dilation=[2, 2], output_padding=[1, 0])"
            ),
            True,
        ),
        _graph(
            "  input dy : half[4, 64, 9, 16] nhwc\n  input w : half[64, 32, 3, 3] nhwc\n"
            "  output dx = conv_dgrad(dy, w, pre_padding=[1, 0], post_padding=[2, 1], stride=[2, 1], "
            "output_padding=[1, 0])"
        ),
    ],
    "layernorm": [
        _graph(_NORM + "  output y = layernorm(x, gamma, beta, epsilon=0.001)", "bf16"),
        _graph(
            _NORM + "  scalar eps : float[1] = 0.001 uid=30\n  output y = layernorm(x, gamma, beta, epsilon=eps)",
            "bf16",
        ),
        _graph(
            _NORM + "  y, m, iv = layernorm(x, gamma, beta, phase=training)\n  output y\n  output m\n  output iv",
            "bf16",
        ),
    ],
    "rmsnorm": [
        _graph(_NORM + "  output y = rmsnorm(x, gamma, bias=beta, epsilon=0.0001)", "bf16"),
        _graph(
            "  input x : bf16[512, 256, 1, 1]\n  input gamma : float[1, 256, 1, 1]\n"
            "  y, iv = rmsnorm(x, gamma, phase=training)\n  output y\n  output iv",
            "bf16",
        ),
    ],
    "instancenorm": [
        (_graph(_IN + "  output y = instancenorm(x, gamma, beta, epsilon=0.001)"), True),
        (
            _graph(
                _IN + "  y, m, iv = instancenorm(x, gamma, beta, phase=training)\n  output y\n  output m\n  output iv"
            ),
            True,
        ),
    ],
    "adalayernorm": [
        (
            _graph(
                "  input x : half[8, 128, 256]\n  input gamma : float[8, 1, 256]\n  input beta : float[8, 1, 256]\n"
                "  y, m, iv = adalayernorm(x, gamma, bias=beta, epsilon=0.001, phase=training)\n"
                "  output y\n  output m\n  output iv"
            ),
            True,
        )
    ],
    "batchnorm": [
        (
            _graph(
                "  input x : half[8, 64, 16, 16] nhwc\n"
                + "".join(f"  input {n} : float[1, 64, 1, 1] nhwc\n" for n in ("gamma", "beta", "rm", "rv"))
                + "  y, m, iv, nrm, nrv = batchnorm(x, gamma, beta, rm, rv, epsilon=0.001, momentum=0.2)\n"
                "  output y\n  output m\n  output iv\n  output nrm\n  output nrv"
            ),
            True,
        ),
        (
            _graph(
                "  input x : half[8, 64, 16, 16] nhwc\n"
                + "".join(f"  input {n} : float[1, 64, 1, 1] nhwc\n" for n in ("gamma", "beta", "rm", "rv"))
                + "  scalar eps : float[1] = 0.001 uid=30\n  scalar mom : float[1, 1] = 0.2 uid=31\n"
                "  y, m, iv, nrm, nrv = batchnorm(x, gamma, beta, rm, rv, epsilon=eps, momentum=mom)\n"
                "  output y\n  output m\n  output iv\n  output nrm\n  output nrv"
            ),
            True,
        ),
    ],
    "genstats": [
        (_graph("  input x : half[8, 64, 16, 16] nhwc\n  s, sq = genstats(x)\n  output s\n  output sq"), True)
    ],
    "rope": [
        (
            _graph(
                "  input x : half[2, 4, 128, 64]\n  input f : float[128, 1, 1, 32]\n"
                "  output y = rope(x, f, rope_dim=32, output_scale=2)"
            ),
            True,
        )
    ],
    "sdpa_fp8": [
        _graph(
            "".join(f"  input {n} : fp8_e4m3[1, 2, 128, 128]\n" for n in "qkv")
            + "".join(f"  input {n} : float[1, 1, 1, 1]\n" for n in ("dq", "dk", "dv", "ds", "ss", "so"))
            + "  o, amax, st = sdpa_fp8(q, k, v, dq, dk, dv, ds, ss, so, causal=true, scale=0.125, stats=true)\n"
            "  output o\n  output amax\n  output st",
            "fp8_e4m3",
        ),
        *(
            (
                _graph(
                    "".join(f"  input {n} : fp8_e4m3[1, 2, 128, 128]\n" for n in "qkv")
                    + "".join(f"  input {n} : float[1, 1, 1, 1]\n" for n in ("dq", "dk", "dv", "ds", "ss", "so"))
                    + f"  o, amax = sdpa_fp8(q, k, v, dq, dk, dv, ds, ss, so, {band})\n  output o\n  output amax",
                    "fp8_e4m3",
                ),
                False,
            )
            for band in (
                "causal=true, sliding_window_length=64",
                "diagonal_alignment=top_left, left_bound=32, right_bound=8",
            )
        ),
    ],
    "sdpa_fp8_backward": [
        (
            _graph(
                "".join(f"  input {n} : fp8_e4m3[1, 2, 128, 128]\n" for n in ("q", "k", "v", "o", "do"))
                + "  input st : float[1, 2, 128, 1]\n"
                + "".join(f"  input {n} : float[1, 1, 1, 1]\n" for n in _FP8_BWD_FACTORS)
                + f"  dq, dk, dv, aq, ak, av, ap = sdpa_fp8_backward(q, k, v, o, do, st, {_FP8_BWD_ARGS}, {band})\n"
                + "".join(f"  output {n}\n" for n in ("dq", "dk", "dv", "aq", "ak", "av"))
                + "  output ap",
                "fp8_e4m3",
            ),
            False,
        )
        for band in (
            "causal=true, sliding_window_length=64, scale=0.125, deterministic=true",
            "diagonal_alignment=top_left, left_bound=32, right_bound=8",
        )
    ],
    **_BACKWARD_CASES,
}


def _op_cases():
    """A case for every op the tables produce: pointwise ops in a matmul epilogue, the others from CASES."""
    for op in sorted(IMPORTED):
        sig = OPS[op]
        if op in CASES:
            cases = CASES[op]
        elif sig.family == "pointwise" and len(sig.inputs) == 1:
            cases = [_graph(_MM + f"  output y : float = {op}(matmul(a, b) * 0.125 + 2)")]
        elif sig.family == "pointwise" and len(sig.inputs) == 2:
            cases = [_graph(_MM + f"  input c : half[1, 1, 32]\n  output y : float = {op}(matmul(a, b), c + 2)")]
        else:
            cases = [None]  # fails below, naming the op
        for i, case in enumerate(cases):
            text, unplanned = case if isinstance(case, tuple) else (case, False)
            yield pytest.param(op, text, unplanned, id=f"{op}-{i}")


@pytest.mark.parametrize("op,text,unplanned", list(_op_cases()))
def test_every_imported_op_round_trips_through_the_frontend(op, text, unplanned, h200):
    from cudnn_dsl.interop.fe_export import frontend_json

    assert text is not None, f"add a graph using {op} to CASES in tests/test_import.py"
    g = program(text=text, file=f"{op}.cdg").graphs[0]
    inst = g.instances[0]
    assert op in {n.op for n in g.nodes}
    fe = frontend_json(g, inst, h200, plans=not unplanned)
    cdg, imported = to_cdg(fe, f"{op}.json")
    back = program(text=cdg, file="imported.cdg")
    verify(back, imported)
    assert _listing(back.graphs[0], back.graphs[0].instances[0]) == _listing(g, inst)


def test_a_rank_2_graph_comes_back_rank_3(h200):
    """cuDNN gets unit dims in front of rank 1 and 2 tensors (build.lower.MIN_RANK), so its JSON and the import are
    rank 3, axes counted in rank 3; the imported graph is the same cuDNN graph."""
    from cudnn_dsl.interop.fe_export import frontend_json

    text = _graph("  input a : half[64, 32]\n  output y : float = reduction(relu(a), mode=sum, axes=[1])")
    g = program(text=text, file="r2.cdg").graphs[0]
    fe = frontend_json(g, g.instances[0], h200, plans=False)  # no engine reduces this alone; its JSON is enough
    cdg, _ = to_cdg(fe, "r2.json")
    assert "input a : half[1, 64, 32] strides [2048, 32, 1]" in cdg
    assert "reduction(relu_0, mode=sum, axes=[0, 2])" in cdg  # the unit lead dim counts as reduced
    g2 = program(text=cdg, file="imported.cdg").graphs[0]
    again = frontend_json(g2, g2.instances[0], h200, plans=False)
    assert _graph_json(json.loads(again)) == _graph_json(json.loads(fe))


def test_import_starts_fast_without_torch_or_cudnn():
    import subprocess
    import sys

    code = (
        "import sys\nfrom cudnn_dsl.cli import main\nrc = main(sys.argv[1:])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'cudnn', 'numpy'})\n"
        "print('HEAVY', heavy, rc, file=sys.stderr)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, "import", str(FIXTURES / "frontend_log.txt")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert "HEAVY [] 0" in p.stderr, p.stderr[-500:]
    p = run_cli("import", "--help")
    assert p.returncode == 0 and "CUDNN_FRONTEND_LOG_INFO=1" in p.stdout and "--force" in p.stdout


# ---- R9: a tensor the JSON gives otherwise than its graph makes it, refused at its field ---------------------


@pytest.fixture(scope="module")
def conv_bias_relu_json(tmp_path_factory) -> dict:
    p = run_cli("emit", ROOT / "examples" / "conv_bias_relu.cdg", "--format", "fe-json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _set(tensor: str, field: str, value):
    def change(j: dict) -> None:
        t = next(t for t in j["tensors"] if t["name"] == tensor)
        t[field] = value(t[field]) if callable(value) else value

    return change


@pytest.mark.parametrize(
    "change,field,words",
    [  # y: the conv's virtual result; bias_0: the bias's; out: the graph's output
        (_set("y", "dim", lambda d: d[:2] + [57] + d[3:]), "dim", "node 'y' (CONV_FPROP, nodes[0]) makes"),
        (_set("bias_0", "stride", lambda s: [s[0] + 1] + s[1:]), "stride", "contradicts its graph"),
        (_set("bias_0", "stride", lambda s: [2**62] + s[1:]), "stride", "its size overflows a 64-bit integer"),
        (_set("out", "dim", lambda d: [d[0] + 1] + d[1:]), "dim", "output 'out' is declared [33, 256, 56, 56]"),
        (_set("out", "stride", lambda s: [2**62] + s[1:]), "stride", "its size overflows a 64-bit integer"),
        (_set("bias_0", "is_virtual", "TRAINING"), "is_virtual", 'is_virtual "TRAINING" is not true or false'),
        (_set("x", "is_pass_by_value", 1), "is_pass_by_value", "is_pass_by_value 1 is not true or false"),
    ],
)
def test_a_tensor_the_json_gives_otherwise_than_its_graph_is_refused_at_its_field(
    conv_bias_relu_json, change, field, words, tmp_path
):
    j = json.loads(json.dumps(conv_bias_relu_json))
    change(j)
    fe = tmp_path / "bad.json"
    text = json.dumps(j, indent=1)
    fe.write_text(text)
    p = run_cli("import", fe)
    assert p.returncode == 1 and words in p.stderr, p.stderr
    line = int(re.search(rf"{re.escape(str(fe))}:(\d+):\d+: error", p.stderr).group(1))
    assert text.splitlines()[line - 1].strip().startswith(f'"{field}"'), (line, p.stderr)
    assert "<imported>" not in p.stderr


def test_import_into_a_fifo_writes_through_it_without_force(tmp_path):
    """A FIFO holds nothing to keep: it is written into, and stays a FIFO."""
    fe = tmp_path / "mm.json"
    fe.write_text(run_cli("emit", ROOT / "examples" / "matmul_epilogue.cdg", "--format", "fe-json").stdout)
    fifo = tmp_path / "out.cdg"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    p = run_cli("import", fe, "-o", fifo)
    reader.join(timeout=60)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and "reduction(y, mode=amax)" in got[0]


def _set_node(field: str, value):
    def change(j: dict) -> None:
        j["nodes"][0][field] = value

    return change


@pytest.mark.parametrize(
    "change,field,words",
    [  # nodes[0]: the convolution; b: the bias, made a pass-by-value scalar below
        (_set_node("stride", [1.7, 1]), "stride", "stride [1.7, 1]: 1.7 is not an integer"),
        (_set_node("dilation", [1.2, 1]), "dilation", "dilation [1.2, 1]: 1.2 is not an integer"),
        (_set_node("pre_padding", [1.9, 1]), "pre_padding", "pre_padding [1.9, 1]: 1.9 is not an integer"),
        (_set_node("post_padding", [True, 1]), "post_padding", "post_padding [true, 1]: true is not an integer"),
        (_set_node("stride", "1,1"), "stride", 'stride "1,1" is not a list of integers'),
        (_set("w", "uid", 1), "uid", "uid 1 is given to both x and w"),
    ],
)
def test_a_field_of_the_wrong_kind_is_refused_at_it(conv_bias_relu_json, change, field, words, tmp_path):
    j = json.loads(json.dumps(conv_bias_relu_json))
    change(j)
    text = json.dumps(j, indent=1)
    err = _import_error(tmp_path, text)
    assert words in err, err
    line = int(re.search(r"g\.json:(\d+):\d+: error", err).group(1))
    assert text.splitlines()[line - 1].strip().startswith(f'"{field}"'), err


@pytest.mark.parametrize(
    "value,words",
    [
        ({"index": 1, "value": "hello"}, 'pass_by_value.value "hello" must be an integer, for int32'),
        ({"index": 0, "value": 2.5}, "pass_by_value.value 2.5 must be an integer, for int64"),
        ({"index": 3, "value": [1, 2]}, "pass_by_value.value [1, 2] must be a number or the value's bytes as hex"),
        ({"index": 3, "value": "ZZZZZZZZ"}, 'pass_by_value.value "ZZZZZZZZ" must be a number or the value\'s bytes'),
    ],
)
def test_a_pass_by_value_of_the_wrong_kind_says_what_it_must_be(conv_bias_relu_json, value, words, tmp_path):
    j = json.loads(json.dumps(conv_bias_relu_json))
    _set("b", "is_pass_by_value", True)(j)
    _set("b", "pass_by_value", value)(j)
    err = _import_error(tmp_path, json.dumps(j, indent=1))
    assert "tensor 'b': " + words in err, err
    assert "int()" not in err and "fromhex" not in err


@pytest.mark.parametrize(
    "edit,field,words",
    [
        ({"left_bound": 3.5}, "left_bound", "left_bound 3.5 is not an integer"),
        ({"right_bound": 0.5}, "right_bound", "right_bound 0.5 is not an integer"),
        ({"attn_scale_value": "ZZZZZZZZ"}, "attn_scale_value", "must be a number or the value's bytes as hex, 8"),
    ],
)
def test_an_sdpa_field_of_the_wrong_kind_is_refused_at_it(tmp_path, h200, edit, field, words):
    from cudnn_dsl.interop.fe_export import frontend_json

    g = program(text=CASES["sdpa"][0], file="c.cdg").graphs[0]
    text = _edit(frontend_json(g, g.instances[0], h200), lambda j: j["nodes"][-1].update(edit))
    err = _import_error(tmp_path, text)
    assert words in err and "fromhex" not in err, err
    line = int(re.search(r"g\.json:(\d+):\d+: error", err).group(1))
    assert text.splitlines()[line - 1].strip().startswith(f'"{field}"'), err
