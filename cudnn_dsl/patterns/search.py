"""A graph's pattern search as a PyTorch model computes it: its inputs as the model holds them, its ops in torch's
own idioms.

Inductor matches a pattern by the aten ops traced from its search, so the search must be written as a model is.
A graph declares a Linear's weight as a col_major [1, K, N] operand of `matmul` and its bias as [1, 1, N]; the
model holds them as the weight's [N, K] and a [N] bias and calls `F.linear`, whose aten graph (view, permute,
addmm, view) shares no op with a batched matmul's. So a search takes each input in the model's form (`Form`: the
declared tensor less its leading unit dims, transposed for a Linear weight) and runs the graph's reference with
those ops written as torch's modules write them (`idioms`): `F.linear` with its bias, `F.layer_norm` and
`F.rms_norm` on their [D] weights (the RMSNorm as torch traces it on the model's device: one fused op on CUDA, its
decomposition on the CPU; or spelled out, as Llama's reference code and its ports write it: RMS_NORM_FORMS), an
eval BatchNorm's `(y - mean) * inv_variance * scale + bias` as `F.batch_norm` on its running statistics, a
training-mode `batchnorm` as the functional BatchNorm torch.compile holds (its next running statistics returned).
The replacement views each matched input back to its declared form (no copy), but for a running variance, whose
inverse square root it computes.
"""

from __future__ import annotations

import functools
import math
import struct

import attrs
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from cudnn_dsl.ops import pointwise
from cudnn_dsl.patterns.library import BATCHNORM_EPS
from cudnn_dsl.target.dtypes import torch_dtype
from dsl.ir import Graph, Instance


@attrs.frozen
class Form:
    """How a model holds one of a graph's inputs: the declared tensor less `lead` leading unit dims, and
    `transposed` in its last two (a Linear's [N, K] weight for a col_major [1, K, N] operand of matmul)."""

    lead: int = 0
    transposed: bool = False
    model_dtype = None  # the declared one

    def native(self, declared: torch.Tensor) -> torch.Tensor:
        """The model's tensor of an example in the declared form (contiguous, as a module's parameter is)."""
        t = declared.reshape(declared.shape[self.lead :])
        return t.mT.contiguous() if self.transposed else t

    def declared(self, native: torch.Tensor, rank: int) -> torch.Tensor:
        """The declared form of a model's tensor: a view of it. Fewer dims than declared get leading unit dims
        (torch's broadcasting aligns trailing dims: a [C, 1, 1] statistic against [N, C, H, W] is [1, C, 1, 1])."""
        t = native.mT if self.transposed and native.dim() >= 2 else native
        return t if t.dim() == rank else t.reshape((1,) * (rank - t.dim()) + tuple(t.shape))


PLAIN = Form()
ROWS = Form(lead=1)
"""tokens [B, T, D] held as rows [T, D]: a Linear's or a norm's 2-D input"""


@attrs.frozen
class PerChannel:
    """A BatchNorm's per-channel tensor (a parameter, a running statistic) as the model holds it, declared
    [1, C, 1, ...]: [C] in the model's dtype; for an eval BatchNorm's inverse square root of the running variance
    (`eps` set), the variance itself. Torch's backward of an eval BatchNorm reads the variance, not the inverse
    square root its forward computes, so a search taking the latter would match no model's region with its
    backward."""

    lead: int
    model_dtype: torch.dtype
    declared_dtype: torch.dtype
    eps: float | None = None
    transposed = False

    def native(self, declared: torch.Tensor) -> torch.Tensor:
        t = declared.reshape(-1)
        return (t.square().reciprocal() - self.eps if self.eps is not None else t).to(self.model_dtype)

    def declared(self, native: torch.Tensor, rank: int) -> torch.Tensor:
        t = native.to(self.declared_dtype)
        t = torch.rsqrt(t + self.eps) if self.eps is not None else t
        return t.reshape((1, -1) + (1,) * (rank - 2))


