"""SDPA's masks, padding, ALiBi, grouped heads and dropout: the language's rules, its one canonical
form, and the reference against attention written out element by element."""

import math
import re
from pathlib import Path

import pytest
import torch

from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import drawn_values, run_reference
from cudnn_dsl.store.keys import graph_digest
from dsl.diagnostics import DslError
from dsl.pipeline import program
from dsl.syntax.printer import dump_ir

DECLS = {
    "q": "half[2, 4, 5, 8]",
    "k": "half[2, 2, 7, 8]",
    "v": "half[2, 1, 7, 16]",
    "b": "half[1, 4, 5, 7]",
    "lq": "int32[2, 1, 1, 1]",
    "lkv": "int32[2, 1, 1, 1]",
    "dm": "half[2, 4, 5, 7]",
    "ds": "float[1, 1, 1, 1]",
    "sd": "int64[1, 1, 1, 1]",
    "so": "int64[1, 1, 1, 1]",
}


SEEDED = "dropout_seed=sd, dropout_offset=so"


def text(call: str, dtype: str = "half", stats: bool = False) -> str:
    used = [n for n in DECLS if n in "qkv" or f"{n}," in call + "," or f"={n}" in call or f" {n})" in call]
    decls = "".join(f"  input {n} : {DECLS[n].replace('half', dtype)}\n" for n in used)
    out = f"  o, st = {call}\n  output o\n  output st\n" if stats else f"  output o = {call}\n"
    return f"graph s {{\n{decls}{out}}}\n"


def graph(call: str, **kw):
    return program(text=text(call, **kw), file="s.cdg").graphs[0]


def error(call: str) -> str:
    with pytest.raises(DslError) as e:
        graph(call)
    return str(e.value)


# ---- one canonical form ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spellings,attrs",
    [
        (
            ["causal=true", "right_bound=0", "right_bound=0, diagonal_alignment=top_left"],
            {"right_bound": 0, "left_bound": None, "diagonal_alignment": "top_left"},
        ),
        (
            ["causal_bottom_right=true", "right_bound=0, diagonal_alignment=BOTTOM_RIGHT"],
            {"right_bound": 0, "left_bound": None, "diagonal_alignment": "bottom_right"},
        ),
        (
            ["causal=true, sliding_window_length=3", "left_bound=3, right_bound=0", "causal=true, left_bound=3"],
            {"right_bound": 0, "left_bound": 3, "diagonal_alignment": "top_left"},
        ),
        (
            ["diagonal_alignment=top_left", "causal=false", ""],
            {"right_bound": None, "left_bound": None, "diagonal_alignment": "top_left"},
        ),
    ],
)
def test_every_spelling_of_a_mask_is_one_graph(spellings, attrs):
    graphs = [graph(f"sdpa(q, k, v, b{', ' + s if s else ''})") for s in spellings]
    assert len({graph_digest(g, g.instances[0]) for g in graphs}) == 1
    a = graphs[0].instances[0].attrs(0)
    assert {k: a[k] for k in attrs} == attrs
    assert not {"causal", "causal_bottom_right", "sliding_window_length"} & set(a)  # folded away


def test_an_alignment_without_a_band_stays_bottom_right():
    """As a hand-written frontend graph sets it: the IR, the lowered call and the frontend's JSON keep it, the
    import gives it back, and the reference is the unmasked attention (no bound for it to shift)."""
    from cudnn_dsl.interop.emit import emit_cudnn
    from dsl.pipeline import load

    src = text("sdpa(q, k, v, causal=false, diagonal_alignment=BOTTOM_RIGHT)")
    r = load(text=src, file="s.cdg")
    assert r.ok and r.diagnostics == (), r.render()
    g = r.program.graphs[0]
    assert g.instances[0].attrs(0)["diagonal_alignment"] == "bottom_right"
    assert len({graph_digest(x, x.instances[0]) for x in (g, graph("sdpa(q, k, v)"))}) == 2
    script = emit_cudnn(g, g.instances[0])
    assert "diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT" in script
    assert "diagonal_band_" not in script
    ins, out, scale = reference("sdpa(q, k, v, diagonal_alignment=bottom_right, stats=true)")
    close(out, by_hand(ins, scale))
    padded = "sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, diagonal_alignment=bottom_right, stats=true)"
    ins, out, scale = reference(padded, lens=([3, 5], [6, 7]))
    close(out, by_hand(ins, scale, bottom_right=True))


def test_an_unknown_argument_lists_the_optional_inputs_beside_the_attributes():
    message = error("sdpa(q, k, v, atn_mask=b)")
    assert "s.cdg:6:28: error: sdpa: unknown argument 'atn_mask'" in message
    assert "; it takes attributes scale, diagonal_alignment, " in message
    assert " and the optional inputs bias, seq_len_q, seq_len_kv, dropout_mask, " in message


def test_optional_inputs_by_position_or_by_name_are_one_graph():
    a = program(text=text("sdpa(q, k, v, b, lq, lkv)"), file="s.cdg")
    b = program(text=text("sdpa(q, k, v, seq_len_kv=lkv, bias=b, seq_len_q=lq)"), file="s.cdg")
    assert dump_ir(a) == dump_ir(b)
    assert "sdpa(%q, %k, %v, %b, %lq, %lkv, _, _, _, _, _, _, _, _, _, _, _, _, _)" in dump_ir(a)


# ---- shape and dtype rules, located --------------------------------------------------------------


