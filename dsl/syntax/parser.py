""".cdg text -> ast.Module, with Lark errors turned into located diagnostics."""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import math
from pathlib import Path

from lark import Lark, Token, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.lark import PostLex
from lark.visitors import Transformer_NonRecursive

from dsl.diagnostics import Diagnostic, DslError, Loc
from dsl.syntax import ast

_BRACKETS = {"LPAR": 1, "LSQB": 1, "RPAR": -1, "RSQB": -1}

# What a user calls the terminals Lark reports in "expected ..." lists.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "RANGE": "a range (1..4096)",
    "STRING": "a string",
    "_NL": "end of line",
    "SEMICOLON": "';'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "COMMA": "','",
    "COLON": "':'",
    "EQUAL": "'='",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "TYPES_KIND": "'io', 'intermediate' or 'compute'",
    "$END": "end of file",
}


MAX_SOURCE_BYTES = 4 * 1024 * 1024
"""the largest .cdg file accepted, in bytes (and a text, in characters); generated graphs of 10,000 ops
are ~0.4 MB"""
MAX_STATEMENT_TOKENS = 5000
"""tokens in one statement; checked while lexing, so a runaway line cannot exhaust memory"""
MAX_DEPTH = 200
"""nesting of expressions and of the values in them (lists of lists); later passes recurse over both"""


class _TooLong(Exception):
    def __init__(self, tok: Token):
        self.tok = tok


class _NewlinesInBrackets(PostLex):
    """Drops newlines inside ( ) and [ ] so that calls and lists may span lines, and stops a
    statement that runs past MAX_STATEMENT_TOKENS before the parser builds its tree."""

    always_accept = ("_NL",)

    def process(self, stream):
        depth = count = 0
        for tok in stream:
            depth = max(0, depth + _BRACKETS.get(tok.type, 0))
            if tok.type == "_NL" and depth:
                continue
            count = 0 if tok.type in ("_NL", "SEMICOLON", "LBRACE", "RBRACE") and not depth else count + 1
            if count > MAX_STATEMENT_TOKENS:
                raise _TooLong(tok)
            yield tok


_COMMENTS: contextvars.ContextVar[list[tuple[int, str]]] = contextvars.ContextVar("comments")
"""the comments of the text being parsed, collected by the lexer as it skips them (one pass, under the limits of
the parse itself)"""


def _comment(tok: Token) -> None:
    _COMMENTS.get().append((tok.line, str(tok).rstrip()))


def _per_parse() -> dict:
    """The options a parser takes afresh wherever it is built or loaded (objects, not tables)."""
    return {"postlex": _NewlinesInBrackets(), "lexer_callbacks": {"COMMENT": _comment}}


_GRAMMAR = Path(__file__).parent / "grammar.lark"
_TABLES = Path(__file__).parent / "grammar_tables.json"
_LARK_OPTIONS = dict(parser="lalr", lexer="basic", propagate_positions=True, maybe_placeholders=False)


def _build() -> Lark:
    return Lark(_GRAMMAR.read_text(), **_per_parse(), **_LARK_OPTIONS)


def _int_keys(d: dict) -> dict:
    """JSON turns the tables' integer keys (states, tokens, memo ids) into strings; turn them back."""
    return {int(k) if k.isdigit() else k: v for k, v in d.items()}


@functools.cache
def _lark() -> Lark:
    """The parser, from the tables generated out of grammar.lark (building them takes ~0.15 s, too
    long for a `check` on every save); built from the grammar when the tables are missing or stale."""
    digest = hashlib.sha256(_GRAMMAR.read_bytes()).hexdigest()
    try:
        tables = json.loads(_TABLES.read_text(), object_hook=_int_keys)
    except (OSError, ValueError):
        return _build()
    if tables.get("grammar_sha256") != digest:
        return _build()
    return Lark._load_from_dict(tables["data"], tables["memo"], **_per_parse())


