"""An op family is one file in each half: dsl/ops/<family>.py (signatures, shape rules, flop counts, VJP rules)
and cudnn_dsl/ops/<family>.py (torch references and cuDNN lowerings); the side tables are derived from the
rows."""

import importlib
from pathlib import Path

import pytest

import cudnn_dsl.ops
import dsl.ops
from cudnn_dsl.interop import fe_nodes

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = list(dsl.ops.FAMILIES)


def _family_files(package: str) -> set[str]:
    return {p.stem for p in (ROOT / package / "ops").glob("*.py")} - {"__init__", "base"}


def test_every_family_file_has_its_twin_in_the_other_half():
    assert _family_files("dsl") == _family_files("cudnn_dsl") == set(FAMILIES)
    assert [m.__name__ for m in dsl.ops.FAMILY_MODULES] == [f"dsl.ops.{f}" for f in FAMILIES]
    assert [m.__name__ for m in cudnn_dsl.ops.FAMILY_MODULES] == [f"cudnn_dsl.ops.{f}" for f in FAMILIES]


def test_every_op_is_in_one_family():
    names = [op for m in dsl.ops.FAMILY_MODULES for op in m.OPS]
    assert len(names) == len(set(names)) == len(dsl.ops.OPS)
    implemented = [op for m in cudnn_dsl.ops.FAMILY_MODULES for op in m.IMPLS]
    assert len(implemented) == len(set(implemented)) == len(cudnn_dsl.ops.IMPLS)


def _functions(*objects) -> set[str]:
    """The modules that define the functions among these objects."""
    return {f.__module__ for f in objects if callable(f)}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_familys_ops_are_defined_and_implemented_in_its_file_in_each_half(family):
    sigs = importlib.import_module(f"dsl.ops.{family}")
    impls = importlib.import_module(f"cudnn_dsl.ops.{family}")
    assert sigs.FAMILY.name == family and all(s.family == family for s in sigs.OPS.values())
    assert set(sigs.BACKWARD_OPS) <= set(sigs.OPS)
    assert set(impls.IMPLS) == set(sigs.OPS), "an op's reference and lowering sit in its family's twin file"
    rules = [f for s in sigs.OPS.values() for f in (s.infer, s.flops, s.results, s.derive, s.lint, s.domains)]
    assert _functions(*rules) <= {sigs.__name__, "dsl.ops.base"}
    runs = [f for i in impls.IMPLS.values() for f in (i.ref, i.lower, i.undefined, i.drawn)]
    assert _functions(*runs) <= {impls.__name__, "cudnn_dsl.ops.base"}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_op_of_a_family_has_its_vjp_or_a_reason_in_its_file(family):
    sigs = importlib.import_module(f"dsl.ops.{family}")
    assert set(sigs.VJPS).isdisjoint(sigs.NO_VJP)
    assert set(sigs.VJPS) | set(sigs.NO_VJP) == set(sigs.OPS)
    assert all(sigs.NO_VJP.values())
    assert _functions(*sigs.VJPS.values()) <= {sigs.__name__, "dsl.ops.base"}


def test_the_side_tables_say_what_the_rows_say():
    with_stats = {op: s.statistics for op, s in dsl.ops.OPS.items() if s.statistics is not None}
    assert dsl.ops.STATISTICS == set(with_stats)
    assert dsl.ops.EMIT_STATISTICS == {op: st.switch for op, st in with_stats.items() if st.switch is not None}
    assert all(len(dsl.ops.OPS[op].outputs) > 1 for op in with_stats), "statistics are the results after the first"
    assert dsl.ops.VJPS == {op: rule for m in dsl.ops.FAMILY_MODULES for op, rule in m.VJPS.items()}
    assert dsl.ops.NO_VJP == {op: why for m in dsl.ops.FAMILY_MODULES for op, why in m.NO_VJP.items()}
    assert cudnn_dsl.ops.BACKWARD_IMPLS == {op: cudnn_dsl.ops.IMPLS[op] for op in dsl.ops.BACKWARD_OPS}
    assert fe_nodes.IMPORTED == {op: tag for tag, row in fe_nodes.NODES.items() for op in row.ops}
    assert {symbol: op for op, symbol in fe_nodes.INFIX_SYMBOL.items()} == dsl.ops.INFIX
