"""The prompt cache: saved model states for token prefixes, in RAM and on disk.

Layer: prompt_cache, above ``runtime`` (it saves and restores a ``Model``'s state) and below decoding.
"""
