"""Choosing tokens from logits and accepting drafts, in numpy: sampling, Leviathan/Chen acceptance, processors.

Layer: sampling, above ``runtime``. Pure functions of logit rows and options; nothing here decodes.
"""
