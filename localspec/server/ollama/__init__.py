"""Ollama's API: request bodies translated into the server's request type, its routes and replies.

Layer: an entry point, inside ``server``; it imports the server's shared modules and the layers below.
"""
