"""Golden tests: the IR dump of every example, and the exact diagnostics of every bad input."""

import ast
import difflib
import re
from pathlib import Path

import pytest

from dsl.pipeline import load, program
from dsl.syntax.printer import dump_ir

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"
EXAMPLES = sorted((ROOT / "examples").glob("*.cdg"))
ERRORS = sorted((GOLDEN / "errors").glob("*.cdg"))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def diagnostics(path: Path) -> str:
    return load(path, file=_rel(path)).render() + "\n"


def _compare(actual: str, expected_path: Path, update: bool) -> None:
    if update:
        old = expected_path.read_text() if expected_path.exists() else ""
        if old != actual:
            diff = "".join(
                difflib.unified_diff(
                    old.splitlines(True), actual.splitlines(True), str(expected_path), str(expected_path) + " (new)"
                )
            )
            print(diff)
            expected_path.write_text(actual)
        return
    assert expected_path.exists(), f"no golden {expected_path}; run pytest --update-goldens and review the diff"
    assert actual == expected_path.read_text()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_ir_dump(path, update_goldens):
    _compare(dump_ir(program(path, file=_rel(path))), GOLDEN / "dumps" / f"{path.stem}.ir", update_goldens)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_lowering(path, update_goldens):
    """What is sent to cuDNN, as the ejected script shows it (no cuDNN needed: emit lowers against a
    recorder); a change to any frontend call shows in review. Dynamic graphs: their first shape."""
    from cudnn_dsl.interop.emit import emit_cudnn

    graphs = program(path, file=_rel(path)).graphs
    text = "".join(emit_cudnn(g, g.instances[0]) for g in graphs)
    _compare(text, GOLDEN / "lowering" / f"{path.stem}.py.txt", update_goldens)


@pytest.mark.parametrize("path", ERRORS, ids=lambda p: p.stem)
def test_bad_input_diagnostics(path, update_goldens):
    out = diagnostics(path)
    assert "error:" in out
    assert "Traceback" not in out
    _compare(out, path.with_suffix(".expected"), update_goldens)


def test_there_are_at_least_40_bad_inputs():
    assert len(ERRORS) >= 40


def test_the_parser_tables_are_generated_from_the_grammar():
    """dsl/syntax/grammar_tables.json must match dsl/syntax/grammar.lark (regenerate: python -m dsl.syntax.parser)."""
    import hashlib
    import json

    tables = json.loads((ROOT / "dsl" / "syntax" / "grammar_tables.json").read_text())
    assert (
        tables["grammar_sha256"] == hashlib.sha256((ROOT / "dsl" / "syntax" / "grammar.lark").read_bytes()).hexdigest()
    )


def _coverage(what: str) -> str:
    from cudnn_dsl.interop import coverage
    from cudnn_dsl.target.library import load_cudnn

    pygraph = load_cudnn().pygraph
    if what == "table":
        return coverage.table(pygraph)
    (n, m), (bn, bm) = coverage.count(pygraph), coverage.count(pygraph, backward=True)
    return (
        f"The language spells **{n} of the {m} forward ops** of cuDNN Frontend 1.32's `pygraph`, and "
        f"**{bn} of its {bm} backward ops**.\n"
    )


def _first_sentence(path: Path) -> str:
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0].split())
    return re.split(r"(?<!\.)\. ", doc)[0].removesuffix(".")  # a sentence ends at '. ', not at 'FILE... '


def _layout() -> str:
    """Each package of the two halves and its modules, with their docstrings' first sentences: the layout
    as the tree has it."""
    lines = []
    for half in ("dsl", "cudnn_dsl"):
        for init in sorted((ROOT / half).rglob("__init__.py")):
            pkg = init.parent
            lines.append(f"- **`{pkg.relative_to(ROOT)}/`** — {_first_sentence(init)}")
            for mod in sorted(pkg.glob("*.py")):
                if mod.name != "__init__.py":
                    lines.append(f"  - `{mod.name}` — {_first_sentence(mod)}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "doc_name,block",
    [
        ("docs/language.md", "options"),
        ("docs/language.md", "ops"),
        ("docs/language.md", "coverage"),
        ("README.md", "coverage-count"),
        ("docs/language.md", "inits"),
        ("docs/architecture.md", "layout"),
        ("docs/cudnn-quirks.md", "quirks"),
    ],
)
def test_the_language_reference_tables_come_from_the_registries(doc_name, block, update_goldens):
    """docs/language.md's option, op and coverage tables (and the README's count) are the registries'
    own text (one place per fact)."""
    import re

    from cudnn_dsl.target.quirks import table as quirks_table
    from dsl.syntax.printer import inits_table, ops_tables, options_table

    doc = ROOT / doc_name
    text = doc.read_text()
    pattern = re.compile(rf"(<!-- generated: {block} .*?-->\n)(.*?)(<!-- end generated -->)", re.S)
    want = {
        "options": options_table,
        "ops": ops_tables,
        "coverage": lambda: _coverage("table"),
        "coverage-count": lambda: _coverage("count"),
        "inits": inits_table,
        "layout": _layout,
        "quirks": quirks_table,
    }[block]()
    if update_goldens:
        doc.write_text(pattern.sub(lambda m: m.group(1) + want + m.group(3), text))
        return
    assert pattern.search(text).group(2) == want, "run pytest --update-goldens and review docs/language.md"
