"""Public kernel ops: CPU tensors run the reference twins unless NIBBLEKV_KERNELS=triton forces Triton."""

from __future__ import annotations

import math

import pytest
import torch

import nibblekv.kernels as K
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.formats.layout import KVDtype
from nibblekv.kernels import reference
from nibblekv.kernels.testing import make_batch, rel_rms


@pytest.mark.parametrize("mode", ["auto", "triton"])
def test_dispatch_matches_reference(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mode == "auto" and not torch.cuda.is_available():
        # on CPU, auto must call the twin itself: make the Triton modules unusable to prove it
        monkeypatch.setattr("nibblekv.kernels.decode.launch.decode_triton", None)
    monkeypatch.setenv("NIBBLEKV_KERNELS", mode)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    pb = make_batch(KVDtype.NVFP4, [5, 17], 2, 64, 16, dev, tail_lens=[0, 3])
    q = torch.randn(2, 4, 64, device=dev)
    out = K.decode_attention(q, pb.view(), 1 / math.sqrt(64))
    ref = reference.decode_ref(q, pb.view(), 1 / math.sqrt(64))
    assert rel_rms(out, ref) <= 1e-2
    rows = torch.randn(3, 2, 64, device=dev)
    slots = torch.tensor([0, 7, -1], device=dev)
    a = make_batch(KVDtype.NVFP4, [16], 2, 64, 16, dev, via_write=False).cache
    b = LayerKV(a.layout, a.k_data.clone(), a.v_data.clone(), a.k_scale.clone(), a.v_scale.clone(), a.global_scale)  # type: ignore[union-attr]
    K.write_kv(rows, rows, a, slots)
    reference.write_kv_ref(rows, rows, b, slots)
    assert torch.equal(a.k_data, b.k_data) and torch.equal(a.v_scale.view(torch.uint8), b.v_scale.view(torch.uint8))  # type: ignore[union-attr]