def _leading_units(shape: tuple[int, ...], keep: int) -> int:
    """How many leading unit dims `shape` has, leaving at least `keep` dims."""
    n = 0
    while n < len(shape) - keep and shape[n] == 1:
        n += 1
    return n


def forms(graph: Graph, inst: Instance, batchnorm: bool = True) -> dict[str, Form | PerChannel]:
    """Each tensor input's form in a model, by what reads it: a matmul's weight, a norm's scale and bias, the
    bias added to a Linear's matmul, an eval BatchNorm's running statistics and affine ([C]; `batchnorm`: else
    its chain is pointwise ops like any), an operand a pointwise op broadcasts over leading dims. An input read
    two ways keeps its declared form."""
    inputs = {v.name for v in graph.values if v.kind == "input"}
    made_by = {o: node for node in graph.nodes for o in node.outputs}
    proposed: dict[str, set[Form | PerChannel]] = {}

    def propose(name: str, form: Form | PerChannel) -> None:
        if name in inputs:
            proposed.setdefault(name, set()).add(form)

    for node in graph.nodes:
        if node.op == "batchnorm":  # in training mode: its parameters and running statistics as the model's [C]
            for name in node.inputs[1:5]:
                t = inst.type(name)
                propose(name, PerChannel(len(t.shape) - 1, torch_dtype(t.dtype), torch_dtype(t.dtype)))
    in_batchnorm = set()
    for bn in batchnorms(graph, inst) if batchnorm else ():
        in_batchnorm.update(bn.nodes)
        lead = len(inst.type(bn.mean).shape) - 1
        model = torch_dtype(inst.type(bn.scale).dtype)
        for name in (bn.mean, bn.inv_variance, bn.scale, bn.bias):
            eps = BATCHNORM_EPS if name == bn.inv_variance else None
            propose(name, PerChannel(lead, model, torch_dtype(inst.type(name).dtype), eps))
    for k, node in enumerate(graph.nodes):
        if k in in_batchnorm:
            continue
        if node.op == "matmul" and node.inputs[1] in inputs:
            t = inst.type(node.inputs[1])
            lead = len(t.shape) - 2
            if all(d == 1 for d in t.shape[:lead]):
                col_major = t.strides[-2] == 1 and t.shape[-2] != 1
                propose(node.inputs[1], Form(lead, col_major))
        elif node.op in ("layernorm", "rmsnorm") and len(node.outputs) == 1 and not node.scalars:
            for s in node.inputs[1:3]:
                if s:
                    propose(s, Form(_leading_units(inst.type(s).shape, keep=1)))
        elif node.op in pointwise.IMPLS:
            after_matmul = node.op == "add" and any(made_by.get(i) and made_by[i].op == "matmul" for i in node.inputs)
            out = inst.type(node.outputs[0]).shape
            for i in (i for i in node.inputs if i in inputs):
                shape = inst.type(i).shape
                if after_matmul:  # a Linear's bias: [N]
                    propose(i, Form(_leading_units(shape, keep=1)))
                elif len(shape) == len(out):  # torch broadcasts the dims a model's tensor lacks
                    propose(i, Form(_broadcast_lead(shape, out)))
    return {n: next(iter(f)) for n, f in proposed.items() if len(f) == 1}


def _broadcast_lead(shape: tuple[int, ...], out: tuple[int, ...]) -> int:
    """How many leading dims of `shape` are units a pointwise op broadcasts to `out`'s (leaving one dim)."""
    n = 0
    while n < len(shape) - 1 and shape[n] == 1 and out[n] != 1:
        n += 1
    return n


@attrs.frozen
class BatchNorm:
    """An eval BatchNorm in a graph: `(y - mean) * inv_variance * scale + bias` over inputs [1, C, 1, ...] of
    the channel dim, by the indices of its four nodes."""

    nodes: tuple[int, ...]
    y: str
    mean: str
    inv_variance: str
    scale: str
    bias: str