def write_tables() -> None:
    """Regenerates grammar_tables.json from grammar.lark (`python -m dsl.syntax.parser`)."""
    from lark.grammar import Rule
    from lark.lexer import TerminalDef

    data, memo = _build().memo_serialize([TerminalDef, Rule])
    data["options"] = {k: v for k, v in data["options"].items() if k not in _per_parse()}
    digest = hashlib.sha256(_GRAMMAR.read_bytes()).hexdigest()
    text = json.dumps({"grammar_sha256": digest, "data": data, "memo": memo}, sort_keys=True, separators=(",", ":"))
    _TABLES.write_text(text + "\n")


def _tok_loc(file: str, tok: Token) -> Loc:
    return Loc(file, tok.line, tok.column, tok.end_line, tok.end_column)


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    """Lark tree -> ast nodes; every node gets the span of its rule."""

    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def _loc(self, meta) -> Loc:
        if getattr(meta, "empty", True):
            return Loc(self.file, 0, 0, 0, 0)
        return Loc(self.file, meta.line, meta.column, meta.end_line, meta.end_column)

    def _t(self, tok: Token) -> Loc:
        return _tok_loc(self.file, tok)

    def start(self, meta, graphs):
        return tuple(graphs)

    def graph(self, meta, ch):
        return ast.GraphDef(str(ch[0]), tuple(ch[1:]), self._loc(meta))

    def types_decl(self, meta, ch):
        kind, dtype = ch
        return ast.TypesDecl(str(kind), str(dtype), self._loc(meta), self._t(dtype))

    def option_decl(self, meta, ch):
        return ast.OptionDecl(str(ch[0]), ch[1], self._loc(meta))

    def _int(self, tok: Token) -> int:
        """An integer where the grammar has a NUMBER (one lexer state cannot tell them apart)."""
        if not str(tok).isdigit():
            raise DslError(Diagnostic("error", f"expected an integer, got {tok}", self._t(tok)))
        return int(tok)

    def dim_decl(self, meta, ch):
        return ast.DimDecl(str(ch[0]), tuple(self._int(t) for t in ch[1:]), self._loc(meta))

    def dim_range(self, meta, ch):
        lo, hi = (int(x) for x in str(ch[1]).split(".."))
        step = self._int(ch[2]) if len(ch) > 2 else 1
        return ast.DimDecl(str(ch[0]), (), self._loc(meta), span=(lo, hi, step))

    def input_decl(self, meta, ch):
        return ast.InputDecl(str(ch[0]), ch[1], tuple(ch[2:]), self._loc(meta))

    def scalar_decl(self, meta, ch):
        name, ty, value, *specs = ch
        return ast.ScalarDecl(str(name), ty.dtype, value, tuple(specs), self._loc(meta), ty.dtype_loc, dims=ty.dims)

    def output_decl(self, meta, ch):
        name, rest = ch[0], list(ch[1:])
        type_ = rest.pop(0) if rest and isinstance(rest[0], ast.TypeSpec) else None
        expr = rest.pop() if rest and not isinstance(rest[-1], ast.TensorSpec) else None
        return ast.OutputDecl(str(name), type_, tuple(rest), expr, self._loc(meta))

    def buffer_decl(self, meta, ch):
        return ast.BufferDecl(str(ch[0]), ch[1], tuple(ch[2:]), self._loc(meta))

    def place(self, meta, ch):
        offset = self._int(ch[1]) if len(ch) > 1 else None
        return ast.Place(str(ch[0]), offset, self._loc(meta))

    def assign(self, meta, ch):
        type_ = ch.pop(1) if isinstance(ch[1], ast.TypeSpec) else None
        return ast.Assign(tuple(str(t) for t in ch[:-1]), ch[-1], self._loc(meta), type_)

    def layout(self, meta, ch):
        return ast.Layout(str(ch[0]), self._loc(meta))

    def strides(self, meta, ch):
        return ast.Strides(tuple(v for v, _ in ch), self._loc(meta), tuple(loc for _, loc in ch))

    def stride(self, meta, ch):
        """(a number, or a product's factors; where it is written)"""
        factors = tuple(self._int(t) if t.type == "NUMBER" else str(t) for t in ch)
        value = factors[0] if len(factors) == 1 and isinstance(factors[0], int) else factors
        return value, self._loc(meta)

    def uid(self, meta, ch):
        return ast.Uid(self._int(ch[0]), self._loc(meta))

    def init(self, meta, ch):
        return ast.InitSpec(str(ch[0]), tuple(ch[1:]), self._loc(meta))

    def tensor_type(self, meta, ch):
        return ast.TypeSpec(str(ch[0]), tuple(ch[1:]), self._loc(meta), self._t(ch[0]))

    def out_type(self, meta, ch):
        dims = tuple(ch[1:]) if len(ch) > 1 else None
        return ast.TypeSpec(str(ch[0]), dims, self._loc(meta), self._t(ch[0]))

    def dim(self, meta, ch):
        tok = ch[0]
        value = self._int(tok) if tok.type == "NUMBER" else str(tok)
        return ast.Dim(value, self._loc(meta))

    def _binop(op):
        def method(self, meta, ch):
            return ast.BinOp(op, ch[0], ch[1], self._loc(meta))

        return method

    add, sub, mul, div = _binop("+"), _binop("-"), _binop("*"), _binop("/")

    def neg(self, meta, ch):
        return ast.Neg(ch[0], self._loc(meta))

    def call(self, meta, ch):
        name, args = ch[0], ch[1:]
        pos = tuple(a for a in args if not isinstance(a, ast.Kwarg))
        kws = tuple(a for a in args if isinstance(a, ast.Kwarg))
        return ast.Call(str(name), pos, kws, self._loc(meta), self._t(name))

    def ref(self, meta, ch):
        return ast.Ref(str(ch[0]), self._loc(meta))

    def num(self, meta, ch):
        return _number(ch[0], self._loc(meta))

    def kwarg(self, meta, ch):
        return ast.Kwarg(str(ch[0]), ch[1], self._loc(meta))

    def kwarg_uid(self, meta, ch):
        return ast.Kwarg(str(ch[0]), ch[1], self._loc(meta), self._int(ch[2]), self._t(ch[2]))

    def signed_number(self, meta, ch):
        n = _number(ch[0], self._loc(meta))
        if meta.column < ch[0].column:  # a leading '-' (filtered from the children)
            return ast.Number(-n.value, "-" + n.text, self._loc(meta))
        return n

    def ident(self, meta, ch):
        return ast.Ident(str(ch[0]), self._loc(meta))

    def string(self, meta, ch):
        return ast.String(str(ch[0])[1:-1], self._loc(meta))

    def list(self, meta, ch):
        return ast.ListValue(tuple(ch), self._loc(meta))


