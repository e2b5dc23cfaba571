"""Ragged (THD) attention over token buffers: tensors whose batch stride is left to the offsets (`strides [_, ...]`),
whose memory is one batch slice of S rows (the token capacity), not B * S."""

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cudnn_dsl.run.buffers import BindingError, check_binding
from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.pipeline import program

EXAMPLE = Path(__file__).parent.parent / "examples" / "sdpa_ragged_thd.cdg"

# B=3 sequences in a capacity of S=10 tokens; q 2 heads, k and v 1 (grouped), D=4
THD = (
    "graph r {{\n  input q : float[3, 2, 10, 4] strides [_, 4, 8, 1]\n"
    "  input k : float[3, 1, 10, 4] strides [_, 4, 4, 1]\n  input v : float[3, 1, 10, 4] strides [_, 4, 4, 1]\n"
    "  input lq : int32[3, 1, 1, 1]\n  input lkv : int32[3, 1, 1, 1]\n"
    "  input rq : int64[4]\n  input rk : int64[4]\n  input rs : int32[4]\n"
    "  o, st = sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, stats=true{extra}, ragged_q=rq, ragged_k=rk, ragged_v=rk, "
    "ragged_o=rq, ragged_stats=rs)\n"
    "  output o : float[3, 2, 10, 4] strides [_, 4, 8, 1]\n  output st : float[3, 2, 10, 1] strides [_, 1, 2, 1]\n}}\n"
)


def graph(extra=", causal=true"):
    return program(text=THD.format(extra=extra), file="r.cdg").graphs[0]


def tokens(thd: torch.Tensor, batch: int) -> torch.Tensor:
    """A [T, H, D] token buffer as the [B, H, T, D] tensor a `_` batch stride binds: every batch its memory."""
    return thd.transpose(0, 1).unsqueeze(0).expand(batch, -1, -1, -1)


def memory(t: torch.Tensor) -> torch.Tensor:
    """The [S, H, D] memory of a tensor whose batch stride is left to the offsets (batch 0 is all of it)."""
    return t[0].transpose(0, 1)


def test_a_left_batch_stride_takes_one_batch_slice_of_memory():
    """The type's batch stride is 0 and its storage S*H*D: the buffers `run` allocates hold the capacity, not B*S
    rows; generated lengths take their share of it and the offsets pack them back to back inside it."""
    g = graph()
    inst = g.instances[0]
    assert inst.type("q").strides == (0, 4, 8, 1) and inst.type("q").storage == 10 * 2 * 4
    assert inst.type("st").strides == (0, 1, 2, 1) and inst.type("st").storage == 10 * 2
    ins = generate_inputs(g, inst, "cpu", seed=5)
    for name, elements in (("q", 80), ("k", 40), ("v", 40)):
        assert ins[name].untyped_storage().nbytes() == elements * 4, name
    lq, lkv = ins["lq"].flatten().long(), ins["lkv"].flatten().long()
    assert int(lq.max()) <= 10 // 3 and int(lkv.max()) <= 10 // 3
    assert ins["rq"].tolist() == [0, *(lq * 8).cumsum(0).tolist()]
    assert ins["rs"].tolist() == [0, *(lq * 2).cumsum(0).tolist()]
    run_reference(g, inst, ins, "cpu")  # the generated offsets pass the checks


