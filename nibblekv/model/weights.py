"""Copy HF-named checkpoint tensors into a :class:`CausalLM`, filling the fused projections.

Every loader (safetensors folder, GGUF, HF state dict in tests) produces ``(hf_name, tensor)`` pairs
and ends here, so the name mapping and the completeness check live in one place.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from nibblekv.model.causal_lm import CausalLM

# HF projection name -> (our fused parameter's module name, shard index)
_FUSED: dict[str, tuple[str, int]] = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def _shard_bounds(model: CausalLM, fused: str, shard: int) -> tuple[int, int]:
    """Row range ``[start, end)`` of shard ``shard`` inside fused parameter ``fused``."""
    cfg = model.config
    if fused.endswith("qkv_proj"):
        sizes = (cfg.q_size, cfg.kv_size, cfg.kv_size)
    else:
        sizes = (cfg.intermediate_size, cfg.intermediate_size)
    start = sum(sizes[:shard])
    return start, start + sizes[shard]


def map_name(model: CausalLM, hf_name: str) -> tuple[str, tuple[int, int] | None] | None:
    """HF name -> (our parameter name, row range or None for the whole tensor); None = skip it.

    Skipped: ``lm_head.weight`` when embeddings are tied, and rotary ``inv_freq`` buffers.
    """
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    if hf_name == "lm_head.weight" and model.lm_head is None:
        return None  # NOTE: some tied checkpoints still store a copy of the embedding here.
    prefix, _, leaf = hf_name.rpartition(".")  # leaf: weight / bias
    for hf_proj, (ours, shard) in _FUSED.items():
        if prefix.endswith(hf_proj):
            base = prefix[: -len(hf_proj)] + ours
            return f"{base}.{leaf}", _shard_bounds(model, ours, shard)
    return hf_name, None


def _scale_slot(
    model: CausalLM, hf_name: str, name: str, param: torch.Tensor, rows: tuple[int, int] | None,
    tensor: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(slice of ``param`` to fill, tensor to copy) for an FP8 ``weight_scale``: a per-tensor scalar fills
    its rows of per-channel scales; block scales ``[N/B, K/B]`` take rows ``rows / B``."""
    block = getattr(model.get_submodule(name.rpartition(".")[0]), "block", None)
    if block is None:
        target = param if rows is None else param[rows[0] : rows[1]]
        if tensor.numel() == 1:
            tensor = tensor.reshape(()).expand(target.shape)
        return target, tensor
    if rows is None:
        return param, tensor
    lo, hi = rows
    if lo % block:
        raise ValueError(
            f"{hf_name}: the fused projection's part starts at row {lo}, inside a {block}-row scale block "
            "(block-scaled FP8 needs every fused q/k/v and gate/up part to start on a block boundary)"
        )
    return param[lo // block : -(-hi // block)], tensor


def weight_slot(
    model: CausalLM, hf_name: str, name: str, param: torch.Tensor, rows: tuple[int, int] | None,
    tensor: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(slice of ``param`` to fill, tensor to copy) for checkpoint tensor ``hf_name`` mapped to ``name`` (rows
    ``rows`` of a fused parameter); ValueError where an FP8 tensor and the parameter's dtype disagree."""
    if name.endswith(".weight_scale"):  # FP8 weight scales: rows in scale units, scalars per shard
        return _scale_slot(model, hf_name, name, param, rows, tensor)
    if param.dtype == torch.float8_e4m3fn and tensor.dtype != param.dtype:
        raise ValueError(
            f"{hf_name}: checkpoint dtype {tensor.dtype} in an FP8 layer (float8_e4m3fn expected: "
            "the quantization_config says this checkpoint is FP8)"
        )
    if tensor.dtype == torch.float8_e4m3fn and param.dtype != tensor.dtype:
        raise ValueError(
            f"{hf_name}: an FP8 tensor for a {param.dtype} parameter (embeddings, LM head, norms and the "
            "modules the quantization_config leaves unquantized are served in the model dtype)"
        )
    return (param if rows is None else param[rows[0] : rows[1]]), tensor


@torch.no_grad()
def load_hf_weights(
    model: CausalLM, weights: Iterable[tuple[str, torch.Tensor]], adopt: bool = False
) -> None:
    """Copy every ``(hf_name, tensor)`` into ``model`` (cast to its dtype and device).

    ``adopt``: the caller hands over fresh tensors it no longer uses; a whole parameter of the same dtype,
    device and shape then takes the tensor itself instead of a copy (on CPU the copy's first touch of the
    parameter's ~0.5 GB cost seconds for SmolLM2).

    Raises ``KeyError`` for a name the model has no slot for, ``ValueError`` for a shape mismatch
    and for any parameter (or fused shard) left unfilled at the end.
    """
    params = dict(model.named_parameters())
    pending: set[tuple[str, tuple[int, int] | None]] = set()
    for name in params:
        module = name.rpartition(".")[0]
        if module.endswith(("qkv_proj", "gate_up_proj")):
            shards = 3 if module.endswith("qkv_proj") else 2
            pending.update((name, _shard_bounds(model, module, s)) for s in range(shards))
        else:
            pending.add((name, None))
    for hf_name, tensor in weights:
        mapped = map_name(model, hf_name)
        if mapped is None:
            continue
        name, rows = mapped
        if name not in params:
            raise KeyError(f"checkpoint tensor {hf_name!r} has no place in the model (mapped to {name!r})")
        param = params[name]
        target, tensor = weight_slot(model, hf_name, name, param, rows, tensor)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"{hf_name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}")
        if adopt and rows is None and tensor.dtype == target.dtype and tensor.device == target.device:
            target.data = tensor.contiguous()
        else:
            target.copy_(tensor)
        pending.discard((name, rows))
    if pending:
        missing = sorted(f"{n}{'' if r is None else list(r)}" for n, r in pending)
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")
