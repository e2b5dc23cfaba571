"""The language's dtypes as torch and cuDNN types, and default tolerances.

Torch is imported only when a torch dtype is asked for, so lowering and deviceless planning
(`check --target`) run without it.
"""

from __future__ import annotations

#: language dtype -> (torch attribute, cuDNN data_type name)
_NAMES = {
    "half": ("float16", "HALF"),
    "bf16": ("bfloat16", "BFLOAT16"),
    "float": ("float32", "FLOAT"),
    "double": ("float64", "DOUBLE"),
    "fp8_e4m3": ("float8_e4m3fn", "FP8_E4M3"),
    "fp8_e5m2": ("float8_e5m2", "FP8_E5M2"),
    "fp8_e8m0": ("float8_e8m0fnu", "FP8_E8M0"),
    "int8": ("int8", "INT8"),
    "uint8": ("uint8", "UINT8"),
    "int32": ("int32", "INT32"),
    "int64": ("int64", "INT64"),
    "bool": ("bool", "BOOLEAN"),
}

#: (atol, rtol) against the reference, by output dtype
TOLERANCES = {
    "half": (1e-2, 1e-2),
    "bf16": (3e-2, 3e-2),
    "float": (1e-3, 1e-3),
    "double": (1e-6, 1e-6),
    "fp8_e4m3": (1.25e-1, 1.25e-1),
    "fp8_e5m2": (2.5e-1, 2.5e-1),
}


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, _NAMES[dtype][0])


def torch_dtype_name(dtype: str) -> str:
    """'torch.float16': how a generated script spells the dtype."""
    return f"torch.{_NAMES[dtype][0]}"


def from_torch(t_dtype) -> str | None:
    """The language's name of a torch dtype, None when it has none."""
    name = str(t_dtype).removeprefix("torch.")
    return next((k for k, (attr, _) in _NAMES.items() if attr == name), None)


def cudnn_name(dtype: str) -> str:
    return _NAMES[dtype][1]


def cudnn_type(cudnn, dtype: str):
    return getattr(cudnn.data_type, cudnn_name(dtype))


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (0.0, 0.0))
