"""specdec inside vLLM (public names; the code is in :mod:`specdec.integrations.vllm`).

- ``PromptLookup``, ``Lookahead``: proposers for vLLM's ``custom_class`` speculative method::

      LLM(model=..., speculative_config={"method": "custom_class",
                                         "model": "specdec.vllm.PromptLookup",
                                         "num_speculative_tokens": 8})

- ``export_medusa(heads, out_dir)``: heads from ``specdec train-medusa`` in the layout of vLLM's
  ``medusa`` method; ``medusa_engine_args(out_dir, target_dir)`` checks them against
  the target and gives the engine arguments that serve them; ``lm_head_weight(target_dir)``
  reads the target's LM head for heads not attached to it.
- ``export_eagle(drafter, out_dir)``: an EAGLE drafter (``specdec train-eagle``) in the layout of
  vLLM's ``eagle`` method (``EagleLlamaForCausalLM``; Llama and Qwen2 targets);
  ``eagle_engine_args(out_dir, target_dir, num_speculative_tokens=3)`` checks it against the
  target and gives the engine arguments that serve it.

See docs/integrations.md.
"""

from specdec.integrations.vllm import (
    TESTED_VLLM,
    Lookahead,
    PromptLookup,
    check_vllm_version,
    eagle_engine_args,
    export_eagle,
    export_medusa,
    lm_head_weight,
    medusa_engine_args,
)

__all__ = ["TESTED_VLLM", "Lookahead", "PromptLookup", "check_vllm_version", "eagle_engine_args", "export_eagle",
           "export_medusa", "lm_head_weight", "medusa_engine_args"]
