"""Reasoning models: the formats their thinking is written in, a model's own format, and its budget gate.

Layer: reasoning, above ``structured`` (a reasoning budget closes over a grammar) and ``runtime``.
"""
