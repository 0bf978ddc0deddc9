"""The model layer: the KV cache (``cache``), the attention backend for transformers
(``attention``), one forward over a token tree (``forward``), prefill (``prefill``), prompt
planning with no model (``prompt_plan``) and the CPU preparation of linear layers (``prepare``).

Importing this package imports nothing else: each module is loaded on its own, so that
``prompt_plan`` (used by the proposer protocol) stays free of transformers.
"""
