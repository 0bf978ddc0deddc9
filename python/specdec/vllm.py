"""specdec inside vLLM (public names; the code is in :mod:`specdec.integrations.vllm`).

- ``PromptLookup``, ``Lookahead``: proposers for vLLM's ``custom_class`` speculative method::

      LLM(model=..., speculative_config={"method": "custom_class",
                                         "model": "specdec.vllm.PromptLookup",
                                         "num_speculative_tokens": 8})

See docs/integrations.md.
"""

from specdec.integrations.vllm import TESTED_VLLM, Lookahead, PromptLookup, check_vllm_version

__all__ = ["TESTED_VLLM", "Lookahead", "PromptLookup", "check_vllm_version"]
