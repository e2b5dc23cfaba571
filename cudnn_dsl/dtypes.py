"""Backend layer: the language's dtypes as torch and cuDNN types, and default tolerances."""

from __future__ import annotations

import torch

TORCH = {
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "float": torch.float32,
    "double": torch.float64,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
FROM_TORCH = {v: k for k, v in TORCH.items()}

_CUDNN_NAMES = {
    "half": "HALF",
    "bf16": "BFLOAT16",
    "float": "FLOAT",
    "double": "DOUBLE",
    "fp8_e4m3": "FP8_E4M3",
    "fp8_e5m2": "FP8_E5M2",
    "int8": "INT8",
    "uint8": "UINT8",
    "int32": "INT32",
    "int64": "INT64",
    "bool": "BOOLEAN",
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


def cudnn_type(cudnn, dtype: str):
    return getattr(cudnn.data_type, _CUDNN_NAMES[dtype])


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (0.0, 0.0))