@pytest.mark.parametrize(
    "call,words,col",
    [
        ("sdpa(q, k, v, causal=true, right_bound=2)", "'causal' is right_bound=0, but right_bound=2", "right_bound=2"),
        ("sdpa(q, k, v, causal=true, causal_bottom_right=true)", "two alignments of one mask", "causal_bottom_right"),
        (
            "sdpa(q, k, v, causal_bottom_right=true, diagonal_alignment=top_left)",
            "is diagonal_alignment=bottom_right, but top_left is given",
            "diagonal_alignment",
        ),
        ("sdpa(q, k, v, sliding_window_length=4, left_bound=2)", "is left_bound=4, but left_bound=2", "left_bound=2"),
        ("sdpa(q, k, v, left_bound=0)", "'left_bound' must be >= 1", "0"),
        ("sdpa(q, k, v, right_bound=-1)", "must be >= 0", "-1"),
        ("sdpa(q, k, v, seq_len_q=lq)", "seq_len_q needs seq_len_kv too", "lq"),
        ("sdpa(q, k, v, seq_len_q=lq, seq_len_kv=q)", "seq_len_kv must be int32[2, 1, 1, 1]", "q)"),
        ("sdpa(q, k, v, dropout_mask=dm)", "dropout_mask needs dropout_scale too", "dm"),
        ("sdpa(q, k, v, dropout_mask=dm, dropout_scale=dm)", "dropout_scale [2, 4, 5, 7] must be [1, 1, 1, 1]", "dm)"),
        ("sdpa(q, k, v, dropout_mask=lq, dropout_scale=ds)", "dropout_mask is int32; it must be a float type", "lq"),
        ("sdpa(q, k, v, dropout_seed=sd, dropout_offset=so)", "dropout_seed is for seeded dropout", "sd,"),
        (
            "sdpa(q, k, v, dropout_probability=0.1, dropout_seed=sd)",
            "needs dropout_seed and dropout_offset",
            "dropout_p",
        ),
        (f"sdpa(q, k, v, dropout_probability=1, {SEEDED})", "dropout_probability must be below 1", "dropout_p"),
        (f"sdpa(q, k, v, dropout_probability=-0.5, {SEEDED})", "must be >= 0", "-0.5"),
        (
            "sdpa(q, k, v, dropout_probability=0.1, dropout_seed=sd, dropout_offset=lq)",
            "int64[1, 1, 1, 1], got int32",
            "lq",
        ),
        (
            f"sdpa(q, k, v, dropout_mask=dm, dropout_scale=ds, dropout_probability=0.1, {SEEDED})",
            "two forms",
            "dropout_p",
        ),
        ("sdpa(q, k, v, b, bias=b)", "input 'bias' given twice", "bias=b"),
        ("sdpa(q, k, v, seq_len_q=3, seq_len_kv=lkv)", "input 'seq_len_q' takes a tensor's name", "3"),
        ("sdpa(q, dm, v)", "head dim differs: q has D=8, k has D=7", "dm"),
    ],
)
def test_a_bad_sdpa_is_refused_where_it_is_wrong(call, words, col):
    msg = error(call)
    assert words in msg
    line, column = map(int, next(m for m in msg.splitlines() if "error:" in m).split(":")[1:3])
    assert text(call).splitlines()[line - 1][column - 1 :].startswith(col)


def test_grouped_heads_must_divide_the_query_heads():
    text_ = (
        "graph s {\n  input q : half[1, 6, 8, 8]\n  input k : half[1, 4, 8, 8]\n  input v : half[1, 4, 8, 8]\n"
        "  output o = sdpa(q, k, v)\n}\n"
    )
    with pytest.raises(DslError, match="k has 4 heads, which do not divide q's 6"):
        program(text=text_, file="s.cdg")


def test_stats_are_float_whatever_the_io():
    g = graph("sdpa(q, k, v, causal=true, stats=true)", stats=True)
    assert g.instances[0].type("st").dtype == "float" and g.instances[0].type("st").shape == (2, 4, 5, 1)
    bad = text("sdpa(q, k, v, stats=true)", stats=True).replace("output st", "output st : half")
    with pytest.raises(DslError, match="output 'st' is declared half but sdpa gives float"):
        program(text=bad, file="s.cdg")


def test_generated_sequence_lengths_are_valid():
    g = graph("sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv)")
    for seed in range(20):
        ins = generate_inputs(g, g.instances[0], "cpu", seed=seed)
        assert 1 <= int(ins["lq"].min()) and int(ins["lq"].max()) <= 5
        assert 1 <= int(ins["lkv"].min()) and int(ins["lkv"].max()) <= 7


def test_flops_count_only_the_pairs_the_band_lets_through():
    from dsl.ops import OPS, Ctx

    g = graph("sdpa(q, k, v, left_bound=2, right_bound=0)")
    inst = g.instances[0]
    ins = tuple(inst.type(n) if n else None for n in g.nodes[0].inputs)
    pairs = sum(1 for i in range(5) for j in range(7) if i - 2 < j <= i)
    assert OPS["sdpa"].count_flops(Ctx("sdpa", ins, inst.attrs(0)), []) == 2 * 2 * 4 * pairs * (8 + 16)


# ---- the reference, against attention written out element by element ---------------------------


def by_hand(ins, scale, *, left=None, right=None, bottom_right=False, alibi=False, bias=None, drop=None):
    """Loops over (batch, head, query) with every rule spelt out: GQA by integer division of the head,
    keys past seq_len_kv and queries past seq_len_q masked, the band measured from the diagonal that
    starts at (0, 0) or ends at (seq_len_q - 1, seq_len_kv - 1)."""
    q, k, v = ins["q"].double(), ins["k"].double(), ins["v"].double()
    b_, h, sq, _ = q.shape
    skv = k.shape[2]
    o = torch.zeros(b_, h, sq, v.shape[3], dtype=torch.float64)
    st = torch.full((b_, h, sq, 1), float("-inf"), dtype=torch.float64)
    n = 2 ** math.floor(math.log2(h))
    slopes = [2 ** (-8 * (i + 1) / n) for i in range(n)] + [2 ** (-4 * (2 * i + 1) / n) for i in range(h - n)]
    for bi in range(b_):
        lq = int(ins["lq"][bi]) if "lq" in ins else sq
        lkv = int(ins["lkv"][bi]) if "lkv" in ins else skv
        shift = lkv - lq if bottom_right else 0
        for hi in range(h):
            kh, vh = hi // (h // k.shape[1]), hi // (h // v.shape[1])
            for i in range(lq):
                keys = [
                    j
                    for j in range(lkv)
                    if (right is None or j - i - shift <= right) and (left is None or j - i - shift > -left)
                ]
                if not keys:
                    continue
                s = torch.stack([q[bi, hi, i] @ k[bi, kh, j] * scale for j in keys])
                if bias is not None:
                    s = s + torch.stack([bias[0, hi, i, j].double() for j in keys])
                if alibi:
                    s = s + torch.tensor([(j - i) * slopes[hi] for j in keys], dtype=torch.float64)
                p = torch.softmax(s, 0)
                st[bi, hi, i, 0] = torch.logsumexp(s, 0)
                if drop is not None:
                    p = p * torch.stack([drop[0][bi, hi, i, j].double() for j in keys]) * drop[1]
                o[bi, hi, i] = sum(p[n_] * v[bi, vh, j] for n_, j in enumerate(keys))
    return o, st