@pytest.mark.parametrize("extra,causal", [(", causal=true", True), ("", False)])
def test_the_reference_is_each_packed_sequence_by_torch(extra, causal):
    """Three sequences packed in token buffers of 10 rows: O's and the stats' rows of each are
    F.scaled_dot_product_attention (and logsumexp) of that sequence's rows alone; the rows past the last
    sequence are unspecified and nothing the reference reads there (NaN) reaches a written row."""
    g = graph(extra)
    inst = g.instances[0]
    lens_q, lens_kv = [2, 4, 3], [3, 1, 5]
    gen = torch.Generator().manual_seed(0)
    q_thd, k_thd, v_thd = (torch.randn(10, h, 4, generator=gen) for h in (2, 1, 1))
    q_thd[sum(lens_q) :], k_thd[sum(lens_kv) :], v_thd[sum(lens_kv) :] = float("nan"), float("nan"), float("nan")
    starts_q, starts_kv = [0, 2, 6, 9], [0, 3, 4, 9]
    ins = {
        "q": tokens(q_thd, 3),
        "k": tokens(k_thd, 3),
        "v": tokens(v_thd, 3),
        "lq": torch.tensor(lens_q, dtype=torch.int32).view(3, 1, 1, 1),
        "lkv": torch.tensor(lens_kv, dtype=torch.int32).view(3, 1, 1, 1),
        "rq": torch.tensor(starts_q) * 8,
        "rk": torch.tensor(starts_kv) * 4,
        "rs": torch.tensor(starts_q, dtype=torch.int32) * 2,
    }
    out = run_reference(g, inst, ins, "cpu")
    o, st = memory(out["o"]), memory(out["st"])
    scale = inst.attrs(0)["scale"]
    for b in range(3):
        rows_q = slice(starts_q[b], starts_q[b] + lens_q[b])
        rows_kv = slice(starts_kv[b], starts_kv[b] + lens_kv[b])
        qs = q_thd[rows_q].transpose(0, 1)[None].double()
        ks, vs = (x[rows_kv].transpose(0, 1)[None].double().repeat_interleave(2, 1) for x in (k_thd, v_thd))
        mask = torch.ones(lens_q[b], lens_kv[b], dtype=torch.bool)
        mask = mask.tril() if causal else mask  # top-left aligned, as cuDNN's causal mask
        want = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
        scores = (qs @ ks.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(o[rows_q].double(), want[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
        lse = torch.logsumexp(scores, -1, keepdim=True)[0].transpose(0, 1)
        torch.testing.assert_close(st[rows_q].double(), lse, atol=1e-5, rtol=1e-5)
    unwritten = torch.zeros(10, dtype=torch.bool)
    unwritten[sum(lens_q) :] = True
    assert torch.equal(memory(out.undefined["o"]), unwritten.view(10, 1, 1).expand(10, 2, 4))
    assert torch.equal(memory(out.undefined["st"]), unwritten.view(10, 1, 1).expand(10, 2, 1))


def test_offsets_past_the_token_capacity_are_refused():
    """Given offsets are checked before the reference reads them: offset[B] inside the capacity of S rows."""
    import cudnn_dsl

    cg = cudnn_dsl.compile(text=THD.format(extra=", causal=true"))
    ins = cg.allocate_inputs()
    cg.reference(**ins)
    ins["lq"] = torch.tensor([4, 4, 3], dtype=torch.int32).view(3, 1, 1, 1)  # 11 rows: one past the 10
    ins["rq"] = torch.tensor([0, 4, 8, 11]) * 8
    ins["rs"] = torch.tensor([0, 4, 8, 10], dtype=torch.int32) * 2
    with pytest.raises(BindingError, match=re.escape("is 88, past the end of 'q' (80 elements, its token capacity")):
        cg.reference(**ins)


def test_a_token_buffer_smaller_than_the_capacity_is_refused():
    """A [T, H, D] buffer bound as [B, H, S, D] with T < S: the memory the offsets may reach is not all there."""
    want = graph().instances[0].type("q")
    cpu = torch.device("cpu")
    check_binding("q", tokens(torch.zeros(10, 2, 4), 3), want, cpu)
    with pytest.raises(BindingError, match=re.escape("'q': expected shape [3, 2, 10, 4], given [3, 2, 9, 4]")):
        check_binding("q", tokens(torch.zeros(9, 2, 4), 3), want, cpu)
    with pytest.raises(BindingError, match=re.escape("'q': expected strides [0, 4, 8, 1], given [80, 4, 8, 1]")):
        check_binding("q", torch.zeros(3, 10, 2, 4).transpose(1, 2), want, cpu)  # B * S rows: not the THD memory


def _located(text: str, words: str, at: str) -> None:
    with pytest.raises(DslError, match=words) as e:
        program(text=text, file="r.cdg")
    line, col = (int(x) for x in re.match(r"r\.cdg:(\d+):(\d+):", str(e.value)).groups())
    assert text.splitlines()[line - 1][col - 1 :].startswith(at), str(e.value)


BASE = THD.format(extra="")


@pytest.mark.parametrize(
    "text,words,at",
    [
        (
            BASE.replace("ragged_k=rk, ", ""),
            re.escape("sdpa: 'k' leaves its batch stride to ragged offsets (`_`), but none place it as k"),
            "k, v",
        ),
        (
            BASE.replace("ragged_o=rq, ", ""),
            re.escape("output 'o' leaves its batch stride to ragged offsets (`_`), but sdpa is given none"),
            "output o",
        ),
        (
            BASE.replace("  input lq", "  input x : float[3, 2, 10, 4] strides [_, 4, 8, 1]\n  input lq"),
            re.escape("'x' leaves its batch stride to ragged offsets (`_`), but no op reads it to place it"),
            "input x",
        ),
        (
            BASE.replace("  output o :", "  y = relu(q)\n  output y\n  output o :"),
            re.escape("relu: 'q' leaves its batch stride to ragged offsets (`_`), but none place it as x"),
            "q)",
        ),
        (
            BASE.replace("}\n", "  y = relu(o)\n  output y\n}\n"),
            re.escape("relu: 'o' leaves its batch stride to ragged offsets (`_`), but none place it as x"),
            "o)",
        ),
        (
            BASE.replace("k : float[3, 1, 10, 4] strides [_, 4, 4, 1]", "k : float[3, 1, 10, 4] strides [40, _, 4, 1]"),
            re.escape("`_` leaves the batch stride (axis 0) to ragged offsets; axis 1 needs its stride"),
            "_, 4, 1]",
        ),
        (
            BASE.replace("q : float[3, 2, 10, 4] strides [_, 4, 8, 1]", "q : float[3, 2, 10, 4] strides [_, 40, 4, 1]"),
            re.escape("ragged_q packs q as BSHD (THD): its strides must be [_, 4, 8, 1], got [_, 40, 4, 1]"),
            "rq",
        ),
        (
            BASE.replace("graph r {\n", "graph r {\n  dim _ in {3}\n"),
            re.escape("`_` names no dimension: as a stride it leaves the batch stride to ragged offsets"),
            "dim _",
        ),
    ],
    ids=["k-unplaced", "o-unplaced", "unread", "read-elsewhere", "output-read-elsewhere", "not-batch", "bhsd", "dim"],
)
def test_a_left_batch_stride_no_offset_places_is_refused_where_written(text, words, at):
    _located(text, words, at)


def test_the_example_reaches_cudnn_with_the_batch_stride_of_one_slice():
    """What TransformerEngine's THD graphs pass: [B, H, S, D] with batch stride S*H*D, which the offsets replace;
    cuDNN 9.28 plans it for the H200 without a GPU."""
    from cudnn_dsl.build.lower import cudnn_dims, left_to_offsets
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target

    g = program(text=EXAMPLE.read_text(), file=str(EXAMPLE)).graphs[0]
    inst = g.instances[0]
    assert left_to_offsets(g, inst) == {"q", "k", "v", "o", "stats"}
    assert cudnn_dims(inst.type("q"), True) == ([4, 16, 1536, 128], [1536 * 2048, 128, 2048, 1])
    assert cudnn_dims(inst.type("k"), True)[1] == [1536 * 512, 128, 512, 1]
    assert cudnn_dims(inst.type("stats"), True)[1] == [1536 * 16, 1, 16, 1]
    assert inst.type("q").storage == 1536 * 2048  # the token capacity, a quarter of B * S rows
    assert compile_shape(g, inst, g.options, Target.named("h200")).plan_count >= 1


def test_the_lowering_script_gives_cudnn_the_batch_stride_and_fills_one_slice(tmp_path):
    """`check --emit lowering`: the tensors are declared with batch stride S*H*D, and the drawn values fill batch
    0 (the memory; torch writes no element twice)."""
    from tests.cli_util import run_cli

    p = run_cli("check", "--emit", "lowering", str(EXAMPLE))
    assert p.returncode == 0, p.stderr
    assert "q = g.tensor(name='q', dim=[4, 16, 1536, 128], stride=[3145728, 128, 2048, 1]" in p.stdout
    assert "o[1].set_stride([24576, 1, 16, 1])" in p.stdout
    assert "buffers['q'][:1].copy_(draw_values(" in p.stdout


@pytest.mark.parametrize("dims", ["fixed", "symbolic"])
def test_the_torch_op_takes_and_returns_token_buffers(dims):
    """The torch op (strict: the declared layout only) binds [T, H, D] token buffers and returns each output as one
    batch slice of memory, whose written rows are the reference's; with a symbolic capacity too, whose declared
    strides keep the batch stride 0."""
    import cudnn_dsl
    from cudnn_dsl.torch_op.op import as_torch_op

    text = THD.format(extra=", causal=true")
    if dims == "symbolic":
        text = text.replace("graph r {\n", "graph r {\n  dim S in {10, 12}\n").replace(", 10, ", ", S, ")
    cg = cudnn_dsl.compile(text=text)
    ins = cg.allocate_inputs({"S": 12} if dims == "symbolic" else None, seed=2)
    want = cg.reference(**ins)
    o, st = as_torch_op(cg, strict=True)(**ins)
    assert o.stride()[0] == 0 and st.stride()[0] == 0
    for name, got in (("o", o), ("st", st)):
        written = ~memory(want.undefined[name])
        assert written.any()
        torch.testing.assert_close(memory(got)[written], memory(want[name])[written])


def test_a_file_whose_batches_differ_is_no_token_buffer():
    """`run --input`: a file for a tensor left to its offsets holds one token buffer in every batch (NaN alike, as
    unused rows may hold); one of B * S distinct rows is refused, not cut to its first batch."""
    from cudnn_dsl.run.buffers import converted

    want = graph().instances[0].type("q")
    thd = torch.randn(10, 2, 4)
    thd[9] = float("nan")
    assert torch.equal(memory(converted(tokens(thd, 3).clone(), want)).nan_to_num(), thd.nan_to_num())
    padded = torch.randn(3, 10, 2, 4).transpose(1, 2)
    with pytest.raises(BindingError, match=re.escape("but the file's batch 1 differs from batch 0")):
        converted(padded, want)


# ---- the batch stride of one token, as flashinfer's prefill binds q over its token buffer ---------------------

#: THD with every batch stride one token (q [3, 2, 10, 4] over tokens of 2 * 4 elements: [8, 4, 8, 1])
TOKEN_STRIDE = (
    THD.format(extra=", causal=true")
    .replace("strides [_, 4, 8, 1]", "strides [8, 4, 8, 1]")
    .replace("strides [_, 4, 4, 1]", "strides [4, 4, 4, 1]")
    .replace("strides [_, 1, 2, 1]", "strides [2, 1, 2, 1]")
)


def flashinfer(thd: torch.Tensor, batch: int) -> torch.Tensor:
    """[B, H, S, D] over a [T, H, D] token buffer with a batch stride of one token (T >= B + S - 1), as flashinfer
    binds q for its prefill graph: batch b is the buffer from token b on."""
    t, h, d = thd.shape
    return thd.as_strided((batch, h, t - batch + 1, d), (h * d, d, h * d, 1))


def test_a_batch_stride_of_one_token_is_the_batch_stride_left_to_the_offsets():
    """`strides [512, 128, 512, 1]` on a tensor ragged offsets place is `_` as flashinfer spells it: the same IR
    (batch stride 0, memory of S tokens, the capacity), planned for the H200 as the `_` graph is."""
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.target.library import Target

    g = program(text=TOKEN_STRIDE, file="r.cdg").graphs[0]
    inst, want = g.instances[0], graph().instances[0]
    assert inst.types == want.types
    assert inst.type("q").strides == (0, 4, 8, 1) and inst.type("q").storage == 10 * 8
    text = EXAMPLE.read_text().replace("strides [_, ", "strides [TOKEN, ")
    for name, token in (("q", 2048), ("k", 512), ("v", 512), ("o", 2048), ("stats", 16)):
        text = re.sub(rf"({name} : \w+\[[^\]]*\] strides \[)TOKEN", rf"\g<1>{token}", text)
    ex = program(text=text, file="ex.cdg").graphs[0]
    assert ex.instances[0].types == program(EXAMPLE).graphs[0].instances[0].types
    assert compile_shape(ex, ex.instances[0], ex.options, Target.named("h200")).plan_count >= 1


def test_a_tensor_bound_with_a_batch_stride_of_one_token_is_read_as_its_token_buffer():
    """A flashinfer binding (batch stride one token) is taken where the batch stride is left to the offsets, and
    the reference reads the tokens as from the `_` binding of the same buffer; the memory must hold every token
    up to the capacity of S rows."""
    g = program(text=TOKEN_STRIDE, file="r.cdg").graphs[0]
    inst, cpu = g.instances[0], torch.device("cpu")
    ins = generate_inputs(g, inst, "cpu", seed=4)
    want = run_reference(g, inst, ins, "cpu")
    bound = dict(ins)
    for name in ("q", "k", "v"):
        thd = torch.cat([memory(ins[name]), torch.full_like(memory(ins[name])[:2], float("nan"))])  # B + S - 1 tokens
        bound[name] = flashinfer(thd, 3)
        assert bound[name].stride()[0] == bound[name].stride()[2]
        check_binding(name, bound[name], inst.type(name), cpu)
    got = run_reference(g, inst, bound, "cpu")
    for name in ("o", "st"):
        written = ~memory(want.undefined[name])
        torch.testing.assert_close(memory(got[name])[written], memory(want[name])[written])
    short = torch.zeros(11, 2, 4).as_strided((3, 2, 9, 4), (8, 4, 8, 1))  # 9 rows of a capacity of 10
    with pytest.raises(BindingError, match=re.escape("'q': expected shape [3, 2, 10, 4], given [3, 2, 9, 4]")):
        check_binding("q", short, inst.type("q"), cpu)
    padded = torch.zeros(3, 10, 2, 4).transpose(1, 2)  # B * S rows: a batch stride of S tokens, not one
    with pytest.raises(BindingError, match=re.escape("'q': expected strides [0, 4, 8, 1], given [80, 4, 8, 1]")):
        check_binding("q", padded, inst.type("q"), cpu)


def test_a_batch_stride_of_one_token_on_a_tensor_no_offset_places_still_aliases():
    text = BASE.replace("  input lq", "  input x : float[3, 2, 10, 4] strides [8, 4, 8, 1]\n  input lq")
    text = text.replace("}\n", "  output y = relu(x)\n}\n")
    _located(text, re.escape("strides [8, 4, 8, 1] alias elements of [3, 2, 10, 4]: axes 0 and 2 overlap"), "input x")
