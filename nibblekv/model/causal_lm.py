"""The decoder-only language model: one implementation for Llama, Mistral, Qwen2 and Qwen3."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nibblekv.attention.backend import AttentionBackend
from nibblekv.kernels import use_triton
from nibblekv.model.config import ModelConfig
from nibblekv.model.layers import DecoderLayer, RMSNorm
from nibblekv.model.rope import RotaryEmbedding


class DecoderStack(nn.Module):
    """Embedding, decoder layers and final norm (HF's ``model.*`` submodule)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # NOTE: an uninitialised weight: loaders fill it, and nn.Embedding's own normal_() init on the meta
        # device imports torch's compile stack (~2.5 s on a 2-core CPU)
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=torch.empty(config.vocab_size, config.hidden_size)
        )
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Flattened-batch decoder: the engine lays out all requests' tokens in one ``[T]`` sequence.

    Which tokens attend to which is entirely the :class:`AttentionBackend`'s business (it knows
    where each request starts); the model itself is position-wise apart from that call.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        # NOTE: with tied embeddings there is no lm_head; compute_logits reads embed_tokens.weight, so
        # the tie survives meta-device construction, to_empty() and dtype casts.
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """``input_ids [T]``, ``positions [T]`` (each token's index in its own request) -> ``[T, hidden]``.

        Returns the final-normed hidden states; call :meth:`compute_logits` on the rows you sample from.
        """
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        if use_triton(h):
            return self._forward_fused(h, cos, sin, attn)
        for layer in self.model.layers:
            h = layer(h, cos, sin, attn)
        return self.model.norm(h)

    def _forward_fused(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """The layers with fused Triton kernels (see ``nibblekv.model.layers``): same math as the eager loop.

        NOTE: the residual stream runs alongside ``h``; the last layer's add fuses into the final norm.
        """
        residual: torch.Tensor | None = None
        for layer in self.model.layers:
            h, residual = layer.forward_fused(h, residual, cos, sin, attn)
        return self.model.norm.forward_fused(h, residual)[0]

    def fold_output_rotation(self, rotation: torch.Tensor) -> None:
        """Fold a cache's rotation ``[D, D]`` into every layer's o_proj (see ``Attention.fold_output_rotation``).

        NOTE: this changes a model that other engines may share. Their eager forwards stay exact (each
        layer rotates a plain backend's output into the folded basis); their captured CUDA graphs are
        re-captured on the next replay (``CudaGraphRunner`` compares :attr:`output_rotation_folded`)."""
        for layer in self.model.layers:
            layer.self_attn.fold_output_rotation(rotation)

    @property
    def output_rotation_folded(self) -> bool:
        return self.model.layers[0].self_attn.o_rotation is not None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [N, hidden]`` -> float32 logits ``[N, vocab]`` (matmul in the model dtype, as HF)."""
        return F.linear(hidden, self.lm_head_weight).float()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """The output projection ``[vocab, hidden]`` (the embedding matrix when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device
