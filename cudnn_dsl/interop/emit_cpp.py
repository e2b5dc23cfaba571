"""A C++ project of graphs — their cudnn_frontend::graph::Graph calls, a CMake file and a `main` that plans them (for
a target, without a device) or runs them on the inputs `run` draws.

As for the Python script (emit.py), the real lowering pass runs against a recorder, which here writes each call it
receives as C++; a frontend call the recorder has no C++ spelling for is refused at the op that makes it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import re
from importlib import resources
from pathlib import Path

import attrs

from cudnn_dsl.build.lower import NotLowered
from cudnn_dsl.build.pipeline import compile_shape
from cudnn_dsl.interop.emit import bound_uids, own_memory
from cudnn_dsl.interop.fe_nodes import POINTWISE
from cudnn_dsl.ops.pointwise import CUDNN_NAME
from cudnn_dsl.run.partition import declined_whole
from cudnn_dsl.target.driver import StandInUnavailable, stand_in_image
from cudnn_dsl.target.library import CUDNN_PACKAGES, BackendUnavailable, Target, cudnn_library
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance
from dsl.types import TensorType, itemsize

#: the pygraph's enums (cudnn.NAME.VALUE) as the C++ frontend names them; the values are spelled alike
_ENUMS = {
    "data_type": "DataType_t",
    "norm_forward_phase": "NormFwdPhase_t",
    "reduction_mode": "ReductionMode_t",
    "diagonal_alignment": "DiagonalAlignment_t",
}

#: pygraph builder -> pointwise mode: the language's modes (fe_nodes.POINTWISE) under their builders' names, and
#: the pygraph's aliases of a mode
_MODES = {CUDNN_NAME.get(op, op): mode for mode, op in POINTWISE.items()} | {
    "bias": "ADD",
    "scale": "MUL",
    "leaky_relu": "RELU_FWD",
}

#: pygraph keyword -> the C++ attribute setter it calls, where the names differ
_SETTERS = {
    "use_padding_mask": "set_padding_mask",
    "negative_slope": "set_relu_lower_clip_slope",
    "lower_clip": "set_relu_lower_clip",
    "upper_clip": "set_relu_upper_clip",
    "norm_forward_phase": "set_forward_phase",
}


@attrs.frozen
class _Op:
    """How a pygraph builder is spelled in C++: the Graph method, its attributes class, how many of the
    positional arguments are the method's tensors, the setters of the rest in order, and its result count."""

    method: str
    attributes: str
    tensors: int
    positional: tuple[str, ...] = ()
    results: int = 1


_OPS = {
    "conv_fprop": _Op("conv_fprop", "Conv_fprop_attributes", 2),
    "conv_dgrad": _Op("conv_dgrad", "Conv_dgrad_attributes", 2),
    "matmul": _Op("matmul", "Matmul_attributes", 2),
    "reduction": _Op("reduction", "Reduction_attributes", 1),
    "reshape": _Op("reshape", "Reshape_attributes", 1),
    "layernorm": _Op("layernorm", "Layernorm_attributes", 3, ("set_epsilon",), 3),
    "rmsnorm": _Op("rmsnorm", "Rmsnorm_attributes", 2, ("set_bias", "set_epsilon"), 2),
    "batchnorm": _Op("batchnorm", "Batchnorm_attributes", 3, ("mean", "var", "set_epsilon", "momentum"), 5),
    "batchnorm_inference": _Op("batchnorm_inference", "Batchnorm_inference_attributes", 5),
    "sdpa": _Op("sdpa", "SDPA_attributes", 3, (), 2),
}


class Unspelled(NotLowered):
    """A frontend call the C++ emitter has no spelling for (lower() locates it at its op)."""


