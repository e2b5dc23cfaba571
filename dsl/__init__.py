"""The .cdg language: grammar, parser, AST, checked IR, op registry and printer.

Imports neither torch nor cuDNN, so it runs anywhere (a test proves it). The front door is
``dsl.pipeline.load``.
"""
