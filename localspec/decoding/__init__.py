"""The speculative decoding loop: one generation's rounds of draft, verify, accept and cut back.

Layer: decoding, above ``drafting``, ``sampling``, ``structured``, ``reasoning``, ``prompt_cache`` and
``runtime``, with ``localspec.events`` (what a round reports); below the API (``localspec.api``).
"""
