"""SDPA's masks, padding, grouped heads, ALiBi and dropout on the GPU, against the reference, each graph
compiled whole (split=False): the test is what cuDNN computes for it.

Forms cuDNN 9.19 is known (or, from the frontend's own test matrix, expected) to run must match. For the
forms whose 9.19 support was not known when these tests were written, RECORDED holds what cuDNN did with
each on the H200: ran it and matched, or refused it at the sdpa's line. A change either way fails.
"""

import re
import warnings
from pathlib import Path

import pytest

from tests.helpers import ACCEPTED, as_recorded, check, check_as_recorded, where_refused

pytestmark = pytest.mark.gpu

DECLS = {
    "q": "bf16[2, 8, 512, 128]",
    "k": "bf16[2, 2, 512, 128]",
    "v": "bf16[2, 2, 512, 128]",
    "lq": "int32[2, 1, 1, 1]",
    "lkv": "int32[2, 1, 1, 1]",
    "b": "bf16[1, 8, 512, 512]",
    "dm": "bf16[2, 8, 512, 512]",
    "ds": "float[1, 1, 1, 1]",
}


def sdpa_text(extra: str, **decls) -> str:
    """A graph of one sdpa(q, k, v, `extra`, stats=true) on DECLS' inputs (`decls` in their place) that it reads."""
    names = {**DECLS, **decls}
    used = [n for n in names if n in "qkv" or f"={n}" in extra or f"{n}," in extra + ","]
    inputs = "".join(f"  input {n} : {names[n]}\n" for n in used)
    return f"graph t {{\n  io bf16\n{inputs}  o, st = sdpa(q, k, v, {extra}, stats=true)\n  output o\n  output st\n}}\n"


#: what cuDNN did with each form whose support was not known (where: helpers.SEEN_ON, which warned of no
#: refusal: each ran and matched)
RECORDED = {
    "left_bound=64, right_bound=32": ACCEPTED,
    "right_bound=16": ACCEPTED,
    "causal_bottom_right=true": ACCEPTED,
    "seq_len_q=lq, seq_len_kv=lkv, causal_bottom_right=true": ACCEPTED,
    "seq_len_q=lq, seq_len_kv=lkv, left_bound=64, right_bound=0, diagonal_alignment=bottom_right": ACCEPTED,
    "alibi=true, causal=true": ACCEPTED,
    "dropout_mask=dm, dropout_scale=ds": ACCEPTED,
    "causal_bottom_right and S_q < S_kv": ACCEPTED,
    "D_v 64 with D_qk 128": ACCEPTED,
    "paged K/V caches": ACCEPTED,
    "fp8, S_kv 128": ACCEPTED,
    "fp8, S_kv 128, causal=true": ACCEPTED,
    "fp8, S_kv 512, causal=true, left_bound=128": ACCEPTED,
    "ragged q/o/stats with int64 offsets, padded k/v": ACCEPTED,
    "ragged q/o/stats with int32 offsets, padded k/v": ACCEPTED,
    "ragged offsets with gaps": ACCEPTED,
    "seeded dropout": ACCEPTED,
}


@pytest.mark.parametrize(
    "extra",
    [
        "causal=true",
        "causal=true, left_bound=128",
        "b, causal=true",
        "seq_len_q=lq, seq_len_kv=lkv",
        "seq_len_q=lq, seq_len_kv=lkv, causal=true, left_bound=128",
    ],
)
def test_forms_the_frontend_tests_on_hopper(extra):
    check(sdpa_text(extra), "cuda", split=False)


@pytest.mark.parametrize(
    "extra",
    [
        "left_bound=64, right_bound=32",
        "right_bound=16",
        "causal_bottom_right=true",
        "seq_len_q=lq, seq_len_kv=lkv, causal_bottom_right=true",
        "seq_len_q=lq, seq_len_kv=lkv, left_bound=64, right_bound=0, diagonal_alignment=bottom_right",
        "alibi=true, causal=true",
        "dropout_mask=dm, dropout_scale=ds",
    ],
)
def test_forms_whose_919_support_was_not_known(extra):
    given = {}
    if "dropout" in extra:
        import torch

        g = torch.Generator(device="cuda").manual_seed(0)
        given = {
            "dm": (torch.rand(2, 8, 512, 512, device="cuda", generator=g) > 0.1).to(torch.bfloat16),
            "ds": torch.full((1, 1, 1, 1), 1 / 0.9, device="cuda"),
        }
    check_as_recorded(RECORDED, extra, sdpa_text(extra), op="sdpa", given=given)