def _cstr(text: str) -> str:
    """A C++ string literal: printable ASCII as itself, every other byte of its UTF-8 as a 3-digit octal escape."""
    out = []
    for b in str(text).encode():
        c = chr(b)
        out.append(c if 32 <= b < 127 and c not in '"\\?' else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _comment(text: str) -> str:
    """A // comment of one line: its whitespace runs made one space, no backslash at its end (which would splice
    the next line of code into the comment)."""
    return "// " + re.sub(r"[\\\s]+$", "", " ".join(text.split()))


def _cpp(x) -> str:
    """A C++ expression of a value the lowering passes: a recorded value, bool, int, float, str, or a list."""
    if isinstance(x, _Value):
        return x.expr
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(int(x))
    if isinstance(x, float):
        if math.isnan(x):
            return "std::numeric_limits<double>::quiet_NaN()"
        if math.isinf(x):
            return f"{'-' if x < 0 else ''}std::numeric_limits<double>::infinity()"
        return repr(float(x))
    if isinstance(x, str):
        return _cstr(x)
    if isinstance(x, (list, tuple)):
        return "std::vector<int64_t>{" + ", ".join(_cpp(v) for v in x) + "}"
    raise Unspelled(f"emit --format cpp: cannot write a {type(x).__name__} into C++")


class _Value:
    def __init__(self, expr: str):
        self.expr = expr


class _Enum(_Value):
    """cudnn.data_type (and its kin): VALUE gives `fe::TYPE::VALUE`."""

    def __getattr__(self, name: str) -> _Value:
        if name.startswith("__") or not name.isidentifier():
            raise AttributeError(name)
        return _Value(f"{self.expr}::{name}")


class _Cudnn:
    """The `cudnn` module as the lowering sees it: its enums, and pygraph, the graph recorder."""

    def __init__(self, code: _Code):
        self._code = code

    def __getattr__(self, name: str):
        if name in _ENUMS:
            return _Enum(f"fe::{_ENUMS[name]}")
        if name == "pygraph":
            return self._code.graph
        raise Unspelled(f"emit --format cpp: the frontend's cudnn.{name} has no C++ spelling here yet")


class _Tensor(_Value):
    """A tensor of the recorded graph: each set_X(v) becomes `var->set_X(v);`."""

    def __init__(self, code: _Code, expr: str):
        super().__init__(expr)
        self._code = code

    def __getattr__(self, name: str):
        if not name.startswith("set_"):
            raise AttributeError(name)
        return lambda value: self._code.lines.append(f"{self.expr}->{name}({_cpp(value)});")


class _Results(_Value):
    """The results of a builder with several: [i] is the i-th tensor."""

    def __init__(self, code: _Code, expr: str):
        super().__init__(expr)
        self._code = code

    def __getitem__(self, i: int) -> _Tensor:
        return _Tensor(self._code, f"{self.expr}[{int(i)}]")


class _Code:
    """The C++ statements of `define_graph(fe::graph::Graph& g)`, as the lowering makes its calls."""

    def __init__(self):
        self.lines: list[str] = []
        self._names: set[str] = set()

    def var(self, hint: str) -> str:
        base = "t_" + re.sub(r"[^0-9A-Za-z_]", "_", hint)
        name, k = base, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def graph(self, **kw) -> _GraphRecorder:
        for key in ("kernel_cache", "is_dynamic_shape_enabled", "is_override_shape_enabled"):
            if key in kw:
                raise Unspelled(f"emit --format cpp: {key} has no C++ spelling here yet")
        for key in ("name", "io_data_type", "intermediate_data_type", "compute_data_type"):
            if key in kw and _cpp(kw[key]) != "fe::DataType_t::NOT_SET":  # a C++ graph's types start unset
                self.lines.append(f"g.set_{key}({_cpp(kw[key])});")
        return _GraphRecorder(self)


class _GraphRecorder:
    """The pygraph as the lowering calls it: tensor() and the builders, each written as C++."""

    def __init__(self, code: _Code):
        self._code = code

    def tensor(self, **kw) -> _Tensor:
        setters = "".join(f".set_{k}({_cpp(v)})" for k, v in kw.items())
        var = self._code.var(str(kw.get("name", "tensor")))
        self._code.lines.append(f"auto {var} = g.tensor(fe::graph::Tensor_attributes(){setters});")
        return _Tensor(self._code, var)

    def __getattr__(self, builder: str):
        if builder.startswith("__"):
            raise AttributeError(builder)
        if builder in _MODES:
            return lambda *args, **kw: self._pointwise(_MODES[builder], args, kw)
        if builder in _OPS:
            return lambda *args, **kw: self._op(_OPS[builder], args, kw)
        raise Unspelled(f"emit --format cpp: the frontend's {builder} has no C++ spelling here yet")

    def _call(self, method: str, tensors, attributes: str, setters: list[str], results: int, name: str):
        var = self._code.var(name)
        args = ", ".join([_cpp(t) for t in tensors] + [f"fe::graph::{attributes}(){''.join(setters)}"])
        self._code.lines.append(f"auto {var} = g.{method}({args});")
        return _Tensor(self._code, var) if results == 1 else _Results(self._code, var)

    def _setters(self, kw: dict) -> list[str]:
        for k, v in kw.items():
            if v is None or isinstance(v, tuple):
                raise Unspelled(f"emit --format cpp: the frontend's {k}= argument has no C++ spelling here yet")
        return [f".{_SETTERS.get(k, 'set_' + k)}({_cpp(v)})" for k, v in kw.items()]

    def _pointwise(self, mode: str, args, kw) -> _Tensor:
        setters = [f".set_mode(fe::PointwiseMode_t::{mode})", *self._setters(kw)]
        return self._call("pointwise", args, "Pointwise_attributes", setters, 1, str(kw.get("name", "pointwise")))

    def _op(self, op: _Op, args, kw):
        tensors, rest = args[: op.tensors], dict(zip(op.positional, args[op.tensors :]))
        if len(args) > op.tensors + len(op.positional) or any(t is None for t in tensors):
            raise Unspelled(f"emit --format cpp: {op.method} called with arguments it has no C++ spelling for")
        setters = self._setters(kw)
        for setter, value in rest.items():
            if setter.startswith("set_") and value is not None:
                setters.append(f".{setter}({_cpp(value)})")
        if "mean" in rest:  # batchnorm's running statistics and momentum: one setter
            setters.append(
                f".set_previous_running_stats({_cpp(rest['mean'])}, {_cpp(rest['var'])}, {_cpp(rest['momentum'])})"
            )
        return self._call(op.method, tensors, op.attributes, setters, op.results, str(kw.get("name", op.method)))


def define_graph(graph: Graph, inst: Instance, options) -> tuple[str, dict, dict]:
    """The body of `define_graph(g)` (the lowering pass run against the recorder); also the pass-by-value tensors,
    uid -> (value, dtype), and the scratch tensors, name -> uid."""
    code = _Code()
    try:
        low = compile_shape(graph, inst, options, stop="lowered", handle=_Value("handle"), cudnn=_Cudnn(code))
    except Unspelled as e:  # raised outside an op's lowering: at the graph
        raise DslError(Diagnostic("error", str(e), graph.loc)) from None
    body = "\n".join("    " + line for line in code.lines)
    return body, low.host_values, low.scratch


@attrs.frozen
class Twin:
    """One graph of a C++ project: its section of graphs.cpp and its input files."""

    name: str
    """what main calls it (unique in a project)"""
    code: str
    """its namespace in graphs.cpp: define_graph and the Twin main plans and runs"""
    inputs: dict[str, bytes]
    """its input files, by path in the project"""


def namespace(name: str) -> str:
    """The C++ namespace of the twin called `name`."""
    return "twin_" + re.sub(r"[^0-9A-Za-z_]", "_", name)


def _nbytes(t: TensorType) -> int:
    """The bytes of a buffer of type t, as `run` allocates it (worked out on the meta device: nothing allocated)."""
    from cudnn_dsl.target.memory import empty

    return empty(t, "meta").untyped_storage().nbytes()


def _memory(t) -> bytes:
    """A CPU tensor's memory, as cuDNN reads it (the whole of its storage)."""
    storage = t.untyped_storage()
    return ctypes.string_at(storage.data_ptr(), storage.nbytes())


def _memories(graph: Graph, inst: Instance, options, inits, extra, where: str) -> tuple[list[str], dict]:
    """The initializers of the allocations (`own_memory`'s names, `extra` the scratch tensors and what parts make
    for later ones) and the input files, under `where`: every input drawn as `run` draws it
    (run.inputs.generate_inputs, on the CPU), written as the bytes of its memory."""
    from cudnn_dsl.run.inputs import generate_inputs

    drawn = generate_inputs(graph, inst, "cpu", options.seed, inits)
    memories, files = [], {}
    for k, name in enumerate(own_memory(graph, extra)):
        file = "nullptr"
        if name in drawn:
            files[f"{where}/{k}.bin"] = _memory(drawn[name])
            file = _cstr(f"{where}/{k}.bin")
        memories.append(f"{{{_cstr(name)}, {_nbytes(inst.type(name))}, {file}}}")
    return memories, files


def _views(graph: Graph, inst: Instance) -> list[str]:
    """{view, buffer, byte offset} of each view, and {output, the value it overwrites, 0} of each in-place output."""
    out = []
    for v in graph.views:
        t = inst.type(v.name)
        if t.dtype == "bool":
            raise DslError(Diagnostic("error", "emit --format cpp: a view of a bool buffer is not written yet", v.loc))
        out.append(f"{{{_cstr(v.name)}, {_cstr(v.view[0])}, {v.view[1] * itemsize(t.dtype)}}}")
    return out + [f"{{{_cstr(v.name)}, {_cstr(v.into)}, 0}}" for v in graph.in_place]


def _host_bytes(value, dtype: str) -> str:
    from cudnn_dsl.target.memory import host_scalar

    return ", ".join(map(str, _memory(host_scalar(value, dtype))))


def _list(items: list[str], indent: str = "        ") -> str:
    """A braced initializer list, an item a line."""
    return "{}" if not items else "{\n" + "".join(f"{indent}{item},\n" for item in items) + indent[4:] + "}"


def twin(name: str, graph: Graph, inst: Instance, options, target: Target, inits=None, partition=None) -> Twin:
    """The twin of one shape of a graph, called `name` in its project: the graph whole, or, where cuDNN for
    `target` takes it only in parts (`partition`, partition.plan_for_target's), its cuDNN parts in order, each a
    graph of its own, and what one part makes for a later one in memory main allocates once. A part left to
    torch is refused at its op."""
    ns = namespace(name)
    if partition is None:
        graphs, made, views = [(0, graph, inst)], [], []
        about = ""
    else:
        graphs, made, views = _parts(graph, inst, partition)
        why = declined_whole(partition.declined, "it", target.name)
        lines = [f"In {len(partition.parts)} parts: {why}", *partition.lines(graph)]
        about = "".join(f"\n{_comment(line)}" for line in lines)
    functions, parts, scratches = [], [], []
    for k, g, i in graphs:
        body, host, scratch = define_graph(g, i, options)
        function = f"define_part{k}" if k else "define_graph"
        functions.append(f"void {function}(fe::graph::Graph& g) {{\n{body}\n}}\n")
        bound = [f"{{{_cstr(n)}, {uid}}}" for n, uid in bound_uids(g, scratch)]
        scalars = [f"{{{uid}, {{{_host_bytes(v, dt)}}}}}" for uid, (v, dt) in host.items()]
        fields = [f".index = {k}", f".define_graph = {function}", f".bound = {_list(bound, ' ' * 16)}"]
        fields.append(f".host_scalars = {_list(scalars, ' ' * 16)}")
        parts.append("{\n" + "".join(f"            {f},\n" for f in fields) + "        }")
        scratches += scratch
    extra = list(dict.fromkeys(made + scratches))
    memories, files = _memories(graph, inst, options, inits, extra, f"inputs/{ns}")
    modes = ", ".join(f"fe::HeurMode_t::{m}" for m in options.modes())
    pinned = ", ".join(f"fe::HeurMode_t::{m}" for m in options.modes(True))
    engines = [str(int(e)) for e in sorted(set(options.exclude_engines or ()))]
    outputs = [f"{{{_cstr(v.name)}, {_nbytes(inst.type(v.name))}}}" for v in graph.outputs]
    views = _views(graph, inst) + [f"{{{_cstr(a)}, {_cstr(b)}, 0}}" for a, b in views]
    sep = "\n"
    code = f"""// Graph {_cstr(graph.name)} ({inst.label or "one shape"}) from {_cstr(graph.file)}.{about}
namespace {ns} {{

{sep.join(functions)}
const Twin twin{{
    .name = {_cstr(name)},
    .parts = {_list(parts)},
    .heuristic_modes = {{{modes}}},
    .pinned_modes = {{{pinned}}},
    .excluded_engines = {{{", ".join(engines)}}},
    .constrained = {_cpp(bool(options.constraints))},
    .build_all = {_cpp(options.build_policy == "all")},
    .workspace_limit = {-1 if options.workspace_limit is None else int(options.workspace_limit)},
    .deterministic = {_cpp(bool(options.deterministic))},
    .no_runtime_compilation = {_cpp(bool(options.no_runtime_compilation))},
    .memories = {_list(memories)},
    .views = {_list(views)},
    .outputs = {_list(outputs)},
}};

}}  // namespace {ns}
"""
    return Twin(name, code, files)


def _parts(graph: Graph, inst: Instance, partition) -> tuple[list, list[str], list[tuple[str, str]]]:
    """A graph in parts as main runs it: (part number, graph, shape) of each cuDNN part; the values a part makes
    for a later one, in memory of their own; and (value, the value whose memory it is) of each view part, as
    run.parts places them. Refused, at its op, where C++ cannot do as `run` does: a part left to torch, an output
    that overwrites an input a later part may read, a view that would be a copy."""
    from cudnn_dsl.run.buffers import written
    from cudnn_dsl.run.partition import CUDNN, TORCH, VIEW

    for k, p in enumerate(partition.parts, 1):
        if p.kind == TORCH:
            raise DslError(
                Diagnostic(
                    "error",
                    f"emit --format cpp: part {k} of graph '{graph.name}' ({p.ops(graph)}) is a torch fallback, "
                    "not a cuDNN graph, and C++ has no torch to run it",
                    graph.nodes[p.first].loc,
                )
            )
    if keep := written(graph):
        raise DslError(
            Diagnostic(
                "error",
                f"emit --format cpp: graph '{graph.name}' runs in parts and its outputs overwrite "
                f"{', '.join(sorted(keep))}, which a later part reads as it was: not written yet",
                graph.loc,
            )
        )
    cudnn = [(k, p.graph, p.graph.instances[0]) for k, p in enumerate(partition.parts, 1) if p.kind == CUDNN]
    made = [v.name for _, g, _ in cudnn for v in g.outputs if graph.value(v.name).kind != "output"]
    views = [graph.nodes[p.first] for p in partition.of_kind(VIEW)]
    held = {v.name for v in graph.outputs}
    placed = partition.views_placed(graph, held)  # an intermediate made in the output it is viewed as, as run's
    held |= set(placed)
    aliases = []
    for node in views:
        operand, result = node.inputs[0], node.outputs[0]
        if placed.get(operand) == result:
            continue
        if result in held:
            raise DslError(
                Diagnostic(
                    "error",
                    f"emit --format cpp: reshape's result '{result}' has memory of its own, which its operand "
                    f"'{operand}' cannot be made in: the copy between them is not written yet",
                    node.loc,
                )
            )
        aliases.append((result, operand))
    return cudnn, [n for n in dict.fromkeys(made) if n not in placed], [*placed.items(), *aliases]


def project(twins: list[Twin], target: Target) -> dict[str, bytes]:
    """The files of a C++ project of these twins, by relative path. `target`: what main plans for without a
    device. ValueError when two twins' names give one namespace."""
    spaces = [namespace(t.name) for t in twins]
    if len(set(spaces)) < len(spaces):
        raise ValueError(f"twins' names must give distinct C++ namespaces: {', '.join(t.name for t in twins)}")
    sources = resources.files("cudnn_dsl.interop").joinpath("cpp")
    graphs = [
        "// The graphs of this project, emitted by `cudnn-dsl emit --format cpp`: each one's frontend calls",
        "// (define_graph) and what main plans and runs it with (twin.h says what each field means).",
        '#include "twin.h"',
        "",
        "namespace fe = cudnn_frontend;",
        "",
        f"const char* const TARGET_NAME = {_cstr(target.name)};",
        f"const int32_t TARGET_SM_VERSION = {int(target.sm_version)};",
        "",
        *(t.code for t in twins),
        "const std::vector<const Twin*> TWINS = {" + ", ".join(f"&{ns}::twin" for ns in spaces) + "};",
        "",
    ]
    files = {rel: data for t in twins for rel, data in t.inputs.items()}
    files["graphs.cpp"] = "\n".join(graphs).encode()
    for name in ("twin.h", "main.cpp"):
        files[name] = sources.joinpath(name).read_bytes()
    files["device.json"] = target.descriptor.encode()
    files["CMakeLists.txt"] = _cmake().encode()
    files[STAND_IN] = _stand_in()
    return files


def emit_cpp(graph: Graph, inst: Instance, options, target: Target, inits=None, partition=None) -> dict[str, bytes]:
    """The C++ project of one graph (the twin's name is the graph's), by relative path."""
    return project([twin(graph.name, graph, inst, options, target, inits, partition)], target)


STAND_IN = "nodevice/libcuda.so.1"
"""the project's file of the no-device libcuda.so.1 (target.driver), which main loads where no driver is"""


def _cudnn() -> Path:
    lib = cudnn_library()
    if lib is None:
        raise BackendUnavailable(f"the cuDNN library is not installed: pip install {' or '.join(CUDNN_PACKAGES)}")
    return lib


def _stand_in() -> bytes:
    try:
        return stand_in_image(_cudnn().parent)
    except StandInUnavailable as e:
        raise BackendUnavailable(f"a C++ project needs a no-device libcuda.so.1: {e}") from None


def _frontend_include() -> Path:
    spec = importlib.util.find_spec("cudnn")
    if spec is None or spec.origin is None:
        raise BackendUnavailable("the cuDNN Frontend is not installed: pip install nvidia-cudnn-frontend")
    return Path(spec.origin).parents[1] / "include"


def _cmake() -> str:
    """The CMake project: main, from two translation units (its graphs, and main.cpp), which build in parallel; the
    frontend's and cuDNN's paths default to the pip packages the emitter ran with."""
    lib = _cudnn()
    return f"""# C++ twins of cudnn-dsl graphs, emitted by `cudnn-dsl emit --format cpp`.
cmake_minimum_required(VERSION 3.18)
project(cudnn_dsl_twins LANGUAGES CXX)

set(CUDNN_FRONTEND_INCLUDE_DIR "{_frontend_include()}" CACHE PATH "the cuDNN Frontend's headers")
set(CUDNN_INCLUDE_DIR "{lib.parent.parent / "include"}" CACHE PATH "cuDNN's headers")
set(CUDNN_LIBRARY "{lib}" CACHE FILEPATH "libcudnn.so.9")
find_path(CUDA_RUNTIME_INCLUDE_DIR cuda_runtime_api.h HINTS ENV CUDA_HOME PATH_SUFFIXES include
          PATHS /usr/local/cuda/include /usr/local/cuda-13.0/include REQUIRED)
find_path(NVRTC_INCLUDE_DIR nvrtc.h HINTS "{lib.parents[2] / "cu13" / "include"}" ENV CUDA_HOME PATH_SUFFIXES include
          PATHS /usr/local/cuda/include REQUIRED)
find_library(NVRTC_LIBRARY NAMES nvrtc libnvrtc.so.13 HINTS "{lib.parents[2] / "cu13" / "lib"}" ENV CUDA_HOME
             PATH_SUFFIXES lib lib64 PATHS /usr/local/cuda/lib64 REQUIRED)
find_library(CUDART_LIBRARY cudart HINTS ENV CUDA_HOME PATH_SUFFIXES lib lib64
             PATHS /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13.0/lib REQUIRED)

add_executable(main main.cpp graphs.cpp)
set_target_properties(main PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON BUILD_RPATH "{lib.parent}")
target_include_directories(main PRIVATE "${{CUDNN_FRONTEND_INCLUDE_DIR}}" "${{CUDNN_INCLUDE_DIR}}"
                           "${{CUDA_RUNTIME_INCLUDE_DIR}}" "${{NVRTC_INCLUDE_DIR}}")
# main reads device.json and inputs/ from here, and loads the no-device libcuda.so.1 where no driver provides one.
target_compile_definitions(main PRIVATE PROJECT_DIR="${{CMAKE_CURRENT_SOURCE_DIR}}"
                           NO_DEVICE_DRIVER="${{CMAKE_CURRENT_SOURCE_DIR}}/{STAND_IN}")
target_link_libraries(main PRIVATE "${{CUDNN_LIBRARY}}" "${{NVRTC_LIBRARY}}" "${{CUDART_LIBRARY}}" dl)
"""
