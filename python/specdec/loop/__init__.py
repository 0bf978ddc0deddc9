"""The verify loop and what it is made of: ``generate`` (the loop), ``protocol`` (what a
proposer implements), ``verify`` (the ops' verification of a step), ``rows`` (batch rows that
join and leave), ``random_streams`` and ``sampling``, ``cost_model``, ``shape_choice`` and ``pacing`` (how
many tokens a pass should verify, in which shape), ``stats`` (what a call returns).

The protocol's types (``specdec.loop.protocol``) import without transformers.
"""
