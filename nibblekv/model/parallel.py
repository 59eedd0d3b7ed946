"""Tensor parallelism for :class:`CausalLM`: how a model is cut across ranks, and the layers that cut it.

Every rank holds one *shard* (:class:`TPShard`) and runs the same forward on it:

* attention: a contiguous range of KV heads and the query heads that read them (column-parallel
  ``qkv_proj``), then a row-parallel ``o_proj`` whose partial sums are all-reduced;
* MLP: a contiguous range of the intermediate dimension (column-parallel ``gate_up_proj``,
  row-parallel ``down_proj`` + all-reduce);
* embedding and LM head: a contiguous range of the vocabulary (all-reduce after the lookup, all-gather
  of the logits, so every rank ends with the full ``[N, vocab]``).

Head split rule (:func:`partition`): with at least as many KV heads as ranks, KV heads are dealt out
as evenly as possible, *unevenly if need be* (SmolLM2's 3 KV heads on 2 ranks: 2 + 1, with 6 + 3
query heads). That is exact, since attention is per head and the row-parallel sum does not care how
many heads each rank contributed; it only costs balance. With fewer KV heads than ranks, each KV head
is replicated on ``tp / kv_heads`` ranks that split its query heads; anything else is refused.
Norms, RoPE and biases of row-parallel layers are replicated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nibblekv.model.causal_lm import CausalLM
from nibblekv.model.config import ModelConfig

Weights = Iterator[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class TPContext:
    """This process's place in a tensor-parallel group; ``group=None`` means the default group."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.size})")


@dataclass(frozen=True)
class TPShard:
    """Half-open ranges of the global model this rank owns; ``vocab_rows`` is the padded shard height
    (equal on every rank, as all-gather needs; rows past ``vocab[1] - vocab[0]`` are zero)."""

    rank: int
    size: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]
    vocab_rows: int

    @property
    def num_q_heads(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


def _even(n: int, parts: int, i: int) -> tuple[int, int]:
    """Part ``i`` of ``range(n)`` cut into ``parts`` contiguous pieces whose sizes differ by <= 1."""
    return n * i // parts, n * (i + 1) // parts


def partition(config: ModelConfig, rank: int, size: int) -> TPShard:
    """The shard of ``rank`` in a group of ``size``; ``ValueError`` when heads cannot be split exactly."""
    hq, hkv = config.num_heads, config.num_kv_heads
    group = hq // hkv  # query heads per KV head
    if size > hq:
        raise ValueError(f"--tp-size {size} is larger than the model's {hq} attention heads")
    if config.intermediate_size < size:
        raise ValueError(f"--tp-size {size} is larger than intermediate_size {config.intermediate_size}")
    if hkv >= size:
        kv = _even(hkv, size, rank)
        q = (kv[0] * group, kv[1] * group)
    else:
        replicas = size // hkv
        if size % hkv or group % replicas:
            raise ValueError(
                f"--tp-size {size} cannot split {hq} query / {hkv} KV heads: with fewer KV heads than "
                f"ranks, tp must be a multiple of the KV heads and divide each KV head's {group} query heads"
            )
        per_rank = group // replicas
        kv = (rank // replicas, rank // replicas + 1)
        q = (rank * per_rank, (rank + 1) * per_rank)
    rows = -(-config.vocab_size // size)
    vocab = (min(rank * rows, config.vocab_size), min((rank + 1) * rows, config.vocab_size))
    return TPShard(rank, size, q, kv, _even(config.intermediate_size, size, rank), vocab, rows)


def local_config(config: ModelConfig, shard: TPShard) -> ModelConfig:
    """The config a rank's layers are built from: its own heads and intermediate size.

    ``vocab_size`` stays global: it is what callers validate token ids against and the width of the
    (gathered) logits.
    """
    return replace(
        config,
        num_heads=shard.num_q_heads,
        num_kv_heads=shard.num_kv_heads,
        intermediate_size=shard.intermediate[1] - shard.intermediate[0],
    )


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local @ W_local^T) + b``: the input dimension is split, the bias replicated.

    Parameter names match :class:`nn.Linear` (``weight [out, in_local]``, ``bias [out]``).
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool, group: dist.ProcessGroup | None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        dist.all_reduce(y, group=self.group)
        # NOTE: the bias is added once, after the sum; adding it per rank would count it tp times.
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, start + num_real)`` of the embedding; other ids look up zeros, then all-reduce."""

    def __init__(
        self, rows: int, hidden: int, start: int, num_real: int, group: dist.ProcessGroup | None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.start = start
        self.num_real = num_real
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_real)
        out = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[:, None], 0.0)
        dist.all_reduce(out, group=self.group)
        return out


class TPCausalLM(CausalLM):
    """One rank's shard of a :class:`CausalLM`; same ``forward`` / ``compute_logits`` contract.

    ``config`` is the *local* config (its ``num_kv_heads`` sizes this rank's KV pool);
    ``full_config`` the checkpoint's. Every forward and every :meth:`compute_logits` call is a
    collective: all ranks must make the same calls with the same row counts, in the same order.
    """

    def __init__(self, config: ModelConfig, tp: TPContext) -> None:
        shard = partition(config, tp.rank, tp.size)
        super().__init__(local_config(config, shard))
        self.full_config = config
        self.shard = shard
        self.tp = tp
        hidden = config.hidden_size
        real = shard.vocab[1] - shard.vocab[0]
        self.model.embed_tokens = VocabParallelEmbedding(  # type: ignore[assignment]
            shard.vocab_rows, hidden, shard.vocab[0], real, tp.group
        )
        if self.lm_head is not None:
            self.lm_head = nn.Linear(hidden, shard.vocab_rows, bias=False)
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.o_proj = RowParallelLinear(  # type: ignore[assignment]
                shard.num_q_heads * config.head_dim, hidden, config.o_proj_bias, tp.group
            )
            mlp.down_proj = RowParallelLinear(mlp.intermediate_size, hidden, False, tp.group)  # type: ignore[assignment]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [N, hidden]`` -> float32 logits ``[N, vocab]``, identical on every rank."""
        local = F.linear(hidden, self.lm_head_weight).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.tp.size)]
        dist.all_gather(parts, local, group=self.tp.group)
        return torch.cat(parts, dim=-1)[:, : self.full_config.vocab_size].float()


