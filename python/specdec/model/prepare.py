"""Cheap, exact verification passes on CPU: linear layers that cost little more for k rows
than for one, and give a row the same bits for every k.

Speculative decoding pays only when a target pass over k proposed tokens costs little more than
a pass over one. On CPU in float32 it does not, out of the box: for k >= 2 ``F.linear`` runs a
GEMM that re-packs the whole weight matrix on every call, so a pass over 2 tokens can cost 2-3
one-token passes; and it takes other paths for 1, 2-3 and 4+ rows, so a token's logits depend
on how many tokens share the pass. :func:`pack_linear_layers` swaps every ``nn.Linear`` for

- a :class:`DotLinear` (the default where specdec's own kernel has AVX2/FMA): the plain weight,
  multiplied by ``specdec.ops.linear``, which streams it once per pass and sums every output in
  one fixed order, or
- a :class:`PackedLinear` (elsewhere, or asked for): the weight packed ONCE into
  oneDNN's blocked layout (through torch's own ``torch.ops.mkldnn`` ops), which serves every k;
  the packed copy REPLACES the weight, except for a weight that another module also uses (an
  output head tied to the input embeddings), which keeps its plain tensor for the embedding and
  gets a packed copy (see :func:`memory_overhead`).

The layers live in :mod:`specdec.model.linear_layers` (and are exported here too);
docs/verification.md has the measurements.

:func:`profile_passes` measures what a pass over k tokens costs on the machine it runs on, for
decoders that choose how many tokens to verify.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from specdec.model.linear_layers import DOT_DTYPES, DotLinear, PackedLinear, UpcastLinear, dense_weight
from specdec.renamed import warn_renamed

__all__ = [
    "DotLinear",
    "PackedLinear",
    "UpcastLinear",
    "PackingConfig",
    "bf16_packable",
    "copy_in_dtype",
    "VerificationConfig",
    "accelerate_verification",
    "dot_kernel_pays",
    "is_prepared",
    "pack_linear_layers",
    "dense_weight",
    "memory_overhead",
    "profile_passes",
]


@dataclass(frozen=True)
class PackingConfig:
    """How :func:`pack_linear_layers` packs weights.

    ``batch_hint`` is the number of rows oneDNN chooses the blocked layout for; any layout serves
    every number of rows correctly, the hint only tunes speed (16 measured best over k = 2..64).
    ``dtypes`` are the weight dtypes that are packed (bfloat16 only where oneDNN supports it on
    this CPU); both gained at every k measured, bfloat16 a little less than float32.
    ``pack_shared`` packs weights that another module also uses (a tied output head), at the cost
    of a packed copy beside the plain tensor.
    ``min_rows``: products over fewer rows are padded with zero rows to this many. oneDNN
    reduces a one-row product in another order than products over 2 or more rows (whenever
    ``in_features > 1024``, fp32 and bf16), while every row count from 2 up gives a row
    the same bits; padding makes a token's logits independent of how many tokens share the pass,
    which keeps speculative decoding exact in bf16 (docs/verification.md). 4, because oneDNN's
    4-row products run faster than its 1- and 2-row ones (docs/benchmarks.md): the padding is
    free. 1 turns padding off.

    ``upcast_rows``: on a CPU whose oneDNN has no bfloat16 products (no AVX512-BF16/AMX,
    :func:`bf16_packable`), the bfloat16 layers stay unpacked, and torch multiplies them row by
    row: a product over k rows costs k one-row products, a prompt's prefill many times its
    float32 one (docs/benchmarks.md). With ``upcast_rows = n > 0`` those layers become :class:`UpcastLinear`, which computes
    products over n rows or more in float32 on a transient float32 copy of the weight. Its
    logits then depend on how many rows share the pass, so it is off (0) by default and on only
    for drafts, whose logits only propose (exactness never depends on them).

    ``kernel``: what multiplies the layers. ``"specdec"``: :class:`DotLinear` (specdec's own
    kernel, float32 and bfloat16: the plain weight, no copy, every row count summed one way, by
    construction; the fastest for the single rows of decoding steps); ``"onednn"``:
    :class:`PackedLinear`; ``"auto"``: specdec's where its kernel runs with AVX2/FMA or AVX-512
    (x86-64 CPUs since 2013), oneDNN's elsewhere, where specdec's portable build would be slower.
    ``batch_hint``, ``pack_shared`` and ``min_rows`` apply to :class:`PackedLinear` layers only;
    ``upcast_rows`` to bfloat16 layers that neither kernel takes.

    A draft model only proposes: its logits need not be the same for every row count, so
    :meth:`for_draft` takes oneDNN's kernel, whose bfloat16 products are several times faster on
    CPUs with AMX (docs/verification.md), turns padding off, which makes a small draft's one-token
    passes cheaper (docs/benchmarks.md), and turns on ``upcast_rows``.
    """

    batch_hint: int = 16
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    pack_shared: bool = True
    min_rows: int = 4
    upcast_rows: int = 0
    kernel: Literal["auto", "specdec", "onednn"] = "auto"

    def __post_init__(self) -> None:
        if self.kernel not in ("auto", "specdec", "onednn"):
            raise ValueError(f"PackingConfig: kernel must be 'auto', 'specdec' or 'onednn', got {self.kernel!r}")
        if self.min_rows < 1:
            raise ValueError(f"PackingConfig: min_rows must be >= 1, got {self.min_rows}")
        if self.upcast_rows < 0:
            raise ValueError(f"PackingConfig: upcast_rows must be >= 0 (0: off), got {self.upcast_rows}")

    @classmethod
    def for_draft(cls) -> PackingConfig:
        """The configuration for a model that only proposes tokens (a draft): oneDNN's kernel
        (no row invariance needed), no padding, and bfloat16 products over 10 rows or more in
        float32 where oneDNN cannot pack bfloat16 (10: where the upcast pays for every layer
        shape of Qwen2.5-Coder-0.5B on an AVX2 CPU, docs/benchmarks.md).

        Example:
            >>> draft = PackingConfig.for_draft()
            >>> draft.kernel, draft.min_rows, draft.upcast_rows
            ('onednn', 1, 10)
        """
        return cls(min_rows=1, upcast_rows=10, kernel="onednn")


def pack_linear_layers(
    model: nn.Module, config: PackingConfig | None = None
) -> nn.Module:
    """Prepare a CPU model so passes over many tokens cost little more than one, and a token's
    outputs do not depend on how many tokens share the pass.

    Replaces, in place, every ``nn.Linear`` (exactly that class; subclasses such as quantized
    linears are left alone) whose weight dtype is in ``config.dtypes`` by a :class:`DotLinear`
    (``config.kernel``: by default where specdec's kernel runs with AVX2/FMA or AVX-512) or a
    :class:`PackedLinear`, one layer at a time so peak memory grows by one layer only; with
    ``config.upcast_rows``, a bfloat16 layer that neither takes (oneDNN without AVX512-BF16)
    becomes an :class:`UpcastLinear`. Returns ``model``. Outputs equal the unprepared model's up to float
    rounding (the products are summed in another order). A model with any parameter or buffer
    off the CPU (CUDA, meta) and a model already prepared are returned unchanged; without
    oneDNN, only the :class:`DotLinear` layers are made. Inference only: prepared layers pass no
    gradients. Parameters that view memory torch did not allocate (a memory-mapped checkpoint)
    are copied into memory of their own, so that the mapping is released.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        >>> x = torch.randn(3, 8)
        >>> before = model(x)
        >>> model = pack_linear_layers(model, PackingConfig(kernel="onednn"))
        >>> type(model[0]).__name__
        'PackedLinear'
        >>> torch.allclose(model(x), before, rtol=1e-5, atol=1e-6)
        True
    """
    config = config or PackingConfig()
    dot = set(config.dtypes) & set(DOT_DTYPES) if _kernel(config) == "specdec" else set()
    packable = set(config.dtypes) if bf16_packable() else set(config.dtypes) - {torch.bfloat16}
    if not torch.backends.mkldnn.is_available():
        packable = set()
    dtypes = packable | dot
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.device.type != "cpu" for t in tensors) or is_prepared(model):
        return model
    upcast = set(config.dtypes) - dtypes if config.upcast_rows else set()  # asked for, not packable
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    targets = [
        name
        for name, m in model.named_modules(remove_duplicate=False)
        if type(m) is nn.Linear
        and m.weight.dtype in dtypes | upcast
        and (config.pack_shared or uses[id(m.weight)] == 1 or m.weight.dtype in dot)
    ]
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, child)
        if type(linear) is not nn.Linear:  # the same module reached under a second name
            continue
        if linear.weight.dtype in upcast:
            setattr(parent, child, UpcastLinear(linear, config.upcast_rows))
        elif linear.weight.dtype in dot and linear.weight.is_contiguous():
            setattr(parent, child, DotLinear(linear))
        elif linear.weight.dtype in packable:
            shared = uses[id(linear.weight)] > 1
            setattr(parent, child, PackedLinear(linear, config.batch_hint, shared, config.min_rows))
    if targets:
        _own_memory(model)
    return model


def is_prepared(model: nn.Module) -> bool:
    """Whether :func:`pack_linear_layers` prepared any of ``model``'s linear layers.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 8))
        >>> is_prepared(model), is_prepared(pack_linear_layers(model))
        (False, True)
    """
    return any(isinstance(m, (PackedLinear, UpcastLinear, DotLinear)) for m in model.modules())


def copy_in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """An unprepared copy of ``model`` with its parameters in ``dtype``: every prepared linear
    layer back to a plain ``nn.Linear`` (a :class:`PackedLinear` unpacked), parameters converted
    (tied ones stay tied, but for a packed head: it keeps no plain weight to share), buffers
    copied as they are (rotary tables stay float32), frozen. The model is not changed. For
    passes whose result may differ by rounding from the model's own, e.g. a training's data in
    bfloat16 where the CPU multiplies it natively.

    Example:
        >>> model = pack_linear_layers(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
        >>> half = copy_in_dtype(model, torch.bfloat16)
        >>> type(half[0]).__name__, half[0].weight.dtype, next(model.parameters()).dtype
        ('Linear', torch.bfloat16, torch.float32)
        >>> x = torch.randn(3, 8)
        >>> torch.allclose(half(x.bfloat16()).float(), model(x), atol=0.1)
        True
    """
    memo: dict[int, object] = {}

    def converted(p: Tensor) -> nn.Parameter:
        if id(p) not in memo:
            memo[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=False)
        return memo[id(p)]  # type: ignore[return-value]

    for m in model.modules():
        if isinstance(m, (PackedLinear, DotLinear, UpcastLinear)):
            plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
            plain.weight = converted(m.weight) if m.weight is not None else nn.Parameter(
                dense_weight(m).to(dtype), requires_grad=False)
            if m.bias is not None:
                plain.bias = converted(m.bias)
            memo[id(m)] = plain  # deepcopy takes it for the prepared layer (never copying its packed weight)
    for p in model.parameters():
        converted(p)
    return copy.deepcopy(model, memo)


def _kernel(config: PackingConfig) -> str:
    """``config.kernel`` with "auto" resolved: specdec's kernel where it runs with AVX2/FMA or
    AVX-512 (torch reports the CPU's capability), oneDNN's elsewhere."""
    if config.kernel != "auto":
        return config.kernel
    return "specdec" if dot_kernel_pays() else "onednn"


def dot_kernel_pays() -> bool:
    """Whether specdec's own kernel (:class:`DotLinear`) is built for this CPU's vector units
    (AVX2/FMA or AVX-512, as torch reports them): where it is, it is the fastest for decoding's
    few-row products; elsewhere its portable build is slower than oneDNN's.

    Example:
        >>> isinstance(dot_kernel_pays(), bool)
        True
    """
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def bf16_packable() -> bool:
    """Whether oneDNN multiplies bfloat16 on this CPU (AVX512-BF16 or AMX): only then does
    :func:`pack_linear_layers` pack bfloat16 layers.

    Example:
        >>> isinstance(bf16_packable(), bool)
        True
    """
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _own_memory(model: nn.Module) -> None:
    # transformers memory-maps safetensors checkpoints, and a mapping stays alive while any one
    # tensor views it: after the linear weights were replaced, the embeddings and norms would keep
    # the whole file mapped, and the packed copies would double the resident memory (13 GB instead
    # of 7 for Qwen2.5-Coder-1.5B in fp32). Tensors on memory that torch did not allocate (not
    # resizable: a mapped file, a foreign buffer) are copied into memory of their own instead.
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if not t.untyped_storage().resizable():
                t.data = t.data.clone()


def memory_overhead(model: nn.Module) -> int:
    """Bytes that :func:`pack_linear_layers` added to ``model``.

    0 when no plain weight stays in memory beside its packed copy and the layers' sizes are
    multiples of oneDNN's blocks (on AVX2: 64 outputs, 16 inputs; real models' are), else what
    the copies and the padding of the blocks take.

    Example:
        >>> emb = nn.Embedding(64, 64)
        >>> model = nn.ModuleDict({"emb": emb, "head": nn.Linear(64, 64, bias=False)})
        >>> model["head"].weight = emb.weight  # a tied output head
        >>> memory_overhead(pack_linear_layers(model, PackingConfig(kernel="onednn")))  # 64 * 64 * 4 bytes
        16384
    """
    return sum(m.extra_bytes for m in model.modules() if isinstance(m, PackedLinear))


@torch.inference_mode()
def profile_passes(
    model: nn.Module,
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    prefix_len: int = 100,
    repeats: int = 5,
    seed: int = 0,
) -> dict[int, float]:
    """Milliseconds (median of ``repeats``) of one forward pass over k new tokens, for each k.

    Each pass runs on a KV cache (``DynamicCache``) already holding ``prefix_len`` tokens, as a
    verification step does, and returns logits for all k positions; the cache is cropped back to
    the prefix after every pass. Token ids are random (seeded): the cost does not depend on them.
    One unmeasured pass per k comes first, so lazily initialised paths are not counted; the
    measured passes then take the ks in turn, ``repeats`` rounds.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> cost = profile_passes(LlamaForCausalLM(cfg), ks=(1, 4), prefix_len=8, repeats=2)
        >>> sorted(cost) == [1, 4] and all(ms > 0 for ms in cost.values())
        True
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prefix = torch.randint(vocab, (1, prefix_len), generator=gen).to(device)
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix, cache=cache, use_cache=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def one_pass(ids: Tensor) -> float:
        sync()
        start = time.perf_counter()
        model(input_ids=ids, cache=cache, use_cache=True)
        sync()
        elapsed = time.perf_counter() - start
        cache.crop(prefix_len - cache.get_seq_length())
        return elapsed

    ids = {k: torch.randint(vocab, (1, k), generator=gen).to(device) for k in ks}
    for k in ks:
        one_pass(ids[k])
    # Round robin over k: a slow spell of the machine slows every k alike, not one of them.
    samples: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            samples[k].append(one_pass(ids[k]))
    return {k: statistics.median(samples[k]) * 1e3 for k in ks}


def accelerate_verification(model: nn.Module, config: PackingConfig | None = None) -> nn.Module:
    """Deprecated name of :func:`pack_linear_layers` (it read like Hugging Face's ``accelerate``)."""
    warn_renamed("specdec.accelerate_verification", "specdec.pack_linear_layers")
    return pack_linear_layers(model, config)


@dataclass(frozen=True)
class VerificationConfig(PackingConfig):
    """Deprecated name of :class:`PackingConfig`."""

    def __post_init__(self) -> None:
        warn_renamed("specdec.VerificationConfig", "specdec.PackingConfig", stacklevel=4)
        super().__post_init__()