def reference(call: str, lens=None, **given):
    """The reference on seeded inputs (sequence lengths and other tensors as given), and the scale."""
    g = graph(call, dtype="float", stats=True)
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed=3)
    if lens is not None:
        ins["lq"] = torch.tensor(lens[0], dtype=torch.int32).view(2, 1, 1, 1)
        ins["lkv"] = torch.tensor(lens[1], dtype=torch.int32).view(2, 1, 1, 1)
    ins.update(given)
    return ins, run_reference(g, inst, ins, "cpu"), inst.attrs(0)["scale"]


def close(out, want):
    torch.testing.assert_close(out["o"].double(), want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["st"].double(), want[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "extra,band",
    [
        ("causal=true", {"right": 0}),
        ("left_bound=3, right_bound=1", {"left": 3, "right": 1}),
        ("causal_bottom_right=true", {"right": 0, "bottom_right": True}),
        ("left_bound=2, right_bound=0, diagonal_alignment=bottom_right", {"left": 2, "right": 0, "bottom_right": True}),
        ("sliding_window_length=2", {"left": 2}),
    ],
)
def test_band_masks_by_hand(extra, band):
    ins, out, scale = reference(f"sdpa(q, k, v, {extra}, stats=true)")
    close(out, by_hand(ins, scale, **band))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_padding_with_a_band_by_hand(align):
    # batch 0 is padded on both sides, batch 1 on neither
    ins, out, scale = reference(
        f"sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, left_bound=3, right_bound=0, diagonal_alignment={align}, "
        "stats=true)",
        lens=([3, 5], [6, 7]),
    )
    close(out, by_hand(ins, scale, left=3, right=0, bottom_right=align == "bottom_right"))
    assert (out["o"][0, :, 3:] == 0).all() and out["st"][0, :, 3:].isneginf().all()  # padded query rows


def test_alibi_bias_and_grouped_heads_by_hand():
    ins, out, scale = reference("sdpa(q, k, v, b, alibi=true, causal=true, stats=true)")
    close(out, by_hand(ins, scale, right=0, alibi=True, bias=ins["b"]))


def test_alibi_slopes_for_heads_not_a_power_of_two():
    from cudnn_dsl.ops.attention import _alibi

    slopes = [2 ** (-8 * i / 4) for i in (1, 2, 3, 4)] + [2 ** (-4 * i / 4) for i in (1, 3)]
    want = torch.tensor(slopes).view(1, 6, 1, 1) * (torch.arange(3).view(1, 3) - torch.arange(2).view(2, 1))
    torch.testing.assert_close(_alibi(torch.zeros(1, 6, 2, 3)), want)


def test_dropout_mask_and_scale_by_hand():
    mask = (torch.rand(2, 4, 5, 7, generator=torch.Generator().manual_seed(0)) > 0.25).float()
    scale = torch.full((1, 1, 1, 1), 1 / 0.75)
    ins, out, s = reference("sdpa(q, k, v, dropout_mask=dm, dropout_scale=ds, stats=true)", dm=mask, ds=scale)
    close(out, by_hand(ins, s, drop=(mask, 1 / 0.75)))


def test_the_compare_skips_only_the_padded_query_rows_of_o():
    from cudnn_dsl.run.compare import compare_outputs

    g = graph("sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, stats=true)", stats=True)
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed=0)
    ins["lq"] = torch.tensor([2, 5], dtype=torch.int32).view(2, 1, 1, 1)
    want = run_reference(g, inst, ins, "cpu")
    got = {k: v.clone() for k, v in want.items()}
    got["o"][0, :, 2:] = float("nan")  # what cuDNN leaves there is unspecified
    assert all(c.ok for c in compare_outputs(g, inst, got, want, g.options))
    got["st"][0, :, 2:] = 0.0  # the stats there are defined: -inf
    got["o"][1, :, 4:] = 7.0  # batch 1 has 5 valid rows: this one counts
    bad = {c.name: c.mismatches for c in compare_outputs(g, inst, got, want, g.options)}
    assert bad == {"o": 4 * 16, "st": 4 * 3}


# ---- deviceless: the real cuDNN library (9.28 here) plans each form for an H200 -----------------

PLANNED = {
    "q": "bf16[2, 8, 256, 128]",
    "k": "bf16[2, 2, 256, 128]",
    "v": "bf16[2, 2, 256, 64]",
    "lq": "int32[2, 1, 1, 1]",
    "lkv": "int32[2, 1, 1, 1]",
    "b": "bf16[1, 8, 256, 256]",
    "dm": "bf16[2, 8, 256, 256]",
    "ds": "float[1, 1, 1, 1]",
}


def planned(call: str):
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target

    used = [n for n in PLANNED if n in "qkv" or f"={n}" in call or f" {n}," in call]
    decls = "".join(f"  input {n} : {PLANNED[n]}\n" for n in used)
    g = program(text=f"graph p {{\n  io bf16\n{decls}  o, st = {call}\n  output o\n  output st\n}}\n", file="p.cdg")
    g = g.graphs[0]
    return compile_shape(g, g.instances[0], g.options, Target.named("h200"))


@pytest.mark.parametrize(
    "extra",
    [
        "causal=true, left_bound=64",
        "left_bound=32, right_bound=16",
        "causal_bottom_right=true",
        "diagonal_alignment=bottom_right",
        "seq_len_q=lq, seq_len_kv=lkv, causal=true, left_bound=64",
        "seq_len_q=lq, seq_len_kv=lkv, causal_bottom_right=true",
        "alibi=true, causal=true",
        "b, causal=true",
        "dropout_mask=dm, dropout_scale=ds",
    ],
)
def test_h200_plans_every_form(extra):
    assert planned(f"sdpa(q, k, v, {extra}, stats=true)").plan_count >= 1


def test_a_form_cudnn_refuses_is_reported_at_the_sdpa():
    with pytest.raises(DslError, match="alibi mask is used, diagonal_band_right_bound needs to be set to 0") as e:
        planned("sdpa(q, k, v, alibi=true, stats=true)")
    assert str(e.value).startswith("p.cdg:6:11: error: cuDNN validate failed for sdpa")  # at the op


# ---- paged K/V -----------------------------------------------------------------------------------