def _number(tok: Token, loc: Loc) -> ast.Number:
    text = str(tok)
    if text.isdigit():
        return ast.Number(int(text), text, loc)
    value = float(text)
    if math.isinf(value) or (value == 0 and any(c in "123456789" for c in text.lower().split("e")[0])):
        what = "too large" if math.isinf(value) else "too small (it would be 0)"
        raise DslError(Diagnostic("error", f"number {text} is {what} for a 64-bit float", loc))
    return ast.Number(value, text, loc)


def parse(text: str, file: str = "<string>") -> ast.Module:
    """Parses .cdg text; raises DslError with a located diagnostic on a syntax error."""
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    if len(text) > MAX_SOURCE_BYTES:
        raise DslError(
            Diagnostic(
                "error",
                f"file is {len(text):,} characters; the limit is {MAX_SOURCE_BYTES:,} (split it into several files)",
                Loc(file, 1, 1, 1, 2),
            )
        )
    comments: list[tuple[int, str]] = []
    collecting = _COMMENTS.set(comments)
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise DslError(_syntax_diagnostic(e, text, file)) from None
    except _TooLong as e:
        loc = _tok_loc(file, e.tok)
        raise DslError(
            Diagnostic("error", f"statement longer than {MAX_STATEMENT_TOKENS} tokens; split it into named steps", loc)
        ) from None
    finally:
        _COMMENTS.reset(collecting)
    try:
        graphs = _ToAst(file).transform(tree)
    except VisitError as e:  # an error raised inside a transformer method
        raise e.orig_exc from None
    _check_depth(graphs)
    return ast.Module(file, graphs, tuple(comments))


