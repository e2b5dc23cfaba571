"""Layering and registry invariants."""

import subprocess
import sys

from cudnn_dsl.target import library
from dsl.ops import OPS


def test_dsl_imports_neither_torch_nor_cudnn():
    code = (
        "import sys; import dsl.syntax.parser, dsl.check, dsl.syntax.printer, dsl.ops, dsl.ir, dsl.pipeline; "
        "from dsl.pipeline import program; "
        "program(text='graph g {\\n input x : half[2]\\n output y = relu(x)\\n}\\n'); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'cudnn', 'cudnn_dsl', 'numpy')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_op_is_documented():
    assert all(sig.doc for sig in OPS.values())


def test_language_reference_names_every_op():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "language.md").read_text()
    missing = [op for op in OPS if f"`{op}`" not in text]
    assert not missing, f"docs/language.md does not mention {missing}"


# ---- the rules the layout keeps (docs/architecture.md) --------------------------------------

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODULES = {
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
    for pkg in ("dsl", "cudnn_dsl")
    for p in sorted((ROOT / pkg).rglob("*.py"))
}
BUILD_STEPS = {
    "validate",
    "build_operation_graph",
    "create_execution_plans",
    "create_execution_plan",
    "check_support",
    "build_plans",
    "build_plan_at_index",
    "deserialize",
}
#: the cuDNN Frontend internals the runtime reads, as the loader checks them at import (target.library)
FRONTEND_INTERNALS = {n for where, names in library.FRONTEND_INTERNALS.items() for n in (*where.split("."), *names)}
#: Lark's loader of serialized tables (what its own standalone parsers call): dsl.syntax.parser._lark
LARK_INTERNALS = {"_load_from_dict"}
#: torch's raw current device and stream, read per launch without making a Stream object (run.launch)
TORCH_INTERNALS = {"_C", "_cuda_getDevice", "_cuda_getCurrentRawStream"}
#: torch's C++ guard of a tensor's kind and Inductor's allocation without argument parsing (run.launch_plan), and
#: its checks for a mode or transform intercepting a call (torch_op.eager)
TORCH_INTERNALS |= {"_dynamo", "_len_torch_dispatch_stack", "_len_torch_function_stack", "_functorch"}
#: aten ops whose names are private, as a functionalized export graph holds them (from_torch converts them)
TORCH_INTERNALS |= {"_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional", "_softmax"}
#: the fused RMSNorm op torch traces F.rms_norm as on CUDA (patterns.search writes its search so there)
TORCH_INTERNALS |= {"_fused_rms_norm"}


def _imports(module: str, tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else module.rsplit(".", node.level)[0] + "." + node.module
            names = {f"{base}.{a.name}" for a in node.names}
            out.update(names if names & MODULES.keys() else {base})
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in MODULES}


def _trees():
    return {m: ast.parse(p.read_text()) for m, p in MODULES.items()}


def test_no_import_cycles():
    graph = {m: _imports(m, t) - {m} for m, t in _trees().items()}
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}  # a package's own init
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in graph[m]:
            visit(d, path + [m])
        state[m] = 2

    for m in graph:
        visit(m, [])


def test_a_command_is_one_file_that_imports_no_other_command():
    from cudnn_dsl.cli import COMMANDS

    commands = {f"cudnn_dsl.cli.{m}" for m in COMMANDS.values()}
    for m, tree in _trees().items():
        if m in commands:
            assert not (_imports(m, tree) & (commands | {"cudnn_dsl.cli"})), m


def test_no_module_reads_another_modules_private_names():
    for m, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("dsl", "cudnn_dsl"):
                assert not [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")], m
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                allowed = FRONTEND_INTERNALS | LARK_INTERNALS | TORCH_INTERNALS
                assert owner in ("self", "cls") or node.attr in allowed, f"{m}: .{node.attr}"


def test_only_the_build_package_drives_cudnns_build_steps():
    for m, tree in _trees().items():
        calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        if _package(m) != "cudnn_dsl.build":
            assert not calls & BUILD_STEPS, f"{m} calls {calls & BUILD_STEPS}"


#: the frontend's launches: execute (mapping and ordered forms), one plan by its index (tune's timing), and the
#: innermost launch of a prepared variant pack
LAUNCHES = {"execute", "execute_plan_at_index", "_execute_with_raw_ptrs"}
#: (module, the called object's name, the launch) that is no frontend launch: tune.bench calls the `execute`
#: function of an ejected script, the very script it measures against
NOT_FRONTEND_LAUNCHES = {("cudnn_dsl.tune.bench", "mod", "execute")}


def test_only_the_launch_module_launches():
    for m, tree in _trees().items():
        if m == "cudnn_dsl.run.launch":
            continue
        launches = {  # read, not only called: a launch taken to be called later is one too
            (m, n.value.id if isinstance(n.value, ast.Name) else None, n.attr)
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in LAUNCHES
        }
        assert not launches - NOT_FRONTEND_LAUNCHES, f"{m} launches: {sorted(launches - NOT_FRONTEND_LAUNCHES)}"


#: the back half's stages, each walked only by build.pipeline (compile_shape), so every command reaches them there
STAGE_FUNCTIONS = {("cudnn_dsl.build.lower", "lower"), ("cudnn_dsl.build.steps", "plan")}


def test_only_the_pipeline_lowers_and_plans():
    for m, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and m != "cudnn_dsl.build.pipeline":
                taken = {(node.module, a.name) for a in node.names} & STAGE_FUNCTIONS
                assert not taken, f"{m} imports {taken}: go through build.pipeline.compile_shape"


#: the packages of cudnn_dsl, ground floor first: a module imports only from its own package and the floors
#: below (at module level or inside a function alike). The language is the ground under all of them.
FLOORS = (
    ("dsl",),
    ("cudnn_dsl.store",),
    ("cudnn_dsl.target",),
    ("cudnn_dsl.ops",),
    ("cudnn_dsl.build",),
    ("cudnn_dsl.run",),
    ("cudnn_dsl.interop",),
    ("cudnn_dsl.tune", "cudnn_dsl.debug"),
    ("cudnn_dsl.sweep",),
    ("cudnn_dsl.api",),
    ("cudnn_dsl.torch_op",),
    ("cudnn_dsl.patterns",),
    ("cudnn_dsl",),
    ("cudnn_dsl.cli",),
    ("cudnn_dsl.__main__",),
)


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "dsl":
        return "dsl"
    return ".".join(parts[:2])


def _floor(package: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if package in floor)


def test_every_module_is_in_a_package_of_a_floor():
    assert {_package(m) for m in MODULES} == {p for floor in FLOORS for p in floor}


def test_packages_import_only_their_own_and_the_floors_below():
    up = []
    for m, tree in _trees().items():
        here = _package(m)
        for d in _imports(m, tree):
            there = _package(d)
            if there != here and _floor(there) >= _floor(here):
                up.append(f"{m} -> {d}")
    assert not up, "imports that reach up or sideways: " + ", ".join(up)


def test_only_the_cli_entry_point_turns_exceptions_into_exit_codes():
    for m, p in MODULES.items():
        text = p.read_text()
        if m not in ("cudnn_dsl.cli", "cudnn_dsl.__main__"):
            assert "sys.exit" not in text and "SystemExit" not in text, m