PAGED = (
    "graph p {{\n  input q : float[2, 4, 5, 8]\n  input kc : float[{n}, 2, {block}, 8]\n"
    "  input vc : float[{n}, 2, {block}, 16]\n  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
    "  input tk : int32[2, 1, {pages}, 1]\n  input tv : int32[2, 1, {pages}, 1]\n"
    "  o, st = sdpa(q, kc, vc, seq_len_q=lq, seq_len_kv=lkv, page_table_k=tk, page_table_v=tv{extra})\n"
    "  output o\n  output st\n}}\n"
)


def paged(n=6, block=3, pages=3, extra=", causal_bottom_right=true, stats=true"):
    return program(text=PAGED.format(n=n, block=block, pages=pages, extra=extra), file="p.cdg").graphs[0]


def test_paged_caches_give_the_attention_of_the_dense_keys():
    # 2 sequences of up to 3 pages of 3 keys: 9 keys, cut to max_seq_len_kv=7
    g = paged(extra=", causal_bottom_right=true, stats=true, max_seq_len_kv=7")
    inst = g.instances[0]
    assert inst.attrs(0)["max_seq_len_kv"] == 7 and inst.type("o").shape == (2, 4, 5, 16)
    ins = generate_inputs(g, inst, "cpu", seed=5)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(1))  # block i of the dense keys -> order[i]
    dense_k, dense_v = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 16)
    ins["kc"], ins["vc"] = torch.empty(6, 2, 3, 8), torch.empty(6, 2, 3, 16)
    for b in range(2):
        for p in range(3):
            ins["kc"][order[3 * b + p]] = dense_k[b, :, 3 * p : 3 * p + 3]
            ins["vc"][order[3 * b + p]] = dense_v[b, :, 3 * p : 3 * p + 3]
    ins["tk"] = ins["tv"] = order.view(2, 1, 3, 1).to(torch.int32)
    ins["lq"] = torch.tensor([4, 5], dtype=torch.int32).view(2, 1, 1, 1)
    ins["lkv"] = torch.tensor([6, 7], dtype=torch.int32).view(2, 1, 1, 1)
    out = run_reference(g, inst, ins, "cpu")
    dense = {"q": ins["q"], "k": dense_k[:, :, :7], "v": dense_v[:, :, :7], "lq": ins["lq"], "lkv": ins["lkv"]}
    close(out, by_hand(dense, inst.attrs(0)["scale"], right=0, bottom_right=True))


PLAIN_PAGED = PAGED.format(n=6, block=3, pages=3, extra=", stats=true")


def test_generated_page_tables_index_the_caches():
    g = paged(n=5)
    for seed in range(10):
        ins = generate_inputs(g, g.instances[0], "cpu", seed=seed)
        assert 0 <= int(ins["tk"].min()) and int(ins["tk"].max()) <= 4
        assert 1 <= int(ins["lkv"].min()) and int(ins["lkv"].max()) <= 9  # max_seq_len_kv: 3 pages of 3


def test_generated_page_tables_are_a_permutation_of_the_blocks():
    """Distinct blocks while the cache has enough (drawn as any int32, they were random and negative too)."""
    for n, used in ((6, list(range(6))), (9, None), (4, list(range(4)))):
        g = paged(n=n)
        tk = generate_inputs(g, g.instances[0], "cpu", seed=3)["tk"].flatten().tolist()
        assert len(set(tk)) == min(n, 6) and all(0 <= b < n for b in tk), (n, tk)
        assert used is None or sorted(set(tk)) == used


@pytest.mark.parametrize(
    "name, values, words",
    [
        ("tk", [0, 1, 2, 3, 4, -1], "'tk' (page_table_k of sdpa): element [1, 0, 2, 0] is -1, outside 0 to 5"),
        ("tv", [0, 1, 2, 6, 4, 5], "'tv' (page_table_v of sdpa): element [1, 0, 0, 0] is 6, outside 0 to 5"),
        ("lkv", [9, 10], "'lkv' (seq_len_kv of sdpa): element [1, 0, 0, 0] is 10, outside 1 to 9"),
        ("lq", [0, 5], "'lq' (seq_len_q of sdpa): element [0, 0, 0, 0] is 0, outside 1 to 5"),
    ],
)
def test_bound_index_inputs_are_checked_before_the_reference_and_the_torch_op(name, values, words):
    import cudnn_dsl
    from cudnn_dsl.run.buffers import BindingError

    cg = cudnn_dsl.compile(text=PLAIN_PAGED)
    ins = cg.allocate_inputs()
    ins[name] = torch.tensor(values, dtype=torch.int32).view(ins[name].shape)
    line = PLAIN_PAGED.splitlines().index(next(r for r in PLAIN_PAGED.splitlines() if f" {name} :" in r)) + 1
    for call in (cg.reference, cudnn_dsl.as_torch_op(cg)):  # the op's CPU kernel is the reference
        with pytest.raises(BindingError, match=re.escape(words)) as e:
            call(**ins)
        assert e.value.loc.line == line


@pytest.mark.parametrize(
    "text_,words",
    [
        (PAGED.format(n=6, block=3, pages=3, extra=", stats=true, max_seq_len_kv=10"), "has 3 pages of 3 keys"),
        (PLAIN_PAGED.replace("tv : int32", "tv : int64"), "page_table_v must be int32"),
        (PLAIN_PAGED.replace(", page_table_v=tv", ""), "page_table_k needs page_table_v too"),
        (PLAIN_PAGED.replace("seq_len_q=lq, seq_len_kv=lkv, ", ""), "paged K/V needs seq_len_q and seq_len_kv"),
        (text("sdpa(q, k, v, max_seq_len_kv=8)"), "max_seq_len_kv is for paged K/V"),
    ],
    ids=["too-few-pages", "int64-table", "one-table", "no-lengths", "not-paged"],
)
def test_a_bad_paged_sdpa_is_refused(text_, words):
    with pytest.raises(DslError, match=words):
        program(text=text_, file="p.cdg")


def test_h200_plans_paged_caches():
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target

    text_ = PAGED.format(n=64, block=64, pages=8, extra=", causal=true, stats=true").replace("float[", "bf16[")
    text_ = text_.replace("8]", "128]").replace("16]", "128]").replace("[2, 4, 5,", "[2, 8, 256,")
    g = program(text=text_, file="p.cdg").graphs[0]
    assert compile_shape(g, g.instances[0], g.options, Target.named("h200")).plan_count >= 1


# ---- ragged (packed, THD) sequences --------------------------------------------------------------

