"""The contract between model layers and whatever holds the KV cache."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class AttentionBackend(ABC):
    """Attention for one forward pass of a batch, set up by the engine before the model runs.

    The model calls :meth:`forward` once per layer, in layer order, with the batch's tokens
    flattened: ``T`` tokens of all requests, in the order the engine laid them out.
    """

    @abstractmethod
    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store ``k, v [T, kv_heads, D]`` (after RoPE) in the cache and attend.

        ``q [T, q_heads, D]`` -> ``[T, q_heads, D]`` in ``q``'s dtype. Each token attends causally to
        its own request's earlier tokens (cached or in this batch) and to itself.
        """
