"""Ollama's API: request bodies translated into the server's request type, its routes and replies."""