RAGGED = (
    "graph r {{\n  input q : {dt}[2, 2, 5, 8] strides [80, 8, 16, 1]\n"
    "  input k : {dt}[2, 1, 6, 8] strides [48, 8, 8, 1]\n  input v : {dt}[2, 1, 6, 4] strides [24, 4, 4, 1]\n"
    "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
    "  input rq : int64[3, 1, 1, 1]\n  input rk : int64[3, 1, 1, 1]\n  input rv : int64[3, 1, 1, 1]\n"
    "  input ro : int64[3, 1, 1, 1]\n  input rs : int32[3, 1, 1, 1]\n"
    "  o, st = sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, stats=true{extra},\n"
    "               ragged_q=rq, ragged_k=rk, ragged_v=rv, ragged_o=ro, ragged_stats=rs)\n"
    "  output o\n  output st\n}}\n"
)


def ragged(extra=", causal=true", dt="float", offsets="[3, 1, 1, 1]"):
    """The graph RAGGED, its offsets declared `offsets`: [3, 1, 1, 1], or [3] as flashinfer passes them."""
    text_ = RAGGED.format(dt=dt, extra=extra).replace("[3, 1, 1, 1]", offsets)
    return program(text=text_, file="r.cdg").graphs[0]


def flat(t: torch.Tensor) -> torch.Tensor:
    """t's whole buffer, in memory order."""
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)


def test_generated_ragged_offsets_pack_the_sequences_back_to_back():
    g = ragged()
    inst = g.instances[0]
    assert inst.type("o").strides == (40, 4, 8, 1) and inst.type("st").strides == (10, 1, 2, 1)  # BSHD
    ins = generate_inputs(g, inst, "cpu", seed=4)
    lq, lkv = ins["lq"].flatten().long(), ins["lkv"].flatten().long()
    for name, lengths, row in (("rq", lq, 16), ("rk", lkv, 8), ("rv", lkv, 4), ("ro", lq, 8), ("rs", lq, 2)):
        want = torch.cat((torch.zeros(1, dtype=torch.long), (lengths * row).cumsum(0)))
        assert ins[name].flatten().tolist() == want.tolist(), name


def test_run_packs_the_offsets_of_lengths_given_by_input(tmp_path):
    """`run --input lq=FILE`: the offsets pack the given lengths, not the drawn ones the file replaced (longer
    given sequences overran the packed room, the last one past the end of the buffers)."""
    from cudnn_dsl.debug import dump
    from tests.cli_util import run_cli

    f = tmp_path / "r.cdg"
    f.write_text(RAGGED.format(dt="float", extra=", causal=true"))
    lengths = tmp_path / "lq.pt"
    torch.save(torch.tensor([5, 4], dtype=torch.int32).view(2, 1, 1, 1), lengths)
    p = run_cli("run", str(f), "--input", f"lq={lengths}", "--dump", str(tmp_path / "d"))
    assert p.returncode == 0, p.stdout + p.stderr
    g = program(text=f.read_text(), file=str(f)).graphs[0]
    ins = dump.read_tensors(tmp_path / "d", g, g.instances[0], "inputs")
    assert ins["lq"].flatten().tolist() == [5, 4]
    assert ins["rq"].flatten().tolist() == [0, 80, 144] and ins["ro"].flatten().tolist() == [0, 40, 72]
    want = generate_inputs(g, g.instances[0], "cpu", 0)  # what is not given is as drawn
    assert torch.equal(ins["lkv"], want["lkv"]) and torch.equal(ins["rk"], want["rk"])


@pytest.mark.parametrize(
    "name, values, words",
    [
        ("rq", [-16, 64, 144], "'rq' (ragged_q of sdpa): element [0, 0, 0, 0] is -16; an offset is at least 0"),
        (
            "rq",
            [64, 0, 80],
            "'rq' (ragged_q of sdpa): sequence 0 of 'q' (3 rows of 'lq', from element 64) ends at element 112, past "
            "element [1, 0, 0, 0], 0, where the next starts",
        ),
        ("ro", [0, 24, 81], "'ro' (ragged_o of sdpa): element [2, 0, 0, 0] is 81, past the end of 'o' (80 elements)"),
        (
            "rs",
            [0, 6, 12],
            "'rs' (ragged_stats of sdpa): sequence 1 of 'st' (5 rows of 'lq', from element 6) ends at element 16",
        ),
    ],
)
def test_ragged_offsets_are_checked_before_the_reference(name, values, words):
    import cudnn_dsl
    from cudnn_dsl.run.buffers import BindingError

    cg = cudnn_dsl.compile(text=RAGGED.format(dt="float", extra=", causal=true"))
    ins = cg.allocate_inputs()
    cg.reference(**ins)  # packed from the drawn lengths: inside
    ins["lq"] = torch.tensor([3, 5], dtype=torch.int32).view(2, 1, 1, 1)
    for packed, offsets in (("rq", [0, 48, 128]), ("ro", [0, 24, 64]), ("rs", [0, 6, 16]), (name, values)):
        ins[packed] = torch.tensor(offsets, dtype=ins[packed].dtype).view(3, 1, 1, 1)
    with pytest.raises(BindingError, match=re.escape(words)):
        cg.reference(**ins)


def test_run_checks_index_inputs_given_by_file_and_from_a_dump(tmp_path):
    """`run --input` and `run --inputs-from`: a block index past the cache is refused at its declaration
    before the reference reads it (the reference indexed the cache with it; -1 read the last block)."""
    from tests.cli_util import run_cli

    f = tmp_path / "p.cdg"
    f.write_text(PLAIN_PAGED)
    bad = tmp_path / "tk.pt"
    torch.save(torch.tensor([0, 1, 2, 3, 4, -1], dtype=torch.int32).view(2, 1, 3, 1), bad)
    p = run_cli("run", str(f), "--input", f"tk={bad}")
    assert p.returncode == 1 and f"{f}:7:3: error: 'tk' (page_table_k of sdpa): element [1, 0, 2, 0] is -1" in p.stderr
    d = tmp_path / "d"
    assert run_cli("run", str(f), "--dump", str(d)).returncode == 0
    dumped = torch.load(d / "p.inputs.pt")
    dumped["tv"] = torch.tensor([6, 1, 2, 3, 4, 5], dtype=torch.int32).view(2, 1, 3, 1)
    torch.save(dumped, d / "p.inputs.pt")
    p = run_cli("run", str(f), "--inputs-from", str(d))
    assert p.returncode == 1 and "'tv' (page_table_v of sdpa): element [0, 0, 0, 0] is 6, outside 0 to 5" in p.stderr


