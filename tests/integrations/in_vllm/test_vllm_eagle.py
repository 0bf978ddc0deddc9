"""EAGLE drafters of specdec in vLLM's ``eagle`` method (EagleLlamaForCausalLM).

- The export read by vLLM's own config classes; a drafter for another model refused.
- SmolLM2-135M (a Llama) with an untrained drafter (``EagleDrafter.for_target``: the target's
  last layer, ``fc`` adding the token's embedding to the feature), served by vLLM's CPU build:
  greedy output identical to vLLM without speculation, the four prompts one at a time and
  together, and vLLM's drafts are our drafter's (below). Untrained, it has (next to) no draft accepted.
- A tiny random Qwen2 target (SmolLM2's tokenizer) with q/k/v biases and a drafter that is
  nearly the target (see ``qwen2``): greedy output identical to vLLM without speculation with
  drafts accepted, and vLLM's drafts are our drafter's, so ``qkv_bias`` gives vLLM's Llama
  layer the biases Qwen2's layer has, and vLLM feeds the drafter after accepted drafts as
  specdec does (the target's features for every committed token).

vLLM's drafts are recorded by wrapping its proposer's ``propose`` (the engine runs in-process)
while each prompt runs alone; our drafter's chain (top-1 over the target's whole vocabulary,
as vLLM drafts) is computed on the same context from the target's features computed by
transformers, so a rare near-tie may differ in the last bits.
"""

from __future__ import annotations

import gc
import shutil
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("vllm")

from support.models import tiny_lm  # noqa: E402
from vllm_engines import MAX_TOKENS, PROMPTS, engine, run  # noqa: E402

from specdec import models  # noqa: E402
from specdec.proposers.eagle.drafter import EagleDrafter  # noqa: E402
from specdec.vllm import eagle_engine_args, export_eagle  # noqa: E402

K = 3  # num_speculative_tokens


@dataclass
class EagleRun:
    """One engine's greedy outputs, vLLM's drafts and counters."""

    prompt_ids: list[list[int]]
    singles: list[list[int]]
    chains: list[list[list[int]]]  # per prompt run alone: each proposal of vLLM's drafter
    single_metrics: dict[str, float]  # after the singles
    batch: list[list[int]]
    metrics: dict[str, float]  # after both


