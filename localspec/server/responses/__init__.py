"""OpenAI's Responses API: request bodies translated into the server's request type, its route and replies.

Layer: an entry point, inside ``server``; it imports the server's shared modules and the layers below.
"""
