"""A C++ project of a graph — the cudnn_frontend::graph::Graph calls, a CMake file and a `main` that plans it (for
a target, without a device) or runs it on the inputs `run` draws.

As for the Python script (emit.py), the real lowering pass runs against a recorder, which here writes each call it
receives as C++; a frontend call the recorder has no C++ spelling for is refused at the op that makes it.
"""

from __future__ import annotations

import importlib.util
import math
import re
from importlib import resources
from pathlib import Path

import attrs

from cudnn_dsl.build.pipeline import compile_shape
from cudnn_dsl.interop.emit import bound_uids, own_memory
from cudnn_dsl.interop.fe_nodes import POINTWISE
from cudnn_dsl.ops.pointwise import CUDNN_NAME
from cudnn_dsl.target.library import BackendUnavailable, Target, cudnn_library, stand_in_source
from dsl.diagnostics import Diagnostic, DslError
from dsl.ir import Graph, Instance

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


class Unspelled(Exception):
    """A frontend call the C++ emitter has no spelling for (lower() locates it at its op)."""


def _cstr(text: str) -> str:
    """A C++ string literal: printable ASCII as itself, every other byte of its UTF-8 as a 3-digit octal escape."""
    out = []
    for b in str(text).encode():
        c = chr(b)
        out.append(c if 32 <= b < 127 and c not in '"\\?' else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


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
            if key in kw:
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
                raise Unspelled(f"emit --format cpp: {k}={v!r} has no C++ spelling here yet")
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
class Memory:
    """One allocation of the C++ main: its name, size in bytes, and the input file it starts from (or none)."""

    name: str
    nbytes: int
    file: str | None


def _limit(workspace_limit) -> int:
    return -1 if workspace_limit is None else int(workspace_limit)


def _memories(graph: Graph, inst: Instance, options, inits, scratch) -> tuple[list[Memory], dict[str, bytes]]:
    """The allocations (`own_memory`'s names) and the input files: every input drawn as `run` draws it
    (run.inputs.generate_inputs, on the CPU), written as the bytes of its memory."""
    from cudnn_dsl.run.inputs import generate_inputs
    from cudnn_dsl.target.memory import empty

    drawn = generate_inputs(graph, inst, "cpu", options.seed, inits)
    memories, files = [], {}
    for k, name in enumerate(own_memory(graph, scratch)):
        t = empty(inst.type(name), "cpu")
        nbytes = t.untyped_storage().nbytes()
        file = None
        if name in drawn:
            file = f"inputs/{k}.bin"
            files[file] = bytes(drawn[name].untyped_storage())
        memories.append(Memory(name, nbytes, file))
    return memories, files


def _views(graph: Graph, inst: Instance) -> list[tuple[str, str, int]]:
    """(view, buffer, byte offset) of each view, and (output, the value it overwrites, 0) of each in-place output."""
    from cudnn_dsl.target.dtypes import torch_dtype

    out = []
    for v in graph.views:
        t = inst.type(v.name)
        if t.dtype == "bool":
            raise DslError(Diagnostic("error", "emit --format cpp: a view of a bool buffer is not written yet", v.loc))
        out.append((v.name, v.view[0], v.view[1] * torch_dtype(t.dtype).itemsize))
    out += [(v.name, v.into, 0) for v in graph.in_place]
    return out


def _host_bytes(value, dtype: str) -> list[int]:
    from cudnn_dsl.target.memory import host_scalar

    return list(bytes(host_scalar(value, dtype).untyped_storage()))


def _frontend_include() -> Path:
    spec = importlib.util.find_spec("cudnn")
    if spec is None or spec.origin is None:
        raise BackendUnavailable("the cuDNN Frontend is not installed: pip install nvidia-cudnn-frontend")
    return Path(spec.origin).parents[1] / "include"


def emit_cpp(graph: Graph, inst: Instance, options, target: Target, inits=None, partition=None) -> dict[str, bytes]:
    """The files of the C++ project, by relative path. `target`: what main plans for without a device. A graph
    cuDNN takes only in parts (`partition`) is refused at the graph."""
    if partition is not None:
        raise DslError(
            Diagnostic(
                "error",
                f"emit --format cpp writes a graph cuDNN takes whole; cuDNN for {target.name} splits graph "
                f"'{graph.name}' into {len(partition.parts)} parts ({partition.declined})",
                graph.loc,
            )
        )
    body, host, scratch = define_graph(graph, inst, options)
    memories, files = _memories(graph, inst, options, inits, scratch)
    outputs = [v.name for v in graph.outputs]
    lines = [
        f"// Graph {_cstr(graph.name)} ({inst.label or 'one shape'}) from {_cstr(graph.file)}:",
        "// emitted by `cudnn-dsl emit --format cpp`; main.cpp includes it.",
        "#pragma once",
        "",
        "namespace emitted {",
        "",
        f"inline const char* const GRAPH_NAME = {_cstr(graph.name)};",
        f"inline const char* const TARGET_NAME = {_cstr(target.name)};",
        f"constexpr int32_t TARGET_SM_VERSION = {int(target.sm_version)};",
        "inline const std::vector<fe::HeurMode_t> HEURISTIC_MODES = {"
        + ", ".join(f"fe::HeurMode_t::{m}" for m in options.modes() if m.isidentifier())
        + "};",
        "inline const std::vector<int64_t> EXCLUDED_ENGINES = {"
        + ", ".join(str(int(e)) for e in sorted(set(options.exclude_engines or ())))
        + "};",
        f"constexpr bool CONSTRAINED = {_cpp(bool(options.constraints))};  // a walk over the plans left, as run's",
        f"constexpr bool BUILD_ALL = {_cpp(options.build_policy == 'all')};",
        f"constexpr int64_t WORKSPACE_LIMIT = {_limit(options.workspace_limit)};  // -1: none",
        f"constexpr bool DETERMINISTIC = {_cpp(bool(options.deterministic))};",
        f"constexpr bool NO_RUNTIME_COMPILATION = {_cpp(bool(options.no_runtime_compilation))};",
        "",
        "// Memory of its own: name, bytes, the input file it is read from (nullptr: left uninitialised).",
        "inline const std::vector<Memory> MEMORIES = {",
        *(f"    {{{_cstr(m.name)}, {m.nbytes}, {_cstr(m.file) if m.file else 'nullptr'}}}," for m in memories),
        "};",
        "// Views into another's memory: name, whose, byte offset (an in-place output: the value it overwrites).",
        "inline const std::vector<View> VIEWS = {",
        *(f"    {{{_cstr(n)}, {_cstr(b)}, {off}}}," for n, b, off in _views(graph, inst)),
        "};",
        "// The variant pack: name -> uid of every tensor bound.",
        "inline const std::vector<Bound> BOUND = {",
        *(f"    {{{_cstr(n)}, {uid}}}," for n, uid in bound_uids(graph, scratch)),
        "};",
        "// Pass-by-value scalars: uid, the bytes cuDNN reads from host memory.",
        "inline const std::vector<HostScalar> HOST_SCALARS = {",
        *(f"    {{{uid}, {{{', '.join(map(str, _host_bytes(v, dt)))}}}}}," for uid, (v, dt) in host.items()),
        "};",
        "inline const std::vector<const char*> OUTPUTS = {" + ", ".join(map(_cstr, outputs)) + "};",
        "",
        "inline void define_graph(fe::graph::Graph& g) {",
        body,
        "}",
        "",
        "}  // namespace emitted",
        "",
    ]
    files["graph.h"] = "\n".join(lines).encode()
    files["device.json"] = target.descriptor.encode()
    files["nodevice.c"] = stand_in_source().encode()
    files["main.cpp"] = resources.files("cudnn_dsl.interop").joinpath("cpp/main.cpp").read_bytes()
    files["CMakeLists.txt"] = _cmake(graph.name).encode()
    return files


def _cmake(name: str) -> str:
    """The CMake project: main, and the stand-in libcuda.so.1 it loads where no driver is; the frontend's and
    cuDNN's paths default to the pip packages the emitter ran with."""
    lib = cudnn_library()
    project = re.sub(r"[^0-9A-Za-z_]", "_", name) or "graph"
    return f"""# The C++ twin of graph {name!r}, emitted by `cudnn-dsl emit --format cpp`.
cmake_minimum_required(VERSION 3.18)
project(cudnn_dsl_{project} LANGUAGES C CXX)

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

# Target names: main and nodevice, after a prefix a project holding several twins sets (add_subdirectory).
set(main "${{CUDNN_DSL_PREFIX}}main")
set(nodevice "${{CUDNN_DSL_PREFIX}}nodevice")

# Answers CUDA_ERROR_NO_DEVICE to every driver call: main loads it where no libcuda.so.1 does, so cuDNN loads.
add_library(${{nodevice}} SHARED nodevice.c)
set_target_properties(${{nodevice}} PROPERTIES OUTPUT_NAME cuda NO_SONAME ON LINK_FLAGS "-Wl,-soname,libcuda.so.1"
                      SUFFIX ".so.1" LIBRARY_OUTPUT_DIRECTORY "${{CMAKE_CURRENT_BINARY_DIR}}/nodevice")

add_executable(${{main}} main.cpp)
set_target_properties(${{main}} PROPERTIES OUTPUT_NAME main CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                      BUILD_RPATH "{lib.parent}")
target_include_directories(${{main}} PRIVATE "${{CMAKE_CURRENT_SOURCE_DIR}}" "${{CUDNN_FRONTEND_INCLUDE_DIR}}"
                           "${{CUDNN_INCLUDE_DIR}}" "${{CUDA_RUNTIME_INCLUDE_DIR}}" "${{NVRTC_INCLUDE_DIR}}")
target_compile_definitions(${{main}} PRIVATE NO_DEVICE_DRIVER="$<TARGET_FILE:${{nodevice}}>"
                           PROJECT_DIR="${{CMAKE_CURRENT_SOURCE_DIR}}")
target_link_libraries(${{main}} PRIVATE "${{CUDNN_LIBRARY}}" "${{NVRTC_LIBRARY}}" "${{CUDART_LIBRARY}}" dl)
add_dependencies(${{main}} ${{nodevice}})
"""