def eagle_run(model_dir, drafter_dir, prompts, max_tokens, batch=True) -> EagleRun:
    from vllm import SamplingParams
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    proposals: list[list[list[int]]] = []
    original = SpecDecodeBaseProposer.propose

    def propose(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        proposals.append((out[0] if isinstance(out, tuple) else out).tolist())
        return out

    def counters(llm):
        return {m.name: float(m.value) for m in llm.get_metrics() if hasattr(m, "value")}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SpecDecodeBaseProposer, "propose", propose)
        llm = engine(model_dir, **eagle_engine_args(drafter_dir, model_dir, num_speculative_tokens=K))
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
        try:
            prompt_ids, singles, chains = [], [], []
            for p, s in zip(prompts, params):
                start = len(proposals)
                out = llm.generate([p], [s], use_tqdm=False)[0]
                prompt_ids.append(list(out.prompt_token_ids))
                singles.append(list(out.outputs[0].token_ids))
                assert all(len(rows) == 1 for rows in proposals[start:])  # one request: one row
                chains.append([rows[0] for rows in proposals[start:]])
            single_metrics = counters(llm)
            together = ([list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
                        if batch else [])
            metrics = counters(llm)
        finally:
            del llm
            gc.collect()
    return EagleRun(prompt_ids, singles, chains, single_metrics, together, metrics)


@dataclass
class Replay:
    same: int  # vLLM's chains equal to ours
    chains: int  # chains compared
    drafted: int  # draft tokens verified (vLLM counts these)
    accepted: int


@torch.no_grad()
def replay(target, drafter, prompt_ids, output, chains) -> Replay:
    """Walk one request's steps as vLLM took them (each chain verified against the greedy text)
    and compare each of vLLM's chains with our drafter's on the same context: the pairs
    ``(x_{t+1}, f_t)`` of the committed tokens (the target's features), then its own."""
    seq = prompt_ids + output
    for _ in range(K):  # the greedy text past max_tokens, which the last step may verify
        seq.append(int(target(torch.tensor([seq])).logits[0, -1].argmax()))
    features = target.model(torch.tensor([seq])).last_hidden_state[0]
    lm_head = target.get_output_embeddings()
    n, end = len(prompt_ids) + 1, len(prompt_ids) + len(output)  # n: committed tokens (the prefill sampled one)
    result = Replay(0, 0, 0, 0)
    for chain in chains:
        ids, feats, ours = torch.tensor(seq[1:n]), features[: n - 1], []
        for _ in range(K):
            h = drafter(ids[None], feats[None])[0, -1]
            ours.append(int(lm_head(h).argmax()))
            ids, feats = torch.cat([ids, torch.tensor(ours[-1:])]), torch.cat([feats, h[None]])
        result.same += ours == chain
        result.chains += 1
        if n >= end:  # proposed in the request's last step: never verified
            break
        accepted = next((i for i in range(K) if chain[i] != seq[n + i]), K)
        result.drafted += K
        result.accepted += accepted
        n += accepted + 1
    assert n >= end, "vLLM proposed fewer chains than the request took steps"
    return result


def replay_all(target, drafter, run: EagleRun) -> Replay:
    total = Replay(0, 0, 0, 0)
    for prompt_ids, output, chains in zip(run.prompt_ids, run.singles, run.chains):
        r = replay(target, drafter, prompt_ids, output, chains)
        total = Replay(*(a + b for a, b in zip(vars(total).values(), vars(r).values())))
    return total


# --- SmolLM2 -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(model_dir):
    model, _ = models.load(model_dir)
    return model


@pytest.fixture(scope="module")
def smollm2_drafter(smollm2, tmp_path_factory):
    drafter = EagleDrafter.for_target(smollm2).eval()
    return drafter, export_eagle(drafter, tmp_path_factory.mktemp("eagle") / "vllm")


@pytest.fixture(scope="module")
def eagle(smollm2_drafter, model_dir) -> EagleRun:
    return eagle_run(model_dir, smollm2_drafter[1], PROMPTS, MAX_TOKENS)


def test_greedy_output_is_identical_one_at_a_time_and_batched(eagle, plain):
    assert [len(s) for s in eagle.singles] == MAX_TOKENS
    assert eagle.singles == plain.singles
    assert eagle.batch == plain.batch


def test_vllm_speculates_with_our_drafter_and_drafts_what_it_drafts(eagle, smollm2, smollm2_drafter):
    drafted = eagle.metrics["vllm:spec_decode_num_draft_tokens"]
    assert drafted > 100 and drafted % K == 0
    r = replay_all(smollm2, smollm2_drafter[0], eagle)
    print(f"SmolLM2, untrained drafter: {r}; vLLM counters after the singles {eagle.single_metrics}, "
          f"after all {eagle.metrics}")
    assert r.same >= r.chains - 2, f"{r.chains - r.same} of vLLM's {r.chains} chains differ from our drafter's"
    assert (r.drafted, r.accepted) == (eagle.single_metrics["vllm:spec_decode_num_draft_tokens"],
                                       eagle.single_metrics["vllm:spec_decode_num_accepted_tokens"])


# --- a tiny Qwen2 and a drafter that is almost the target: biases on q, k, v; drafts accepted --


@pytest.fixture(scope="module")
def qwen2(model_dir, tmp_path_factory):
    """A random one-layer Qwen2 (head size 64, which vLLM's CPU attention takes) over SmolLM2's
    tokenizer, saved for vLLM, with N(0, 0.5) q/k/v biases and embedding rows of RMS 1; and a
    drafter that is nearly the target: its layer the target's (copied whole),
    ``fc = [I, 0.03 I]`` (the token's embedding, a little of the feature). The target's input norm
    is then the identity (unit rows, unit weights) and its final norm does not move the argmax, so
    with ``fc = [I, 0]`` the drafter at position t would compute the target's position t + 1 but for
    the first token, which its attention does not see. The feature's part costs some acceptance
    (a random model's top logits are close) but makes the drafts depend on the features vLLM feeds
    after accepted drafts."""
    root = tmp_path_factory.mktemp("qwen2")
    target = tiny_lm("qwen2", seed=11, vocab=49152, layers=1, hidden_size=128, intermediate_size=256,
                     num_attention_heads=2, num_key_value_heads=1)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        embedding = target.get_input_embeddings().weight
        embedding.div_(embedding.pow(2).mean(-1, keepdim=True).sqrt())
        attention = target.model.layers[0].self_attn
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
            proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * 0.5)
    target.save_pretrained(root / "target")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{model_dir}/{name}", root / "target" / name)
    drafter = EagleDrafter.for_target(target).eval()
    layer = {k: v for k, v in target.model.layers[0].state_dict().items() if not k.startswith("input_layernorm")}
    with torch.no_grad():
        drafter.layer.load_state_dict(layer)  # the output projections too (a fresh drafter's are zero)
        drafter.fc.weight.copy_(torch.cat([torch.eye(128), 0.03 * torch.eye(128)], 1))
    return target, drafter, root / "target", export_eagle(drafter, root / "vllm")


