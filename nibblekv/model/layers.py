"""Decoder building blocks: RMSNorm, attention (fused qkv) and the gated MLP (fused gate/up).

Module names mirror HF's (``self_attn``, ``mlp``, ``input_layernorm`` ...) so checkpoint names map
onto ours with only the fused projections renamed (see :mod:`nibblekv.model.weights`).

NOTE: two paths with the same math. Eager torch (CPU tensors, and ``NIBBLEKV_KERNELS=reference``) is
HF's code, which the equivalence tests compare against. CUDA tensors (or ``NIBBLEKV_KERNELS=triton``)
take the fused Triton kernels of :mod:`nibblekv.kernels.fused` instead: a decode step is dominated
by launches of tiny kernels, and RMSNorm, the residual add, SiLU * mul and RoPE are ~25 of them per layer.
The fused path keeps a running residual (``forward_fused``, SGLang style) so that each residual add
rides along with the next RMSNorm. It is imported lazily: the eager path never needs triton.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nibblekv.attention.backend import AttentionBackend
from nibblekv.formats.fp8_weights import Fp8Input, QuantizedRows
from nibblekv.kernels import use_triton
from nibblekv.model.config import ModelConfig
from nibblekv.model.rope import apply_rope


class RMSNormBase(nn.Module):
    """What the RMS norms share: a ``weight`` of ``size`` (filled with ``init``), ``eps`` and the float32
    normalization; each norm applies the weight its own way."""

    def __init__(self, size: int, eps: float, init: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), init))
        self.eps = eps

    def normalized(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in float32 divided by its root mean square along the last dim."""
        xf = x.to(torch.float32)
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)


class RMSNorm(RMSNormBase):
    """HF's Llama RMSNorm: normalize in float32, cast back, then scale by the weight."""

    # NOTE: set (by model.fp8) when an FP8 layer takes this norm's output: the fused kernel then hands it
    # over quantized as that layer would quantize it (bit for bit)
    fp8_out: Fp8Input | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normalized(x).to(x.dtype)

    def forward_fused(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor | QuantizedRows, torch.Tensor]:
        """``(norm(x + residual), x + residual)`` in one kernel (``residual=None``: ``(norm(x), x)``)."""
        from nibblekv.kernels.fused.elementwise import add_rms_norm, add_rms_norm_fp8

        if self.fp8_out is not None:
            return add_rms_norm_fp8(x, residual, self.weight, self.eps, self.fp8_out.group)
        return add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    """Projections, optional q/k norm and RoPE around the backend's attention.

    The backend receives q ``[T, num_heads, D]`` and k, v ``[T, num_kv_heads, D]`` (after RoPE and
    q/k norm) and applies the softmax scale ``D ** -0.5`` itself.
    """

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        # NOTE: rows are [q | k | v]; weights.py fills the slices in that order.
        self.qkv_proj = nn.Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.split = (config.q_size, config.kv_size, config.kv_size)
        # The orthogonal R folded into o_proj's input columns (``W_o <- W_o blockdiag(R)``), or None: then
        # o_proj takes attention output in R's basis, which is what attention over R-rotated V returns.
        self.o_rotation: torch.Tensor | None = None

    def fold_output_rotation(self, rotation: torch.Tensor) -> None:
        """Fold ``rotation [D, D]`` (symmetric, orthogonal) into o_proj, in place (captured graphs keep
        the same weight storage). Idempotent.

        NOTE: every caller passes the one Sylvester Hadamard matrix of this head_dim, so a folded layer
        and a backend that rotates agree on the basis without comparing tensors."""
        if self.o_rotation is not None:
            return
        w = self.o_proj.weight
        if w.dtype == torch.float8_e4m3fn:
            return  # FP8 o_proj: folding would requantize it; forward rotates the output instead (exact)
        with torch.no_grad():
            cols = w.view(w.shape[0], -1, self.head_dim).float() @ rotation.float()
            w.copy_(cols.reshape(w.shape).to(w.dtype))
        self.o_rotation = rotation

    def forward(
        self, x: torch.Tensor | QuantizedRows, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """``x [T, hidden]`` (or its rows quantized for an FP8 qkv_proj) -> ``[T, hidden]``."""
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        rot = attn.qkv_rotation
        # NOTE: q/k norm (Qwen3) is not fused: those models keep the eager split, norm and RoPE.
        if self.q_norm is None and use_triton(qkv):
            # NOTE: the cache's rotation (if any) rides along in the RoPE kernel: no extra launches
            fused_rot = rot if self.head_dim >= 32 else None
            q, k, v = self._qkv_fused(qkv, cos, sin, fused_rot)
        else:
            fused_rot = None
            q, k, v = self._qkv_eager(qkv, cos, sin)
        if rot is None:
            out = attn.forward(self.layer_id, q, k, v)
        else:
            if fused_rot is None:
                q, k, v = q @ rot, k @ rot, v @ rot
            out = attn.forward_rotated(self.layer_id, q, k, v)  # in rot's basis
        out = out.reshape(t, self.num_heads * self.head_dim)
        # Bring out into o_proj's basis; R is its own inverse, and both sides use the same R.
        if (rot is None) != (self.o_rotation is None):
            back = rot if rot is not None else self.o_rotation
            assert back is not None
            fp8: Fp8Input | None = getattr(self.o_proj, "fp8_input", None)
            if fp8 is not None and use_triton(out):
                from nibblekv.kernels.fused.rotate_quant import rotate_quant_fp8, rotate_quant_supported

                # an FP8 o_proj (which cannot absorb R): rotation and its input quantization in one kernel
                if rotate_quant_supported(out, back, fp8.group):
                    return self.o_proj(rotate_quant_fp8(out, back, fp8.group))
            out = (out.view(t, self.num_heads, self.head_dim) @ back).view(t, -1)
        return self.o_proj(out)

    def _qkv_eager(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split ``qkv`` into heads, q/k norm, RoPE; v contiguous (HF's code)."""
        t = qkv.shape[0]
        q, k, v = qkv.split(self.split, dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.contiguous()

    def _qkv_fused(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotation: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_qkv_eager` without q/k norm as one kernel (bit-exact with it), then times ``rotation``."""
        from nibblekv.kernels.fused.rope import rope_qk

        return rope_qk(qkv, cos, sin, self.num_heads, self.num_kv_heads, self.head_dim, rotation)


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up in one matmul (rows ``[gate | up]``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if use_triton(gate_up):
            from nibblekv.kernels.fused.elementwise import silu_and_mul, silu_and_mul_fp8

            # an FP8 down_proj takes its input quantized by the SiLU * mul kernel
            fp8: Fp8Input | None = getattr(self.down_proj, "fp8_input", None)
            act = silu_and_mul(gate_up) if fp8 is None else silu_and_mul_fp8(gate_up, fp8.group)
            return self.down_proj(act)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))`` (HF's order of operations)."""

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_id)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attn)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_fused(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` with a running residual: returns ``(mlp_out, residual)`` whose sum is its output.

        ``h`` is the previous layer's MLP output not yet added to ``residual`` (on the first layer:
        the embeddings, ``residual=None``). Each add is done by the next RMSNorm's kernel.
        """
        x, residual = self.input_layernorm.forward_fused(h, residual)
        h = self.self_attn(x, cos, sin, attn)
        x, residual = self.post_attention_layernorm.forward_fused(h, residual)
        return self.mlp(x), residual
