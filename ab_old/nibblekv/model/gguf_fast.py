"""Faster GGUF reading on top of the ``gguf`` package: its metadata parser and its common dequantizers.

Why: loading the bundled SmolLM2 GGUF took ~24 s on a 2-core CPU, ~5 s of it in ``GGUFReader`` building one
numpy memmap view per element of the tokenizer's arrays (~150K: vocab, merges, token types) and ~3 s in
``gguf.quants.dequantize``'s single-threaded numpy for the Q4_1 / Q8_0 blocks.

* :class:`FastGGUFReader` is ``GGUFReader`` with one override: an array field of scalars is read as ONE view
  (``parts = [type, count, values]``, ``data = [2]``) and a string array walks its lengths with ``struct`` on
  plain ndarray slices. ``ReaderField.contents()`` (whole field) returns the same values as the stock
  reader's; indexing one element of a scalar array (``contents(i)``) is not supported. Big-endian files
  and nested arrays go through the stock code.
* :func:`dequantize` does F32 / F16 / Q4_0 / Q4_1 / Q8_0 in torch -- the same float32 operations in the
  same order as ``gguf.quants``, so bit-identical (tests compare) -- and hands every other type to
  ``gguf.quants.dequantize``.

NOTE: ``gguf`` is imported inside the functions (and the reader class is built on first use): the GPU
machine has no ``gguf`` package and must still import :mod:`nibblekv.model`.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np
import torch

# GGML's type numbering; the block types hold 32 values in these many bytes
_Q4_0, _Q4_1, _Q8_0, _F32, _F16 = 2, 3, 8, 0, 1
_BLOCK_BYTES = {_Q4_0: 18, _Q4_1: 20, _Q8_0: 34}


@functools.cache
def fast_reader_class() -> type:
    """``FastGGUFReader`` (a ``gguf.GGUFReader`` subclass), defined once ``gguf`` can be imported."""
    from gguf import GGUFReader, GGUFValueType

    class FastGGUFReader(GGUFReader):  # type: ignore[misc]
        """``GGUFReader`` whose arrays cost one view (scalars) or one slice per string (see module doc)."""

        def _get_field_parts(
            self, orig_offs: int, raw_type: int
        ) -> tuple[int, list[Any], list[int], list[Any]]:
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I":
                return super()._get_field_parts(orig_offs, raw_type)  # type: ignore[no-any-return]
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            itype = GGUFValueType(raw_itype[0])
            offs, count = orig_offs + 12, int(alen[0])
            nptype = self.gguf_scalar_to_np.get(itype)
            if nptype is not None:
                values = self._get(offs, nptype, count)
                return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]
            if itype != GGUFValueType.STRING:
                return super()._get_field_parts(orig_offs, raw_type)  # type: ignore[no-any-return]
            # NOTE: plain ndarray slices: a slice of the memmap itself runs a Python __array_finalize__
            base = self.data.view(np.ndarray)
            mv = memoryview(base)
            parts: list[Any] = [raw_itype, alen]
            idxs: list[int] = []
            for _ in range(count):
                (n,) = struct.unpack_from("=Q", mv, offs)  # byte order "I": the host's
                parts.append(base[offs : offs + 8].view(np.uint64))
                parts.append(base[offs + 8 : offs + 8 + n])
                idxs.append(len(parts) - 1)
                offs += 8 + n
            return offs - orig_offs, parts, idxs, [GGUFValueType.ARRAY, GGUFValueType.STRING]

    return FastGGUFReader


def dequantize(data: np.ndarray, qtype: int) -> torch.Tensor:
    """A GGUF tensor's raw bytes ``[..., row bytes]`` (``ReaderTensor.data``) -> float32 ``[..., values]``."""
    qt = int(qtype)
    if qt == _F32:
        return torch.from_numpy(np.array(data, dtype=np.float32))
    if qt == _F16:
        return torch.from_numpy(np.array(data, dtype=np.float16)).float()
    if qt not in _BLOCK_BYTES:
        from gguf.quants import dequantize as gguf_dequantize

        out = gguf_dequantize(data, qtype)
        return torch.from_numpy(np.require(out, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))
    rows = data.shape[:-1]
    b = torch.from_numpy(np.array(data, dtype=np.uint8)).reshape(-1, _BLOCK_BYTES[qt])
    d = b[:, :2].contiguous().view(torch.float16).float()
    if qt == _Q8_0:
        out = b[:, 2:].contiguous().view(torch.int8).float() * d
    else:
        qs = b[:, 4:] if qt == _Q4_1 else b[:, 2:]
        # NOTE: the block's first 16 values are the low nibbles, the next 16 the high ones
        q = torch.cat((qs & 0x0F, qs >> 4), dim=1)
        if qt == _Q4_1:
            out = d * q.float() + b[:, 2:4].contiguous().view(torch.float16).float()
        else:
            out = d * (q.to(torch.int8) - 8).float()
    return out.reshape(*rows, -1)
