"""`model.generate(..., custom_generate=specdec.hf_generate(method))` on tiny models."""

import pytest
import torch
from transformers import GenerationConfig
from support.decoding import left_padded, PROMPTS
from support.models import perturbed, tiny_lm

import specdec


@pytest.mark.parametrize("method", ["lookup", "draft", None])
def test_greedy_identical_to_plain_generate(method):
    target = tiny_lm("qwen2", seed=21)
    methods = {"lookup": specdec.PromptLookup(), "draft": specdec.DraftModel(perturbed(target, 0.05, 1), 4),
               None: None}
    ids, mask = left_padded(PROMPTS)
    kw = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=2, eos_token_id=40)
    plain = target.generate(ids, **kw)
    fast = target.generate(ids, custom_generate=specdec.hf_generate(methods[method]), **kw)
    assert torch.equal(fast, plain)


def test_a_batch_served_a_few_rows_at_a_time_is_plain_generate():
    target = tiny_lm("qwen2", seed=21)
    ids, mask = left_padded(PROMPTS)
    kw = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=2, eos_token_id=40)
    plain = target.generate(ids, **kw)
    rows = []
    hook = target.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    fast = target.generate(ids, custom_generate=specdec.hf_generate(specdec.PromptLookup(), batching=specdec.Batching(max_batch_size=2)), **kw)
    hook.remove()
    assert torch.equal(fast, plain)
    assert max(rows) == 2


def test_generation_config_streamer_and_dict_output():
    target = tiny_lm("llama", seed=22)
    ids = torch.tensor([PROMPTS[2]])
    config = GenerationConfig(max_new_tokens=12, do_sample=False, pad_token_id=2, eos_token_id=1,
                              return_dict_in_generate=True)
    plain = target.generate(ids, generation_config=config)

    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Collect()
    fast = target.generate(ids, generation_config=config,
                           custom_generate=specdec.hf_generate(specdec.PromptLookup(), streamer=streamer))
    assert torch.equal(fast.sequences, plain.sequences)
    # The prompt once, then exactly the new tokens, then end.
    assert streamer.chunks[0] == PROMPTS[2] and streamer.chunks[-1] == "end"
    assert sum(streamer.chunks[1:-1], []) == plain.sequences[0, len(PROMPTS[2]):].tolist()


def test_seeded_sampling_matches_specdec_generate():
    target = tiny_lm("llama", seed=23, init=0.15)
    ids = torch.tensor([PROMPTS[0]])
    sample = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    hf = target.generate(ids, max_new_tokens=10, pad_token_id=2, eos_token_id=[], **sample,
                         custom_generate=specdec.hf_generate(specdec.PromptLookup(),
                                                             generator=torch.Generator().manual_seed(4)))
    ours = specdec.generate(target, ids, max_new_tokens=10, eos_token_id=[], **sample,
                            generator=torch.Generator().manual_seed(4)).sequences
    assert torch.equal(hf, ours)


@pytest.mark.parametrize("setting, match", [
    (dict(num_beams=2), "beam search"),
    (dict(repetition_penalty=1.2), "RepetitionPenalty"),
    (dict(no_repeat_ngram_size=2), "NoRepeatNGram"),
    (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
    (dict(min_new_tokens=3, eos_token_id=1), "MinNewTokens"),
])
def test_unsupported_settings_raise(setting, match):
    target = tiny_lm("llama", seed=24)
    with pytest.raises(ValueError, match=match):
        target.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=5, pad_token_id=2,
                        custom_generate=specdec.hf_generate(specdec.PromptLookup()), **setting)
