"""FP8 weights for the decoder's linear layers (qkv, o, gate/up, down); embedding, LM head and norms
keep the model dtype.

Three ways in, one layer (:class:`Fp8Linear`):

* ``--quantization fp8`` on a bf16 / dummy checkpoint: :func:`quantize_model` turns each loaded linear
  layer into per-channel FP8 (weight scale per output row, activation scale per token).
* an HF folder whose ``config.json`` has a ``quantization_config`` (:func:`parse_quantization_config`):
  block-scaled ``quant_method: "fp8"`` (``weight_block_size: [128, 128]``, ``<proj>.weight_scale_inv``;
  Qwen3-*-FP8, DeepSeek) or compressed-tensors ``float-quantized`` with channel / tensor weight scales
  (``<proj>.weight_scale``; the ``-FP8-dynamic`` checkpoints). A per-tensor scale is stored as the same
  per-channel value on every row (exact), so fused q/k/v keep their own scales. The projections the
  checkpoint leaves unquantized (``modules_to_not_convert`` / ``ignore``) stay in the model dtype.

The GEMMs: CUDA on sm_90+ runs FP8 tensor cores (per-channel weights: the Triton split-K GEMM for decode
batches, ``torch._scaled_mm`` row-wise for prefill chunks; block weights: the Triton block GEMM); everything
else runs the reference (dequantize, fp32 matmul).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nibblekv.formats.fp8_weights import Fp8Input, QuantizedRows, quantize_weight_channel
from nibblekv.kernels import use_triton
from nibblekv.kernels.fp8.reference import fp8_gemm_ref, fp8_linear_ref
from nibblekv.model.causal_lm import CausalLM
from nibblekv.model.parallel import RowParallelLinear

# the linear layers of every decoder layer that hold FP8 weights
FP8_MODULES: tuple[str, ...] = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
# hybrid layers (gated attention or Gated DeltaNet, then the MLP): the projections present in a layer. The
# DeltaNet's beta / decay-gate projections (one output per value head) stay in the model dtype: they are a
# few KB, and their outputs go through a sigmoid / softplus into the recurrent state's decay.
HYBRID_FP8_MODULES: tuple[str, ...] = (
    *FP8_MODULES, "linear_attn.in_proj_qkvz", "linear_attn.in_proj_qkv", "linear_attn.in_proj_z",
    "linear_attn.out_proj",
)  # fmt: skip


class QuantMethod(Enum):
    """``--quantization`` values (SGLang's names)."""

    FP8 = "fp8"


class Fp8Source(Enum):
    ONLINE = "online"  # quantize the loaded bf16 weights (``--quantization fp8``)
    CHECKPOINT = "checkpoint"  # the checkpoint holds FP8 weights and scales


@dataclass(frozen=True)
class Fp8Config:
    """How the linear layers hold FP8 weights. ``block=None``: per-channel weight scales and per-token
    activation scales; ``block=B``: ``B x B`` weight blocks and per token-group-of-``B`` activation scales.
    Activations are always quantized dynamically (the only scheme served)."""

    source: Fp8Source = Fp8Source.ONLINE
    block: int | None = None
    # the checkpoint's modules left unquantized (its modules_to_not_convert / ignore list): HF module names,
    # matched as substrings (transformers' convention) or as ``re:`` patterns (compressed-tensors')
    ignore: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.block is not None and self.block not in (32, 64, 128, 256):
            raise ValueError(f"FP8 weight block size {self.block} is not supported (checkpoints use 128)")
        if self.source is Fp8Source.ONLINE and self.block is not None:
            raise ValueError("--quantization fp8 quantizes per channel; block scales come from checkpoints")


@functools.lru_cache(maxsize=8)
def _fp8_tensor_cores(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


class Fp8Linear(nn.Module):
    """``y = x @ W^T + b`` with ``W`` stored as float8_e4m3fn ``weight [N, K]`` and FP32 ``weight_scale``
    (``[N]`` per channel, or ``[ceil(N/B), ceil(K/B)]`` per block). ``reduce_group`` (row-parallel under
    TP): the partial products are all-reduced before the bias is added once, as in RowParallelLinear."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, block: int | None,
        bias_dtype: torch.dtype, reduce: bool = False, reduce_group: dist.ProcessGroup | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_features, self.out_features, self.block = in_features, out_features, block
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn), False)
        blocks = (-(-out_features // block), -(-in_features // block)) if block is not None else None
        scale_shape = (out_features,) if blocks is None else blocks
        self.weight_scale = nn.Parameter(torch.empty(scale_shape, dtype=torch.float32), False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype), False) if bias else None
        self.reduce = reduce
        self.reduce_group = reduce_group

    @property
    def fp8_input(self) -> Fp8Input:
        """How this layer quantizes its input (per row, or per ``block`` columns)."""
        return Fp8Input(self.block)

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        bias = None if self.reduce else self.bias
        y = self._gemm(x, bias)
        if self.reduce:
            dist.all_reduce(y, group=self.reduce_group)
            if self.bias is not None:
                y = y + self.bias
        return y

    def _gemm(self, x: torch.Tensor | QuantizedRows, bias: torch.Tensor | None) -> torch.Tensor:
        n = self.weight.shape[0]
        t = x.q if isinstance(x, QuantizedRows) else x
        if use_triton(t) and (_fp8_tensor_cores(t.device) or not t.is_cuda):
            if self.block is not None:
                from nibblekv.kernels.fp8.gemm import fp8_linear_block

                return fp8_linear_block(x, self.weight, self.weight_scale, self.block, bias)
            from nibblekv.kernels.fp8.gemm import fp8_linear_rowwise

            return fp8_linear_rowwise(x, self.weight, self.weight_scale.view(1, n), bias)
        if isinstance(x, QuantizedRows):
            return fp8_gemm_ref(x.q, x.scale, self.weight, self.weight_scale, self.block, x.dtype, bias)
        return fp8_linear_ref(x, self.weight, self.weight_scale, self.block, bias)

    def extra_repr(self) -> str:
        scales = "per-channel" if self.block is None else f"{self.block}x{self.block} blocks"
        return f"in={self.in_features}, out={self.out_features}, fp8 e4m3, {scales}"


def _fp8_twin(old: nn.Module, block: int | None) -> Fp8Linear:
    """An :class:`Fp8Linear` (uninitialized, on ``old``'s device) of ``old``'s shape and bias."""
    w = old.weight
    bias = getattr(old, "bias", None)
    reduce = isinstance(old, RowParallelLinear)
    with torch.device(w.device):
        return Fp8Linear(
            w.shape[1], w.shape[0], bias is not None, block, bias.dtype if bias is not None else w.dtype,
            reduce, old.group if isinstance(old, RowParallelLinear) else None,
        )  # fmt: skip


# our fused projections -> the checkpoint's modules they are made of
_CHECKPOINT_PARTS: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def _ignored(ignore: tuple[str, ...], layer: int, part: str) -> bool:
    """Whether an ignore entry names checkpoint module ``part`` of decoder layer ``layer`` (under either
    prefix: ``model.`` or Qwen3.5's ``model.language_model.``)."""
    names = [f"{pre}layers.{layer}.{part}" for pre in ("model.", "model.language_model.")]
    for entry in ignore:
        if entry.startswith("re:"):
            if any(re.match(entry[3:], n) for n in names):
                return True
        elif any(entry in n for n in names):
            return True
    return False


def _fp8_slots(model: CausalLM, ignore: tuple[str, ...] = ()) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent module, attribute, linear layer) of every FP8-capable projection not in ``ignore``."""
    out = []
    for i, layer in enumerate(model.model.layers):
        for path in HYBRID_FP8_MODULES if model.config.is_hybrid else FP8_MODULES:
            parent_name, _, attr = path.rpartition(".")
            parent = getattr(layer, parent_name)
            if parent is None or not hasattr(parent, attr):  # a hybrid layer has one of the two mixers
                continue
            parts = _CHECKPOINT_PARTS.get(path, (path,))
            kept = [p for p in parts if _ignored(ignore, i, p)]
            if kept and len(kept) < len(parts):
                raise ValueError(
                    f"quantization_config leaves layer {i}'s {', '.join(kept)} unquantized but not the rest "
                    f"of {', '.join(parts)}, which nibblekv serves as one fused layer"
                )
            if not kept:
                out.append((parent, attr, getattr(parent, attr)))
    return out


def install_fp8_layers(model: CausalLM, block: int | None, ignore: tuple[str, ...] = ()) -> None:
    """Replace every decoder projection not in ``ignore`` by an uninitialized :class:`Fp8Linear` (for a
    loader to fill)."""
    for parent, attr, old in _fp8_slots(model, ignore):
        setattr(parent, attr, _fp8_twin(old, block))
    _route_fp8_inputs(model)


def _route_fp8_inputs(model: CausalLM) -> None:
    """A dense layer's RMSNorms quantize their output for the FP8 projection after them (qkv, gate/up): one
    kernel where there were two. (SiLU * mul does the same for down_proj, in ``GatedMLP``.)"""
    if model.config.is_hybrid:
        return  # NOTE: hybrid layers norm without the fused kernel (and a DeltaNet's input feeds bf16 layers)
    for layer in model.model.layers:
        attn_in = (layer.input_layernorm, layer.self_attn.qkv_proj)
        for norm, linear in (attn_in, (layer.post_attention_layernorm, layer.mlp.gate_up_proj)):
            norm.fp8_out = linear.fp8_input if isinstance(linear, Fp8Linear) else None


@torch.no_grad()
def quantize_model(model: CausalLM, ignore: tuple[str, ...] = ()) -> None:
    """Quantize every loaded decoder projection not in ``ignore`` to per-channel FP8, in place, one layer at a
    time."""
    for parent, attr, old in _fp8_slots(model, ignore):
        if isinstance(old, Fp8Linear):
            continue  # already FP8 (an FP8 checkpoint)
        new = _fp8_twin(old, None)
        wq, ws = quantize_weight_channel(old.weight)
        new.weight.data, new.weight_scale.data = wq, ws
        if new.bias is not None:
            new.bias.data = old.bias.data
        setattr(parent, attr, new)
    _route_fp8_inputs(model)
    if model.device.type == "cuda":
        torch.cuda.empty_cache()  # hand the bf16 weights' memory back: the KV pool is sized from free memory


def fp8_checkpoint_weights(
    weights: Iterator[tuple[str, torch.Tensor]], config: Fp8Config
) -> Iterator[tuple[str, torch.Tensor]]:
    """An FP8 checkpoint's tensors under the names and shapes :class:`Fp8Linear` uses: block scales
    ``<proj>.weight_scale_inv`` (the multiplier that dequantizes, despite the name) -> ``weight_scale``,
    per-channel ``[N, 1]`` -> ``[N]``; ``input_scale`` (unused by dynamic activations) is dropped."""
    for name, t in weights:
        if name.endswith(".input_scale"):
            continue
        if name.endswith(".weight_scale_inv"):
            if config.block is None:
                raise ValueError(f"{name}: block scales in a checkpoint whose quantization_config has no "
                                 "weight_block_size")  # fmt: skip
            name = name[: -len("_inv")]
        elif name.endswith(".weight_scale") and config.block is not None:
            raise ValueError(
                f"{name}: per-channel scales in a checkpoint whose quantization_config says "
                f"{config.block}x{config.block} blocks (expected <proj>.weight_scale_inv)"
            )
        if name.endswith(".weight_scale"):
            if config.block is None and t.dim() == 2 and t.shape[1] == 1:
                t = t[:, 0]
            if not t.is_floating_point() or t.dim() > 2:
                raise ValueError(f"{name}: FP8 scales must be a float tensor of at most 2 dims, got "
                                 f"{t.dtype} {tuple(t.shape)}")  # fmt: skip
        yield name, t


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter of ``model`` as stored (FP8 weights count 1 byte each, their scales 4)."""
    return sum(t.numel() * t.element_size() for t in model.parameters())


def has_fp8_weights(model: nn.Module) -> bool:
    return any(isinstance(m, Fp8Linear) for m in model.modules())


def _parse_fp8(qc: dict[str, Any]) -> Fp8Config:
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise ValueError(f"FP8 checkpoint with activation_scheme {qc.get('activation_scheme')!r}: only "
                         "'dynamic' activation scales are supported")  # fmt: skip
    if qc.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"FP8 checkpoint in format {qc.get('fmt')!r}: only e4m3 weights are supported")
    ignore = tuple(qc.get("modules_to_not_convert") or ()) + tuple(qc.get("ignored_layers") or ())
    block = qc.get("weight_block_size")
    if block is None:
        return Fp8Config(Fp8Source.CHECKPOINT, None, ignore)
    if not (isinstance(block, list) and len(block) == 2 and block[0] == block[1]):
        raise ValueError(f"FP8 checkpoint weight_block_size {block!r}: only square blocks like [128, 128]")
    return Fp8Config(Fp8Source.CHECKPOINT, int(block[0]), ignore)


def _parse_compressed_tensors(qc: dict[str, Any]) -> Fp8Config:
    fmt = qc.get("format")
    if fmt != "float-quantized":
        raise ValueError(
            f"compressed-tensors checkpoint in format {fmt!r}: only 'float-quantized' (FP8) is supported"
        )
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise ValueError(
            f"compressed-tensors checkpoint with {len(groups)} config_groups: exactly one is supported"
        )
    group = next(iter(groups.values()))
    w, a = group.get("weights") or {}, group.get("input_activations")
    if w.get("type") != "float" or w.get("num_bits") != 8 or w.get("strategy") not in ("channel", "tensor"):
        raise ValueError(
            f"compressed-tensors weights {w!r}: only 8-bit float weights with 'channel' or 'tensor' strategy "
            "are supported"
        )
    if a is None or not a.get("dynamic") or a.get("type") != "float" or a.get("num_bits") != 8:
        raise ValueError(f"compressed-tensors input_activations {a!r}: only dynamic 8-bit float activations "
                         "(the -FP8-dynamic scheme) are supported")  # fmt: skip
    return Fp8Config(Fp8Source.CHECKPOINT, None, tuple(qc.get("ignore") or ()))


def parse_quantization_config(hf_config: dict[str, Any]) -> Fp8Config | None:
    """The FP8 scheme of an HF ``config.json`` (``None``: unquantized); ValueError naming anything else."""
    qc = hf_config.get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method == "fp8":
        return _parse_fp8(qc)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(qc)
    raise ValueError(
        f"checkpoint quantization_config has quant_method {method!r}; nibblekv loads FP8 checkpoints only "
        "('fp8' with weight_block_size, or 'compressed-tensors' float-quantized)"
    )