def test_bottom_right_with_fewer_queries_than_keys():
    # prefill of 128 new tokens against a cache of 512: the last query sees every key
    text = sdpa_text("causal_bottom_right=true", q="bf16[2, 8, 128, 128]")
    check_as_recorded(RECORDED, "causal_bottom_right and S_q < S_kv", text, op="sdpa")


def test_grouped_query_and_multi_query_heads():
    check(sdpa_text("causal=true"), "cuda", split=False)  # 8 query heads on 2 K/V heads
    check(sdpa_text("causal=true", k="bf16[2, 1, 512, 128]", v="bf16[2, 1, 512, 128]"), "cuda", split=False)


def test_value_head_dim_differs_from_query_head_dim():
    check_as_recorded(RECORDED, "D_v 64 with D_qk 128", sdpa_text("causal=true", v="bf16[2, 2, 512, 64]"), op="sdpa")


def test_padded_rows_the_stats_say_minus_infinity_and_o_is_not_compared():
    import torch

    lens = {
        "lq": torch.tensor([300, 512], dtype=torch.int32, device="cuda").view(2, 1, 1, 1),
        "lkv": torch.tensor([200, 512], dtype=torch.int32, device="cuda").view(2, 1, 1, 1),
    }
    cg, tensors = check(sdpa_text("seq_len_q=lq, seq_len_kv=lkv, causal=true"), "cuda", given=lens, split=False)
    out = cg(**tensors)
    assert out["st"][0, :, 300:].isneginf().all()
    assert out["st"][1].isfinite().all()
    o_pad = out["o"][0, :, 300:]
    if not (o_pad == 0).all():  # informational: the compare does not read these rows
        warnings.warn("cuDNN leaves O's padded query rows non-zero", stacklevel=1)


def test_the_masked_example_with_lengths_of_every_kind():
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(str(Path(__file__).resolve().parents[2] / "examples" / "sdpa_masked.cdg"))
    tensors = cg.allocate_inputs()
    for lq, lkv in (([1, 1024], [1, 1024]), ([17, 1000], [300, 1024])):
        tensors["seq_q"] = torch.tensor(lq, dtype=torch.int32, device="cuda").view(2, 1, 1, 1)
        tensors["seq_kv"] = torch.tensor(lkv, dtype=torch.int32, device="cuda").view(2, 1, 1, 1)
        for r in cg.check(**tensors):
            assert r.ok, f"lengths {lq}, {lkv}: {r}"


def test_paged_kv_caches():
    # The frontend's paged layout (test/python/sdpa/helpers.py): each sequence's keys cut into
    # blocks of 64, the blocks of all sequences in one cache, here shuffled; a table per sequence.
    import torch

    text = (
        "graph t {\n  io bf16\n  input q : bf16[2, 8, 128, 128]\n  input kc : bf16[16, 2, 64, 128]\n"
        "  input vc : bf16[16, 2, 64, 128]\n  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
        "  input tk : int32[2, 1, 8, 1]\n  input tv : int32[2, 1, 8, 1]\n"
        "  o, st = sdpa(q, kc, vc, seq_len_q=lq, seq_len_kv=lkv, page_table_k=tk, page_table_v=tv, "
        "causal_bottom_right=true, stats=true)\n  output o\n  output st\n}\n"
    )
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0)).to(torch.int32).cuda()
    given = {
        "tk": order.view(2, 1, 8, 1),
        "tv": order.flip(0).view(2, 1, 8, 1),
        "lq": torch.tensor([100, 128], dtype=torch.int32, device="cuda").view(2, 1, 1, 1),
        "lkv": torch.tensor([300, 512], dtype=torch.int32, device="cuda").view(2, 1, 1, 1),
    }
    check_as_recorded(RECORDED, "paged K/V caches", text, op="sdpa", given=given)


