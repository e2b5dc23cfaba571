"""Frontend node -> language op: one row per node tag (NODES, each naming the ops it produces), POINTWISE and
REDUCTION by mode, and every field a row does not read held to its neutral value (NEUTRAL)."""

from __future__ import annotations

from cudnn_dsl.build.lower import MIN_RANK
from cudnn_dsl.interop.fe_graph import Call, Node, NodeRow, Tensor, bool_text, f32_text, ints_text
from dsl.ops import INFIX, OPS

#: 1.0 as the frontend's JSON writes a float32
_F32_ONE = "3F800000"

#: sdpa_fp8's inputs, in the language's order
_SDPA_FP8 = ("Q", "K", "V", "Descale_Q", "Descale_K", "Descale_V", "Descale_S", "Scale_S", "Scale_O")

#: sdpa_fp8_backward's inputs, in the language's order
_SDPA_FP8_BWD = (
    *("Q", "K", "V", "O", "dO", "Stats", "Descale_Q", "Descale_K", "Descale_V", "Descale_O", "Descale_dO"),
    *("Descale_S", "Descale_dP", "Scale_S", "Scale_dQ", "Scale_dK", "Scale_dV", "Scale_dP"),
)

#: pointwise mode -> language op (unary or binary, as the registry has it)
POINTWISE = {
    "ADD": "add",
    "SUB": "sub",
    "MUL": "mul",
    "DIV": "div",
    "MAX": "max",
    "MIN": "min",
    "POW": "pow",
    "RELU_FWD": "relu",
    "GELU_FWD": "gelu",
    "GELU_APPROX_TANH_FWD": "gelu_tanh",
    "SIGMOID_FWD": "sigmoid",
    "TANH_FWD": "tanh",
    "ELU_FWD": "elu",
    "SOFTPLUS_FWD": "softplus",
    "SWISH_FWD": "swish",
    "EXP": "exp",
    "LOG": "log",
    "SQRT": "sqrt",
    "RSQRT": "rsqrt",
    "ABS": "abs",
    "NEG": "neg",
    "RECIPROCAL": "reciprocal",
    "ERF": "erf",
    "SIN": "sin",
    "COS": "cos",
    "FLOOR": "floor",
    "CEIL": "ceil",
    "IDENTITY": "identity",
    "TAN": "tan",
    "MOD": "mod",
    "ADD_SQUARE": "add_square",
    "CMP_EQ": "cmp_eq",
    "CMP_NEQ": "cmp_neq",
    "CMP_GT": "cmp_gt",
    "CMP_GE": "cmp_ge",
    "CMP_LT": "cmp_lt",
    "CMP_LE": "cmp_le",
    "LOGICAL_AND": "logical_and",
    "LOGICAL_OR": "logical_or",
    "LOGICAL_NOT": "logical_not",
    "BINARY_SELECT": "binary_select",
    "GEN_INDEX": "gen_index",
    # backward modes (dy, the forward input)
    "RELU_BWD": "relu_backward",
    "GELU_BWD": "gelu_backward",
    "GELU_APPROX_TANH_BWD": "gelu_tanh_backward",
    "SIGMOID_BWD": "sigmoid_backward",
    "TANH_BWD": "tanh_backward",
    "ELU_BWD": "elu_backward",
    "SOFTPLUS_BWD": "softplus_backward",
    "SWISH_BWD": "swish_backward",
}


#: reduction mode -> the language's reduction mode
REDUCTION = {
    "ADD": "sum",
    "MUL": "mul",
    "MIN": "min",
    "MAX": "max",
    "AMAX": "amax",
    "AVG": "avg",
    "NORM1": "norm1",
    "NORM2": "norm2",
    "MUL_NO_ZEROS": "mul_no_zeros",
}


