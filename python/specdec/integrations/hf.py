"""``model.generate(..., custom_generate=specdec.hf_generate(method))``: our decoders behind the
Hugging Face ``generate`` call an existing user already makes.

transformers 5 prepares the generation config, the stopping criteria and the logits processors,
then calls the callable given as ``custom_generate`` in place of its own decoding loop. This
one reads what it honours from the prepared ``generation_config`` and raises a clear error for
anything it would otherwise silently ignore.

Honoured: ``max_new_tokens`` / ``max_length``, ``do_sample``, ``temperature``, ``top_k``,
``top_p``, ``eos_token_id``, ``pad_token_id``, ``attention_mask``,
``return_dict_in_generate`` (``sequences`` only). Refused with an error: beam
search and other multi-sequence modes (``num_beams``, ``num_return_sequences``), every other
logits processor or warper (``repetition_penalty``, ``no_repeat_ngram_size``,
``min_new_tokens``, ``min_p``, ``typical_p``, bad or forced words, user ``logits_processor``),
stopping criteria other than length and EOS (``max_time``, ``stop_strings``, user criteria),
``output_scores`` / ``output_logits`` / ``output_attentions`` / ``output_hidden_states``,
``assistant_model`` and ``prompt_lookup_num_tokens`` (use a specdec method instead).

Streamers: transformers (5.24) does not hand a ``custom_generate`` callable the ``streamer``
given to ``generate``; give it to ``hf_generate(..., streamer=...)`` instead (a streamer given
to ``generate`` receives the prompt and nothing after it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from specdec.loop.options import Batching

__all__ = ["hf_generate"]

_WARPERS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper")
_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria")


def hf_generate(method=None, *, typical=None, generator: torch.Generator | None = None,
                pass_costs: dict[int, float] | None = None, streamer=None,
                batching: Batching | None = None) -> Callable:
    """A ``custom_generate`` callable running :func:`specdec.generate` with ``method``
    (``typical``, ``generator``, ``pass_costs``, ``streamer``, ``batching``: as there;
    ``Batching(max_batch_size=M)`` serves a large batch of prompts that many rows at a time, each row's
    output unchanged).

    Greedy output is identical to the model's plain ``generate``; sampling follows the same
    distribution (seeded by ``generator``, else by torch's global generator).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> import specdec
        >>> _ = torch.manual_seed(0)
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_attention_heads=4,
        ...     num_key_value_heads=2, num_hidden_layers=2, intermediate_size=64, vocab_size=50)).eval()
        >>> ids = torch.tensor([[1, 7, 8, 9, 7, 8]])
        >>> fast = model.generate(ids, max_new_tokens=8, do_sample=False,
        ...                       custom_generate=specdec.hf_generate(specdec.PromptLookup()))
        >>> torch.equal(fast, model.generate(ids, max_new_tokens=8, do_sample=False))
        True
    """

    def specdec_generate(model, input_ids: Tensor, logits_processor=None, stopping_criteria=None,
                         generation_config=None, synced_gpus: bool = False, **model_kwargs):
        from specdec.loop.generate import generate

        cfg = generation_config
        _check_supported(cfg, logits_processor, stopping_criteria, synced_gpus, model_kwargs)
        new = cfg.max_length - input_ids.shape[1]
        if new < 1:
            raise ValueError(f"specdec: nothing to generate (max_length {cfg.max_length}, "
                             f"prompt {input_ids.shape[1]} tokens)")
        eos = cfg._eos_token_tensor
        pad = cfg._pad_token_tensor
        out = generate(
            model, input_ids, max_new_tokens=new, method=method, do_sample=bool(cfg.do_sample),
            temperature=cfg.temperature if cfg.do_sample and cfg.temperature is not None else 1.0,
            top_k=(cfg.top_k or 0) if cfg.do_sample else 0,
            top_p=cfg.top_p if cfg.do_sample and cfg.top_p is not None else 1.0,
            eos_token_id=[] if eos is None else eos.reshape(-1).tolist(),
            pad_token_id=None if pad is None else int(pad),
            attention_mask=model_kwargs.get("attention_mask"), streamer=streamer,
            generator=generator, pass_costs=pass_costs, typical=typical, batching=batching,
        )
        # HF stops the batch when its longest row does: trim the columns no row reached.
        longest = int(out.stats.new_tokens_per_row.max())
        sequences = out.sequences[:, : input_ids.shape[1] + longest]
        if cfg.return_dict_in_generate:
            from transformers.generation.utils import GenerateDecoderOnlyOutput

            return GenerateDecoderOnlyOutput(sequences=sequences)
        return sequences

    return specdec_generate


def _check_supported(cfg, logits_processor, stopping_criteria, synced_gpus, model_kwargs) -> None:
    problems = []
    if (cfg.num_beams or 1) > 1 or (cfg.num_return_sequences or 1) > 1:
        problems.append("beam search / several sequences per prompt (num_beams, num_return_sequences)")
    for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(cfg, name, False):
            problems.append(name)
    for p in logits_processor or []:
        if type(p).__name__ not in _WARPERS:
            problems.append(f"logits processor {type(p).__name__} (from repetition_penalty, "
                            "no_repeat_ngram_size, min_new_tokens, min_p, ... or logits_processor=)")
    for c in stopping_criteria or []:
        if type(c).__name__ not in _CRITERIA:
            problems.append(f"stopping criterion {type(c).__name__} (stop_strings or stopping_criteria=)")
    if synced_gpus:
        problems.append("synced_gpus")
    if model_kwargs.get("inputs_embeds") is not None:
        problems.append("inputs_embeds (give input_ids)")
    if problems:
        raise ValueError("specdec.hf_generate does not support: " + "; ".join(problems))