def batchnorms(graph: Graph, inst: Instance) -> list[BatchNorm]:
    """The graph's eval BatchNorms, each node of them read once (a value read elsewhere is not the norm's own)."""
    inputs = {v.name for v in graph.values if v.kind == "input"}
    outputs = {v.name for v in graph.outputs}
    readers: dict[str, list[int]] = {}
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            readers.setdefault(i, []).append(k)

    def channel(name: str, like: str) -> bool:
        shape, of = inst.type(name).shape, inst.type(like).shape
        return (
            name in inputs
            and len(shape) == len(of) >= 3
            and shape[1] == of[1]
            and sum(shape) - shape[1] == len(shape) - 1
        )

    def step(value: str, op: str) -> tuple[int, str] | None:
        """The one node reading `value` (not an output), if it is `op` of it and a channel input: its index and
        that input."""
        if value in outputs or len(readers.get(value, ())) != 1:
            return None
        k = readers[value][0]
        node = graph.nodes[k]
        if node.op != op or len(node.inputs) != 2:
            return None
        other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
        return (k, other) if channel(other, value) else None

    found = []
    for k, node in enumerate(graph.nodes):
        if node.op != "sub" or len(node.inputs) != 2 or not channel(node.inputs[1], node.inputs[0]):
            continue
        chain, value = [k], node.outputs[0]
        names = [node.inputs[1]]
        for op in ("mul", "mul", "add"):
            got = step(value, op)
            if got is None:
                break
            chain.append(got[0])
            names.append(got[1])
            value = graph.nodes[got[0]].outputs[0]
        if len(chain) == 4:
            found.append(BatchNorm(tuple(chain), node.inputs[0], *names))
    return found


#: a node folded into a later one's idiom (a Linear's matmul into its bias add): run_reference skips it
FOLDED = None


@attrs.frozen
class Spelling:
    """How a model writes the ops a search holds besides torch's modules: its RMSNorm (one of RMS_NORM_FORMS), a
    Linear of a [K, N] weight as HF transformers' Conv1D (`conv1d`: `torch.addmm(bias, x.view(-1, K), weight)`),
    its tanh GELU as HF's NewGELUActivation spells it out (`written_gelu`)."""

    rms_norm: str = "cpu"
    conv1d: bool = False
    written_gelu: bool = False


