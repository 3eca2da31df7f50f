"""Several generations of one pair at once: a lane per sequence of its models' contexts, decoded together.

A pair loaded with ``parallel=N`` holds N sequences in each model's context (one unified cache). Lane 0 is the
pair itself; lane i is the same pair over sequence i of each model. ``generate_many`` runs one generation per
lane, each exactly as it would run alone (its own drafter, acceptance, cut-backs and prompt-cache restores),
as members of one ``StepBatcher``, the loop that gathers their decode calls into one llama.cpp decode per model
and step. The pair's prompt cache, history, cost correction and measured costs are shared by its lanes.

The lanes share the context's cells. A generation starts when what it needs (its prompt, less what it shares,
and room for its reply: its max_tokens, or a typical reply where it set none) fits beside what the running
ones claim; until then it waits (``room_waits``). One that still runs out of cells is set aside by the loop
and brought back when room comes, so a request that fits alone never fails for the others.

``pool.Lanes`` holds, admits and runs the lanes; ``sharing`` lets one start from the cells another holds.

Layer: API, beside ``localspec.api`` (which gives each pair its lanes); above ``decoding``, ``drafting`` and
``runtime``.
"""

from .pool import Lanes, Prompt, is_conversation

__all__ = ["Lanes", "Prompt", "is_conversation"]
