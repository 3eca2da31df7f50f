"""Drafting: every drafter, auto mode's choice among them, the costs it decides by and their calibration.

Layer: drafting, above ``sampling``, ``structured``, ``reasoning`` and ``runtime``; below ``decoding``, which
verifies what a drafter proposes. ``replay`` runs auto's policy offline over recorded generations.
"""
