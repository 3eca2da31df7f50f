"""Structured output: a generation's grammar state, and tool calls (the grammar they follow, read back).

Layer: structured, above ``runtime``. What a caller asks for (``localspec.constraint``) lives below, with the
options; this package runs it over llama.cpp's vocabulary.
"""
