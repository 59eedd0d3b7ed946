"""Extend through the decode kernels (short chunks over an NVFP4 / FP8 prefix) against the fp32 reference."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
import torch
import triton
from test_kernels_extend_paged import _run as run_extend

from nibblekv.formats.kv_view import PagedKV
from nibblekv.formats.layout import KVDtype
from nibblekv.kernels.decode.launch import decode_triton
from nibblekv.kernels.extend import via_decode as ed
from nibblekv.kernels.extend.paged import extend_triton
from nibblekv.kernels.extend.via_decode import (
    extend_decode,
    extend_decode_unsupported,
    gather_q_ref,
    merge_ref,
)
from nibblekv.kernels.testing import decode_config_from_spec, make_batch, rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
P = 16
W = 2 * P


def _run(prefix: list[int], chunks: list[int], tails: list[int] | None, hkv: int, group: int, d: int,
         dtype: KVDtype = KVDtype.NVFP4, wide: str = "mma") -> float:  # fmt: skip
    splits = 3 if DEVICE == "cpu" else None  # the interpreter runs every (mostly empty) split program
    return run_extend(dtype, prefix, chunks, tails, hkv, group, d, gscale=(0.37, 2.5),
                      fn=partial(extend_decode_fn, num_splits=splits, wide=wide))  # fmt: skip


def extend_decode_fn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedKV, sm_scale: float, **kw: object
) -> torch.Tensor:
    """extend_decode where the view has no ``max_chunk`` (taken from its ``cu_seqlens``)."""
    assert kv.cu_seqlens is not None
    longest = int((kv.cu_seqlens[1:] - kv.cu_seqlens[:-1]).max())
    return extend_decode(q, k, v, replace(kv, max_chunk=longest), sm_scale, **kw)  # type: ignore[arg-type]


# ragged batches: prefixes 0 / 1 / P-1 / P+1 / several tiles; chunks 1..4 (one and two column groups,
# columns past a chunk); tails 0 / 1 / W; GQA 1, 3 (SmolLM2) and 4
@pytest.mark.parametrize("group", [1, 3, 4])
def test_extend_decode_nvfp4_head_dim_128(group: int) -> None:
    chunks = [1, 2, 1, 2] if group == 4 else [1, 4, 2, 3] if group == 1 else [2, 1, 2, 1]
    assert _run([0, P - 1, P + 1, 40], chunks, [5, 1, W, 0], 1, group, 128) <= 1e-2


def test_extend_decode_nvfp4_head_dim_64_and_no_tail() -> None:
    # head_dim 64: two tokens a row in decode_mma (4 columns a group); odd prefixes; no tail pool
    assert _run([0, 1, P, 33], [1, 2, 1, 2], [0, 1, W, 3], 1, 3, 64) <= 1e-2
    assert _run([1, P + 1, 40], [2, 1, 4], None, 1, 1, 128) <= 1e-2


@pytest.mark.parametrize("group", [6] if DEVICE == "cpu" else [1, 6, 8])
def test_extend_decode_nvfp4_head_dim_256(group: int) -> None:
    # head_dim 256 (decode_mma on two 128-dim halves, <= 8 columns a group): GQA 6 (Qwen3.5-27B) and 8
    # (Qwen3-Next); chunks of 1 and 2 tokens (one group; two groups of 8 columns past 8), odd prefixes, tails
    q = torch.randn(2, 2 * group, 256)
    assert ed.extend_decode_plan(q, make_batch(KVDtype.NVFP4, [5], 2, 256, P, "cpu").cache, 2) == (
        "mma", min(8, 2 * group), -(-2 * group // 8))
    assert _run([0, P + 1, 37], [1, 2, 1], [5, W, 0], 1, group, 256) <= 1e-2


def test_extend_decode_nvfp4_16_and_32_columns() -> None:
    # chunk x GQA group of 9-16 columns: one decode_mma16 warp reads the prefix once; 17-32: two of them
    assert _run([1, P + 1, 40], [4, 3, 1], [0, 1, W], 1, 4, 128) <= 1e-2
    assert _run([P - 1, 40], [8, 5], [W, 1], 1, 4, 128) <= 1e-2


def test_extend_decode_own_chunk_launch_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # own_warps / own_block_n (a benchmark sweep's knobs) reach step 2's launch alone: 32-key blocks over
    # the chunk's own keys and the bf16 tail (16 is the interpreter's default), one warp
    seen: list[tuple[object, object]] = []

    def spy(*args: object, **kw: object) -> object:
        seen.append((kw.get("num_warps"), kw.get("block_n")))
        return extend_triton(*args, **kw)

    monkeypatch.setattr(ed, "extend_triton", spy)
    splits = 3 if DEVICE == "cpu" else None
    fn = partial(extend_decode_fn, num_splits=splits, own_warps=1, own_block_n=32)
    err = run_extend(KVDtype.NVFP4, [1, P + 1, 40], [4, 3, 1], [W, 1, 0], 1, 4, 128, gscale=(0.37, 2.5),
                     fn=fn)  # fmt: skip
    assert err <= 1e-2 and seen == [(1, 32)]
    # the defaults: 16-key blocks, one warp up to 16 columns (4 tokens x GQA 4), two beyond (8 x 4 = 32)
    seen.clear()
    for chunks in ([4, 3, 1], [8, 5]):
        fn = partial(extend_decode_fn, num_splits=splits)
        run_extend(KVDtype.NVFP4, [1, P + 1, 40][: len(chunks)], chunks, None, 1, 4, 128, fn=fn)
    assert seen == [(1, 16), (2, 16)]


@pytest.mark.parametrize("fold", [True, False])
def test_extend_decode_fold_q(monkeypatch: pytest.MonkeyPatch, fold: bool) -> None:
    # fold_q (the default; and off): decode_mma16 reads the virtual batch's query rows from q itself
    # (decode_triton's q_rows, no gather launch): one group of 9-16 columns, ragged chunks (columns past a
    # chunk clamp to the last row); on the GPU also two groups (NG = 2) and a group of 12
    folded: list[bool] = []

    def spy(*args: object, **kw: object) -> object:
        folded.append(kw.get("q_rows") is not None)
        return decode_triton(*args, **kw)

    monkeypatch.setattr(ed, "decode_triton", spy)
    cases = [([1, P + 1, 40], [4, 3, 1], 4)] if DEVICE == "cpu" else [
        ([1, P + 1, 40], [4, 3, 1], 4), ([P - 1, 40], [8, 5], 4), ([0, P + 1, 40], [3, 1, 2], 4)]
    splits = 3 if DEVICE == "cpu" else None
    for prefix, chunks, group in cases:
        fn = partial(extend_decode_fn, num_splits=splits, fold_q=fold)
        err = run_extend(KVDtype.NVFP4, prefix, chunks, [W, 1, 0][: len(chunks)], 1, group, 128,
                         gscale=(0.37, 2.5), fn=fn)  # fmt: skip
        assert err <= 1e-2, (chunks, err)
    assert folded == [fold] * len(cases)
    if not fold:
        return
    pb = make_batch(KVDtype.NVFP4, [20, 5], 1, 128, P, DEVICE)
    q = torch.randn(3, 4, 128, device=DEVICE).to(torch.bfloat16)
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="q_rows"):  # 8 columns: decode_mma, which has no q_rows
        decode_triton(q.as_strided((2, 8, 128), (0, 0, 1)), pb.view(), 0.1,
                      config=decode_config_from_spec("mma", KVDtype.NVFP4, 128), q_rows=(q, cu, 4, 1))  # fmt: skip


@pytest.mark.parametrize("group,chunks", [(3, [1, 5, 2]), (4, [4, 1, 3])])
def test_extend_decode_fp8(group: int, chunks: list[int]) -> None:
    # decode_tok with up to 16 columns (chunk x GQA group) per KV head, one virtual request per request
    assert _run([0, P + 1, 40], chunks, [1, 0, W], 2, group, 64, dtype=KVDtype.FP8) <= 1e-2


@pytest.mark.parametrize("group", [6] if DEVICE == "cpu" else [6, 8])
def test_extend_decode_fp8_head_dim_256(monkeypatch: pytest.MonkeyPatch, group: int) -> None:
    # decode_tok groups at head_dim 256 (FP8; the hybrid models' GQA 6 and 8): on a GPU only where 256 is in
    # TOK_VERIFIED_HEAD_DIMS -- this is the extend check that gates putting it there (set here for the run)
    monkeypatch.setattr(ed, "TOK_VERIFIED_HEAD_DIMS", (64, 128, 256))
    assert _run([0, P + 1, 37], [1, 2, 1], [1, 0, W], 1, group, 256, dtype=KVDtype.FP8) <= 1e-2


def test_extend_decode_nvfp4_wide_chunks_through_decode_tok() -> None:
    # 12 columns at head_dim 128 (more than one decode_mma group of 8): one decode_tok group instead
    assert _run([0, P + 1, 40], [3, 1, 2], [1, 0, W], 1, 4, 128, wide="tok") <= 1e-2
    pb = make_batch(KVDtype.NVFP4, [20], 2, 128, P, DEVICE)
    q = torch.randn(3, 8, 128)
    assert ed.extend_decode_plan(q, pb.cache, 3, "tok") == ("tok", 12, 1)
    assert ed.extend_decode_plan(q, pb.cache, 3) == ("mma", 12, 1)  # one decode_mma16 group
    assert ed.extend_decode_plan(q, pb.cache, 8) == ("mma", 16, 2)
    assert ed.extend_decode_plan(q, pb.cache, 2, "tok") == ("mma", 8, 1)  # one group: decode_mma either way
    with pytest.raises(ValueError, match="wide"):
        ed.extend_decode_plan(q, pb.cache, 2, "rows")


def test_extend_decode_fp8_two_decode_tok_groups() -> None:
    # an FP8 chunk of 9 tokens x GQA 3 = 27 columns as two decode_tok groups of 16 (virtual requests reading
    # the same prefix; the second group's last 5 columns past the chunk); ragged chunks; the default plan
    assert _run([0, P + 1, 40], [9, 1, 6], [1, 0, W], 2, 3, 64, dtype=KVDtype.FP8) <= 1e-2
    pb = make_batch(KVDtype.FP8, [20], 2, 128, P, DEVICE)
    q = torch.randn(9, 8, 128)
    assert ed.extend_decode_plan(q, pb.cache, 8) == ("tok", 16, 2)
    assert ed.extend_decode_plan(q, pb.cache, 8, "tok") == ("tok", 16, 2)  # wide is NVFP4's choice only


def test_extend_decode_caps_decode_tok_groups_at_16_columns() -> None:
    # wider decode_tok groups were wrong on the H200 (and slower): 16-column groups, two at most -- 9 tokens
    # x 4 heads (36 columns) is refused, not run
    pb = make_batch(KVDtype.FP8, [20], 2, 128, P, DEVICE)
    q = torch.randn(9, 8, 128)
    assert "<= 32 columns" in (extend_decode_unsupported(q, pb.cache, 9) or "")
    assert ed.extend_decode_plan(q, pb.cache, 4) == ("tok", 16, 1)
    assert ed.extend_decode_plan(q, pb.cache, 5) == ("tok", 16, 2)


def test_extend_decode_refuses_what_it_cannot_serve() -> None:
    pb = make_batch(KVDtype.NVFP4, [20], 2, 128, P, DEVICE)
    q = torch.randn(4, 8, 128)
    assert extend_decode_unsupported(q, pb.cache, 4) is None  # 16 columns: one decode_mma16 group
    assert extend_decode_unsupported(q, pb.cache, 8) is None  # 32 columns: two groups
    assert "columns" in (extend_decode_unsupported(q, pb.cache, 9) or "")
    fp8 = make_batch(KVDtype.FP8, [20], 2, 128, P, DEVICE)
    assert extend_decode_unsupported(q, fp8.cache, 4) is None  # 16 columns, one decode_tok group
    assert extend_decode_unsupported(q, fp8.cache, 8) is None  # 32 columns, two
    assert "columns" in (extend_decode_unsupported(q, fp8.cache, 9) or "")
    bf16 = make_batch(KVDtype.BF16, [20], 2, 128, P, DEVICE)
    assert "NVFP4 or FP8" in (extend_decode_unsupported(q, bf16.cache, 1) or "")
    cu = torch.tensor([0, 9], dtype=torch.int32)
    q9 = torch.randn(9, 8, 128)
    with pytest.raises(ValueError, match="extend variant 'decode'"):
        extend_decode(q9, q9[:, :2], q9[:, :2], pb.view(cu_seqlens=cu, max_chunk=9), 0.1)


@pytest.mark.parametrize("g,gv,ng", [(4, 8, 2), (3, 5, 2), (1, 5, 1)])
def test_gather_and_merge_kernels_match_their_twins(g: int, gv: int, ng: int) -> None:
    # step 1 (gather, bit-exact) and step 3 (extend_triton's merge epilogue) alone, against their twins;
    # chunks 1 / 3 / 2 (past-the-end columns clamp to the last row), tails 0 / 1 / 17 over an empty prefix
    torch.manual_seed(g * 10 + gv)
    hkv, d = 2, 32  # NOTE: extend_triton splits D in halves, and tl.dot needs K >= 16 on the GPU
    cu = torch.tensor([0, 1, 4, 6], dtype=torch.int32, device=DEVICE)
    q = torch.randn(6, hkv * g, d, device=DEVICE).to(torch.bfloat16)
    qv = torch.full((3 * ng, hkv * gv, d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    ed._gather_q_kernel[(3 * ng, hkv)](
        q, q.stride(0), q.stride(1), cu, qv, 5,
        G=g, GV=gv, GVP=triton.next_power_of_2(gv), NG=ng, HV=hkv * gv, D=d,
    )
    assert torch.equal(qv, gather_q_ref(q, cu, g, gv, ng))
    pb = make_batch(KVDtype.NVFP4, [0, 0, 0], hkv, d, P, DEVICE, tail_lens=[0, 1, 17])
    k, v = torch.randn(2, 6, hkv, d, device=DEVICE).to(torch.bfloat16)
    o1 = torch.randn(3 * ng, hkv * gv, d, device=DEVICE)
    lse1 = torch.randn(3 * ng, hkv * gv, device=DEVICE) * 4
    lse1[0, 0] = float("-inf")  # an empty prefix
    args = (q, k, v, pb.view(cu_seqlens=cu), 0.3)
    o2 = torch.full((6, hkv * g, d), float("nan"), device=DEVICE)
    lse2 = torch.full((6, hkv * g), float("nan"), device=DEVICE)
    extend_triton(*args, out=o2, lse_out=lse2)
    out = torch.full_like(o2, float("nan"))
    extend_triton(*args, out=out, merge=(o1, lse1, gv, ng))
    want = merge_ref(o1, lse1, o2, lse2, cu, g, gv, ng, torch.empty_like(out))
    assert torch.isfinite(out).all() and rel_rms(out, want) <= 1e-5
    assert rel_rms(out, merge_ref(o1, lse1.roll(1, 1), o2, lse2, cu, g, gv, ng, torch.empty_like(out))) > 1e-2
    with pytest.raises(ValueError, match="num_splits == 1"):
        extend_triton(*args, out=out, merge=(o1, lse1, gv, ng), num_splits=2)
    with pytest.raises(ValueError, match="cover"):
        extend_triton(*args, out=out, merge=(o1, lse1, 1, 1))


def test_extend_attention_routes_short_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # the dispatch only: extend_decode itself is checked above
    from nibblekv.kernels import extend_attention

    calls: list[tuple[str, int]] = []
    spy = lambda *a, **k: calls.append((a[3].cache.dtype.value, a[3].max_chunk)) or a[0]
    monkeypatch.setattr(ed, "extend_decode", spy)
    monkeypatch.setenv("NIBBLEKV_KERNELS", "triton")
    q = torch.randn(3, 8, 128, device=DEVICE).to(torch.bfloat16)
    kv = torch.randn(3, 2, 128, device=DEVICE).to(torch.bfloat16)
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE)
    pools = {dt: make_batch(dt, [20, 3], 2, 128, P, DEVICE) for dt in (KVDtype.NVFP4, KVDtype.FP8)}

    def call(dt: KVDtype, max_chunk: int) -> None:
        pb = pools[dt]
        extend_attention(q, kv, kv, pb.view(cu_seqlens=cu, max_chunk=max_chunk), 0.1)

    call(KVDtype.NVFP4, 2)
    call(KVDtype.FP8, 2)  # auto: both quantized dtypes
    call(KVDtype.NVFP4, 9)  # 36 columns: the tl.dot path
    call(KVDtype.FP8, 9)  # 36 too
    call(KVDtype.FP8, 5)  # 20: two decode_tok groups
    assert calls == [("nvfp4", 2), ("fp8_e4m3", 2), ("fp8_e4m3", 5)]
    # short_chunks_by_decode=False: extend_triton for every chunk
    for dt in (KVDtype.NVFP4, KVDtype.FP8):
        pb = pools[dt]
        extend_attention(q, kv, kv, pb.view(cu_seqlens=cu, max_chunk=2), 0.1, short_chunks_by_decode=False)
    assert len(calls) == 3


def test_extend_lse_out_is_the_same_with_and_without_splits() -> None:
    # the S == 1 store and the combine step's lse agree (extend_decode merges by them)
    from nibblekv.kernels.extend.paged import extend_triton

    pb = make_batch(KVDtype.NVFP4, [0, 40], 1, 64, P, DEVICE, tail_lens=[3, W])
    q = torch.randn(5, 4, 64, device=DEVICE).to(torch.bfloat16)
    k, v = torch.randn(2, 5, 1, 64, device=DEVICE).to(torch.bfloat16)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=DEVICE)
    lse = [torch.full((5, 4), float("nan"), device=DEVICE) for _ in range(2)]
    for splits, out in zip((1, 3), lse):
        extend_triton(q, k, v, pb.view(cu_seqlens=cu, max_chunk=3), 0.125, num_splits=splits, lse_out=out)
    assert torch.isfinite(lse[0]).all() and torch.allclose(lse[0], lse[1], atol=1e-4)
    # and it is the log2-sum-exp2 of the scaled scores: a query token alone sees only itself
    one = make_batch(KVDtype.NVFP4, [0], 1, 64, P, DEVICE)
    out1 = torch.empty(1, 4, device=DEVICE)
    q1, k1 = q[:1], k[:1]
    extend_triton(q1, k1, v[:1], one.view(cu_seqlens=cu[:2] // 2, max_chunk=1), 0.125, lse_out=out1)
    want = (q1.float() * k1.float().expand(1, 4, 64)).sum(-1) * 0.125 * 1.4426950408889634
    assert torch.allclose(out1, want, atol=1e-3)


def test_extend_decode_with_a_dense_transposed_q_and_fp32_partials() -> None:
    # q laid out [Hq, T, D] and viewed as [T, Hq, D] (dense, not contiguous): the partials are packed fp32
    # buffers, so the merge reads what extend_triton wrote; and no bf16 rounding of either half
    from nibblekv.kernels.extend.paged import extend_triton
    from nibblekv.kernels.reference import extend_ref

    torch.manual_seed(0)
    hkv, g, d = 2, 3, 128
    pb = make_batch(KVDtype.NVFP4, [3, 18], hkv, d, P, DEVICE, tail_lens=[1, 0])
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE)
    q = torch.randn(3, hkv * g, d, device=DEVICE).to(torch.bfloat16)
    q_t = q.transpose(0, 1).contiguous().transpose(0, 1)
    k, v = (torch.randn(3, hkv, d, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    kv = pb.view(cu_seqlens=cu, max_chunk=2)
    want = extend_ref(q.float(), k, v, kv, d**-0.5)
    splits = 3 if DEVICE == "cpu" else None
    got = extend_decode(q_t, k, v, kv, d**-0.5, num_splits=splits)
    assert rel_rms(got, want) <= 1e-2
    # no worse than extend_triton on the same inputs (the bf16 partials were ~2x worse)
    assert rel_rms(got, want) <= 1.3 * rel_rms(extend_triton(q, k, v, kv, d**-0.5), want) + 1e-4