def _check_depth(graphs) -> None:
    """Later passes (the checker, the printer, the dumps) recurse over expressions and the values in them;
    refuse, at the node past the limit, any nested too deeply (an iterative walk: no recursion here)."""
    for g in graphs:
        for st in g.stmts:
            roots = [getattr(st, field, None) for field in ("expr", "value")]
            stack = [(root, 1) for root in roots if root is not None]
            while stack:
                e, d = stack.pop()
                if d > MAX_DEPTH:
                    what = "value" if isinstance(e, ast.ListValue) else "expression"
                    raise DslError(
                        Diagnostic("error", f"{what} nested more than {MAX_DEPTH} levels deep; {_FLATTEN[what]}", e.loc)
                    )
                stack.extend((k, d + 1) for k in _nested(e) if _nested(k))  # a name or a number is no level


_FLATTEN = {"expression": "split it into named steps", "value": "no attribute or option takes such a value"}


def _nested(e) -> tuple:
    """The expressions and values directly inside `e`."""
    if isinstance(e, ast.Call):
        return (*e.args, *(k.value for k in e.kwargs))
    if isinstance(e, ast.BinOp):
        return (e.lhs, e.rhs)
    if isinstance(e, ast.Neg):
        return (e.operand,)
    if isinstance(e, ast.ListValue):
        return e.items
    return ()


def _syntax_diagnostic(e: UnexpectedInput, text: str, file: str) -> Diagnostic:
    line, col = max(1, e.line or 1), max(1, e.column or 1)
    if isinstance(e, UnexpectedToken) and e.token.type == "$END" or isinstance(e, UnexpectedEOF):
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        what = "unexpected end of file"
    elif isinstance(e, UnexpectedToken):
        tok = e.token
        what = "unexpected end of line" if tok.type == "_NL" else f"unexpected '{tok}'"
        loc = Loc(file, tok.line, tok.column, tok.line, tok.column + len(str(tok).split("\n")[0]))
        return Diagnostic("error", f"syntax error: {what}; {_expected(e.expected)}", loc)
    else:
        # What the lexer could have lexed here is not what the parser expects, so only the character is named.
        char = text.splitlines()[line - 1][col - 1 : col] if isinstance(e, UnexpectedCharacters) else "?"
        return Diagnostic("error", f"syntax error: unexpected character {char!r}", Loc(file, line, col, line, col + 1))
    expected = getattr(e, "expected", None) or ()
    msg = f"syntax error: {what}" + (f"; {_expected(expected)}" if expected else "")
    return Diagnostic("error", msg, Loc(file, line, col, line, col + 1))


_CLOSERS = ("RBRACE", "RPAR", "RSQB")


def _expected(terminals) -> str:
    terminals = [t for t in terminals if not t.startswith("__")]
    closers = [_TERMINAL_NAMES[t] for t in _CLOSERS if t in terminals]  # the likeliest fix goes first
    names = closers + sorted({_TERMINAL_NAMES.get(t, _keyword(t)) for t in terminals} - set(closers))
    if len(names) > 6:
        names = names[:6] + ["..."]
    return "expected " + ", ".join(names)


def _keyword(terminal: str) -> str:
    for t in _lark().terminals:
        if t.name == terminal and t.pattern.type == "str":
            return repr(t.pattern.value)
    return terminal.lower()


if __name__ == "__main__":
    write_tables()
