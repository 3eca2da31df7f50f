"""Reranking in the shape llama-server, Jina and Cohere use: ``POST /v1/rerank`` (and ``/rerank``).

Layer: an entry point, inside ``server``; it imports the server's shared modules and the layers below.
"""
