"""torch, imported when first used: the modules that deviceless planning and `emit` import (the ops' lowerings,
the memory and input code beside them) take torch from here, so that `check --target`, `emit` and `support` run
without it. A name must not be read at import time (a table holds `lambda x: torch.exp(x)`, not `torch.exp`)."""

from __future__ import annotations

import importlib


class LazyModule:
    """A module imported when one of its names is first read. Each name read is then kept on this object, so that
    later reads cost what a module's do and torch.compile traces them as it traces the module's own."""

    def __init__(self, name: str):
        self.__module = name

    def __getattr__(self, attr: str):
        value = getattr(importlib.import_module(self.__module), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<{self.__module}, imported on first use>"


torch = LazyModule("torch")
F = LazyModule("torch.nn.functional")