def idioms(
    graph: Graph, inst: Instance, given: dict[str, Form], cast_per_linear: bool = True, spelling: Spelling = Spelling()
) -> dict[int, object]:
    """By node index, the torch idiom that computes it from the values so far (a function of them), or FOLDED.
    `cast_per_linear`: a cast that Linears alone read is cast by each (casts_per_linear), as autocast writes it.
    `spelling`: how the model writes its RMSNorms, Linears and GELUs where torch's modules are not all there is."""
    uses: dict[str, int] = {}
    for node in graph.nodes:
        for i in node.inputs:
            uses[i] = uses.get(i, 0) + 1
    outputs = {v.name for v in graph.outputs}
    found: dict[int, object] = {}
    for k, node in enumerate(graph.nodes):
        if _training_batchnorm(node, given):
            at = inst.attrs(k)
            found[k] = lambda env, ins=node.inputs[:5], a=at: list(
                torch.ops.aten._native_batch_norm_legit_functional(  # as torch.compile holds F.batch_norm
                    *(env[i] for i in ins), True, a["momentum"], a["epsilon"]
                )
            )
    for bn in batchnorms(graph, inst):
        if isinstance(given.get(bn.inv_variance), PerChannel) and isinstance(given.get(bn.mean), PerChannel):
            found.update((k, FOLDED) for k in bn.nodes[:-1])
            found[bn.nodes[-1]] = lambda env, bn=bn: [
                F.batch_norm(
                    env[bn.y],
                    env[bn.mean],
                    env[bn.inv_variance],
                    env[bn.scale],
                    env[bn.bias],
                    False,
                    0.0,
                    BATCHNORM_EPS,
                )
            ]
    casts = casts_per_linear(graph, inst, given) if cast_per_linear else {}
    found.update((k, FOLDED) for k, node in enumerate(graph.nodes) if node.outputs[0] in casts)

    def read(env: dict, name: str) -> torch.Tensor:
        cast = casts.get(name)
        return env[name] if cast is None else env[cast[0]].to(cast[1])

    for k, node in enumerate(graph.nodes):
        if k in found:
            continue
        if node.op == "matmul" and (
            given.get(node.inputs[1], PLAIN).transposed or (spelling.conv1d and conv1d_weight(inst, node, given))
        ):
            a, w = node.inputs[:2]
            out = node.outputs[0]
            bias_add = _bias_add(graph, inst, out, given) if uses.get(out) == 1 and out not in outputs else None
            if given[w].transposed:  # nn.Linear
                if bias_add is not None:
                    j, b = bias_add
                    found[k] = FOLDED
                    found[j] = lambda env, a=a, w=w, b=b: [F.linear(read(env, a), env[w], env[b])]
                else:
                    found[k] = lambda env, a=a, w=w: [F.linear(read(env, a), env[w])]
            elif bias_add is not None:  # HF's Conv1D, which always has a bias
                j, b = bias_add
                found[k] = FOLDED
                cast = _autocast_cast(graph, inst, a, uses, outputs)
                if cast is None:
                    found[j] = lambda env, a=a, w=w, b=b: [_conv1d(read(env, a), env[w], env[b])]
                else:
                    i, source, to = cast
                    found[i] = FOLDED
                    found[j] = lambda env, x=source, w=w, b=b, to=to: [_conv1d(env[x], env[w], env[b], to)]
        elif node.op == "gelu_tanh" and spelling.written_gelu:
            # declared wider than its input: as autocast computes it, whose pow takes the input in float
            wide = inst.type(node.outputs[0]).dtype == "float" != inst.type(node.inputs[0]).dtype
            found[k] = lambda env, x=node.inputs[0], wide=wide: [_new_gelu(env[x], wide)]
        elif node.op == "swish" and inst.attrs(k).get("beta", 1.0) == 1.0:
            found[k] = lambda env, x=node.inputs[0]: [F.silu(env[x])]  # torch's silu, as nn.SiLU and F.silu
        elif node.op in ("layernorm", "rmsnorm") and len(node.outputs) == 1 and not node.scalars:
            x, scale, bias = (node.inputs + ("",) * 3)[:3]
            eps = inst.attrs(k)["epsilon"]
            if node.op == "layernorm" and scale in given and bias in given:
                found[k] = lambda env, x=x, s=scale, b=bias, e=eps: [
                    F.layer_norm(env[x], tuple(env[s].shape), env[s], env[b], e)
                ]
            elif node.op == "rmsnorm" and scale in given and not bias:
                norm = RMS_NORM_FORMS[spelling.rms_norm]
                found[k] = lambda env, x=x, s=scale, e=eps, norm=norm: [norm(env[x], env[s], e)]
    return found


def casts_per_linear(graph: Graph, inst: Instance, given: dict[str, Form]) -> dict[str, tuple[str, torch.dtype]]:
    """The casts from float to half or bf16 that only Linears read, several of them (their value -> what is cast,
    to what): autocast casts a Linear's input for each Linear, so a model's graph holds a cast per reader where the
    graph holds one (a model that casts once holds one too)."""
    readers: dict[str, list] = {}
    for node in graph.nodes:
        for i in node.inputs:
            readers.setdefault(i, []).append(node)
    outputs = {v.name for v in graph.outputs}
    found = {}
    for node in graph.nodes:
        out = node.outputs[0]
        if out in outputs or len(readers.get(out, ())) < 2:
            continue
        linear = all(
            r.op == "matmul" and r.inputs[0] == out and given.get(r.inputs[1], PLAIN).transposed for r in readers[out]
        )
        to = _narrowing_cast(node, inst)
        if linear and to is not None:
            found[out] = (node.inputs[0], to)
    return found


