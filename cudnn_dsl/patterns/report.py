"""What installed patterns did to a compiled model: each region replaced, each left alone and why."""

from __future__ import annotations

import os

import attrs
import torch


@attrs.frozen
class Replaced:
    """A region of a compiled model that now runs a graph's op."""

    graph: str
    """the graph's name and where it is declared (file:line:col)"""
    where: str
    """the model's source line of the region's last op, as torch.compile recorded it"""
    training: bool
    """matched with its backward (the op's derived backward replaces the region's)"""
    flops: int = 0
    """the graph's forward FLOPs at the matched shape (torch's flop counter over its reference)"""

    def __str__(self) -> str:
        return f"replaced at {self.where}: {self.graph}{' (with its backward)' if self.training else ''}"


@attrs.frozen
class NearMiss:
    """A region that has a graph's ops but breaks one of its conditions, and so is left alone."""

    graph: str
    where: str
    why: str

    def __str__(self) -> str:
        return f"not replaced at {self.where}: {self.graph}: {self.why}"


@attrs.frozen
class Unmatched:
    """A compute op of the model (a convolution, a matmul, a norm, attention) that no installed graph took: no
    graph has its region's ops, so none was tried."""

    where: str
    op: str
    """the model's op as torch wrote it before decomposition (aten.addmm for nn.Linear)"""
    joint: bool = False
    """in a graph with its backward (training, or autograd on), a region whose forward an installed graph's search
    matched: a region is taken only with its backward"""
    batch_statistics: bool = False
    """a BatchNorm in training mode, or the op whose result it normalizes by its batch's statistics"""
    module: str = ""
    """the name of the model's module that ran the op, within its parent (`c_proj`), where it ran in one: two
    Linears on one line are two ops, a layer's Linear repeated in each block one"""

    def __str__(self) -> str:
        at = f"{self.where}, {self.module}" if self.module else self.where
        if self.batch_statistics:
            return (
                f"not replaced at {at}: {self.op}: batch statistics (a BatchNorm in training mode) that no "
                "installed graph computes as the model does; the library's take a float or autocast model's, "
                "affine, tracking running statistics, with torch's default eps and momentum (or an eval BatchNorm), "
                "and are not installed on CUDA by default (cudnn_dsl.patterns.library.TRAINING_ON_CUDA)"
            )
        if self.joint:
            return (
                f"not replaced at {at}: {self.op}: no installed graph took this region with its backward "
                "as the model computes it (autograd is on); for inference, run under torch.no_grad() or "
                "torch.inference_mode()"
            )
        norm = any(n in self.op for n in ("layer_norm", "rms_norm"))
        hint = " (if its eps is not the installed graphs', install_library(norm_eps=...) gives theirs another)"
        hint = hint if norm else ""
        return f"not replaced at {at}: {self.op}: no installed graph has this region's ops{hint}"