def test_one_offset_input_packs_only_tensors_of_equal_rows():
    from cudnn_dsl.run.buffers import BindingError

    text_ = RAGGED.format(dt="float", extra="").replace("ragged_o=ro", "ragged_o=rv").replace("  input ro", "#")
    g = program(text=text_, file="r.cdg").graphs[0]  # v's rows hold 4 elements, o's 2 heads of 4
    with pytest.raises(BindingError, match="ragged offsets 'rv' place tensors whose sequences take different room"):
        generate_inputs(g, g.instances[0], "cpu")
    text_ = RAGGED.format(dt="float", extra="").replace("ragged_o=ro", "ragged_o=rq").replace("  input ro", "#")
    text_ = text_.replace("v : float[2, 1, 6, 4] strides [24, 4, 4, 1]", "v : float[2, 1, 6, 8] strides [48, 8, 8, 1]")
    g = program(text=text_, file="r.cdg").graphs[0]  # q and o: rows of 2 heads of 8
    ins = generate_inputs(g, g.instances[0], "cpu")
    assert ins["rq"].flatten().tolist() == [0, *(ins["lq"].flatten().long() * 16).cumsum(0).tolist()]


@pytest.mark.parametrize("offsets", ["[3, 1, 1, 1]", "[3]"])
@pytest.mark.parametrize("extra,band", [(", causal=true", {"right": 0}), (", left_bound=2", {"left": 2})])
def test_ragged_attention_is_each_packed_sequence_on_its_own(extra, band, offsets):
    """Sequences placed at chosen (not packed) offsets, with gaps: each one's attention by hand, from its
    rows of the buffers, lands at its rows of O's and the stats' buffers; nothing else is compared. Offsets
    [B+1] and [B+1, 1, 1, 1] are one thing."""
    g = ragged(extra, offsets=offsets)
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed=6)
    lens_q, lens_kv = [3, 5], [6, 2]
    ins["lq"] = torch.tensor(lens_q, dtype=torch.int32).view(2, 1, 1, 1)
    ins["lkv"] = torch.tensor(lens_kv, dtype=torch.int32).view(2, 1, 1, 1)
    starts = {"rq": [80, 0], "rk": [40, 0], "rv": [0, 30], "ro": [40, 0], "rs": [4, 10]}
    for name, (a, b) in starts.items():
        ins[name] = torch.tensor([a, b, 0], dtype=ins[name].dtype).view(ins[name].shape)
    out = run_reference(g, inst, ins, "cpu")
    o_buf, st_buf = torch.zeros(80), torch.zeros(20)
    o_buf.as_strided((2, 2, 5, 4), (40, 4, 8, 1)).copy_(out["o"])
    st_buf.as_strided((2, 2, 5, 1), (10, 1, 2, 1)).copy_(out["st"])
    written_o, written_st = torch.zeros(80, dtype=torch.bool), torch.zeros(20, dtype=torch.bool)
    scale = inst.attrs(0)["scale"]
    for b in range(2):
        lq, lkv = lens_q[b], lens_kv[b]

        def rows(name, length, heads, d, b=b):
            return flat(ins[name[1]])[starts[name][b] :][: length * heads * d].view(length, heads, d)

        seq = {
            "q": rows("rq", lq, 2, 8).transpose(0, 1)[None],
            "k": rows("rk", lkv, 1, 8).transpose(0, 1)[None],
            "v": rows("rv", lkv, 1, 4).transpose(0, 1)[None],
        }
        o, st = by_hand(seq, scale, **band)
        o_at = starts["ro"][b] + torch.arange(lq * 2 * 4)
        st_at = starts["rs"][b] + torch.arange(lq * 2)
        torch.testing.assert_close(o_buf[o_at].double(), o[0].transpose(0, 1).flatten(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(st_buf[st_at].double(), st[0].transpose(0, 1).flatten(), atol=1e-5, rtol=1e-5)
        written_o[o_at], written_st[st_at] = True, True
    unspecified_o = torch.zeros(80, dtype=torch.bool)
    unspecified_o.as_strided((2, 2, 5, 4), (40, 4, 8, 1)).copy_(out.undefined["o"])
    unspecified_st = torch.zeros(20, dtype=torch.bool)
    unspecified_st.as_strided((2, 2, 5, 1), (10, 1, 2, 1)).copy_(out.undefined["st"])
    assert torch.equal(unspecified_o, ~written_o) and torch.equal(unspecified_st, ~written_st)


BAD_RAGGED = RAGGED.format(dt="float", extra="")


@pytest.mark.parametrize(
    "text_,words,at",
    [
        (
            BAD_RAGGED.replace("rk : int64[3,", "rk : int64[2,"),
            "ragged_k must be int32 or int64\\[3\\] \\(or \\[3, 1, 1, 1\\]\\)",
            "rk",
        ),
        (BAD_RAGGED.replace("rv : int64", "rv : float"), "ragged_v must be int32 or int64", "rv"),
        (
            BAD_RAGGED.replace("seq_len_q=lq, seq_len_kv=lkv, ", "")
            .replace("  input lq", "#")
            .replace("  input lkv", "#"),
            "ragged_q needs seq_len_q and seq_len_kv",
            "rq",
        ),
        (
            BAD_RAGGED.replace("stats=true", "stats=false").replace("o, st =", "o =").replace("  output st\n", ""),
            "need stats=true",
            "rs",
        ),
        (BAD_RAGGED.replace("strides [80, 8, 16, 1]", ""), "packs q as BSHD \\(THD\\): its strides", "rq"),
    ],
    ids=["shape", "dtype", "no-lengths", "stats-off", "bhsd-q"],
)
def test_a_bad_ragged_sdpa_is_refused_at_its_offset(text_, words, at):
    with pytest.raises(DslError, match=words) as e:
        program(text=text_, file="r.cdg")
    line, col = (int(x) for x in re.match(r"r\.cdg:(\d+):(\d+):", str(e.value)).groups())
    assert text_.splitlines()[line - 1][col - 1 :].startswith(at)  # the caret is at the offset


def test_ragged_paged_keys_are_refused():
    text_ = (
        PLAIN_PAGED.replace("  output o\n", "  output o\n")
        .replace("page_table_v=tv", "page_table_v=tv, ragged_k=rk")
        .replace("  input tk", "  input rk : int64[3, 1, 1, 1]\n  input tk")
    )
    with pytest.raises(DslError, match="ragged_k: paged k and v are caches of blocks"):
        program(text=text_, file="p.cdg")


@pytest.mark.parametrize("offsets", ["[5, 1, 1, 1]", "[5]"])
@pytest.mark.parametrize("stats", [False, True])
def test_h200_plans_ragged_attention(stats, offsets):
    """1-D offsets reach cuDNN as [B+1, 1, 1, 1] (it declines them at rank 3, `MIN_RANK`'s padding: 'ragged dim
    should match dim value + 1 of original tensor. All other offset dim values should be singleton')."""
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target

    path = Path(__file__).parent.parent / "examples" / "sdpa_ragged.cdg"
    text_ = path.read_text()
    if stats:  # the stats packed too, with int32 offsets of their own
        text_ = text_.replace("  o = sdpa(", "  input offset_st : int32[5, 1, 1, 1]\n  o, st = sdpa(")
        text_ = text_.replace("ragged_o=offset_q)", "ragged_o=offset_q, stats=true, ragged_stats=offset_st)")
        text_ = text_.replace("  output o\n", "  output o\n  output st\n")
    g = program(text=text_.replace("[5, 1, 1, 1]", offsets), file=str(path)).graphs[0]
    assert compile_shape(g, g.instances[0], g.options, Target.named("h200")).plan_count >= 1


SHARED = Path(__file__).parent.parent / "examples" / "sdpa_ragged_paged.cdg"


def _shared_small() -> str:
    """examples/sdpa_ragged_paged.cdg at B=2, H=2, S=6, D=8 with caches of 5 blocks of 4 keys (pages of 3)."""
    text_ = SHARED.read_text()
    for old, new in (
        ("int32[48]", "int32[20]"),
        ("int32[4, 1, 1, 1] in meta at 4", "int32[2, 1, 1, 1] in meta at 4"),
        ("int32[4, 1, 1, 1]", "int32[2, 1, 1, 1]"),
        ("int32[5] in meta", "int32[3] in meta"),
        ("int32[4, 1, 8, 1] in meta at 16", "int32[2, 1, 3, 1] in meta at 12"),
        ("bf16[4, 8, 256, 128] strides [262144, 128, 1024, 1]", "float[2, 2, 6, 8] strides [96, 8, 16, 1]"),
        ("bf16[32, 2, 64, 128]", "float[5, 1, 4, 8]"),
    ):
        text_ = text_.replace(old, new)
    return text_.replace("io bf16", "io float")


def test_index_inputs_in_one_shared_allocation_are_drawn_and_checked_through_their_views():
    """The lengths, 1-D offsets and page table of examples/sdpa_ragged_paged.cdg as views of one int32 buffer:
    each drawn with its op's values and the offsets packed from the drawn lengths, the reference the same as
    with each a tensor of its own (the same values), and a value out of bounds refused at its view."""
    from cudnn_dsl.run.buffers import BindingError
    from cudnn_dsl.run.indices import check_indices

    g = program(text=_shared_small(), file="s.cdg").graphs[0]
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed=2)
    assert sorted(ins) == ["k_cache", "meta", "q", "v_cache"]
    meta = ins["meta"].tolist()
    lq, lkv, offsets, pages = meta[0:2], meta[4:6], meta[8:11], meta[12:18]
    assert all(1 <= n <= 6 for n in lq) and all(1 <= n <= 12 for n in lkv) and set(pages) <= set(range(5))
    assert offsets == [0, lq[0] * 16, (lq[0] + lq[1]) * 16]  # rows of 2 heads of 8, back to back
    check_indices(g, inst, ins)
    separate = (
        _shared_small()
        .replace("  buffer meta : int32[16]\n", "")
        .replace(" in meta at 0", "")
        .replace(" in meta at 4", "")
        .replace(" in meta at 8", "")
        .replace(" in meta at 12", "")
    )
    s = program(text=separate, file="s.cdg").graphs[0]
    plain = {k: v for k, v in ins.items() if k != "meta"}
    plain |= {
        "seq_q": ins["meta"][0:2].view(2, 1, 1, 1),
        "seq_kv": ins["meta"][4:6].view(2, 1, 1, 1),
        "offset_q": ins["meta"][8:11],
        "pages": ins["meta"][12:18].view(2, 1, 3, 1),
    }
    want = run_reference(s, s.instances[0], plain, "cpu")["o"]
    torch.testing.assert_close(run_reference(g, inst, ins, "cpu")["o"], want)
    ins["meta"][13] = 5  # a block past the cache of 5
    with pytest.raises(BindingError, match=r"'pages' \(page_table_v of sdpa\): element \[0, 0, 1, 0\] is 5, outside 0"):
        check_indices(g, inst, ins)


# ---- FP8 attention -------------------------------------------------------------------------------

FP8 = (
    "graph f {{\n  io fp8_e4m3\n  input q : {dt}[1, 2, 6, 16]\n  input k : {dt}[1, 1, 9, 16]\n"
    "  input v : {dt}[1, 1, 9, 8]\n"
    + "".join(f"  input {n} : {{sc}}\n" for n in ("dq", "dk", "dv", "ds", "ss", "so"))
    + "  o, amax, st = sdpa_fp8(q, k, v, dq, dk, dv, ds, ss, so{extra}, stats=true)\n"
    "  output o : float\n  output amax\n  output st\n}}\n"
)


def test_fp8_attention_by_hand():
    g = program(text=FP8.format(dt="fp8_e4m3", sc="float[1, 1, 1, 1]", extra=", causal=true"), file="f.cdg")
    g = g.graphs[0]
    inst = g.instances[0]
    assert [inst.type(n).shape for n in ("o", "amax", "st")] == [(1, 2, 6, 8), (1, 1, 1, 1), (1, 2, 6, 1)]
    ins = generate_inputs(g, inst, "cpu", seed=2)
    scales = {"dq": 0.5, "dk": 2.0, "dv": 0.25, "ds": 1 / 448, "ss": 448.0, "so": 4.0}
    ins.update({n: torch.full((1, 1, 1, 1), x) for n, x in scales.items()})
    out = run_reference(g, inst, ins, "cpu")
    q, k, v = (ins[n].double() for n in "qkv")
    scale = inst.attrs(0)["scale"]
    o = torch.zeros(1, 2, 6, 8, dtype=torch.float64)
    st = torch.zeros(1, 2, 6, 1, dtype=torch.float64)
    for h in range(2):
        for i in range(6):
            s = torch.stack([q[0, h, i] @ k[0, 0, j] * 0.5 * 2.0 * scale for j in range(i + 1)])
            p = torch.exp(s - s.max())
            p8 = (p * 448.0).to(torch.float8_e4m3fn).double() / 448
            o[0, h, i] = sum(p8[j] * v[0, 0, j] * 0.25 for j in range(i + 1)) / p.sum()
            st[0, h, i, 0] = s.max() + torch.log(p.sum())
    torch.testing.assert_close(out["o"].double(), o * 4.0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["amax"].double().flatten(), o.abs().max().view(1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out["st"].double(), st, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "dt,sc,words",
    [
        ("fp8_e5m2", "float[1, 1, 1, 1]", "q, k and v must be fp8_e4m3, got fp8_e5m2"),
        ("fp8_e4m3", "float[1, 1, 1, 2]", "descale_q must be float[1, 1, 1, 1]"),
        ("fp8_e4m3", "half[1, 1, 1, 1]", "descale_q must be float[1, 1, 1, 1], got half"),
    ],
)
def test_a_bad_fp8_attention_is_refused(dt, sc, words):
    with pytest.raises(DslError, match=re.escape(words)):
        program(text=FP8.format(dt=dt, sc=sc, extra=""), file="f.cdg")


def test_h200_plans_fp8_attention():
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target

    text_ = FP8.format(dt="fp8_e4m3", sc="float[1, 1, 1, 1]", extra=", causal=true")
    text_ = text_.replace("[1, 2, 6, 16]", "[2, 8, 256, 128]").replace("[1, 1, 9, 16]", "[2, 8, 256, 128]")
    text_ = text_.replace("[1, 1, 9, 8]", "[2, 8, 256, 128]").replace("output o : float", "output o")
    g = program(text=text_, file="f.cdg").graphs[0]
    assert compile_shape(g, g.instances[0], g.options, Target.named("h200")).plan_count >= 1


def test_h200_refuses_fp8_attention_with_a_bf16_o_at_the_op():
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target

    text_ = FP8.format(dt="fp8_e4m3", sc="float[1, 1, 1, 1]", extra="").replace("output o : float", "output o : bf16")
    g = program(text=text_.replace("[1, 1, 9, 8]", "[1, 1, 9, 16]"), file="f.cdg").graphs[0]
    with pytest.raises(DslError, match="HALF/BFLOAT16 output is only supported on Blackwell") as e:
        compile_shape(g, g.instances[0], g.options, Target.named("h200"))
    assert str(e.value).startswith("f.cdg:12:17: error: cuDNN create_execution_plans failed for sdpa_fp8")


# ---- seeded dropout: cuDNN draws the mask, the reference reads it --------------------------------


def test_seeded_dropout_returns_the_mask_cuDNN_draws_last():
    g = graph(f"sdpa(q, k, v, dropout_probability=0.25, {SEEDED}, stats=true)", stats=True)
    inst = g.instances[0]
    (mask,) = drawn_values(g, inst)
    assert g.nodes[0].outputs == ("o", "st", mask) and g.value(mask).kind == "virtual"
    assert inst.type(mask).shape == (2, 4, 5, 7) and inst.type(mask).dtype == "float"
    assert inst.attrs(0)["dropout_probability"] == 0.25
    named = program(text=text(f"sdpa(q, k, v, dropout_probability=0.25, {SEEDED})"), file="s.cdg")
    assert drawn_values(named.graphs[0], named.graphs[0].instances[0]) == ["sdpa_0"]
    assert drawn_values(graph("sdpa(q, k, v)"), graph("sdpa(q, k, v)").instances[0]) == []


def test_the_seeded_reference_is_the_mask_form_with_cudnn_s_mask():
    from cudnn_dsl.run.reference import NeedsDevice

    p = 0.25
    call = f"sdpa(q, k, v, dropout_probability={p}, {SEEDED}, stats=true)"
    g = graph(call, dtype="float", stats=True)
    inst = g.instances[0]
    ins = generate_inputs(g, inst, "cpu", seed=0)
    with pytest.raises(NeedsDevice, match="seeded dropout: the reference needs cuDNN's mask") as e:
        run_reference(g, inst, ins, "cpu")
    assert e.value.diagnostics[0].loc.line == text(call, stats=True).splitlines().index(f"  o, st = {call}") + 1
    assert "drawn on the GPU from the seed and offset" in str(e.value)
    mask = (torch.rand(2, 4, 5, 7, generator=torch.Generator().manual_seed(1)) > p).float()
    out = run_reference(g, inst, ins, "cpu", drawn={drawn_values(g, inst)[0]: mask})
    close(out, by_hand(ins, inst.attrs(0)["scale"], drop=(mask, 1 / (1 - p))))


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target, load_cudnn

    load_cudnn()
    return Target.named("h200")


@pytest.mark.parametrize("stats", [False, True])
def test_cudnn_9_28_plans_seeded_dropout_for_an_h200_with_the_mask_in_scratch_memory(stats, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    extra = ", stats=true" if stats else ""
    g = graph(f"sdpa(q, k, v, dropout_probability=0.1, {SEEDED}{extra})", dtype="bf16", stats=stats)
    low = compile_shape(g, g.instances[0], g.options, h200)
    mask = drawn_values(g, g.instances[0])[0]
    assert low.plan_count > 0 and low.scratch == {mask: g.value(mask).uid}


def test_a_mask_the_graph_outputs_is_no_scratch(h200):
    from cudnn_dsl.build.pipeline import compile_shape

    src = text(f"sdpa(q, k, v, dropout_probability=0.1, {SEEDED})", dtype="bf16")
    src = src.replace("  output o = sdpa", "  o, m = sdpa").replace("}\n", "  output o\n  output m\n}\n")
    g = program(text=src, file="s.cdg").graphs[0]
    assert compile_shape(g, g.instances[0], g.options, h200).scratch == {}


def test_run_without_a_gpu_says_the_seeded_reference_is_skipped(tmp_path):
    from tests.cli_util import run_cli

    f = tmp_path / "s.cdg"
    f.write_text(text(f"sdpa(q, k, v, dropout_probability=0.1, {SEEDED})", dtype="bf16"))
    p = run_cli("run", f)
    assert p.returncode == 0, p.stderr
    assert "skipped    the PyTorch reference: seeded dropout: the reference needs cuDNN's mask" in p.stdout
