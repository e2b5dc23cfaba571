"""The emitted scripts on the CPU: safe against hostile file and tensor names, and the torch one
computing what the reference computes. The cuDNN script is compiled and its module body run (the
frontend imports without a GPU); building its graph needs a GPU (tests/gpu)."""

import ast
import contextlib
import math
import random
import re
import tempfile
from pathlib import Path

import attrs
import pytest
import torch

from cudnn_dsl.interop.emit import emit_cudnn, emit_torch
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.ops import OPS
from dsl.pipeline import program
from tests.graphs import LN_GELU, MM_RESHAPE

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).parent / "emit_cases"
EXAMPLES = sorted((ROOT / "examples").glob("*.cdg"))


def graphs(text: str, file: str = "case.cdg"):
    return program(text=text, file=file).graphs


def run_module(script: str) -> dict:
    """Executes an emitted script as an imported module (not as __main__) and returns its globals."""
    code = compile(script, "emitted.py", "exec")
    env = {"__name__": "emitted"}
    exec(code, env)  # noqa: S102 - the emitted script, not user text: running it is what is tested
    return env


def torch_matches_reference(graph, inst) -> None:
    """Runs the emitted torch function on seeded CPU inputs; it must agree with run_reference."""
    fn = run_module(emit_torch(graph, inst))["reference"]
    tensors = generate_inputs(graph, inst, "cpu")
    args = [torch.tensor(float(v.scalar)) if v.kind == "scalar" else tensors[v.name] for v in graph.inputs]
    got = fn(*args)
    want = run_reference(graph, inst, tensors, "cpu")
    assert len(got) == len(graph.outputs)
    for v, t in zip(graph.outputs, got):
        torch.testing.assert_close(t, want[v.name], equal_nan=True, msg=lambda m, n=v.name: f"output {n}: {m}")


def cudnn_module(graph, inst) -> dict:
    """Compiles the cuDNN script, runs its module body and the parts of it that need no GPU."""
    env = run_module(emit_cudnn(graph, inst))
    buffers = env["make_buffers"](device="cpu")
    memory = {b.name for b in graph.buffers}
    assert set(buffers) - memory == set(env["UIDS"]) == {v.name for v in graph.of_kind("input", "output")}
    env["host_scalars"]()
    return env


# D1: the file path (and the graph name) reach the scripts only as escaped text.

HOSTILE = [
    'x""";__import__("os").system("touch PWNED");""".cdg',
    "x''';__import__('os').system('touch PWNED');'''.cdg",
    'dir\\\n"""\n__import__("os").system("touch PWNED")\n#\\',
    "a\r\x00\x0c\u2028\udcff\\\"\"\"'''.cdg",
]


