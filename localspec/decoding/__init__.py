"""The speculative decoding loop: one generation's rounds of draft, verify, accept and cut back.

``plan`` holds what a generation will do, ``rounds`` runs one round, ``engine`` a whole generation (its prompt,
rounds, events, stats and caches), and ``stop_text`` finds stop strings in the streamed text.

Layer: decoding, above ``drafting``, ``sampling``, ``structured``, ``reasoning``, ``prompt_cache`` and
``runtime``, with ``localspec.events`` (what a round reports); below the API (``localspec.api``).
"""