@pytest.mark.parametrize("keys,extra", [(128, ""), (128, ", causal=true"), (512, ", causal=true, left_bound=128")])
def test_fp8_attention(keys, extra):
    # S_kv 128 is one of cuDNN's tiles, where the reference's untiled quantization of P is exactly
    # cuDNN's; at 512 the two may differ within fp8 rounding (the fp8 tolerance).
    import torch

    text = (
        f"graph t {{\n  io fp8_e4m3\n  input q : fp8_e4m3[2, 8, 128, 128]\n  input k : fp8_e4m3[2, 8, {keys}, 128]\n"
        f"  input v : fp8_e4m3[2, 8, {keys}, 128]\n"
        + "".join(f"  input {n} : float[1, 1, 1, 1]\n" for n in ("dq", "dk", "dv", "ds", "ss", "so"))
        + f"  o, amax, st = sdpa_fp8(q, k, v, dq, dk, dv, ds, ss, so{extra}, stats=true)\n"
        "  output o\n  output amax\n  output st\n}\n"
    )
    scales = {"dq": 0.5, "dk": 0.5, "dv": 1.0, "ds": 1 / 448, "ss": 448.0, "so": 2.0}
    given = {n: torch.full((1, 1, 1, 1), x, device="cuda") for n, x in scales.items()}
    check_as_recorded(RECORDED, f"fp8, S_kv {keys}{extra}", text, op="sdpa", given=given)


def _packed(cg, tensors, name: str, placed: str) -> None:
    """tensors[name] := the offsets that pack `placed`'s sequences back to back (their lengths given)."""
    from cudnn_dsl.run.indices import ragged_offsets
    from cudnn_dsl.run.inputs import packed_offsets

    inst = cg.graph.instances[0]
    r = ragged_offsets(cg.graph, inst)[name]
    assert r.type == inst.type(placed)
    tensors[name] = packed_offsets(r.type, tensors[r.lengths].cpu()).view(-1, 1, 1, 1).to(tensors[name])


def test_the_ragged_example_with_lengths_of_every_kind():
    # q, k, v and o packed (THD), the frontend's test layout (test/python/sdpa/fp16.py, is_ragged)
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(str(Path(__file__).resolve().parents[2] / "examples" / "sdpa_ragged.cdg"))
    tensors = cg.allocate_inputs()  # generated offsets pack the generated lengths
    for r in cg.check(**tensors):
        assert r.ok, f"generated lengths: {r}"
    for lq, lkv in (([1, 512, 1, 512], [1, 512, 512, 1]), ([17, 300, 64, 129], [300, 17, 512, 200])):
        tensors["seq_q"] = torch.tensor(lq, dtype=torch.int32, device="cuda").view(4, 1, 1, 1)
        tensors["seq_kv"] = torch.tensor(lkv, dtype=torch.int32, device="cuda").view(4, 1, 1, 1)
        _packed(cg, tensors, "offset_q", "q")
        _packed(cg, tensors, "offset_kv", "k")
        for r in cg.check(**tensors):
            assert r.ok, f"lengths {lq}, {lkv}: {r}"


RAGGED = (
    "graph t {{\n  io bf16\n  input q : bf16[2, 8, 256, 128] strides [262144, 128, 1024, 1]\n"
    "  input k : bf16[2, 2, 256, 128]{kv_strides}\n  input v : bf16[2, 2, 256, 128]{kv_strides}\n"
    "  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n  input rq : {off}[3, 1, 1, 1]\n"
    "  input rs : {off}[3, 1, 1, 1]\n{more}"
    "  o, st = sdpa(q, k, v, seq_len_q=lq, seq_len_kv=lkv, causal=true, stats=true, ragged_q=rq, ragged_o=rq, "
    "ragged_stats=rs{extra})\n  output o\n  output st\n}}\n"
)


@pytest.mark.parametrize("off", ["int64", "int32"])
def test_ragged_stats_and_keys_left_padded(off):
    # Q, O and the stats packed; K and V padded [B, H, S, D] (the paged-cache sample's Q-only packing)
    text = RAGGED.format(kv_strides="", off=off, more="", extra="")
    check_as_recorded(RECORDED, f"ragged q/o/stats with {off} offsets, padded k/v", text, op="sdpa")


