"""Finding models: the registry of named pairs, names and paths, other programs' stores, pairing, the Hub.

Layer: catalog, above ``runtime`` (it reads GGUF headers and vocabularies) and below the API (``loading``)
and the command line.
"""