@attrs.define
class Report:
    """What the installed patterns did, in the order Inductor matched.

    A region may be checked by several patterns (graphs of one form traced apart, a graph in two dtypes): its
    near misses wait (`pending`, by the region's last node) until the pass has run, and are dropped when a
    pattern took the region."""

    replaced: list[Replaced] = attrs.field(factory=list)
    missed: list[NearMiss] = attrs.field(factory=list)
    unmatched: list[Unmatched] = attrs.field(factory=list)
    pending: list[tuple[torch.fx.Node, NearMiss, set]] = attrs.field(factory=list, repr=False)
    near: set[tuple[str, str]] = attrs.field(factory=set, repr=False)
    """the model lines and modules of the near misses' regions: their compute ops are no op left unmatched"""
    taken: set[torch.fx.Node] = attrs.field(factory=set, repr=False)
    discovered: set[tuple[str, str]] = attrs.field(factory=set, repr=False)
    """the places (model line and module) of the regions whose forward a graph's search matched in a graph
    with its backward, in any graph compiled while the patterns are installed (one region wherever compiled)"""

    def replace(self, node: torch.fx.Node, done: Replaced) -> None:
        self.replaced.append(done)
        self.taken.add(node)

    def miss(self, node: torch.fx.Node, near: NearMiss, region) -> None:
        """A near miss of the region ending at `node`, whose nodes are `region`."""
        self.pending.append((node, near, {place(n) for n in region}))

    def discover(self, region) -> None:
        """A region whose forward a graph's search matched in a graph with its backward (its nodes)."""
        self.discovered.update(place(n) for n in region)

    def settle(self, graph: torch.fx.Graph, sizes: dict[tuple[str, str, str], int], joint: bool) -> None:
        """After a pass over `graph` (`joint`: with its backward): its near misses, once each, and the compute ops
        no graph took (`sizes`: the largest value of each, surveyed before the pass)."""
        for node, near, region in self.pending:
            if node not in self.taken and near not in self.missed:
                self.missed.append(near)
                self.near |= region
        self.pending.clear()
        self.taken.clear()
        for op in unmatched(graph, sizes, self.discovered if joint else set()):
            if op not in self.unmatched and (op.where, op.module) not in self.near:
                self.unmatched.append(op)

    def __str__(self) -> str:
        lines = [str(r) for r in self.replaced] + [str(m) for m in self.missed] + [str(u) for u in self.unmatched]
        return "\n".join(lines) or "no region matched an installed graph"


_TORCH = os.path.dirname(torch.__file__) + os.sep


def where(node: torch.fx.Node) -> str:
    """The model's `file:line (function)` of a node: the last frame of the stack trace torch.compile keeps that is
    not torch's own (nn.RMSNorm's forward calls F.rms_norm: the model's line is the module's call)."""
    frames = [ln.strip() for ln in (node.meta.get("stack_trace") or "").splitlines() if ln.strip().startswith("File ")]
    if not frames:
        return f"node '{node.name}'"
    model = [f for f in frames if not f.removeprefix("File ").strip().strip(chr(34)).startswith(_TORCH)]
    file, line, function = (p.strip() for p in (model or frames)[-1].split(",", 2))  # File "m.py", line 12, in f
    return f"{file.removeprefix('File ').strip(chr(34))}:{line.removeprefix('line ')} ({function.removeprefix('in ')})"


#: the compute ops of a model (as torch wrote them, before Inductor's decompositions) that a graph could take
_COMPUTE = frozenset(
    {
        "aten.convolution.default",
        "aten.addmm.default",
        "aten.mm.default",
        "aten.bmm.default",
        "aten.native_layer_norm.default",
        "aten._fused_rms_norm.default",
        "aten.rms_norm.default",
        "aten._native_batch_norm_legit_no_training.default",
        "aten._native_batch_norm_legit_functional.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default",
    }
)


#: the compute ops torch decomposes before the graph is traced (their nodes name no such op as their
#: original_aten), by what dynamo records the model called (source_fn_stack): nn.RMSNorm, or torch.rms_norm
#: (F.rms_norm's, called by a module of the model's own)
_SOURCES = {torch.nn.RMSNorm: "aten.rms_norm", torch.rms_norm: "aten.rms_norm"}


#: the name the report gives an RMSNorm a model spells out (rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)), which
#: holds no compute op of torch's
WRITTEN_RMS_NORM = "rms_norm (written out)"


def _compute_op(node: torch.fx.Node) -> str | None:
    """The model's compute op (as torch wrote it) that a node of torch's own is part of, if any."""
    op = str(node.meta.get("original_aten", ""))
    # a replacement's op keeps the meta of the node it replaced: only torch's own ops count, and not the view a
    # replacement takes of its op's result
    torch_op = getattr(node.target, "namespace", None) in ("aten", "prims")
    if not torch_op or node.meta.get("partitioner_tag") == "is_backward" or _view_of_replacement(node):
        return None
    if op in _COMPUTE:
        return op
    source = node.meta.get("source_fn_stack") or ()
    if source and source[-1][1] in _SOURCES:
        return _SOURCES[source[-1][1]]
    return WRITTEN_RMS_NORM if _is_written_rms_norm(node) else None