@pytest.mark.parametrize("file", HOSTILE)
def test_hostile_file_name_stays_in_the_docstring(file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    [g] = graphs((CASES / "literals.cdg").read_text(), file)
    g_named = attrs.evolve(g, name='g""";__import__("os").system("touch PWNED");"""')
    for graph in (g, g_named):
        inst = graph.instances[0]
        for script in (emit_cudnn(graph, inst), emit_torch(graph, inst)):
            script.encode("ascii")  # escaped: no raw control, separator or surrogate characters
            tree = ast.parse(script)
            assert file in ast.get_docstring(tree, clean=False)
            assert graph.name in ast.get_docstring(tree, clean=False)
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            assert "__import__" not in names
        cudnn_module(graph, inst)
        torch_matches_reference(graph, inst)
    assert not (tmp_path / "PWNED").exists()


# D3: number literals in expressions.


def test_torch_script_with_number_literals_matches_reference():
    [g] = graphs((CASES / "literals.cdg").read_text())
    script = emit_torch(g, g.instances[0])
    assert "self" not in {n.id for n in ast.walk(ast.parse(script)) if isinstance(n, ast.Name)}
    torch_matches_reference(g, g.instances[0])


def test_torch_scripts_number_literals_follow_the_inputs_device():
    # A literal broadcast to the inputs' rank is no 0-dim tensor that torch moves by itself: on the GPU
    # it met CUDA inputs from the CPU. Meta tensors show the same without a GPU.
    [g] = graphs("graph t {\n  input x : float[4, 8, 1, 1]\n  output y = x * 2.0\n}\n")
    fn = run_module(emit_torch(g, g.instances[0]))["reference"]
    (y,) = fn(torch.empty(4, 8, 1, 1, device="meta"))
    assert y.device.type == "meta" and y.shape == (4, 8, 1, 1)


# D4: names that Python, torch.fx or the scripts themselves use.

# fmt: off
NAMES = ["arg0_1", "arg1_1", "torch", "cudnn", "class", "def", "None", "True", "__debug__", "self", "reference", "g",
         "handle", "inf", "nan", "mul", "view", "bmm", "tensor_constant0", "_tensor_constant0", "t_torch", "print",
         "build", "UIDS", "match", "_"]
# fmt: on


@pytest.mark.parametrize("name", NAMES)
def test_names_python_uses_give_correct_scripts(name):
    text = re.sub(r"\bNAME\b", name, (CASES / "names.cdg").read_text())
    for g in graphs(text):
        inst = g.instances[0]
        torch_matches_reference(g, inst)
        cudnn_module(g, inst)


def test_mangled_names_do_not_collide_with_declared_ones():
    text = (
        "graph g {\n  input class : float[2, 3]\n  input t_class : float[2, 3]\n  input class_ : float[2, 3]\n"
        "  output y = class - t_class * 2 + class_ * 3\n}\n"
    )
    [g] = graphs(text)
    torch_matches_reference(g, g.instances[0])
    cudnn_module(g, g.instances[0])


# D17: non-finite numbers are written as float('inf') / float('nan'), never as a bare name.


def test_non_finite_numbers_are_written_as_floats():
    [g] = graphs((CASES / "nonfinite.cdg").read_text())
    new = {"s": math.inf, "t": math.nan}
    const = next(v for v in g.values if v.kind == "const")
    new[const.name] = -math.inf
    values = tuple(attrs.evolve(v, scalar=new[v.name]) if v.name in new else v for v in g.values)
    inst = g.instances[0]
    node_attrs = tuple(tuple((k, math.inf if k == "slope" else v) for k, v in a) for a in inst.node_attrs)
    inst = attrs.evolve(inst, node_attrs=node_attrs)
    g = attrs.evolve(g, values=values, instances=(inst,))
    script = emit_cudnn(g, inst)
    assert not {"inf", "nan"} & {n.id for n in ast.walk(ast.parse(script)) if isinstance(n, ast.Name)}
    assert "negative_slope=float('inf')" in script
    host = cudnn_module(g, inst)["host_scalars"]()
    assert sorted(str(t.item()) for t in host.values()) == ["-inf", "inf", "nan"]
    torch_matches_reference(g, inst)  # the torch script defines the `inf` that fx writes for the slope


# D32: bench imports the ejected script from a temporary directory, and removes it.


def test_load_ejected_removes_its_temporary_directory(tmp_path, monkeypatch):
    from cudnn_dsl.tune.bench import load_ejected

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    [g] = graphs((CASES / "literals.cdg").read_text())
    inst = g.instances[0]
    tensors = generate_inputs(g, inst, "cuda" if torch.cuda.is_available() else "cpu")
    with contextlib.suppress(Exception):  # without a GPU, building the graph fails after the import
        load_ejected(g, inst, tensors, {v.name: tensors["a"] for v in g.outputs})
    assert list(tmp_path.iterdir()) == []


# Property: the examples with their names replaced by names from a hostile pool.

# fmt: off
POOL = sorted(set(NAMES) | {
    "lambda", "import", "return", "yield", "global", "async", "await", "False", "pass", "is", "not", "and", "or", "if",
    "else", "for", "while", "with", "try", "except", "raise", "del", "from", "as", "assert", "nonlocal", "case", "type",
    "__name__", "__builtins__", "__import__", "__file__", "input_", "max", "sum", "len", "list", "dict", "str", "exec",
    "eval", "object", "getattr", "float_", "device", "operator", "fx_pytree", "pytree", "NoneType", "expand", "add",
    "_to_copy", "_unsafe_view", "args", "kwargs", "gen", "buffers", "INPUTS", "OUTPUTS", "host_scalars", "make_buffers",
    "execute", "t_class", "t___debug__", "arg2_1", "arg3_1", "tensor_constant1",
})
# fmt: on
_DECL = re.compile(r"^\s*(?:graph|input|scalar|output|buffer)\s+(\w+)|^\s*(\w+(?:\s*,\s*\w+)*)\s*=", re.MULTILINE)
_TOKEN = re.compile(r"\d+\.?\d*(?:[eE][+-]?\d+)?|[A-Za-z_]\w*|\S")


_PORTS = {p for sig in OPS.values() for p in sig.optional}


def _renamed(text: str, rng: random.Random) -> str:
    """The .cdg text with its graph and value names replaced; op names, keyword arguments, their
    values (but for inputs given by name) and type names stay."""
    text = re.sub(r"#[^\n]*", "", text)
    declared = []
    for m in _DECL.finditer(text):
        for name in re.findall(r"\w+", m.group(1) or m.group(2)):
            if name not in declared:
                declared.append(name)
    words = set(re.findall(r"\w+", text))
    new = dict(zip(declared, rng.sample([w for w in POOL if w not in words], len(declared))))
    out, depth, toks = [], 0, list(_TOKEN.finditer(text))
    for i, m in enumerate(toks):
        tok, prev = m.group(), toks[i - 1].group() if i else ""
        nxt = toks[i + 1].group() if i + 1 < len(toks) else ""
        depth += {"(": 1, ")": -1}.get(tok, 0)
        named_input = prev == "=" and i > 1 and toks[i - 2].group() in _PORTS  # sdpa(q, k, v, seq_len_q=lens)
        keep = nxt == "(" or prev == ":" or (depth and "=" in (prev, nxt) and not named_input)
        out.append(
            (text[toks[i - 1].end() : m.start()] if i else text[: m.start()]) + (tok if keep else new.get(tok, tok))
        )
    return "".join(out) + "\n"


def _small(text: str) -> str:
    """Every extent in a tensor type shrunk (equal extents stay equal), so that the CPU runs it fast."""
    if "strides" in text:  # explicit strides and view offsets fit the extents as written
        return text
    shrink = lambda m: str(int(m.group()) if int(m.group()) <= 4 else min(8, max(2, int(m.group()) // 16)))
    dims = lambda t: t.group(1) + re.sub(r"\d+", shrink, t.group(2))
    return re.sub(r"\b(half|bf16|float|int8|int32)(\[[^\]]*)", dims, text)


@pytest.mark.parametrize("seed", range(50))
def test_renamed_examples_give_scripts_that_compile_and_agree(seed):
    rng = random.Random(seed)
    path = EXAMPLES[seed % len(EXAMPLES)]
    text = _renamed(_small(path.read_text()), rng)
    for g in graphs(text, path.name):
        inst = g.instances[0]
        torch_matches_reference(g, inst)
        cudnn_module(g, inst)


def test_torch_script_of_a_graph_with_a_bool_input_matches_reference():
    # a bool input is bound bit-packed; unpacking it once traced a `device` the script lacked
    text = (
        "graph msk {\n  input a : float[1, 4, 10]\n  input b : float[1, 4, 10]\n  input m : bool[1, 4, 10]\n"
        "  output y = binary_select(a, b, m)\n  output n = logical_not(m)\n}\n"
    )
    [g] = graphs(text)
    torch_matches_reference(g, g.instances[0])


# The ejected script draws every input as `run` does: the file's init=, the same seed, the same values.

INITS = (
    "graph inits {\n  input x : float[3, 5, 7] init=randn(0.5, 2)\n  input n : int32[3, 5, 7] init=randint(-3, 9)\n"
    "  input m : bool[3, 5, 7] init=bernoulli(0.25)\n  input r : float[3, 5, 7] init=arange(1, 0.5)\n"
    "  input s : float[3, 5, 7] init=sparse(0.5)\n  input d : float[3, 5, 7]\n  input v : float[1, 5, 1]\n"
    "  input z : half[3, 5, 7] init=zeros\n  input o : int32[3, 5, 7] init=ones\n"
    "  input h : half[3, 5, 7] init=randint(-4, 4, 0.25)\n  input c : float[3, 5, 7] strides [1, 3, 15] init=like(x)\n"
    "  input mc : bool[3, 5, 7] strides [1, 3, 15] init=like(m)\n"
    "  output y = binary_select(x + r - s * d, rsqrt(v), m)\n  output k = n + n\n  output ko = o + o\n"
    "  output e = z + h\n"
    "  output w = binary_select(x - c, x, logical_and(m, mc))\n}\n"
)


@pytest.mark.parametrize("seed", [0, 7])
def test_the_ejected_script_draws_the_inputs_run_draws(seed):
    from dsl.inits import parse

    [g] = graphs(INITS)
    inst = g.instances[0]
    env = run_module(emit_cudnn(g, inst))
    got, want = env["make_buffers"](device="cpu", seed=seed), generate_inputs(g, inst, "cpu", seed)
    for name in want:  # bit for bit, bool inputs in cuDNN's packed bytes, v positive (rsqrt's input)
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
    assert want["v"].min() >= 0.5 and not torch.equal(got["x"], generate_inputs(g, inst, "cpu", seed + 1)["x"])
    assert torch.equal(got["c"], got["x"]) and got["c"].stride() == (1, 3, 15)  # like(x), in its own layout
    assert bool((got["z"] == 0).all() and (got["o"] == 1).all()) and set(got["h"].unique().tolist()) <= {
        i / 4 for i in range(-4, 5)
    }
    over = {"x": parse("uniform(2, 3)")}  # run --init over the file's init=
    got = run_module(emit_cudnn(g, inst, inits=over))["make_buffers"](device="cpu", seed=seed)
    assert torch.equal(got["x"], generate_inputs(g, inst, "cpu", seed, over)["x"])
    assert torch.equal(got["c"], got["x"]) and torch.equal(got["mc"], generate_inputs(g, inst, "cpu", seed, over)["mc"])


RAGGED = (
    "graph rag {\n  io bf16\n  compute float\n"
    "  input q : bf16[3, 2, 16, 8] strides [256, 8, 16, 1]\n  input k : bf16[3, 2, 16, 8] strides [256, 8, 16, 1]\n"
    "  input v : bf16[3, 2, 16, 8] strides [256, 8, 16, 1]\n"
    "  input seq_q : int32[3, 1, 1, 1]\n  input seq_kv : int32[3, 1, 1, 1]\n"
    "  input offset_q : int64[4, 1, 1, 1]\n  input offset_kv : int64[4, 1, 1, 1]\n"
    "  o = sdpa(q, k, v, seq_len_q=seq_q, seq_len_kv=seq_kv, causal=true, ragged_q=offset_q, ragged_k=offset_kv, "
    "ragged_v=offset_kv, ragged_o=offset_q)\n  output o\n}\n"
)


def test_the_ejected_script_packs_ragged_offsets_as_run_does():
    """A script's ragged offsets pack the drawn lengths back to back, as run's do: drawn like any int64 input
    they were random (negative, too), and cuDNN would read outside the buffers."""
    [g] = graphs(RAGGED)
    inst = g.instances[0]
    got = run_module(emit_cudnn(g, inst))["make_buffers"](device="cpu", seed=5)
    want = generate_inputs(g, inst, "cpu", 5)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    q_spans = got["seq_q"].flatten().long() * 16 + 1 - 16 + 8 + 7  # rows of 16 elements, 2 heads of 8
    assert got["offset_q"].flatten().tolist() == [0, *q_spans.cumsum(0).tolist()]
    assert got["offset_kv"].flatten()[-1] <= got["k"].untyped_storage().nbytes() // 2


def test_the_ejected_script_draws_page_tables_as_run_does():
    """A permutation of the cache's blocks in both (drawn like any int32 input they were random, negative too)."""
    from tests.test_sdpa import PLAIN_PAGED

    [g] = graphs(PLAIN_PAGED)
    inst = g.instances[0]
    got = run_module(emit_cudnn(g, inst))["make_buffers"](device="cpu", seed=2)
    want = generate_inputs(g, inst, "cpu", 2)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert sorted(got["tk"].flatten().tolist()) == list(range(6))


def test_a_torch_parts_scalar_is_made_on_the_buffers_device():
    """A declared scalar read by a part left to torch: its reference reshapes it to the tensors' rank, and a CPU
    tensor of rank 4 does not meet tensors of another device (CUDA on a GPU; here, meta ones say the same)."""
    from cudnn_dsl.run.partition import find_partition

    [g] = graphs(
        "graph s {\n  io float\n  input x : float[2, 3, 4, 5]\n  input z : float[2, 3, 4, 5]\n"
        "  scalar alpha : float = 0.5\n  output y = relu(x * alpha + z)\n}\n"
    )
    inst = g.instances[0]
    # every op alone left to torch, as when cuDNN runs none of them (acceptance decided here, not by cuDNN)
    p = find_partition(g, inst, lambda part: "not taken here", "not taken here", True)
    env = run_module(emit_cudnn(g, inst, None, p))
    want = env["make_buffers"](device="cpu")
    got = {k: v.to("meta") for k, v in want.items()}
    env["execute"]([None] * 3, None, got, None, [None] * 3)
    assert got["y"].device.type == "meta"
    env["execute"]([None] * 3, None, want, None, [None] * 3)
    assert torch.equal(want["y"], torch.relu(want["x"] * 0.5 + want["z"]))


# A graph cuDNN declines whole (deviceless planning for an H200) is ejected as its parts.


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def _split(text: str, target):
    from cudnn_dsl.run.partition import plan_for_target

    [g] = graphs(text)
    inst = g.instances[0]
    low, partition = plan_for_target(g, inst, g.options, target)
    assert low is None and partition is not None
    return g, inst, partition


def _functions(script: str) -> set[str]:
    return {n.name for n in ast.parse(script).body if isinstance(n, ast.FunctionDef)}


def test_a_split_graph_is_ejected_as_one_frontend_graph_per_part(h200):
    g, inst, partition = _split(LN_GELU, h200)
    script = emit_cudnn(g, inst, partition=partition)
    assert {"build_part1", "build_part2", "build", "execute", "make_buffers"} <= _functions(script)
    assert "as 2 parts run in order" in script and "part 1: layernorm (line 6)" in script
    assert script.count("g = cudnn.pygraph(") == 2 and "name='ln_gelu_part2'" in script
    env = run_module(script)
    assert env["UIDS"] == [{"x": 1, "s": 2, "b": 3, "layernorm_0": 4}, {"layernorm_0": 1, "y": 2}]  # each its own
    assert env["INTERMEDIATES"] == ["layernorm_0"] and env["TORCH_PARTS"] == {}
    buffers = env["make_buffers"](device="cpu")
    assert buffers["layernorm_0"].dtype == torch.float32  # the intermediate, in its inferred dtype
    assert buffers["layernorm_0"].stride() == inst.type("layernorm_0").strides
    scalars = env["host_scalars"]()  # per part: uid 5 is part 1's epsilon
    assert list(scalars[0]) == [5] and scalars[1] == {}


def test_a_view_part_is_its_operands_memory_copied_into_an_output_and_runs_without_a_gpu(h200):
    from cudnn_dsl.run.partition import CUDNN, VIEW

    g, inst, partition = _split(MM_RESHAPE, h200)
    assert [p.kind for p in partition.parts] == [CUDNN, VIEW]  # reshape alone: no engine, but packed
    script = emit_cudnn(g, inst, partition=partition)
    assert "a view: its operand's memory, no kernel" in script and "as_strided([4, 2048], [2048, 1]" in script
    env = run_module(script)
    assert env["TORCH_PARTS"] == {1: env["run_part2"]}
    buffers = env["make_buffers"](device="cpu")
    tensors = generate_inputs(g, inst, "cpu")
    buffers["matmul_0"].copy_(torch.bmm(tensors["a"].float(), tensors["b"].float()))  # part 1's result
    env["run_part2"](buffers)  # part 2 alone (part 1 builds only on a GPU)
    assert torch.equal(buffers["y"], buffers["matmul_0"].reshape(4, 2048))


def test_a_script_of_torch_parts_computes_the_reference_and_reads_an_input_before_it_is_overwritten():
    from cudnn_dsl.run.partition import TORCH, Part, Partition

    text = (
        "graph g {\n  input a : float[1, 8, 8]\n  input b : float[1, 8, 8]\n"
        "  output y in a = relu(b)\n  output z = a + b\n}\n"
    )
    [g] = graphs(text)
    inst = g.instances[0]
    partition = Partition((Part(0, 1, TORCH, why="no engine"), Part(1, 2, TORCH, why="no engine")), "declined")
    env = run_module(emit_cudnn(g, inst, partition=partition))
    buffers = env["make_buffers"](device="cpu", seed=3)
    want = run_reference(g, inst, generate_inputs(g, inst, "cpu", 3))
    env["execute"](env["build"](None), None, buffers, None, env["host_scalars"]())
    assert torch.equal(buffers["y"], want["y"]) and torch.equal(buffers["z"], want["z"])
    assert buffers["a"].data_ptr() == buffers["y"].data_ptr()  # written in place, as run binds it


def test_emit_plans_for_the_target_and_ejects_the_parts(tmp_path):
    from tests.cli_util import run_cli

    f = tmp_path / "ln.cdg"
    f.write_text(LN_GELU)
    p = run_cli("emit", f, "--target", "h200")
    assert p.returncode == 0, p.stderr
    compile(p.stdout, "ejected.py", "exec")
    assert {"build_part1", "build_part2"} <= _functions(p.stdout)
    f.write_text(LN_GELU.replace("io bf16", "io bf16\n  option split = false"))  # the file says: whole
    p = run_cli("emit", f)
    assert p.returncode == 0 and "build_part1" not in p.stdout and "def build(handle)" in p.stdout
    gs = tmp_path / "gs.cdg"
    gs.write_text(
        "graph gs {\n  io half\n  option fallback = false\n  input x : half[8, 64, 16, 16] nhwc\n"
        "  s, sq = genstats(x)\n  output s\n  output sq\n}\n"
    )
    p = run_cli("emit", gs)  # no engine runs genstats alone, and fallback is off: whole, the refusal said
    assert p.returncode == 1 and "fallback to torch is off" in p.stderr and "def build(handle)" in p.stdout
    assert "the script below builds the graph whole, which is not planned for NVIDIA H200" in p.stderr


def test_emit_takes_runs_seed_init_and_constraint_flags(tmp_path):
    from dsl.inits import parse
    from tests.cli_util import run_cli

    f = tmp_path / "inits.cdg"
    f.write_text(INITS)
    p = run_cli("emit", f, "--seed", "11", "--init", "d=randn(0,3)", "--exclude-engine", "3", "--target", "h200")
    assert p.returncode == 0, p.stderr
    assert "not in (3,)" in p.stdout
    [g] = graphs(INITS)
    inst = g.instances[0]
    got = run_module(p.stdout)["make_buffers"](device="cpu")  # the flags' seed and init by default
    want = generate_inputs(g, inst, "cpu", 11, {"d": parse("randn(0, 3)")})
    assert all(torch.equal(got[n], want[n]) for n in want)
    p = run_cli("emit", f, "--format", "torch", "--init", "d=randn")
    assert p.returncode == 2 and "--init goes with --format cudnn" in p.stderr
    p = run_cli("emit", f, "--init", "n=full(1e12)")  # checked against the dtype as run checks it
    assert p.returncode == 2 and "--init n: full(1000000000000) draws" in p.stderr


@pytest.mark.parametrize("name", ["buffers", "made", "env", "torch", "draw_values", "TORCH_PARTS", "part1_reference"])
def test_a_split_script_with_names_it_uses_itself_computes_the_reference(name):
    from cudnn_dsl.run.partition import TORCH, Part, Partition

    text = (
        f"graph g {{\n  input {name} : float[1, 8, 8]\n  input b : float[1, 8, 8]\n"
        f"  t = relu(b) * 2.0\n  output z = {name} + t\n}}\n"
    )
    [g] = graphs(text)
    inst = g.instances[0]
    parts = tuple(Part(i, i + 1, TORCH, why="-") for i in range(len(g.nodes)))
    env = run_module(emit_cudnn(g, inst, partition=Partition(parts, "-")))
    buffers = env["make_buffers"](device="cpu")
    env["execute"](env["build"](None), None, buffers, None, env["host_scalars"]())
    want = run_reference(g, inst, generate_inputs(g, inst, "cpu"))
    assert torch.equal(buffers["z"], want["z"])


def test_run_dump_ejects_what_runs_the_parts_and_the_inits_of_the_run(tmp_path):
    from tests.cli_util import run_cli

    f = tmp_path / "ln.cdg"
    f.write_text(LN_GELU)
    p = run_cli("run", f, "--dump", tmp_path / "d", "--init", "x=randn(0,2)", "--seed", "4")
    assert p.returncode == 0, p.stderr
    [script] = (tmp_path / "d").glob("*.cudnn.py")
    text = script.read_text()
    assert "def build_part2(handle)" in text and "draw_values('randn', (0.0, 2.0)" in text
    assert 'def make_buffers(device="cuda", seed=4)' in text


# R7: names of Python's builtins and of the modules a script imports.

BUILTIN_NAMES = (
    "graph g {\n  option workspace_limit = 1048576\n  input range : float[1, 8, 8]\n"
    "  input Exception : float[1, 8, 8]\n  input open : float[1, 8, 8]\n"
    "  int = matmul(range, Exception)\n  exec = relu(open)\n  torch = int + exec\n"
    "  output RuntimeError = torch * 2.0\n}\n"
)


def _bound(script: str) -> set[str]:
    """Every name the script binds, but for its own imports of modules."""
    bound = set()
    for n in ast.walk(ast.parse(script)):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            bound.add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
        elif isinstance(n, ast.ImportFrom):
            bound |= {a.asname or a.name for a in n.names}
        elif isinstance(n, ast.Import):
            bound |= {a.asname for a in n.names if a.asname and a.asname != a.name}
    return bound


@pytest.mark.parametrize("fmt", ["cudnn", "torch"])
def test_names_of_builtins_and_modules_are_renamed_in_the_scripts(fmt, tmp_path):
    import builtins

    from tests.cli_util import run_cli

    f = tmp_path / "b.cdg"
    f.write_text(BUILTIN_NAMES)
    flags = [
        "--exclude-engine",
        "4",
        "--deterministic",
        "--seed",
        "3",
        "--init",
        "open=uniform(0,1)",
        "--target",
        "h200",
    ]
    p = run_cli("emit", f, "--format", fmt, *(flags if fmt == "cudnn" else ()))
    assert p.returncode == 0, p.stderr
    compile(p.stdout, "emitted.py", "exec")
    assert "for i in range(" in p.stdout or fmt == "torch"
    shadowed = _bound(p.stdout) & (set(dir(builtins)) | {"torch", "cudnn", "math", "hashlib"})
    assert not shadowed, shadowed
    [g] = graphs(f.read_text())
    if fmt == "torch":  # it runs, and computes what the reference computes
        torch_matches_reference(g, g.instances[0])
    else:
        cudnn_module(g, g.instances[0])


# option shape_mode = dynamic: the scripts build as a run builds, in cuDNN's dynamic-shape mode.

DYNAMIC = (
    "graph d {\n  option shape_mode = MODE\n  dim B in {8, 16}\n  input a : bf16[B, 64, 64]\n"
    "  input b : bf16[1, 64, 64]\n  output y = matmul(a, b)\n}\n"
)


def _pygraph_keywords(script: str) -> dict:
    [call] = [
        n
        for n in ast.walk(ast.parse(script))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pygraph"
    ]
    return {k.arg: ast.unparse(k.value) for k in call.keywords}


@pytest.mark.parametrize("mode", ["dynamic", "auto", "static"])
def test_emit_builds_in_dynamic_shape_mode_as_a_run_does(mode, tmp_path):
    import json

    from tests.cli_util import run_cli

    f = tmp_path / "d.cdg"
    f.write_text(DYNAMIC.replace("MODE", mode))
    dynamic = mode == "dynamic"  # auto starts static, as a Planner does
    p = run_cli("emit", f, "--shape", "B=8")
    assert p.returncode == 0, p.stderr
    kw = _pygraph_keywords(p.stdout)
    assert (kw.get("is_dynamic_shape_enabled"), kw.get("kernel_cache")) == (
        ("True", "kernel_cache") if dynamic else (None, None)
    )
    tree = ast.parse(p.stdout)
    [build] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build"]
    assert [a.arg for a in build.args.args] == ["handle", "kernel_cache"] if dynamic else ["handle"]
    # the one cache the builds share is made once, before build(), and given to it
    assert ("kernel_cache = cudnn.create_kernel_cache()\n    g = build(handle, kernel_cache)" in p.stdout) is dynamic
    run_module(p.stdout)
    p = run_cli("emit", f, "--shape", "B=8", "--format", "fe-json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["context"]["is_dynamic_shape_enabled"] is dynamic
