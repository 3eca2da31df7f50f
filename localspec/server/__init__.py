"""``localspec serve``: one loaded pair behind the OpenAI, Anthropic and Ollama HTTP APIs.

Layer: an entry point, with ``cli`` and ``bench``: it may import every layer below and nothing imports it
but the command line.
"""