@pytest.fixture(scope="module")
def qwen2_eagle(qwen2) -> EagleRun:
    _, _, target_dir, exported = qwen2
    return eagle_run(str(target_dir), exported, PROMPTS, MAX_TOKENS)


def test_qwen2_greedy_output_is_identical_with_drafts_accepted(qwen2, qwen2_eagle):
    plain = run(str(qwen2[2]))
    assert qwen2_eagle.singles == plain.singles
    assert qwen2_eagle.batch == plain.batch
    drafted = qwen2_eagle.metrics["vllm:spec_decode_num_draft_tokens"]
    assert qwen2_eagle.metrics["vllm:spec_decode_num_accepted_tokens"] > 0.1 * drafted


def test_a_qwen2_drafter_drafts_in_vllm_what_it_drafts_here(qwen2, qwen2_eagle):
    target, drafter, _, _ = qwen2
    r = replay_all(target, drafter, qwen2_eagle)
    print(f"tiny Qwen2, near-oracle drafter: {r}; vLLM counters after the singles {qwen2_eagle.single_metrics}, "
          f"after all {qwen2_eagle.metrics}")
    assert r.same >= r.chains - 2, f"{r.chains - r.same} of vLLM's {r.chains} chains differ from our drafter's"
    assert (r.drafted, r.accepted) == (qwen2_eagle.single_metrics["vllm:spec_decode_num_draft_tokens"],
                                       qwen2_eagle.single_metrics["vllm:spec_decode_num_accepted_tokens"])


# --- files ----------------------------------------------------------------------------------


def test_vllms_config_classes_read_the_export(qwen2, model_dir):
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    target, _, target_dir, exported = qwen2
    config = EAGLEConfig(get_config(str(exported), trust_remote_code=False), method="eagle", model_type="eagle")
    assert config.architectures == ["EagleLlamaForCausalLM"]
    assert "EagleLlamaForCausalLM" in ModelRegistry.get_supported_archs()
    # vLLM's LlamaDecoderLayer: q/k/v biases from qkv_bias, the o_proj bias from attention_bias.
    assert config.qkv_bias is True and config.attention_bias is False
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (1, 128, 49152)
    assert config.rope_parameters["rope_theta"] == target.config.rope_parameters["rope_theta"]
    assert getattr(config, "layer_types", None) is None  # per-layer lists would index the target's layers
    with pytest.raises(ValueError, match="hidden_size 128.*has hidden_size 576: a drafter trained for another model"):
        eagle_engine_args(exported, model_dir)