def _view_of_replacement(node: torch.fx.Node) -> bool:
    """Whether a node selects from the result of an op not torch's own (a replacement's rows: GraphPattern.replace
    drops the batch dim its graph op returns)."""
    return node.target is torch.ops.aten.select.int and any(
        getattr(n.target, "namespace", None) not in ("aten", "prims") for n in node.all_input_nodes
    )


def _is_written_rms_norm(node: torch.fx.Node) -> bool:
    """Whether a node is the rsqrt of an RMSNorm spelled out: of a mean of squares plus a number."""
    aten = torch.ops.aten

    def arg(n, *targets):
        return n.args[0] if isinstance(n, torch.fx.Node) and n.target in targets and n.args else None

    total = arg(node, aten.rsqrt.default)
    mean = arg(total, aten.add.Tensor, aten.add.Scalar)
    squares = arg(mean, aten.mean.dim)
    return isinstance(squares, torch.fx.Node) and (
        (squares.target is aten.pow.Tensor_Scalar and squares.args[1:2] == (2,))
        or (squares.target is aten.mul.Tensor and squares.args[0] is squares.args[1])
    )


def place(node: torch.fx.Node) -> tuple[str, str]:
    """Where in the model a node is: its line (`where`), and the name, within its parent, of the innermost module of
    the model that ran it ('' where none)."""
    stack = node.meta.get("nn_module_stack") or {}
    module = str(list(stack.values())[-1][0]).rsplit(".", 1)[-1] if stack else ""
    return where(node), module


def _size(node: torch.fx.Node) -> int:
    value = node.meta.get("val")
    return value.numel() if isinstance(value, torch.Tensor) and isinstance(value.numel(), int) else 0


def largest(graph: torch.fx.Graph) -> dict[tuple[str, str, str], int]:
    """Before the patterns run: by compute op, model line and module, the largest value its decomposition makes (a
    BatchNorm's normalized activation, not its [C] statistics)."""
    sizes: dict[tuple[str, str, str], int] = {}
    for node in graph.nodes:
        op = _compute_op(node)
        if op is not None:
            key = (op, *place(node))
            sizes[key] = max(sizes.get(key, 0), _size(node))
    return sizes


def _normalized_by_batch(node: torch.fx.Node) -> bool:
    """Whether a training-mode BatchNorm's statistics are taken of the node's value (widened to float first, in a
    half or bf16 model): a var_mean of it that the BatchNorm's decomposition made (a LayerNorm's makes one too)."""
    widened = [u for u in node.users if u.target is torch.ops.prims.convert_element_type.default]
    return any(
        u.target is torch.ops.aten.var_mean.correction and "batch_norm" in str(u.meta.get("original_aten"))
        for v in (node, *widened)
        for u in v.users
    )


def unmatched(
    graph: torch.fx.Graph, sizes: dict[tuple[str, str, str], int], discovered: set[tuple[str, str]]
) -> list[Unmatched]:
    """The forward compute ops left in a graph after the patterns ran, one per model line and op: those whose
    largest value (`sizes`, surveyed before) its outputs still read. What a replaced region's op takes from outside
    it (a BatchNorm's 1 / sqrt(var + eps)) is no op left behind, and a replaced region's nodes wait for Inductor's
    dead code elimination. `discovered`: in a graph with its backward, the model lines and modules of the regions a
    graph's search matched the forward of (Report.discovered)."""
    live: set[torch.fx.Node] = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack += node.all_input_nodes
    found = []
    for node in (n for n in graph.nodes if n in live):
        op = _compute_op(node)
        at, module = place(node)
        if op is not None and _size(node) >= sizes.get((op, at, module), 0):
            batch = "batch_norm_legit_functional" in op or _normalized_by_batch(node)
            u = Unmatched(at, op.removesuffix(".default"), (at, module) in discovered, batch, module)
            if u not in found:
                found.append(u)
    return found