#: node fields the language has no spelling for, with the values that mean "not used" (null, false and []
#: always do): any other value is an error naming the node
NEUTRAL = {
    "MATMUL": {"padding_value": (0, 0.0)},
    "POINTWISE": {
        "elu_alpha": (1.0, _F32_ONE),
        "softplus_beta": (1.0, _F32_ONE),
    },
    "REDUCTION": {},
    "SDPA": {"implementation": "*", "mma_core_mode": "*"},
    "SDPA_FP8_FWD": {"implementation": "*", "mma_core_mode": "*"},
    "RESHAPE": {"reshape_mode": ("VIEW_ONLY",), "dim": "*", "stride": "*"},
    "SLICE": {},
}


INFIX_SYMBOL = {op: symbol for symbol, op in INFIX.items()}


def import_pointwise(n: Node) -> Call:
    mode = n.get("mode")
    op = POINTWISE.get(mode)
    if op is None:
        raise n.fail(f"pointwise mode {mode} has no op in the language", "mode")
    ins = [n.port("IN_0"), n.port("IN_1", optional=True), n.port("IN_2", optional=True)]
    if ins[2] is not None and op != "binary_select":
        raise n.fail("takes a third input (IN_2), which only binary_select of the language's pointwise ops has")
    attrs_: list[tuple[str, str]] = []
    if op in ("relu", "relu_backward"):
        kind, attrs_ = _relu(n)
        op = kind if op == "relu" else f"{kind}_backward"
    if op in ("swish", "swish_backward"):
        attrs_.append(("beta", n.f32("swish_beta", 1.0)))
    if op == "gen_index":
        attrs_.append(("axis", str(n.integer("axis", required=True))))
    return Call(op, tuple(i for i in ins if i is not None), tuple(attrs_), ("OUT_0",))


def _relu(n: Node) -> tuple[str, list[tuple[str, str]]]:
    """RELU_FWD: relu with its clips, or leaky_relu when only the slope is set (the frontend's leaky_relu is
    that relu: the JSON cannot tell relu(negative_slope=s) from leaky_relu(slope=s))."""
    given = {
        k: n.f32(field)
        for k, field in (
            ("negative_slope", "relu_lower_clip_slope"),
            ("lower_clip", "relu_lower_clip"),
            ("upper_clip", "relu_upper_clip"),
        )
        if n.get(field) is not None
    }
    if given.get("lower_clip") == "0":
        del given["lower_clip"]
    if list(given) == ["negative_slope"]:
        return "leaky_relu", [("slope", given["negative_slope"])]
    return "relu", list(given.items())


def _conv(op: str, ports: tuple[str, str], out: str) -> NodeRow:
    def convert(n: Node) -> Call:
        pre, post = n.integers("pre_padding"), n.integers("post_padding")
        if n.get("math_mode", "CROSS_CORRELATION") != "CROSS_CORRELATION":
            raise n.fail(
                f"math_mode {n.get('math_mode')}: the language's convolutions are cross-correlations", "math_mode"
            )
        padding = (
            (("padding", ints_text(pre)),)
            if pre == post
            else (("pre_padding", ints_text(pre)), ("post_padding", ints_text(post)))
        )
        attrs_ = padding + (
            ("stride", ints_text(n.integers("stride"))),
            ("dilation", ints_text(n.integers("dilation"))),
        )
        if op == "conv_dgrad":
            attrs_ += _output_padding(n, pre, post)
        if op == "conv_wgrad":
            attrs_ += _filter(n, pre, post)
        return Call(op, tuple(n.port(p) for p in ports), attrs_, (out,))

    return NodeRow(convert, (op,))


