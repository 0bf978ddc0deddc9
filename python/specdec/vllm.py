"""specdec inside vLLM (public names; the code is in :mod:`specdec.integrations.vllm`).

- ``PromptLookup``, ``Lookahead``: proposers for vLLM's ``custom_class`` speculative method::

      LLM(model=..., speculative_config={"method": "custom_class",
                                         "model": "specdec.vllm.PromptLookup",
                                         "num_speculative_tokens": 8})

- ``export_medusa(heads, out_dir)``: heads from ``specdec train-medusa`` in the layout of vLLM's
  ``medusa`` method; ``medusa_engine_args(out_dir, target_dir)`` checks them against
  the target and gives the engine arguments that serve them; ``lm_head_weight(target_dir)``
  reads the target's LM head for heads not attached to it.

See docs/integrations.md.
"""

from specdec.integrations.vllm import (
    TESTED_VLLM,
    Lookahead,
    PromptLookup,
    check_vllm_version,
    export_medusa,
    lm_head_weight,
    medusa_engine_args,
)

__all__ = ["TESTED_VLLM", "Lookahead", "PromptLookup", "check_vllm_version", "export_medusa", "lm_head_weight",
           "medusa_engine_args"]