def test_ragged_offsets_with_gaps_between_sequences():
    # sequences placed at b * S * H * D (the padded places) rather than packed: the offsets, not
    # the batch stride, say where each starts; the layout rules are the same
    import torch

    text = RAGGED.format(
        kv_strides=" strides [65536, 128, 256, 1]",
        off="int64",
        more="  input rk : int64[3, 1, 1, 1]\n",
        extra=", ragged_k=rk, ragged_v=rk",
    )
    given = {
        "rq": torch.tensor([0, 262144, 524288], device="cuda").view(3, 1, 1, 1),
        "rs": torch.tensor([0, 2048, 4096], device="cuda").view(3, 1, 1, 1),
        "rk": torch.tensor([0, 65536, 131072], device="cuda").view(3, 1, 1, 1),
    }
    check_as_recorded(RECORDED, "ragged offsets with gaps", text, op="sdpa", given=given)


def test_ragged_offsets_of_one_dimension_are_the_four_dimensional_ones():
    # flashinfer's [B + 1] offsets: cuDNN gets them as the [B + 1, 1, 1, 1] view of the same memory
    import torch

    import cudnn_dsl

    text = RAGGED.format(kv_strides="", off="int32", more="", extra="").replace("[3, 1, 1, 1]", "[3]")
    cg = cudnn_dsl.compile(text, split=False)
    tensors = cg.allocate_inputs()
    assert tensors["rq"].shape == torch.Size([3])
    for r in cg.check(**tensors):
        assert r.ok, str(r)


def test_index_inputs_in_one_shared_allocation():
    # examples/sdpa_ragged_paged.cdg: lengths, 1-D ragged offsets and the page table as views of one int32
    # buffer, each drawn through its view; a scheduler's own values bound in the same buffer
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(str(Path(__file__).resolve().parents[2] / "examples" / "sdpa_ragged_paged.cdg"))
    tensors = cg.allocate_inputs()
    assert sorted(tensors) == ["k_cache", "meta", "q", "v_cache"]
    for r in cg.check(**tensors):
        assert r.ok, f"generated: {r}"
    meta = tensors["meta"]
    meta[0:4] = torch.tensor([256, 1, 17, 100], dtype=torch.int32)  # the query lengths
    meta[4:8] = torch.tensor([512, 64, 300, 100], dtype=torch.int32)
    meta[8:13] = torch.tensor([0, 256, 257, 274, 374], dtype=torch.int32) * 1024  # rows of 8 heads of 128
    meta[16:48] = torch.arange(32, dtype=torch.int32).flip(0)
    for r in cg.check(**tensors):
        assert r.ok, f"given: {r}"


SEEDED = (
    "graph t {{\n  io bf16\n  input q : bf16[2, 8, 512, 128]\n  input k : bf16[2, 2, 512, 128]\n"
    "  input v : bf16[2, 2, 512, 128]\n  input seed : int64[1, 1, 1, 1]\n  input offset : int64[1, 1, 1, 1]\n"
    "  o, st, {mask} = sdpa(q, k, v, dropout_probability=0.2, dropout_seed=seed, dropout_offset=offset, stats=true)\n"
    "  output o\n  output st\n{more}}}\n"
)


