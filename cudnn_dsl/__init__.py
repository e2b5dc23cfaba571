"""cudnn-dsl: declarative fused cuDNN graphs. The public Python API.

    import cudnn_dsl
    cg = cudnn_dsl.compile("examples/conv_bias_relu.cdg")
    out = cg(**cg.allocate_inputs())["out"]

Names are imported on first use, so that `import cudnn_dsl.cli` (and `cudnn-dsl check`) stays
free of torch and cuDNN.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "compile": "cudnn_dsl.api",
    "DslWarning": "cudnn_dsl.api",
    "CompiledGraph": "cudnn_dsl.run.compiled",
    "BindingError": "cudnn_dsl.run.buffers",
    "BackendUnavailable": "cudnn_dsl.target.library",
    "DslError": "dsl.diagnostics",
    "load": "dsl.pipeline",
    "from_torch": "cudnn_dsl.interop.from_torch",
    "as_torch_op": "cudnn_dsl.torch_op.op",
    "TorchOp": "cudnn_dsl.torch_op.op",
    "GraphModule": "cudnn_dsl.torch_op.module",
    "LayoutWarning": "cudnn_dsl.torch_op.layout",
    "pack_bits": "cudnn_dsl.target.bits",
    "unpack_bits": "cudnn_dsl.target.bits",
}

__all__ = list(_EXPORTS)


def __dir__() -> list[str]:
    """The public names too, which are imported on first use (so that editors and dir() complete them)."""
    return sorted({*globals(), *__all__, "__version__"})


def __getattr__(name: str):
    if name == "__version__":  # from the installed metadata, read only when asked (it costs start-up time)
        from importlib import metadata

        try:
            return metadata.version("cudnn-dsl")
        except metadata.PackageNotFoundError:  # a checkout that was never installed
            return "unknown"
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cudnn_dsl' has no attribute {name!r}")
