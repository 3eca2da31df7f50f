"""OpenAI's chat completions and completions: typed request bodies, routes, replies, logprobs.

Layer: an entry point, inside ``server``; it imports the server's shared modules and the layers below.
"""
