"""Hybrid decoders (Qwen3-Next, Qwen3.5 dense): Gated DeltaNet layers between gated full-attention layers.

Only the full-attention layers hold KV: they go through the :class:`AttentionBackend` contract with the
index of the layer among the full-attention ones (the KV pool has only those layers). The linear layers
keep a per-request state instead (:mod:`nibblekv.cache.state_pool`), read and written through the
forward's :class:`LinearStateBatch`.

Module and parameter names are HF's (``linear_attn.in_proj_qkvz`` ...), except the fused ``qkv_proj``
(rows ``[q_proj | k_proj | v_proj]``, q_proj giving each head's query then its gate) and the MLP's
``gate_up_proj``; :func:`load_hybrid_weights` maps checkpoints onto them. Norms are zero-centred
(``x * (1 + weight)``) except the linear layers' gated norm.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from nibblekv.attention.backend import AttentionBackend
from nibblekv.cache.state_pool import LinearStateBatch
from nibblekv.kernels.linear import conv_decode, gated_delta_rule_decode
from nibblekv.kernels.linear.reference import decay_and_beta
from nibblekv.model.causal_lm import CausalLM
from nibblekv.model.config import ModelConfig
from nibblekv.model.gated_deltanet import causal_conv_extend, gated_delta_rule_for
from nibblekv.model.hybrid_config import FULL_ATTENTION
from nibblekv.model.layers import GatedMLP, RMSNormBase
from nibblekv.model.rope import RotaryEmbedding, apply_rope
from nibblekv.model.weights import weight_slot


class ZeroCentredRMSNorm(RMSNormBase):
    """HF's Qwen3-Next / Qwen3.5 RMSNorm: float32 ``norm(x) * (1 + weight)``, cast back (weight init 0)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__(size, eps, init=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.normalized(x) * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(RMSNormBase):
    """The linear layers' output norm: ``weight * norm(x) * silu(gate)`` (HF's ``RMSNormGated``)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return (self.weight * self.normalized(x).to(x.dtype) * F.silu(gate.float())).to(x.dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the leading ``cos.shape[-1]`` dims of each head of ``x [T, heads, D]``; the rest pass through."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)


class GatedAttention(nn.Module):
    """GQA with QK-norm, partial RoPE and a sigmoid gate on the output (q_proj yields query and gate)."""

    def __init__(self, config: ModelConfig, kv_layer: int) -> None:
        super().__init__()
        self.kv_layer = kv_layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.split = (2 * config.q_size, config.kv_size, config.kv_size)
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.split), bias=config.attention_bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.attention_bias)
        self.q_norm = ZeroCentredRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        qg, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        qg = qg.reshape(t, self.num_heads, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(t, self.num_heads * d)
        q = apply_partial_rope(self.q_norm(q), cos, sin)
        k = apply_partial_rope(self.k_norm(k.reshape(t, self.num_kv_heads, d)), cos, sin)
        v = v.reshape(t, self.num_kv_heads, d).contiguous()
        # NOTE: forward (not forward_rotated): a rotating backend applies its rotation on the way in and out
        out = attn.forward(self.kv_layer, q.contiguous(), k.contiguous(), v)
        return self.o_proj(out.reshape(t, self.num_heads * d) * torch.sigmoid(gate))


class GatedDeltaNet(nn.Module):
    """Projections, causal conv, the gated delta rule and the gated norm. Qwen3-Next stores the input
    projections fused and grouped per key head (``in_proj_qkvz``, ``in_proj_ba``); Qwen3.5 as four
    plain ones (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``)."""

    def __init__(self, config: ModelConfig, linear_layer: int) -> None:
        super().__init__()
        la = config.linear_attention
        assert la is not None
        self.la, self.linear_layer = la, linear_layer
        self.fused_qkvz = config.architecture == "qwen3_next"
        h = config.hidden_size
        if self.fused_qkvz:
            self.in_proj_qkvz = nn.Linear(h, 2 * la.key_dim + 2 * la.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(h, 2 * la.num_value_heads, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(h, la.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(h, la.value_dim, bias=False)
            self.in_proj_b = nn.Linear(h, la.num_value_heads, bias=False)
            self.in_proj_a = nn.Linear(h, la.num_value_heads, bias=False)
        # HF's depthwise nn.Conv1d: weight [C, 1, W], no bias
        self.conv1d = nn.Conv1d(la.conv_dim, la.conv_dim, la.conv_kernel, groups=la.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(la.num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(la.num_value_heads))
        self.norm = GatedRMSNorm(la.value_head_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(la.value_dim, h, bias=False)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [T, hidden]`` -> (conv input ``[T, C]`` as ``[q | k | v]``, z ``[T, HV, Dv]``, b, a ``[T, HV]``)."""
        la, t = self.la, x.shape[0]
        if not self.fused_qkvz:
            z = self.in_proj_z(x).reshape(t, la.num_value_heads, la.value_head_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        r = la.num_value_heads // la.num_key_heads
        qkvz = self.in_proj_qkvz(x).reshape(t, la.num_key_heads, -1)
        q, k, v, z = qkvz.split(
            [la.key_head_dim, la.key_head_dim, r * la.value_head_dim, r * la.value_head_dim], -1
        )
        b, a = self.in_proj_ba(x).reshape(t, la.num_key_heads, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        z = z.reshape(t, la.num_value_heads, la.value_head_dim)
        return mixed, z, b.reshape(t, -1), a.reshape(t, -1)

    def _heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv output ``[T, C]`` -> views q, k ``[T, H, K]``, v ``[T, HV, V]``."""
        la, t = self.la, mixed.shape[0]
        q, k, v = mixed.split([la.key_dim, la.key_dim, la.value_dim], dim=-1)
        return (q.reshape(t, la.num_key_heads, -1), k.reshape(t, la.num_key_heads, -1),
                v.reshape(t, la.num_value_heads, -1))  # fmt: skip

    def forward(self, x: torch.Tensor, states: LinearStateBatch) -> torch.Tensor:
        la, t, layer = self.la, x.shape[0], self.linear_layer
        mixed, z, b, a = self._project(x)
        weight = self.conv1d.weight[:, 0, :]
        if states.in_place:  # decode: the kernels update each request's pool rows themselves
            assert states.pool is not None and states.slots is not None
            q, k, v = self._heads(conv_decode(mixed, weight, states.pool.conv[layer], states.slots))
            out = gated_delta_rule_decode(
                q, k, v, a, b, self.A_log, self.dt_bias, states.pool.recurrent[layer], states.slots
            )
        else:
            conv_state, rec_state = states.read(
                layer, (la.conv_dim, la.conv_kernel - 1),
                (la.num_value_heads, la.key_head_dim, la.value_head_dim), x.dtype, x.device,
            )  # fmt: skip
            g, beta = decay_and_beta(a, b, self.A_log, self.dt_bias)
            if states.snapshots:
                out, conv_state, rec_state = self._extend_with_snapshots(
                    mixed, g, beta, states, conv_state, rec_state
                )
            else:
                out, conv_state, rec_state = self._extend(
                    mixed, g, beta, states.cu_seqlens, conv_state, rec_state
                )
            states.write(layer, conv_state, rec_state)
        return self.out_proj(self.norm(out, z).reshape(t, la.value_dim))

    def _extend(
        self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: list[int],
        conv_state: torch.Tensor, rec_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Conv + gated delta rule over the sequences of ``cu_seqlens`` from their states: out, conv, rec."""
        mixed, conv_state = causal_conv_extend(mixed, self.conv1d.weight[:, 0, :], cu_seqlens, conv_state)
        q, k, v = self._heads(mixed)
        out, rec_state = gated_delta_rule_for(mixed).extend(q, k, v, g, beta, cu_seqlens, rec_state)
        return out, conv_state, rec_state

    def _extend_with_snapshots(
        self, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, states: LinearStateBatch,
        conv_state: torch.Tensor, rec_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """:meth:`_extend` where some sequences hold snapshot points: the passes of ``states.split`` in order,
        each cut sequence's state stored (``states.write_snapshots``) before it runs on from its point."""
        out: torch.Tensor | None = None
        for part in states.split.parts:
            r = part.rows
            if part.seqs is None:  # the first pass: every sequence, up to its first point
                o, conv_state, rec_state = self._extend(
                    mixed[r], g[r], beta[r], part.cu, conv_state, rec_state
                )
                out = o.new_empty(mixed.shape[0], *o.shape[1:])
            else:
                assert part.slots is not None
                conv_mid, rec_mid = conv_state[part.seqs], rec_state[part.seqs]
                states.write_snapshots(self.linear_layer, part.slots, conv_mid, rec_mid)
                o, conv_end, rec_end = self._extend(mixed[r], g[r], beta[r], part.cu, conv_mid, rec_mid)
                conv_state[part.seqs], rec_state[part.seqs] = conv_end, rec_end
            assert out is not None
            out[r] = o
        assert out is not None
        return out, conv_state, rec_state


class HybridDecoderLayer(nn.Module):
    """Pre-norm block with either gated attention (``self_attn``) or Gated DeltaNet (``linear_attn``)."""

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn: GatedAttention | None = None
        self.linear_attn: GatedDeltaNet | None = None
        kinds = config.layer_types[:layer_id]
        if config.layer_types[layer_id] == FULL_ATTENTION:
            self.self_attn = GatedAttention(config, sum(t == FULL_ATTENTION for t in kinds))
        else:
            self.linear_attn = GatedDeltaNet(config, sum(t != FULL_ATTENTION for t in kinds))
        self.post_attention_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionBackend,
        states: LinearStateBatch,
    ) -> torch.Tensor:
        x = self.input_layernorm(h)
        if self.self_attn is not None:
            h = h + self.self_attn(x, cos, sin, attn)
        else:
            assert self.linear_attn is not None
            h = h + self.linear_attn(x, states)
        return h + self.mlp(self.post_attention_layernorm(h))


class HybridDecoderStack(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=torch.empty(config.vocab_size, config.hidden_size)
        )  # NOTE: uninitialised, as DecoderStack's (loaders fill it)
        self.layers = nn.ModuleList(HybridDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)


class HybridCausalLM(CausalLM):
    """:class:`CausalLM`'s interface (forward -> final hidden states, ``compute_logits``) for hybrid models.

    ``forward``'s ``states`` carries the linear layers' per-request state (the engine's
    :class:`LinearStateBatch` over its state pool); without it every sequence starts from zeros, the
    sequences being the backend's ``bounds`` (:class:`DenseAttention`); other backends need ``states``.
    """

    def __init__(self, config: ModelConfig) -> None:
        nn.Module.__init__(self)
        if not config.is_hybrid:
            raise ValueError(f"{config.architecture} is not a hybrid model")
        self.config = config
        self.model = HybridDecoderStack(config)  # type: ignore[assignment]
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rotary = RotaryEmbedding(config)

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
        states: LinearStateBatch | None = None,
    ) -> torch.Tensor:  # fmt: skip
        if states is None:
            bounds = _sequence_bounds(attn)
            if bounds is None:  # a cache backend: the requests' states live in the engine's state pool
                raise ValueError(f"{type(attn).__name__}: a hybrid model's forward over a KV cache needs the batch's "
                                 "linear-attention states (LinearStateBatch)")  # fmt: skip
            states = LinearStateBatch(bounds)
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        for layer in self.model.layers:
            h = layer(h, cos, sin, attn, states)
        return self.model.norm(h)

    def fold_output_rotation(self, rotation: torch.Tensor) -> None:
        """Nothing folded: :class:`GatedAttention` calls the backend's ``forward``, which rotates itself
        (the sigmoid gate sits between attention and o_proj, so o_proj cannot absorb the rotation)."""

    @property
    def output_rotation_folded(self) -> bool:
        return False

    @torch.no_grad()
    def init_dummy(self, seed: int, std: float) -> None:
        """Seeded random weights for ``--load-format dummy``: N(0, std) matrices, HF's norm inits (zero-centred
        norms 0, gated norm 1), decay ``A = exp(A_log)`` uniform in [1, 16] and ``dt_bias`` 1 (HF's init)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith(("linear_attn.norm.weight", "dt_bias")):
                p.fill_(1.0)
            elif name.endswith("norm.weight"):
                p.zero_()
            elif name.endswith("A_log"):
                p.uniform_(1.0, 16.0, generator=gen).log_()
            else:
                p.normal_(0.0, std, generator=gen)


def _sequence_bounds(attn: AttentionBackend) -> list[int] | None:
    """The cu_seqlens of a cache-free backend (:class:`DenseAttention`, or a recorder wrapping one as
    ``inner``); None for backends over a cache."""
    while attn is not None:
        bounds = getattr(attn, "bounds", None)
        if bounds is not None:
            return list(bounds)
        attn = getattr(attn, "inner", None)
    return None


def hybrid_checkpoint_name(name: str) -> str | None:
    """A checkpoint tensor's name in our model, or None to skip it (Qwen3.5's vision tower and MTP head,
    rotary buffers). Qwen3.5 prefixes the decoder with ``model.language_model.``."""
    if name.startswith(("model.visual.", "mtp.", "visual.")) or name.endswith("rotary_emb.inv_freq"):
        return None
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    return name


_FUSED_ROWS = {
    "self_attn.q_proj": 0,
    "self_attn.k_proj": 1,
    "self_attn.v_proj": 2,
    "mlp.gate_proj": 0,
    "mlp.up_proj": 1,
}


@torch.no_grad()
def load_hybrid_weights(model: HybridCausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into ``model``; ``KeyError`` for an unknown name, ``ValueError`` for a shape
    mismatch or a parameter left unfilled."""
    params = dict(model.named_parameters())
    cfg = model.config
    sizes = {
        "qkv_proj": (2 * cfg.q_size, cfg.kv_size, cfg.kv_size),
        "gate_up_proj": (cfg.intermediate_size,) * 2,
    }
    pending: set[tuple[str, int]] = set()
    for pname in params:
        module = pname.rpartition(".")[0].rpartition(".")[2]
        pending.update((pname, i) for i in range(len(sizes.get(module, (0,)))))
    for hf_name, tensor in weights:
        name = hybrid_checkpoint_name(hf_name)
        if name is None or (name == "lm_head.weight" and model.lm_head is None):
            continue
        prefix, _, leaf = name.rpartition(".")
        shard, rows = 0, None
        for hf_proj, idx in _FUSED_ROWS.items():
            if prefix.endswith(hf_proj):
                fused = "qkv_proj" if hf_proj.startswith("self_attn") else "gate_up_proj"
                name = f"{prefix[: -len(hf_proj.partition('.')[2])]}{fused}.{leaf}"
                start = sum(sizes[fused][:idx])
                shard, rows = idx, (start, start + sizes[fused][idx])
        if name not in params:
            raise KeyError(f"checkpoint tensor {hf_name!r} has no place in the model (mapped to {name!r})")
        target, tensor = weight_slot(model, hf_name, name, params[name], rows, tensor)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"{hf_name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}"
            )
        target.copy_(tensor)
        pending.discard((name, shard))
    if pending:
        missing = sorted(f"{n}[{s}]" for n, s in pending)
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")
