"""Anthropic's Messages API: request bodies translated into the server's request type, and its replies."""
