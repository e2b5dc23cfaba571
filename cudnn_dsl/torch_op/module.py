"""A graph op (torch_op.op) as an nn.Module that holds some of its inputs."""

from __future__ import annotations

import torch

from cudnn_dsl.run.buffers import BindingError
from cudnn_dsl.torch_op.op import TorchOp, as_torch_op


class GraphModule(torch.nn.Module):
    """A compiled graph as an nn.Module: `state` holds some of its inputs (weights, running statistics), an
    nn.Parameter registered as a parameter and a tensor as a buffer; forward takes the others, by position
    in the graph's order or by name, and returns what the op returns."""

    def __init__(self, graph, **state: torch.Tensor):
        super().__init__()
        self.op = graph if isinstance(graph, TorchOp) else as_torch_op(graph)
        unknown = set(state) - set(self.op.arg_names)
        if unknown:
            raise BindingError(f"graph '{self.op.graph.name}' has no input {', '.join(sorted(unknown))}")
        for name, t in state.items():
            if isinstance(t, torch.nn.Parameter):
                self.register_parameter(name, t)
            else:
                self.register_buffer(name, t)
        self.held = tuple(state)
        self.free = tuple(n for n in self.op.arg_names if n not in state)

    def extra_repr(self) -> str:
        """The op, the graph, the inputs forward takes and the ones the module holds (with their shapes)."""
        held = ", ".join(f"{n}: {tuple(getattr(self, n).shape)}" for n in self.held)
        op = f"torch.ops.{self.op.qualname.replace('::', '.')}"
        return f"op={op}, graph='{self.op.graph.name}', takes=({', '.join(self.free)}), holds=({held})"

    def forward(self, /, *args, **kwargs):
        named = dict(zip(self.free, args))
        named.update(kwargs)
        named.update((n, getattr(self, n)) for n in self.held)
        return self.op(**named)