def _output_padding(n: Node, pre: list, post: list) -> tuple[tuple[str, str], ...]:
    """The JSON has no output_padding: it has dX's dims, and those past the smallest dX that gives dY are it."""
    dy, w, dx = n.tensor("DY"), n.tensor("W"), n.tensor("DX", "outputs")
    if dx is None or not (dx.dims and dy.dims and w.dims):
        raise n.fail("its tensors have no dims in the JSON, so dX's size (output_padding) is unknown")
    stride, dil = n.get("stride", []), n.get("dilation", [])
    spatial = zip(dy.dims[2:], w.dims[2:], dx.dims[2:], pre, post, stride, dil)
    extra = [x - ((p - 1) * s - a - b + d * (r - 1) + 1) for p, r, x, a, b, s, d in spatial]
    if any(e < 0 for e in extra):
        raise n.fail(f"dX dims {dx.dims} are smaller than any convolution giving dY {dy.dims}")
    return (("output_padding", ints_text(extra)),) if any(extra) else ()


def _filter(n: Node, pre: list, post: list) -> tuple[tuple[str, str], ...]:
    """The JSON has dW's dims; the language derives the largest filter that maps X to dY, so a smaller one
    (stride > 1 leaves a choice) is spelled out."""
    x, dy, dw = n.tensor("X"), n.tensor("DY"), n.tensor("DW", "outputs")
    if dw is None or not (dw.dims and dy.dims and x.dims):
        raise n.fail("its tensors have no dims in the JSON, so dW's size (filter) is unknown")
    spatial = zip(x.dims[2:], dy.dims[2:], pre, post, n.get("stride", []), n.get("dilation", []))
    largest = [(h + a + b - (o - 1) * s - 1) // d + 1 for h, o, a, b, s, d in spatial]
    return () if largest == dw.dims[2:] else (("filter", ints_text(dw.dims[2:])),)


def import_matmul(n: Node) -> Call:
    for p in ("M_override", "N_override", "K_override"):
        if n.tensor(p) is not None:
            raise n.fail(f"has a {p} input (ragged shapes), which the language's matmul lacks")
    return Call("matmul", (n.port("A"), n.port("B")), (), ("C",))


def import_reduction(n: Node) -> Call:
    mode = REDUCTION.get(n.get("mode"))
    if mode is None:
        raise n.fail(f"reduction mode {n.get('mode')} has no counterpart in the language", "mode")
    if n.get("is_deterministic", False):
        raise n.fail("is_deterministic=true: the language cannot ask for a deterministic reduction", "is_deterministic")
    out = n.tensor("Y", "outputs")
    if out is None or not out.dims:
        raise n.fail("its output has no dims in the JSON, so the axes it reduces are unknown")
    axes = [i for i, d in enumerate(out.dims) if d == 1]
    attrs_ = [("mode", mode)]
    if len(axes) < len(out.dims):
        attrs_.append(("axes", ints_text(axes)))
    return Call("reduction", (n.port("X"),), tuple(attrs_), ("Y",))


#: sdpa's optional input ports, in the language's argument order (after q, k, v), by the language's name
_SDPA_OPTIONAL = {
    "bias": "Bias",
    "seq_len_q": "SEQ_LEN_Q",
    "seq_len_kv": "SEQ_LEN_KV",
    "dropout_mask": "Dropout_mask",
    "dropout_scale": "Dropout_scale",
    "page_table_k": "Page_table_K",
    "page_table_v": "Page_table_V",
    "sink_token": "SINK_TOKEN",
}


def _unsupported(n: Node, ports) -> None:
    unsupported = [p for p in (n.j.get("inputs") or {}) if p not in ports]
    if unsupported:
        raise n.fail(f"has inputs {', '.join(sorted(unsupported))}, which the language's attention lacks")


def _sdpa_scale(n: Node) -> str:
    if n.get("attn_scale_value") is not None:
        return n.f32("attn_scale_value")
    # the scale as a pass-by-value input; none at all is no scaling
    return f32_text(n.value_of("Attn_scale") if n.tensor("Attn_scale") is not None else 1.0)


def _sdpa_scale_attr(n: Node) -> tuple[str, str]:
    """sdpa's and sdpa_backward's scale: the float the frontend was given (it holds it in attn_scale_value and a
    tensor of its own), or the Attn_scale tensor the caller gave, the language's attn_scale input."""
    if n.get("attn_scale_value") is None and n.tensor("Attn_scale") is not None:
        return ("attn_scale", n.port("Attn_scale"))
    return ("scale", _sdpa_scale(n))


def _sdpa_stats(n: Node) -> bool:
    stats = n.get("generate_stats")
    if stats is None:  # frontends before 1.1x said is_inference
        stats = not n.get("is_inference", True)
    return bool(stats)


def ragged_offset(tensors: dict[str, Tensor], t: Tensor) -> Tensor | None:
    """The tensor that places t's sequences (its ragged offset, `set_ragged_offset`), or None."""
    uid = t.json.get("ragged_offset_uid")
    return None if uid is None else next((o for o in tensors.values() if o.json.get("uid") == uid), None)


#: sdpa's ragged offsets, by the language's name: the port of the tensor each places, and its side
_SDPA_RAGGED = {
    "ragged_q": ("Q", "inputs"),
    "ragged_k": ("K", "inputs"),
    "ragged_v": ("V", "inputs"),
    "ragged_o": ("O", "outputs"),
    "ragged_stats": ("Stats", "outputs"),
}


def _sdpa_ragged(n: Node) -> list[tuple[str, str]]:
    out = []
    for name, (port, side) in _SDPA_RAGGED.items():
        t = n.tensor(port, side)
        if t is None or t.json.get("ragged_offset_uid") is None:
            continue
        offset = ragged_offset(n.tensors, t)
        if offset is None:
            raise n.fail(f"its {port} has ragged_offset_uid {t.json['ragged_offset_uid']}, which is not in 'tensors'")
        out.append((name, offset.name))
    return out


def import_sdpa(n: Node) -> Call:
    _unsupported(n, ("Q", "K", "V", "Attn_scale", "Seed", "Offset", *_SDPA_OPTIONAL.values()))
    args = [n.port("Q"), n.port("K"), n.port("V")]
    kwargs = [(k, n.port(p, optional=True)) for k, p in _SDPA_OPTIONAL.items()]
    if bool(n.get("padding_mask", False)) != (n.tensor("SEQ_LEN_Q") is not None):
        raise n.fail("padding_mask and the SEQ_LEN inputs disagree", "padding_mask")
    stats = _sdpa_stats(n)
    attrs_ = [(k, v) for k, v in kwargs if v is not None] + _sdpa_ragged(n)
    attrs_ += [_sdpa_scale_attr(n), *_sdpa_band(n), ("stats", bool_text(stats))]
    if n.get("alibi_mask", False):
        attrs_.append(("alibi", "true"))
    if n.tensor("Page_table_K") is not None:
        attrs_.append(("max_seq_len_kv", str(n.integer("max_seq_len_kv", required=True))))
    elif n.get("max_seq_len_kv") is not None:
        raise n.fail("max_seq_len_kv without page tables", "max_seq_len_kv")
    for field in ("max_total_seq_len_q", "max_total_seq_len_kv"):
        if n.get(field) is not None:
            raise n.fail(f"{field} (the packed rows' bound, a backward field): the language's sdpa lacks it", field)
    outs = ("O", "Stats") if stats else ("O",)
    if n.get("dropout_probability") is not None:  # seeded dropout: the mask cuDNN draws is the last result
        p = n.f32("dropout_probability")
        attrs_ += [("dropout_seed", n.port("Seed")), ("dropout_offset", n.port("Offset")), ("dropout_probability", p)]
        outs += ("RNG_DUMP",) if n.tensor("RNG_DUMP", "outputs") is not None else ()
    return Call("sdpa", tuple(args), tuple(attrs_), outs)


def import_sdpa_fp8(n: Node) -> Call:
    _unsupported(n, (*_SDPA_FP8, "Attn_scale"))
    stats = _sdpa_stats(n)
    attrs_ = (("scale", _sdpa_scale(n)), *_sdpa_band(n), ("stats", bool_text(stats)))
    outs = ("O", "Amax_O", "Stats") if stats else ("O", "Amax_O")
    return Call("sdpa_fp8", tuple(n.port(p) for p in _SDPA_FP8), attrs_, outs, unused=("Amax_S",))


def _sdpa_band(n: Node) -> list[tuple[str, str]]:
    """The diagonal band: causal spellings where they fit (the checker folds them back into the bounds)."""
    if "causal_mask" in n.j:  # frontends before 1.1x
        if n.get("causal_mask_bottom_right", False):
            return [("causal_bottom_right", "true")]
        return [("causal", "true")] if n.get("causal_mask") else []
    left, right = n.integer("left_bound"), n.integer("right_bound")
    if left is None:
        left = n.integer("sliding_window_length")
    align = str(n.get("diagonal_alignment", "TOP_LEFT")).lower()
    out = []
    if right == 0:
        out.append(("causal" if align == "top_left" else "causal_bottom_right", "true"))
    else:
        if align != "top_left":  # the language's default
            out.append(("diagonal_alignment", align))
        if right is not None:
            out.append(("right_bound", str(right)))
    if left is not None:
        out.append(("left_bound", str(left)))
    return out


def _ports(names: tuple[str, ...]) -> tuple[str, ...]:
    """The frontend's ports of a norm's statistics: the language's names of them, in capitals (MEAN)."""
    return tuple(name.upper() for name in names)


def keeps_dims(t: Tensor, x: Tensor | None) -> bool:
    """Whether a norm's pass-by-value epsilon or momentum has dims of its own: other than the ones at X's rank
    that the language lowers a number to (a C++ graph's `graph.tensor(1e-5f)` is [1]). Such a one imports as a
    declared scalar the attribute names (`epsilon=eps`), which keeps its dims, uid and name."""
    return t.dims != [1] * max(len(x.dims) if x is not None else 0, MIN_RANK)


def _by_value_attr(n: Node, port: str) -> str:
    """A norm's epsilon or momentum as the language spells it: its number, or the scalar that keeps its dims."""
    t = n.tensor(port)
    if t is not None and t.by_value and keeps_dims(t, n.tensor("X")):
        return t.name
    return f32_text(n.value_of(port))


def _norm(op: str, with_bias: bool) -> NodeRow:
    """A norm with a forward phase: y alone in inference, y and its statistics in training."""
    stats = _ports(OPS[op].outputs[1:])

    def convert(n: Node) -> Call:
        phase = n.get("forward_phase", "INFERENCE")
        if phase not in ("INFERENCE", "TRAINING"):
            raise n.fail(f"forward_phase {phase}: the language's {op} has inference and training", "forward_phase")
        args = [n.port("X"), n.port("SCALE"), n.port("BIAS", optional=not with_bias)]
        attrs_ = [("epsilon", _by_value_attr(n, "EPSILON"))]
        outs = ("Y",)
        if phase == "TRAINING":
            attrs_.append(("phase", "training"))
            outs += stats
        return Call(op, tuple(a for a in args if a is not None), tuple(attrs_), outs)

    return NodeRow(convert, (op,))


def import_batchnorm(n: Node) -> Call:
    if n.get("peer_stats"):
        raise n.fail("peer_stats (statistics across GPUs): the language's batchnorm has none", "peer_stats")
    ports = ("X", "SCALE", "BIAS", "PREV_RUNNING_MEAN", "PREV_RUNNING_VAR")
    attrs_ = (("epsilon", _by_value_attr(n, "EPSILON")), ("momentum", _by_value_attr(n, "MOMENTUM")))
    outs = ("Y", *_ports(OPS["batchnorm"].outputs[1:]))
    return Call("batchnorm", tuple(n.port(p) for p in ports), attrs_, outs)


def import_genstats(n: Node) -> Call:
    return Call("genstats", (n.port("X"),), (), ("SUM", "SQ_SUM"))


def import_rope(n: Node) -> Call:
    attrs_ = (
        ("rope_dim", str(n.integer("rope_dim", required=True))),
        ("output_scale", n.f32("output_scale", 1.0)),
    )
    return Call("rope", (n.port("INPUT"), n.port("FREQS")), attrs_, ("OUTPUT",))


def import_concatenate(n: Node) -> Call:
    if n.get("in_place_index") is not None:
        raise n.fail(
            "in_place_index (writing into one of its inputs): the language's concatenate has none", "in_place_index"
        )
    ports = sorted((n.j.get("inputs") or {}), key=lambda p: int(p) if p.isdigit() else -1)
    if not ports or any(not p.isdigit() for p in ports):
        raise n.fail(f"inputs {ports}: a concatenation's inputs are numbered")
    return Call(
        "concatenate", tuple(n.port(p) for p in ports), (("axis", str(n.integer("axis", required=True))),), ("Y",)
    )


def import_batchnorm_inference(n: Node) -> Call:
    ports = ("X", "MEAN", "INV_VARIANCE", "SCALE", "BIAS")
    return Call("batchnorm_inference", tuple(n.port(p) for p in ports), (), ("Y",))


def import_transpose(n: Node) -> Call:
    return Call("transpose", (n.port("X"),), (("perm", ints_text(n.integers("permutation"))),), ("Y",))


def import_reshape(n: Node) -> Call:
    out = n.tensor("Y", "outputs")
    if out is None or not out.dims:
        raise n.fail("its output has no dims in the JSON, so the new shape is unknown")
    return Call("reshape", (n.port("X"),), (("shape", ints_text(out.dims)),), ("Y",))


def import_slice(n: Node) -> Call:
    if any(s != 1 for s in n.get("slice_strides", [])):
        raise n.fail(
            f"slice_strides {n.get('slice_strides')}: the language's slice takes every element", "slice_strides"
        )
    box = n.get("slices", [])
    attrs_ = (("start", ints_text(s for s, _ in box)), ("end", ints_text(e for _, e in box)))
    return Call("slice", (n.port("X"),), attrs_, ("Y",))


def _norm_backward(op: str) -> NodeRow:
    """A norm's gradient: (DY, X, SCALE, the saved statistics) -> DX, DSCALE, DBIAS (rmsnorm: DBIAS only
    with a bias, `dbias=true`)."""
    stats = _ports(OPS[op].inputs[3:])

    def convert(n: Node) -> Call:
        if n.get("peer_stats"):
            raise n.fail(f"peer_stats (statistics across GPUs): the language's {op} has none", "peer_stats")
        args = tuple(n.port(p) for p in ("DY", "X", "SCALE", *stats))
        dbias = n.tensor("DBIAS", "outputs") is not None
        attrs_ = (("dbias", "true"),) if op == "rmsnorm_backward" and dbias else ()
        outs = ("DX", "DSCALE", "DBIAS") if dbias or op != "rmsnorm_backward" else ("DX", "DSCALE")
        return Call(op, args, attrs_, outs)

    return NodeRow(convert, (op,))


#: sdpa_backward's optional input ports, in the language's argument order (after q, k, v, o, do, stats)
_SDPA_BWD_OPTIONAL = {k: v for k, v in _SDPA_OPTIONAL.items() if not k.startswith("page_table")} | {
    "dropout_scale_inv": "Dropout_scale_inv"
}


def import_sdpa_backward(n: Node) -> Call:
    _unsupported(n, ("Q", "K", "V", "O", "dO", "Stats", "Attn_scale", *_SDPA_BWD_OPTIONAL.values()))
    if n.get("dropout_probability") is not None:
        raise n.fail(
            "a random dropout (dropout_probability): the language's sdpa_backward takes a dropout mask",
            "dropout_probability",
        )
    if bool(n.get("padding_mask", False)) != (n.tensor("SEQ_LEN_Q") is not None):
        raise n.fail("padding_mask and the SEQ_LEN inputs disagree", "padding_mask")
    for field in ("max_total_seq_len_q", "max_total_seq_len_kv"):
        if n.get(field) is not None:
            raise n.fail(f"{field} (ragged Q/K/V): the language's sdpa_backward has no ragged offsets", field)
    args = tuple(n.port(p) for p in ("Q", "K", "V", "O", "dO", "Stats"))
    kwargs = [(k, n.port(p, optional=True)) for k, p in _SDPA_BWD_OPTIONAL.items()]
    attrs_ = [(k, v) for k, v in kwargs if v is not None] + [_sdpa_scale_attr(n), *_sdpa_band(n)]
    if n.get("alibi_mask", False):
        attrs_.append(("alibi", "true"))
    if n.get("is_deterministic_algorithm", False):
        attrs_.append(("deterministic", "true"))
    outs = ("dQ", "dK", "dV")
    for port, attr in (("dBias", "dbias"), ("DSINK_TOKEN", "dsink")):  # the results after dV, in the op's order
        if n.tensor(port, "outputs") is not None:
            attrs_.append((attr, "true"))
            outs += (port,)
    return Call("sdpa_backward", args, tuple(attrs_), outs)


def import_sdpa_fp8_backward(n: Node) -> Call:
    _unsupported(n, (*_SDPA_FP8_BWD, "Attn_scale"))
    attrs_ = [("scale", _sdpa_scale(n)), *_sdpa_band(n)]
    if n.get("is_deterministic_algorithm", False):
        attrs_.append(("deterministic", "true"))
    outs = ("dQ", "dK", "dV", "Amax_dQ", "Amax_dK", "Amax_dV", "Amax_dP")
    return Call("sdpa_fp8_backward", tuple(n.port(p) for p in _SDPA_FP8_BWD), tuple(attrs_), outs)


def import_rope_backward(n: Node) -> Call:
    attrs_ = (
        ("rope_dim", str(n.integer("rope_dim", required=True))),
        ("output_scale", n.f32("output_scale", 1.0)),
    )
    return Call("rope_backward", (n.port("DY"), n.port("FREQS")), attrs_, ("DX",))


BACKWARD_NODES: dict[str, NodeRow] = {
    "ROPE_BWD": NodeRow(import_rope_backward, ("rope_backward",)),
    "LAYER_NORM_BPROP": _norm_backward("layernorm_backward"),
    "RMS_NORM_BPROP": _norm_backward("rmsnorm_backward"),
    "DBN": _norm_backward("batchnorm_backward"),
    "INSTANCE_NORM_BPROP": _norm_backward("instancenorm_backward"),
    "ADA_LAYER_NORM_BPROP": _norm_backward("adalayernorm_backward"),
    "SDPA_BWD": NodeRow(import_sdpa_backward, ("sdpa_backward",)),
    "SDPA_FP8_BWD": NodeRow(import_sdpa_fp8_backward, ("sdpa_fp8_backward",)),
}


#: node tag -> how it becomes a language op
NODES: dict[str, NodeRow] = {
    # RELU_FWD and RELU_BWD with only a slope set are leaky_relu and leaky_relu_backward (_relu)
    "POINTWISE": NodeRow(import_pointwise, (*POINTWISE.values(), "leaky_relu", "leaky_relu_backward")),
    "CONV_FPROP": _conv("conv_fprop", ("X", "W"), "Y"),
    "CONV_DGRAD": _conv("conv_dgrad", ("DY", "W"), "DX"),
    "CONV_WGRAD": _conv("conv_wgrad", ("X", "DY"), "DW"),
    "MATMUL": NodeRow(import_matmul, ("matmul",)),
    "REDUCTION": NodeRow(import_reduction, ("reduction",)),
    "SDPA": NodeRow(import_sdpa, ("sdpa",)),
    "SDPA_FP8_FWD": NodeRow(import_sdpa_fp8, ("sdpa_fp8",)),
    "LAYER_NORM": _norm("layernorm", True),
    "RMS_NORM": _norm("rmsnorm", False),
    "INSTANCE_NORM": _norm("instancenorm", True),
    "ADA_LAYER_NORM": _norm("adalayernorm", False),
    "BATCHNORM": NodeRow(import_batchnorm, ("batchnorm",)),
    "GENSTATS": NodeRow(import_genstats, ("genstats",)),
    "ROPE": NodeRow(import_rope, ("rope",)),
    "CONCATENATE": NodeRow(import_concatenate, ("concatenate",)),
    "BATCHNORM_INFERENCE": NodeRow(import_batchnorm_inference, ("batchnorm_inference",)),
    "TRANSPOSE": NodeRow(import_transpose, ("transpose",)),
    "RESHAPE": NodeRow(import_reshape, ("reshape",)),
    "SLICE": NodeRow(import_slice, ("slice",)),
    **BACKWARD_NODES,
}


#: language op -> the node tag it comes from
IMPORTED = {op: tag for tag, row in NODES.items() for op in row.ops}


#: registry ops no frontend node becomes, and why
NOT_IMPORTED = {
    "bias": "the frontend's bias is its pointwise ADD: it imports as add (the same frontend call)",
    "scale": "the frontend's scale is its pointwise MUL: it imports as mul (the same frontend call)",
    **dict.fromkeys(
        ("block_scale_quantize", "block_scale_dequantize", "sdpa_mxfp8"),
        "no importer row reads the frontend's block-scaled nodes (BLOCK_SCALE_QUANTIZE, BLOCK_SCALE_DEQUANTIZE, "
        "SDPA_MXFP8: their block size, axis and the scales' reordering)",
    ),
    **dict.fromkeys(
        ("moe_grouped_matmul", "moe_grouped_matmul_bwd"),
        "no importer row reads the frontend's MOE_GROUPED_MATMUL / MOE_GROUPED_MATMUL_BWD nodes (their mode, "
        "top_k and gather inputs)",
    ),
    "resample": "the frontend's Python API (1.32) builds no RESAMPLE node, so no graph JSON it writes holds one "
    "to round-trip",
}


#: what a .cdg file says that the frontend's graph JSON does not carry, so a round trip cannot keep it, and why
NOT_CARRIED = {
    "buffer": "views of one allocation (`buffer`, `in BUF at OFF`): the JSON has each tensor's dims and strides, "
    "not the memory it lives in; a view imports as an input of its own, with the view's strides",
    "in-place output": "`output y in x`: the JSON has no aliasing; y imports as an output of its own",
    "range dim": "`dim T in LO..HI step S`: the JSON holds one shape; the graph imports at that shape",
    "init": "an input's distribution (`init=`) is the runtime's, not the cuDNN graph's",
    "batch stride left to offsets": "`strides [_, ...]` (a ragged tensor in a token capacity of S rows): the "
    "JSON has the batch stride cuDNN gets, S*H*D, not the memory the tensor lives in; it imports with that "
    "stride, in memory of B * S rows, which holds any offsets that fit the capacity",
    "option": "`option` lines (plan choice, tuning) are planning settings, not the graph's",
    "rank below 3": "rank 1 and 2 tensors reach cuDNN with unit dims in front (build.lower.MIN_RANK): they import "
    "as rank 3, their axes attributes counted in that rank",
    "one-element input at a lower rank": "`input s : float[1]` read by a rank-4 pointwise op reaches cuDNN as "
    "[1, 1, 1, 1] (build.lower.lifted_ranks): it imports at that rank",
    "declared default dtype": "a virtual tensor's dtype is declared only where it differs from the one the "
    "language gives it (`h : float = ...` in a float graph imports as `h = ...`)",
    "relu negative_slope alone": "relu(negative_slope=s) is the frontend's leaky_relu: it imports as "
    "leaky_relu(slope=s)",
    "names of unnamed values": "nested calls and number literals get the frontend's names (a literal imports as a "
    "scalar)",
}
