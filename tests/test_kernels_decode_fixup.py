"""decode_tok with the in-kernel split-K fix-up (``tok:fuse=1``, ``decode_fixup``) against the reference."""

from __future__ import annotations

import math

import pytest
import torch
from test_kernels_decode import LENS, P, W, _run

from nibblekv.formats.layout import KVDtype
from nibblekv.kernels import decode_fixup as fx
from nibblekv.kernels.decode import decode_triton
from nibblekv.kernels.reference import decode_ref
from nibblekv.kernels.testing import make_batch, rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
def test_fused_tok_matches_reference(dtype: KVDtype) -> None:
    # lengths 1, P-1, P, P+1, 3P+5; tails 0, 1, W; Hkv 3 x GQA 3; 3 splits (some empty) + the tail slot
    assert _run(dtype, LENS, [0, 1, W, 5, W], 3, 3, 64, P, 3, variant="tok:fuse=1") <= 1e-2
    assert _run(dtype, [P + 1, 40], None, 2, 4, 128, P, 2, variant="tok:fuse=1") <= 1e-2


def test_fused_tok_many_splits_lse_and_counters_reset() -> None:
    # 37 splits + a tail: three chunks of 16 slots in the merge; lse_out as extend_decode asks for it;
    # every counter is 0 again after the launch (CUDA-graph replays reuse them), and a second launch agrees
    pb = make_batch(KVDtype.FP8, [5 * P + 3, 1, 0], 2, 64, P, DEVICE, tail_lens=[W, 1, 0], global_scale=(0.5, 2.0))
    q = torch.randn(3, 6, 64, device=DEVICE).to(torch.bfloat16)
    sm = 1.0 / math.sqrt(64)
    targs = dict(tail=pb.tail, tail_page_table=pb.tail_page_table, tail_lens=pb.tail_lens)
    outs, lses = [], []
    for _ in range(2):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((3, 6), float("nan"), device=DEVICE)
        decode_triton(q, pb.cache, pb.page_table, pb.lens, sm, **targs, num_splits=37, out=out, lse_out=lse,
                      variant="tok:fuse=1")  # fmt: skip
        assert int(fx.counters(q.device, 6).abs().sum()) == 0
        outs.append(out)
        lses.append(lse)
    ref = decode_ref(q.float(), pb.cache, pb.page_table, pb.lens, sm, **targs)
    assert rel_rms(outs[0][:2], ref[:2]) <= 1e-2 and torch.equal(outs[0], outs[1])
    assert torch.all(outs[0][2] == 0)  # an empty context (no tokens, no tail): zeros, never NaN
    plain_lse = torch.full((3, 6), float("nan"), device=DEVICE)
    plain = decode_triton(q, pb.cache, pb.page_table, pb.lens, sm, **targs, num_splits=37, lse_out=plain_lse,
                          variant="tok")  # fmt: skip
    assert rel_rms(outs[0].float(), plain.float()) <= 1e-3
    assert torch.allclose(lses[0][:2], plain_lse[:2], atol=1e-4) and torch.all(lses[0][2] == float("-inf"))


@pytest.mark.parametrize(
    "spec,group,d,page,tails",
    [("mma:fuse=1,minc=48", 3, 128, 5, [0, 1, W, 5, W]), ("mma:fuse=1,w=2", 4, 128, 5, None),
     ("mma:fuse=1", 3, 64, 6, [W, 0, 1, 5, W])],
)  # fmt: skip
def test_fused_mma_matches_reference(spec: str, group: int, d: int, page: int, tails: list[int] | None) -> None:
    # NVFP4: 3 splits of >= 48 tokens (the later ones empty for short contexts: unwritten slots the merge
    # must skip), the bf16 tail as the grid's last program or no tail, two warps per program; head_dim 64
    # (two tokens a row: two slots per warp, one per parity, and two tail slots)
    lens = [1, P - 1, P, P + 1, 70]
    assert _run(KVDtype.NVFP4, lens, tails, 1, group, d, page, 3, gscale=(0.37, 2.5), variant=spec) <= 1e-2
    assert int(fx.counters(torch.device(DEVICE), 8).abs().sum()) == 0


def test_fused_mma_active_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA-graph padding (DYN): the first 3 of 5 rows are requests, splits sized for them at run time; the
    # spare programs zero the padding rows (as the combine step did); lse_out too
    import nibblekv.kernels.decode as dec

    monkeypatch.setattr(dec, "num_sms", lambda: 1)
    lens, tails = [70, 1, 33, 1, 1], [W, 0, 5, 0, 0]
    hkv = 1 if DEVICE == "cpu" else 2  # NOTE: one KV head keeps the interpreter quick
    pb = make_batch(KVDtype.NVFP4, lens, hkv, 128, P, DEVICE, tail_lens=tails, global_scale=(0.37, 2.5))
    q = torch.randn(5, 4 * hkv, 128, device=DEVICE).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((5, 4 * hkv), float("nan"), device=DEVICE)
    sm = 1.0 / math.sqrt(128)
    act = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    decode_triton(q, pb.cache, pb.page_table, pb.lens, sm, pb.tail, pb.tail_page_table, pb.tail_lens,
                  num_splits=12, out=out, lse_out=lse, variant="mma:ppsm=8,minc=16,fuse=1", active=act)  # fmt: skip
    ref = decode_ref(q[:3].float(), pb.cache, pb.page_table[:3], pb.lens[:3], sm, pb.tail,
                     pb.tail_page_table[:3], pb.tail_lens[:3])  # fmt: skip
    assert rel_rms(out[:3], ref) <= 1e-2 and torch.isfinite(lse[:3]).all()
    assert torch.equal(out[3:], torch.zeros_like(out[3:])) and torch.all(lse[3:] == float("-inf"))
    assert int(fx.counters(torch.device(DEVICE), 5 * hkv).abs().sum()) == 0


def test_fixup_ref_matches_a_direct_softmax() -> None:
    # the twin: merging per-slot softmax partials by their lse equals one softmax over all the scores
    torch.manual_seed(0)
    scores, v = torch.randn(2, 3, 40), torch.randn(2, 3, 40, 8)
    parts = [slice(0, 7), slice(7, 8), slice(8, 40)]
    lse = torch.stack([torch.logsumexp(scores[..., s], -1) / math.log(2) for s in parts], -1)
    o = torch.stack([(torch.softmax(scores[..., s], -1)[..., None] * v[..., s, :]).sum(-2) for s in parts], -2)
    lse = torch.cat([lse, torch.full((2, 3, 1), float("-inf"))], -1)  # an empty slot
    o = torch.cat([o, torch.zeros(2, 3, 1, 8)], -2)
    out, merged = fx.fixup_ref(o, lse)
    want = (torch.softmax(scores, -1)[..., None] * v).sum(-2)
    assert torch.allclose(out, want, atol=1e-5)
    assert torch.allclose(merged, torch.logsumexp(scores, -1) / math.log(2), atol=1e-5)


def test_counters_refuse_too_many_pairs() -> None:
    assert fx.counters(torch.device(DEVICE), fx.MAX_PAIRS + 1) is None
    assert fx.counters(torch.device(DEVICE), 4) is fx.counters(torch.device(DEVICE), fx.MAX_PAIRS)