def _rows(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return t[lo:hi]


def _shard_scale(
    name: str, t: torch.Tensor, config: ModelConfig, shard: TPShard, block: int | None
) -> torch.Tensor:
    """This rank's FP8 ``weight_scale``: per-channel scales ``[N]`` follow a column-parallel layer's rows and
    are whole for a row-parallel one; block scales ``[N/B, K/B]`` follow the weight's cut in block units
    (the cut must fall on a block boundary); per-tensor scalars are replicated."""
    if t.numel() == 1:
        return t
    d = config.head_dim
    q, kv, mlp = shard.q_heads, shard.kv_heads, shard.intermediate
    cuts = {
        ".self_attn.q_proj.": (0, q[0] * d, q[1] * d, config.q_size),
        ".self_attn.k_proj.": (0, kv[0] * d, kv[1] * d, config.kv_size),
        ".self_attn.v_proj.": (0, kv[0] * d, kv[1] * d, config.kv_size),
        ".self_attn.o_proj.": (1, q[0] * d, q[1] * d, config.q_size),
        ".mlp.gate_proj.": (0, *mlp, config.intermediate_size),
        ".mlp.up_proj.": (0, *mlp, config.intermediate_size),
        ".mlp.down_proj.": (1, *mlp, config.intermediate_size),
    }
    cut = next((c for key, c in cuts.items() if key in name), None)
    if cut is None:
        return t
    dim, lo, hi, total = cut
    if block is None:
        return t[lo:hi] if dim == 0 else t
    if lo % block or (hi % block and hi != total):
        raise ValueError(
            f"--tp-size {shard.size}: rank {shard.rank} of {name} is [{lo}, {hi}) of {total}, which does not "
            f"fall on the checkpoint's {block}-wide FP8 scale blocks; choose a --tp-size that does"
        )
    lo_b, hi_b = lo // block, -(-hi // block)
    return t[lo_b:hi_b] if dim == 0 else t[:, lo_b:hi_b]


def shard_tensor(
    name: str, t: torch.Tensor, config: ModelConfig, shard: TPShard, block: int | None = None
) -> torch.Tensor:
    """This rank's slice of HF-named, HF-shaped checkpoint tensor ``t`` (a view where possible);
    ``block``: the FP8 weight block size of a block-scaled checkpoint (its scales are cut in blocks)."""
    if name.endswith(".weight_scale"):
        return _shard_scale(name, t, config, shard, block)
    d = config.head_dim
    q, kv, mlp = shard.q_heads, shard.kv_heads, shard.intermediate
    if ".self_attn.q_proj." in name:
        return _rows(t, q[0] * d, q[1] * d)
    if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
        return _rows(t, kv[0] * d, kv[1] * d)
    if name.endswith(".self_attn.o_proj.weight"):
        return t[:, q[0] * d : q[1] * d]
    if ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
        return _rows(t, *mlp)
    if name.endswith(".mlp.down_proj.weight"):
        return t[:, mlp[0] : mlp[1]]
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        part = _rows(t, *shard.vocab)
        if part.shape[0] < shard.vocab_rows:  # the last rank's padding rows: zero logits, never looked up
            part = torch.cat([part, part.new_zeros(shard.vocab_rows - part.shape[0], *part.shape[1:])])
        return part
    return t


def shard_weights(weights: Weights, config: ModelConfig, shard: TPShard, block: int | None = None) -> Weights:
    """:func:`shard_tensor` over a ``(hf_name, tensor)`` stream (for :func:`load_hf_weights`)."""
    for name, t in weights:
        yield name, shard_tensor(name, t, config, shard, block)


# our fused parameter -> the HF projections stacked in it, in row order
_UNFUSE: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


@torch.no_grad()
def dummy_hf_weights(
    config: ModelConfig, seed: int, std: float, dtype: torch.dtype, device: torch.device
) -> Weights:
    """The random weights ``init_dummy_weights`` gives an unsharded model, as HF-named tensors.

    Draws parameter by parameter in the unsharded model's order from one generator, so every rank
    (each keeping only its slice) ends up with exactly the tp=1 model: ``--tp N`` and ``--tp 1`` agree
    on dummy checkpoints too. One full parameter is alive at a time.
    """
    with torch.device("meta"):
        ref = CausalLM(config)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in ref.named_parameters():
        t = torch.empty(p.shape, dtype=dtype, device=device)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, std, generator=gen)
        module, _, leaf = name.rpartition(".")
        fused = next((f for f in _UNFUSE if module.endswith(f)), None)
        if fused is None:
            yield name, t
            continue
        base = module[: -len(fused)]
        sizes = (
            [config.q_size, config.kv_size, config.kv_size]
            if fused.endswith("qkv_proj")
            else [config.intermediate_size] * 2
        )
        for hf, part in zip(_UNFUSE[fused], t.split(sizes)):
            yield f"{base}{hf}.{leaf}", part
