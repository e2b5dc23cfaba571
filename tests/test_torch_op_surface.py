"""The Python surface a torch user expects of a compiled graph, its op and its module: reprs that name the graph,
its inputs (dims, dtype, layout) and outputs; `cg.inputs` in torch dtypes; the package's lazy names in dir();
the typing marker shipped as package data."""

from pathlib import Path

import torch

import cudnn_dsl

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "examples" / "serve_matmul.cdg"
EMA = ROOT / "examples" / "in_place_update.cdg"
SELECT = ROOT / "examples" / "compare_select.cdg"


def test_the_specs_are_torch_dtypes_dims_and_layouts():
    cg = cudnn_dsl.compile(SELECT)
    assert [(s.dtype, s.dims, s.layout) for s in cg.inputs.values()] == [
        (torch.float16, (8, 64, 128), "row_major"),
        (torch.float16, (8, 128, 64), "row_major"),
        (torch.float32, (), "row_major"),
        (torch.float32, (), "row_major"),
    ]
    assert cg.outputs["clamped"].dtype == torch.uint8 and cg.outputs["clamped"].layout == "bit-packed bool"
    assert repr(cg.inputs["hi"]) == "scalar hi: torch.float32 = 1.0"
    conv = cudnn_dsl.compile(ROOT / "examples" / "conv_bias_relu.cdg")
    assert conv.inputs["x"].layout == "nhwc" and conv.inputs["x"].shape == (32, 128, 56, 56)


def test_the_compiled_graph_repr_names_the_graph_its_dims_inputs_and_outputs():
    text = repr(cudnn_dsl.compile(SERVE)).splitlines()
    assert text[0].startswith("CompiledGraph 'serve_matmul' (") and "serve_matmul.cdg:" in text[0]
    assert text[1:] == [
        "  input x: torch.bfloat16[1, T, 1024] row_major",
        "  input w: torch.bfloat16[1, 1024, 1024] row_major",
        "  input b: torch.bfloat16[1, 1, 1024] row_major",
        "  output y: torch.bfloat16[1, T, 1024] row_major",
        "  dim T in 16..4096 step 16",
    ]


def test_the_op_and_module_reprs_name_the_op_its_schema_and_what_the_module_holds():
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(EMA))
    lines = repr(op).splitlines()
    assert lines[0] == (
        f"TorchOp torch.ops.cudnn_dsl.{op.name}(Tensor(a0!) avg, Tensor w, float rate=0.001) -> (), "
        "graph 'ema_update', layout: a misplaced input copied"
    )
    assert lines[-1] == "  output next_avg in avg: torch.float32[1, 1024, 1024] row_major"
    w = torch.nn.Parameter(torch.zeros(1, 1024, 1024))
    module = cudnn_dsl.GraphModule(op, w=w)
    assert repr(module) == (
        f"GraphModule(op=torch.ops.cudnn_dsl.{op.name}, graph='ema_update', takes=(avg, rate), "
        "holds=(w: (1, 1024, 1024)))"
    )


def test_dir_lists_the_names_imported_on_first_use():
    assert set(cudnn_dsl.__all__) | {"__version__"} <= set(dir(cudnn_dsl))


def test_the_package_ships_its_typing_marker():
    assert (ROOT / "cudnn_dsl" / "py.typed").is_file()
    assert '"cudnn_dsl" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()  # under package-data