@pytest.mark.parametrize("mask_output", [False, True])
def test_seeded_dropout_matches_the_reference_on_the_mask_cudnn_drew(mask_output):
    # cuDNN draws the mask (Philox, from the seed and offset); rng_dump writes it, to scratch memory
    # unless the graph outputs it, and the reference multiplies the probabilities by it / (1 - p).
    import torch

    import cudnn_dsl

    text = SEEDED.format(mask="m", more="  output m\n" if mask_output else "")
    cg = cudnn_dsl.compile(text, split=False)
    tensors = cg.allocate_inputs()
    inst = cg.graph.instances[0]

    def seeded(seed: int) -> torch.Tensor:
        tensors["seed"] = torch.full((1, 1, 1, 1), seed, dtype=torch.int64, device="cuda")
        tensors["offset"] = torch.full((1, 1, 1, 1), 789, dtype=torch.int64, device="cuda")
        for r in cg.check(**tensors):
            assert r.ok, f"seed {seed}: {r}"
        return cg.drawn(inst, {})["m"].clone() if not mask_output else cg(**tensors)["m"].clone()

    drawn = []
    as_recorded(RECORDED, "seeded dropout", lambda: drawn.append(seeded(123456)), where_refused(text, "sdpa"))
    if not drawn:  # declined, as recorded
        return
    first = drawn[0]
    assert set(first.unique().tolist()) <= {0.0, 1.0}
    assert abs(first.mean().item() - 0.8) < 0.01  # 4 M draws kept with 1 - p
    second = seeded(123457)
    assert abs(second.mean().item() - 0.8) < 0.01
    assert (first != second).float().mean() > 0.2  # another seed, another mask
    assert torch.equal(seeded(123456), first)  # the same seed and offset, the same mask


def test_a_stored_plan_of_seeded_dropout_still_writes_its_mask_to_scratch_memory(private_store):
    # the serialized plan writes the mask the graph does not output: loaded from the store, it needs that
    # scratch memory in its variant pack, and the reference reads the mask from it
    import cudnn_dsl

    text = SEEDED.format(mask="m", more="")
    first = cudnn_dsl.compile(text, split=False)
    tensors = first.allocate_inputs()
    assert all(r.ok for r in first.check(**tensors))
    again = cudnn_dsl.compile(text, split=False)
    exe = again.executable(again.graph.instances[0])
    assert exe.source == "plan store (serialized plan)", exe.notes
    for r in again.check(**tensors):
        assert r.ok, r
    assert set(again.drawn(again.graph.instances[0], {})["m"].unique().tolist()) <= {0.0, 1.0}


def test_run_compares_seeded_dropout_on_the_mask_and_isolates_it(tmp_path):
    # `run` and `run --isolate` take the mask from the launch (the whole graph's, then the sdpa's alone)
    from tests.cli_util import run_cli

    f = tmp_path / "seeded.cdg"
    f.write_text(SEEDED.format(mask="m", more=""))
    p = run_cli("run", f, "--isolate", "--iterations", "2", "--warmup", "1")
    assert p.returncode == 0, p.stderr  # cuDNN runs seeded dropout (RECORDED)
    assert "compare    o: ok" in p.stdout and "compare    st: ok" in p.stdout, p.stdout
    assert re.search(r"isolate    8:\d+ o, st, m = sdpa: (ok|cuDNN-declined-alone)", p.stdout), p.stdout


def test_bench_checks_seeded_dropout_on_the_mask_and_says_torch_cannot_run_it(tmp_path):
    import json

    from tests.cli_util import run_cli

    f, report = tmp_path / "seeded.cdg", tmp_path / "bench.json"
    f.write_text(SEEDED.format(mask="m", more=""))
    p = run_cli("bench", f, "--no-peak", "--rounds", "1", "--samples", "2", "--against", "torch", "--json", report)
    assert p.returncode == 0, p.stderr  # cuDNN runs seeded dropout (RECORDED)
    [res] = json.loads(report.read_text())["results"]
    rows = {r["name"]: r for r in res["rows"]}
    assert rows["cudnn-dsl"]["check"] == "ok", rows["cudnn-dsl"]
    assert "seeded dropout: the reference needs cuDNN's mask" in (rows["torch"]["error"] or ""), rows["torch"]


PAGED = (
    "graph t {\n  io bf16\n  input q : bf16[2, 8, 256, 128]\n  input kc : bf16[64, 2, 64, 128]\n"
    "  input vc : bf16[64, 2, 64, 128]\n  input lq : int32[2, 1, 1, 1]\n  input lkv : int32[2, 1, 1, 1]\n"
    "  input tk : int32[2, 1, 8, 1]\n  input tv : int32[2, 1, 8, 1]\n"
    "  o, st = sdpa(q, kc, vc, seq_len_q=lq, seq_len_kv=lkv, page_table_k=tk, page_table_v=tv, causal=true, "
    "stats=true)\n  output o\n  output st\n}\n"
)