def _narrowing_cast(node, inst: Instance) -> torch.dtype | None:
    """Where a node casts float to half or bf16, as autocast casts what an op takes: the dtype it casts to."""
    if node.op != "identity":
        return None
    src, to = inst.type(node.inputs[0]).dtype, inst.type(node.outputs[0]).dtype
    return torch_dtype(to) if src == "float" and to in ("half", "bf16") else None


def _training_batchnorm(node, given: dict[str, Form | PerChannel]) -> bool:
    """Whether a node is a training-mode `batchnorm` whose parameters and running statistics (inputs 1 to 4) the
    model holds as [C]."""
    return node.op == "batchnorm" and all(isinstance(given.get(i), PerChannel) for i in node.inputs[1:5])


def running_statistics(graph: Graph) -> set[str]:
    """The inputs a training-mode `batchnorm` reads as its running statistics (they never want gradients)."""
    return {i for node in graph.nodes if node.op == "batchnorm" for i in node.inputs[3:5]}


def output_forms(graph: Graph, given: dict[str, Form | PerChannel]) -> dict[str, PerChannel]:
    """The outputs a model holds otherwise than the graph declares: a training-mode BatchNorm's next running
    statistics, [C] as its buffers (which the model writes them over)."""
    outputs = {v.name for v in graph.outputs}
    found = {}
    for node in graph.nodes:
        if _training_batchnorm(node, given):
            found.update((o, given[i]) for o, i in zip(node.outputs[3:5], node.inputs[3:5]) if o in outputs)
    return found


def _rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm as a compiled model's graph holds it: torch's decomposition (in float for half and bf16), its
    in-place add of eps functional (traced as F.rms_norm itself, the search would keep the in-place add)."""
    convert = torch.ops.prims.convert_element_type.default
    low = x.dtype in (torch.half, torch.bfloat16)
    wide = convert(x, torch.float32) if low else x
    dims = list(range(x.dim() - scale.dim(), x.dim()))
    eps32 = struct.unpack("f", struct.pack("f", eps))[0]  # torch adds eps as a float32: the graph holds its value
    inv = torch.ops.aten.rsqrt.default(torch.ops.aten.add.Scalar(wide.pow(2).mean(dims, keepdim=True), eps32))
    out = wide * inv * scale
    return convert(out, x.dtype) if low else out


def _fused_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """F.rms_norm as torch traces it where it has a fused kernel: one op, its first result the norm."""
    return torch.ops.aten._fused_rms_norm.default(x, list(scale.shape), scale, eps)[0]


def _written_rms_norm(weight_first: bool):
    """An RMSNorm over the last dim spelled out, as Meta's Llama reference and torchtune write it (`weight_first`:
    as HF transformers' LlamaRMSNorm does): normalized in float, cast back to the input's dtype, then scaled."""

    def norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
        wide = x.float()
        out = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)
        return scale * out if weight_first else out * scale

    return norm


#: the forms of a model's RMSNorm a search takes, by name: F.rms_norm as torch traces it on the CPU (its composite)
#: and where it has a fused kernel (traces_fused_rms_norm), and spelled out as models' own RMSNorm modules write it
RMS_NORM_FORMS = {
    "cpu": _rms_norm,
    "fused": _fused_rms_norm,
    "written": _written_rms_norm(weight_first=False),
    "written, weight first": _written_rms_norm(weight_first=True),
}

#: the spelled-out forms, each searched besides F.rms_norm as torch traces it on the model's device
WRITTEN_RMS_NORMS = ("written", "written, weight first")


@functools.cache
def traces_fused_rms_norm(device: str, dtype: torch.dtype) -> bool:
    """Whether F.rms_norm dispatches on this device to its fused kernel (`aten._fused_rms_norm`: CUDA's in torch
    2.11), which a compiled model's graph holds as Inductor's decomposition of that op (its eps as given), rather
    than to the composite of pointwise ops (the CPU's: its eps added as a float32). Traced without decompositions:
    with Inductor's, the fused op is decomposed, and only its nodes' `original_aten` would tell."""
    x, scale = torch.ones(2, 4, device=device, dtype=dtype), torch.ones(4, device=device, dtype=dtype)
    traced = make_fx(lambda x, scale: F.rms_norm(x, (4,), scale, 1e-6))(x, scale)
    return any(n.target is torch.ops.aten._fused_rms_norm.default for n in traced.graph.nodes)


def conv1d_weight(inst: Instance, node, given: dict[str, Form]) -> bool:
    """Whether a matmul's weight is an input the model holds as a [K, N] matrix (a Conv1D's, row-major)."""
    w = node.inputs[1]
    form = given.get(w)
    return form is not None and not form.transposed and len(inst.type(w).shape) - form.lead == 2


def has_conv1d(graph: Graph, inst: Instance, given: dict[str, Form]) -> bool:
    """Whether the graph has a Linear that HF's Conv1D computes: a matmul of a [K, N] weight plus a bias."""
    return any(
        node.op == "matmul" and conv1d_weight(inst, node, given) and _bias_add(graph, inst, node.outputs[0], given)
        for node in graph.nodes
    )


