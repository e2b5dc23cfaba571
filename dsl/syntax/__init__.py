"""Syntax: the grammar, the parser to an AST, and the canonical printer."""