def test_a_block_index_past_the_cache_is_refused_before_any_launch():
    # generated tables (a permutation of the 64 blocks) run and match; one entry past the cache is refused by
    # the call, by bind and by the torch op's first call, at the table's declaration, before cuDNN reads it
    import cudnn_dsl
    from cudnn_dsl.run.buffers import BindingError

    cg = cudnn_dsl.compile(text=PAGED, split=False)
    tensors = cg.allocate_inputs()
    assert sorted(tensors["tk"].flatten().tolist()) == sorted(set(tensors["tk"].flatten().tolist()))
    for r in cg.check(**tensors):
        assert r.ok, r
    bad = {**tensors, "tk": tensors["tk"].clone()}
    bad["tk"].view(-1)[-1] = 64
    op = cudnn_dsl.as_torch_op(cudnn_dsl.compile(text=PAGED, split=False))
    for call in (cg, cg.bind, op):
        with pytest.raises(BindingError, match=re.escape("'tk' (page_table_k of sdpa): element [1, 0, 7, 0] is 64")):
            call(**bad)
    outs = op(**tensors)  # the first call of a good kind: checked, then launched
    assert outs[0].shape == (2, 8, 256, 128)


def test_token_buffers_with_the_batch_stride_left_to_the_offsets():
    # examples/sdpa_ragged_thd.cdg: q, k, v, o and the stats in [T, H, D] token buffers of T = S = 1536 rows
    # (TransformerEngine's THD tensors), each bound as the [B, H, S, D] view with batch stride 0. Every
    # output matches the reference, and cuDNN writes nothing past a buffer's capacity: O's and the stats'
    # memory sits in a larger allocation whose tail must come back untouched.
    import torch

    import cudnn_dsl

    cg = cudnn_dsl.compile(str(Path(__file__).resolve().parents[2] / "examples" / "sdpa_ragged_thd.cdg"))
    tensors = cg.allocate_inputs()  # generated lengths share the capacity; offsets pack them
    for r in cg.check(**tensors):
        assert r.ok, f"generated lengths: {r}"
    gen = torch.Generator(device="cuda").manual_seed(0)
    thd = {
        n: torch.randn(1536, h, 128, generator=gen, device="cuda").bfloat16()
        for n, h in (("q", 16), ("k", 4), ("v", 4))
    }
    # one sequence of nearly the whole capacity and the rest of one token; then lengths of every size
    for lq, lkv in (([1533, 1, 1, 1], [1, 1, 1, 1533]), ([600, 1, 900, 35], [35, 900, 1, 600])):
        tensors.update({n: t.transpose(0, 1).unsqueeze(0).expand(4, -1, -1, -1) for n, t in thd.items()})
        tensors["seq_q"] = torch.tensor(lq, dtype=torch.int32, device="cuda").view(4, 1, 1, 1)
        tensors["seq_kv"] = torch.tensor(lkv, dtype=torch.int32, device="cuda").view(4, 1, 1, 1)
        _packed(cg, tensors, "offset_q", "q")
        _packed(cg, tensors, "offset_kv", "k")
        _packed(cg, tensors, "offset_stats", "stats")
        for name in ("offset_q", "offset_kv", "offset_stats"):
            tensors[name] = tensors[name].flatten()
        for r in cg.check(**tensors):
            assert r.ok, f"lengths {lq}, {lkv}: {r}"
        guard = 4096
        o_mem = torch.full((1536 * 2048 + guard,), 7.0, dtype=torch.bfloat16, device="cuda")
        st_mem = torch.full((1536 * 16 + guard,), 7.0, device="cuda")
        out = {
            "o": o_mem.as_strided((4, 16, 1536, 128), (0, 128, 2048, 1)),
            "stats": st_mem.as_strided((4, 16, 1536, 1), (0, 1, 16, 1)),
        }
        cg(tensors, out)
        torch.cuda.synchronize()
        assert bool((o_mem[1536 * 2048 :] == 7.0).all()) and bool((st_mem[1536 * 16 :] == 7.0).all())