def _conv1d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, to: torch.dtype | None = None) -> torch.Tensor:
    """HF transformers' Conv1D: a Linear of a [K, N] weight. `to`: as autocast's addmm computes it, of the input
    viewed in its own dtype, then cast."""
    if x.dim() == 2:  # rows: its views are no-ops, which a compiled model's graph does not hold
        return torch.addmm(b, x if to is None else x.to(to), w)
    flat = x.view(-1, x.size(-1))
    return torch.addmm(b, flat if to is None else flat.to(to), w).view(x.size()[:-1] + (w.size(-1),))


def _autocast_cast(
    graph: Graph, inst: Instance, value: str, uses: dict[str, int], outputs: set[str]
) -> tuple[int, str, torch.dtype] | None:
    """Where `value` is a cast of a float input to half or bf16 that one op alone reads, as autocast casts what an op
    takes: the cast's node index, what it casts, to what."""
    inputs = {v.name for v in graph.values if v.kind == "input"}
    for k, node in enumerate(graph.nodes):
        if node.outputs[0] != value or uses.get(value) != 1 or value in outputs or node.inputs[0] not in inputs:
            continue
        to = _narrowing_cast(node, inst)
        return None if to is None else (k, node.inputs[0], to)
    return None


def _new_gelu(x: torch.Tensor, autocast: bool = False) -> torch.Tensor:
    """The tanh GELU as HF transformers' NewGELUActivation (GPT-2's gelu_new) spells it out; `autocast`: as it runs
    under torch.autocast, which computes `torch.pow` in float (the rest follows by type promotion)."""
    # in HF's order of evaluation (autocast's cast made at the pow), which autograd's order of summing x's gradient
    # terms follows
    return (
        0.5
        * x
        * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x.float() if autocast else x, 3.0))))
    )


def _bias_add(graph: Graph, inst: Instance, value: str, given: dict[str, Form]) -> tuple[int, str] | None:
    """The node adding an input bias to `value` (a Linear's matmul), and the bias: `matmul(x, w) + b` with b
    [1, ..., 1, N], a Linear's [N] bias."""
    for j, node in enumerate(graph.nodes):
        if node.op == "add" and value in node.inputs:
            [other] = [i for i in node.inputs if i != value] or [None]
            if other in given and given[other].lead == len(inst.type(other).shape) - 1:
                return j, other
    return None
