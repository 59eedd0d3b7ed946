"""The contract between model layers and whatever holds the KV cache."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class AttentionBackend(ABC):
    """Attention for one forward pass of a batch, set up by the engine before the model runs.

    The model calls :meth:`forward` once per layer, in layer order, with the batch's tokens
    flattened: ``T`` tokens of all requests, in the order the engine laid them out.
    """

    #: An orthogonal ``[D, D]`` matrix ``R`` (model dtype) the backend stores K/V multiplied by, or None.
    #: Callers that can apply it more cheaply (fused with RoPE) pass ``q @ R, k @ R, v @ R`` to
    #: :meth:`forward_rotated` and take the output in R's basis (o_proj may have R folded in);
    #: :meth:`forward` applies R on the way in and out itself.
    qkv_rotation: torch.Tensor | None = None

    def forward_rotated(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`forward` for ``q, k, v`` already multiplied on the right by :attr:`qkv_rotation` ``R``;
        returns the output in R's basis (:meth:`forward`'s output times R: attention over ``v @ R``).
        Only called when ``qkv_rotation`` is not None."""
        raise NotImplementedError(f"{type(self).__name__} has no qkv_rotation")

    @abstractmethod
    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store ``k, v [T, kv_heads, D]`` (after RoPE) in the cache and attend.

        ``q [T, q_heads, D]`` -> ``[T, q_heads, D]`` in ``q``'s dtype. Each token attends causally to
        its own request's earlier tokens (cached or in this batch) and to itself.
        """
