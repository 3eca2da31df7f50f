"""Handing a pair to a serving engine: the command that runs the same speculation on vLLM or llama-server.

Layer: the API's, beside ``localspec.api``; it reads GGUF metadata (``runtime``) and the method registry.
"""
