"""The llama.cpp wrapper: one loaded model, its memory and vocabulary, and GGUF files read without loading.

Layer: runtime, the lowest but for ``errors``, ``paths`` and ``sizes``. ``model.Model``, with the methods it
gets from ``cache_control`` and ``vocabulary``, is the only place in localspec that calls llama.cpp on a
context (decode, logits, cutting and restoring memory); ``process`` holds llama.cpp's process-wide pieces.
Modules here import nothing of localspec above this layer.
"""
