"""The outputs of chosen decoder layers during a model's passes: EAGLE-3's low- and mid-level
features, which a fused drafter (`specdec.EagleDrafter` with ``feature_layers``) reads beside the
final hidden states."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch import Tensor, nn

__all__ = ["check_layers", "layer_outputs"]


def check_layers(model: nn.Module, layers: Sequence[int], who: str) -> tuple[int, ...]:
    """``layers`` as a tuple after checking that each is a decoder layer of ``model``
    (0 .. num_layers - 1, ascending, no repeats); ValueError otherwise."""
    count = len(model.get_decoder().layers)
    layers = tuple(int(i) for i in layers)
    if any(not 0 <= i < count for i in layers) or list(layers) != sorted(set(layers)):
        raise ValueError(f"{who}: feature layers must be distinct decoder layers in ascending order, within "
                         f"0..{count - 1} for this model, got {list(layers)}")
    return layers


@contextmanager
def layer_outputs(model: nn.Module, layers: Sequence[int]) -> Iterator[list[Tensor | None]]:
    """Within the block, the list yielded holds, after each pass of ``model``'s decoder, the
    output of each decoder layer in ``layers`` (the residual stream after it, ``[B, T, H]``), in
    that order; nothing is kept when ``layers`` is empty. Forward hooks, removed on exit.
    ValueError where ``layers`` are not the model's (:func:`check_layers`): a fused drafter
    made for a deeper model.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                                      num_hidden_layers=3, num_attention_heads=4)).eval()
        >>> ids = torch.tensor([[1, 5, 7]])
        >>> with torch.no_grad(), layer_outputs(model, [0, 2]) as taps:
        ...     out = model.model(ids, output_hidden_states=True)
        >>> [t.shape for t in taps], torch.equal(taps[0], out.hidden_states[1])  # hidden_states[0]: the embedding
        ([torch.Size([1, 3, 32]), torch.Size([1, 3, 32])], True)
    """
    layers = check_layers(model, layers, "specdec: the target's layers")
    taps: list[Tensor | None] = [None] * len(layers)
    decoder_layers = model.get_decoder().layers

    def keeper(slot: int):
        def hook(module: nn.Module, args: tuple, output: Tensor | tuple) -> None:
            taps[slot] = output[0] if isinstance(output, tuple) else output
        return hook

    handles = [decoder_layers[i].register_forward_hook(keeper(slot)) for slot, i in enumerate(layers)]
    try:
        yield taps
    finally:
        for handle in handles:
            handle.remove()
