"""Triton paged decode vs the fp32 reference on the dequantized cache (interpreter on CPU, GPU if present)."""

from __future__ import annotations

import math

import pytest
import torch
import triton

from nibblekv.formats.kv_view import PagedKV
from nibblekv.formats.layout import KVDtype
from nibblekv.kernels._common import fmt_code, interpreting
from nibblekv.kernels.decode.config import default_kernel
from nibblekv.kernels.decode.knobs import base_config
from nibblekv.kernels.decode.launch import decode_triton
from nibblekv.kernels.decode.launch_config import DecodeConfig, DecodeKernel
from nibblekv.kernels.reference import decode_ref
from nibblekv.kernels.testing import decode_config_from_spec, make_batch, rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
P = 16
W = 2 * P  # tail window


def _run(dtype: KVDtype, lens: list[int], tails: list[int] | None, hkv: int, group: int, d: int, page: int,
         splits: int | None, gscale: tuple[float, float] = (1.0, 1.0), q_scale: float = 1.0,
         variant: str | None = None, knobs: dict[str, int] | None = None) -> float:  # fmt: skip
    """rel. RMS vs decode_ref; ``variant``: a decode spec (``decode_config_from_spec``), ``knobs``: fields of
    the config replaced (on the default kernel's config where no ``variant``); neither: the default."""
    kw: dict[str, object] = {}
    if variant is not None or knobs:
        cfg = _config(variant, dtype, d)
        kw["config"] = cfg.replace(**(knobs or {}))
    torch.manual_seed(hash((dtype.value, tuple(lens), hkv, group, d, page, splits)) % 2**31)
    pb = make_batch(dtype, lens, hkv, d, page, DEVICE, tail_lens=tails, global_scale=gscale)
    q = (q_scale * torch.randn(len(lens), hkv * group, d, device=DEVICE)).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    sm = 1.0 / math.sqrt(d)
    decode_triton(q, pb.view(), sm, num_splits=splits, out=out, **kw)  # type: ignore[arg-type]
    ref = decode_ref(q.float(), pb.view(), sm)
    return rel_rms(out, ref)


def _config(spec: str | None, dtype: KVDtype, d: int) -> DecodeConfig:
    """The config of a decode spec, or the default kernel's base config (``spec`` None)."""
    if spec is not None:
        return decode_config_from_spec(spec, dtype, d)
    fmt = fmt_code(dtype)
    return base_config(default_kernel(fmt, d, interpreting()), fmt, d)


LENS = [1, P - 1, P, P + 1, 3 * P + 5]
# Every decode kernel family but mma (DecodeKernel; mma has its own tests below): the measured
# default, per-token addressing in the same kernel, and the per-token kernel of decode_tok.
# sv=1: V (sv=2 NVFP4: K too) as even/odd column halves (FP8/NVFP4 only; BF16 ignores it).
VARIANTS = ["paged", "rows", "tok", "tok:sv=1", "tok:sv=2"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_decode_variants(variant: str, dtype: KVDtype, d: int) -> None:
    # odd shapes: lengths 1, P-1, P, P+1; tails 0, 1, W; non-power-of-two heads (Hkv 3, group 3 -> Hq 9);
    # 3 splits (ragged, some empty); d=256 runs fewer requests to keep the interpreter quick
    lens, tails = (LENS, [0, 1, W, 5, W]) if d < 256 else ([1, P + 1, 2 * P + 3], [W, 0, 1])
    assert _run(dtype, lens, tails, 3, 3, d, P, 3, variant=variant) <= 1e-2


# decode_mma: (spec, GQA group, page size). The interpreter runs its PTX twins slowly (~15 s per launch),
# so CPU runs five cases; GPUs run every spec x group x page.
MMA_SPECS = [
    "mma", "mma:w=2,tpi=2", "mma:w=4,pf=0", "mma:tpi=2,pf=0", "mma:minc=64", "mma:vst=0,vq=0", "mma:w=2,vq=0",
    "mma:tpp=1", "mma:l2=1", "mma:tpi=1,l2=2", "mma:pf=0,l2=1", "mma:pf=0,l2=2", "mma:pbf=1",
]
MMA_CASES = (
    [(s, grp, page) for s in MMA_SPECS for grp in (1, 3, 4, 8) for page in (P, 5)] + [("mma", 4, 2 * P)]
    + [("mma:l2=2,l2b=1", grp, P) for grp in (1, 4, 8)] + [("mma:pf=0,l2=1,l2b=1", 4, P)]
    + [(f"mma:sms={s}{x}", grp, P) for s, x in ((2, ",ppsm=16"), (3, ""), (4, ",ppsm=8")) for grp in (1, 8)]
    if DEVICE == "cuda"
    # minc: later splits stay empty; 32-token pages: tiles inside a page
    else [("mma:tpi=2", 4, P), ("mma:w=2,tpi=2,pf=0,minc=48", 3, 5), ("mma:w=2,vst=0,vq=0", 3, P),
          ("mma:w=4", 4, 5), ("mma:tpi=2", 3, 2 * P), ("mma:pf=0,l2=1", 4, P), ("mma:sms=2", 5, P)]
)


@pytest.mark.parametrize("spec,group,page", MMA_CASES)
def test_decode_mma(spec: str, group: int, page: int) -> None:
    # NVFP4, head_dim 128 only; 16-token pages (one page per tile) and 5-token pages (per-row page lookups);
    # lengths 1, P-1, P, P+1 and several tiles (full steps + a masked rest); tails 0, 1, W; global
    # scales != 1 on the odd pages; ragged splits (some empty)
    lens, hkv = (LENS + [200], 2) if DEVICE == "cuda" else ([1, P - 1, P, P + 1, 70], 1)
    gscale = (1.0, 1.0) if page == P else (0.37, 2.5)
    err = _run(KVDtype.NVFP4, lens, [0, 1, W, 5, W, 3][: len(lens)], hkv, group, 128, page, 3, gscale=gscale,
               variant=spec)  # fmt: skip
    assert err <= 1e-2, err


@pytest.mark.parametrize(
    "tin,d,group,page",
    [(1, 128, 8, 5), (0, 128, 8, 5), (1, 64, 3, 6), (1, 64, 4, P), ("1,tpp=0,ts=1", 128, 8, P),
     ("1,ts=3", 64, 4, 2 * P)],
)
def test_decode_mma_tail_in_grid(
    monkeypatch: pytest.MonkeyPatch, tin: int | str, d: int, group: int, page: int
) -> None:
    # the bf16 tail as one more program of decode_mma's grid (tin=1, the default: bf16 mma.sync) or as its
    # own launch (tin=0); tails 3, 0, W, P-1 and W+P (several tiles, the last partial; odd counts leave a
    # row of two tokens half empty at head_dim 64) on 5/6/16/32-token pages, GQA 8 (128) and 3, 4 (64, two
    # tokens a row: two tail slots, one per parity), global scales != 1; the first request is its tail alone;
    # the defaults tpp=1 (each next tile's page id prefetched where a 16-row tile lies in one page) and ts=2
    # (two tail programs share each tail, whole 16-row tiles each; short tails leave one empty), ts=3, and
    # the one tail program without the prefetch (tpp=0, ts=1)
    import nibblekv.kernels.decode.config as dc

    seen: list[bool] = []
    orig = dc._mma_tail_in_grid
    monkeypatch.setattr(dc, "_mma_tail_in_grid", lambda *a: seen.append(orig(*a)) or seen[-1])
    err = _run(KVDtype.NVFP4, [0, 1, 70, 5, 33], [3, 0, W, P - 1, W + P], 1, group, d, page, 3,
               gscale=(0.37, 2.5), variant=f"mma:tin={tin}")  # fmt: skip
    assert seen == [str(tin)[0] == "1"]
    assert err <= 1e-2, err


@pytest.mark.skipif(DEVICE != "cuda", reason="FP8 decode_tok's one-wave splits: GPU configs only")
def test_decode_fp8_one_wave_splits() -> None:
    # 8 requests x 8 KV heads = 64 pairs: the one-wave rule's 4 splits (ragged lengths, tails 0, 1, W)
    lens = [1, P - 1, P + 1, 1000, 4099, 333, 2048, 70]
    assert _run(KVDtype.FP8, lens, [0, 1, W, 7, W, 0, 3, 5], 8, 4, 128, P, None) <= 1e-2


def test_default_num_splits_one_wave() -> None:
    # wave_ctas (FP8 decode_tok's default 2): >= 64 (request, KV head) pairs get the splits of one wave of 2
    # programs per SM where it is >= 90% full (not 208 pairs: 79%); fewer pairs (B=1, 4) and more keep ~16
    # programs per SM; wave_ctas 0 = the old rule
    from nibblekv.kernels.decode.config import default_num_splits, graph_num_splits, mma_num_splits

    got = [default_num_splits(b, 8, wave_ctas=2) for b in (8, 16, 32, 26, 34, 1, 4, 64)]
    assert got == [4, 2, 1, 11, 8, 64, 64, 5]
    assert [default_num_splits(b, 8) for b in (8, 32, 1)] == [33, 9, 64]
    assert default_num_splits(8, 8, cap=2, wave_ctas=2) == 2
    # decode_mma: 8 one-warp programs per SM (head_dim 256) over 132 SMs, capped at mma_slots a pair
    assert [mma_num_splits(1, kv, 1, 8) for kv in (2, 4, 8)] == [256, 256, 132]
    assert [mma_num_splits(1, kv, 1, 8, slots=512) for kv in (2, 4, 8)] == [512, 264, 132]
    # a CUDA graph for 8 requests replayed with 5..8: the old rule (5 requests would not fill the wave)
    assert graph_num_splits(8, 5, 8, 128, 64, 2) == 33 and graph_num_splits(8, 8, 8, 128, 64, 2) == 4
    assert graph_num_splits(32, 25, 8, 128, 64, 2) == 9 and graph_num_splits(32, 32, 8, 128, 64, 0) == 9


def test_decode_mma_no_tail() -> None:
    # no bf16 tail pool: no tail program in the grid (with one, it is program 0 of the split axis)
    assert _run(KVDtype.NVFP4, [1, P - 1, P, P + 1, 70], None, 1, 4, 128, P, 3, variant="mma:tpi=2") <= 1e-2


@pytest.mark.parametrize("group,page,vst", [(3, P, 0), (4, 2 * P, 0), (1, 6, 0), (3, P, 1)])
def test_decode_mma_head_dim_64(group: int, page: int, vst: int) -> None:
    # head_dim 64 read as 128 with two tokens a row (PAIR): odd and even lengths (the last row's second
    # token absent), 1, P-1, P, P+1, a multi-step context; tails 0, 1, W; GQA 3 (SmolLM2), 4 and 1; pages
    # of 16 (two 8-row pages a tile), 32 (one) and 6 (per-row lookups); global scales != 1; 3 splits
    lens = [1, P - 1, P, P + 1, 70, 33] if DEVICE == "cpu" else LENS + [1001, 4099]
    tails = [0, 1, W, 5, W, 3, 0][: len(lens)] + [0] * max(0, len(lens) - 7)
    spec = f"mma:minc=16,vst={vst},vq={vst}"
    hkv = 1 if DEVICE == "cpu" else 2  # NOTE: one KV head keeps the interpreter quick
    err = _run(KVDtype.NVFP4, lens, tails, hkv, group, 64, page, 3, gscale=(0.37, 2.5), variant=spec)
    assert err <= 1e-2, err


# decode_mma at head_dim 256 (decode.mma256: two 128-dim halves a step): (spec, GQA group, page); the
# hybrid models' groups 6 (Qwen3.5-27B) and 8 (Qwen3-Next-80B) and an odd one; CPU runs three cases
MMA256_CASES = (
    [("mma", grp, page) for grp in (1, 6, 8) for page in (P, 5)]
    + [("mma:pf=0", 6, P), ("mma:w=2,vst=0,vq=0", 8, 5), ("mma:minc=16,ppsm=12", 6, P), ("mma:tin=0", 8, P),
       ("mma:tpp=0,ts=1", 6, 5), ("mma:l2=1", 8, P), ("mma:l2=2,w=2", 6, P), ("mma", 6, 2 * P), ("mma", 8, 8),
       ("mma:slots=512", 8, P), ("mma:pf=0,l2=1,ppsm=12", 8, P), ("mma:pf=0,l2=2", 6, P),
       ("mma:l2=2,l2b=1", 8, P), ("mma:l2=3,l2b=1,w=2", 6, P), ("mma:sms=2", 8, P), ("mma:sms=3", 6, P),
       ("mma:sms=4", 1, P)]
    if DEVICE == "cuda"
    else [("mma:ts=3,l2=1", 6, P), ("mma:pf=0,vst=0,vq=0", 8, 5), ("mma:w=2,minc=16", 3, 2 * P),
          ("mma:pf=0,l2=1", 8, P), ("mma:l2=2,l2b=1", 8, P), ("mma:sms=3", 8, P)]
)  # fmt: skip


@pytest.mark.parametrize("spec,group,page", MMA256_CASES)
def test_decode_mma_head_dim_256(spec: str, group: int, page: int) -> None:
    # odd lengths (1, P-1, P+1) and a multi-step context (full steps + a masked rest); the bf16 tail (tails
    # 0, 1, W, 5: mma256's tail programs in the grid, ts of them a pair, or its own launch with w=2 / tin=0)
    # and none; 16-token pages (one page a tile), 5 (per-row lookups), 8 (two pages a tile), 32 (tiles
    # inside a page); global scales != 1 off 16-token pages; 3 splits; l2: the L2 prefetch's page ids (a
    # no-op hint under the interpreter, and on pages of other sizes)
    lens = [1, P - 1, P + 1, 37] if DEVICE == "cpu" else LENS + [1001, 4099]
    tails = [0, 1, W, 5, W, 0, 3][: len(lens)]
    gscale = (1.0, 1.0) if page == P else (0.37, 2.5)
    hkv = 1 if DEVICE == "cpu" else 2  # NOTE: one KV head keeps the interpreter quick
    err = _run(KVDtype.NVFP4, lens, tails, hkv, group, 256, page, 3, gscale=gscale, variant=spec)
    assert err <= 1e-2, err
    if DEVICE == "cuda" or page == 5:  # no bf16 tail
        err = _run(KVDtype.NVFP4, lens, None, hkv, group, 256, page, 3, gscale=gscale, variant=spec)
        assert err <= 1e-2, err


@pytest.mark.parametrize(
    "spec,d,group",
    [("mma:lz=1", 128, 4), ("mma:lz=6", 256, 8)]
    + ([] if DEVICE == "cpu"
       else [("mma:lz=8", 128, 8), ("mma:lz=1,bal=1", 128, 4), ("mma:lz=8,bal=1", 256, 6)]),
)
def test_decode_mma_lazy_rescale(spec: str, d: int, group: int) -> None:
    # lz: a warp keeps its softmax max until a score beats it by more than lz (log2 units). Scores 3x the
    # usual spread over several steps: some steps advance the max, others keep it (probabilities up to
    # 2**lz); the result matches the reference as closely as the every-step rescale does
    # (a wrong kept max -- 3 above the running one -- fails both CPU cases: 0.29 and 0.22)
    lens, tails = ([70, 37], [W, 0]) if d == 128 else ([90], [W])
    err = _run(KVDtype.NVFP4, lens, tails, 1, group, d, P, 2, q_scale=3.0, variant=spec)
    if DEVICE == "cuda":  # the every-step rescale on the same batch
        base = _run(KVDtype.NVFP4, lens, tails, 1, group, d, P, 2, q_scale=3.0, variant="mma")
        assert err <= 1.5 * base + 1e-4, (err, base)
    assert err <= 1e-2, err


@pytest.mark.parametrize(
    "d,group", [(128, 4), (256, 8)] if DEVICE == "cpu" else [(128, 4), (128, 12), (256, 8)]
)
def test_decode_mma_bf16_partials(d: int, group: int) -> None:
    # pbf=1: the partial outputs in bf16 (vector stores of bf16 pairs; the combine step reads them as fp32).
    # 3 splits and the tail's slots: each output row merges several rounded partials, so it differs from
    # the fp32-partial run somewhere (the knob took effect) but by about bf16's rounding only. Where the
    # combine merges whole rows (no cdb here: few slots) the partials stay fp32: equal to the pbf=0 run
    torch.manual_seed(7)
    pb = make_batch(
        KVDtype.NVFP4, [1, P + 1, 48], 1, d, P, DEVICE, tail_lens=[W, 0, 5], global_scale=(0.37, 2.5)
    )
    q = torch.randn(3, group, d, device=DEVICE).to(torch.bfloat16)
    sm = 1.0 / math.sqrt(d)
    outs = []
    specs = [f"mma:minc=16,cdb={d // 2},pbf={b}" for b in (0, 1)]
    if d == 128:  # the whole-row rule does not depend on head_dim (each spec costs ~35 s at 256 on CPU)
        specs += ["mma:minc=16,pbf=0", "mma:minc=16,pbf=1"]
    for spec in specs:  # NOTE: bf16 is head_dim 256's default
        out = torch.full_like(q, float("nan"))
        cfg = decode_config_from_spec(spec, KVDtype.NVFP4, d)
        decode_triton(q, pb.view(), sm, num_splits=3, out=out, config=cfg)
        outs.append(out)
    ref = decode_ref(q.float(), pb.view(), sm)
    assert all(rel_rms(o, ref) <= 1e-2 for o in outs)
    assert not torch.equal(outs[0], outs[1])
    assert rel_rms(outs[1], outs[0].float()) <= 5e-3
    assert d != 128 or torch.equal(outs[2], outs[3])


def test_decode_mma_empty_splits_and_tail_only() -> None:
    # 12 splits for contexts of 0..70 tokens: most splits past the context write nothing and the combine
    # step must skip them (partials are NaN-filled under the interpreter); a request with no main-pool token
    # is its tail alone, and one with neither is zeros
    err = _run(KVDtype.NVFP4, [0, 1, 70, 0, 33], [3, 0, W, 0, 1], 1, 4, 128, P, 12, variant="mma:minc=16")
    assert err <= 1e-2, err


def test_decode_mma_combine_chunks() -> None:
    # 64 splits + the two tail programs' slots, whole-row dim blocks (cdb=128: chunks of 32 slots): most
    # splits past the context write nothing and the combine step (one online pass) must read only the
    # written ones (100 tokens: 7; 20: 2) beside the tail's slots. Two chunks of written slots:
    # test_decode_mma_combine_online
    err = _run(KVDtype.NVFP4, [100, 20], [0, 5], 1, 4, 128, P, 64, variant="mma:minc=16,cdb=128")
    assert err <= 1e-2, err


@pytest.mark.parametrize(
    "pair,db,ts", [(0, 128, 1), (1, 64, 1), (0, 16, 1), (0, 128, 3), (1, 64, 2)],
)
def test_decode_mma_combine_online(pair: int, db: int, ts: int) -> None:
    # the combine step alone on decode_mma's slot layout (one online pass, the tail's slots -- two with PAIR
    # -- merged beside the first chunk; one program per KV head of 3 query heads): 40 splits, MINC 16, slots
    # past each request's written ones NaN; chunks of combine_chunk(4, db) slots (32 at db 64, 16 at 128),
    # so the long request's 38 / 76 written slots take several; an empty request (tail only) and one with
    # neither (its tail program wrote -inf and zeros); ts: tail programs per pair (variant option ts), a
    # slot each (two with PAIR)
    from nibblekv.kernels.decode.combine import _combine_kernel, combine_chunk

    hq, g, d, splits, minc = 6, 3, 128 // (1 + pair), 40, 16
    tail_slots = ts * (1 + pair)
    s_tot = splits * (1 + pair) + tail_slots
    lens = torch.tensor([70, 3, 0, 600 * (1 + pair), 0], dtype=torch.int32)
    torch.manual_seed(5 + pair)
    lse = torch.full((len(lens), hq, s_tot), float("nan"))
    o = torch.full((len(lens), hq, s_tot, d), float("nan"))
    for b, n in enumerate(lens.tolist()):
        rows = (n + pair) // (1 + pair)
        chunk = max(-(-(-(-rows // splits)) // 16) * 16, minc)
        written = -(-rows // chunk) * (1 + pair)
        for sl in [*range(written), *range(s_tot - tail_slots, s_tot)]:
            lse[b, :, sl] = torch.randn(hq) * 4 if b < 4 else float("-inf")  # the last: an empty tail
            o[b, :, sl] = torch.randn(hq, d) if b < 4 else 0.0
        if written:
            lse[b, 0, 0] = float("-inf")  # an empty split (its partial is zeros)
            o[b, 0, 0] = 0.0
    o, lse, lens_dev = o.to(DEVICE), lse.to(DEVICE), lens.to(DEVICE)
    out = torch.full((len(lens), hq, d), float("nan"), device=DEVICE)
    _combine_kernel[(len(lens) * hq // g, d // db)](
        o, lse, out, out.stride(0), out.stride(1), HQ=hq, S=s_tot, D=d, DB=db, CH=combine_chunk(4, db), G=g,
        GP=4, lens_ptr=lens_dev, MMA_SPLITS=splits, MMA_NW=1 + pair, MINC=minc, HAS_TAIL=1,
        TAIL_SLOTS=tail_slots, PAIR=pair, TB=max(2, triton.next_power_of_2(tail_slots)), num_warps=4,
    )  # fmt: skip
    valid = ~torch.isnan(lse)
    w = torch.where(valid, lse, float("-inf"))
    m = w.amax(-1, keepdim=True).clamp_min(-1e30)
    p = torch.exp2(w - m)
    want = (torch.nan_to_num(o) * p[..., None]).sum(-2) / p.sum(-1, keepdim=True).clamp_min(1e-30)
    out = out.cpu()
    want = want.cpu()
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5), (out - want).abs().max()
    assert torch.equal(out[4], torch.zeros_like(out[4]))  # neither context nor tail: zeros, never NaN


@pytest.mark.parametrize(
    "d,group,opts",
    [(128, 4, ""), (128, 4, ",ts=2"), (128, 12, ""), (256, 6, "")] if DEVICE == "cpu"
    else [(128, 4, ""), (128, 8, ""), (128, 12, ""), (64, 3, ""), (128, 8, ",tpp=1,cdb=128"),
          (64, 3, ",tpp=1,cdb=64"), (128, 4, ",ts=2"), (64, 3, ",ts=3,cdb=64"), (256, 6, ""), (256, 8, ",cdb=64")],
)
def test_decode_mma_active_rows(monkeypatch: pytest.MonkeyPatch, d: int, group: int, opts: str) -> None:
    # CUDA-graph padding: only the first 3 of 5 rows are requests (``active`` on the device); decode_mma
    # sizes its splits for them at run time -- 8 warp slots / 3 rows = 2 of the grid's 12 splits here (ts=2:
    # two tail programs per pair) -- in a 1-D grid, the tails after every
    # split; padding rows (1 token of page 0, no tail) come out zeros; tpp / co / ts on and off; group 12:
    # decode_mma16 (its tail in its own launch); head_dim 256 (two 128-dim halves, the tail's too)
    import nibblekv.kernels.decode.launch as dec

    monkeypatch.setattr(dec, "num_sms", lambda: 1)
    lens, tails = [70, 1, 33, 1, 1], [W, 0, 5, 0, 0]
    torch.manual_seed(7)
    hkv = 1 if DEVICE == "cpu" else 2  # NOTE: one KV head keeps the interpreter quick
    pb = make_batch(KVDtype.NVFP4, lens, hkv, d, P, DEVICE, tail_lens=tails, global_scale=(0.37, 2.5))
    q = torch.randn(len(lens), hkv * group, d, device=DEVICE).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    sm = 1.0 / math.sqrt(d)
    act = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    decode_triton(q, pb.view(active=act), sm, num_splits=12, out=out,
                  config=decode_config_from_spec(f"mma:ppsm=8,minc=16{opts}", KVDtype.NVFP4, d))  # fmt: skip
    ref = decode_ref(q[:3].float(), pb.head(3), sm)
    assert rel_rms(out[:3], ref) <= 1e-2
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))
    with pytest.raises(ValueError, match="active must be an int32"):
        decode_triton(q, PagedKV(pb.cache, pb.page_table, pb.lens, active=act.long()), sm,
                      config=decode_config_from_spec("mma", KVDtype.NVFP4, d))


def test_decode_combine_many_slots() -> None:
    # 40 splits (> the combine step's 32-slot chunk): most are empty for the short request
    assert _run(KVDtype.BF16, [1, 300], [0, 3], 1, 2, 64, P, 40) <= 1e-2


def test_decode_default_where_mma_cannot_run() -> None:
    # a GQA group of 17 (> 16): the default NVFP4 kernel falls back to "tok" (on GPUs; "tok" is the
    # interpreter's default anyway) instead of failing
    assert _run(KVDtype.NVFP4, [1, 40], [0, 3], 1, 17, 128, P, 2) <= 1e-2


# decode_mma16 (GQA groups of 9-16 columns, head_dim 128): (spec, group, page); CPU runs two cases
MMA16_CASES = (
    [(s, grp, page) for s in ("mma", "mma:tpi=1,wppsm=9", "mma:w=2,pf=0,vq=0") for grp in (9, 16)
     for page in (P, 5)]
    + [("mma:l2=0", 16, P), ("mma:l2=2", 9, P), ("mma:l2=2,tpi=1", 16, P), ("mma:l2=1", 16, 5)]
    if DEVICE == "cuda"
    else [("mma:tpi=2", 16, P), ("mma:tpi=1,pf=0,vq=0,w=2", 12, 5), ("mma:l2=2", 16, P)]
)  # fmt: skip


@pytest.mark.parametrize("spec,group,page", MMA16_CASES)
def test_decode_mma16(spec: str, group: int, page: int) -> None:
    # S = Q K^T with 16 query columns a warp: lengths 1, P-1, P, P+1 and several tiles; the bf16 tail in its
    # own launch (tails 0, 1, W); global scales != 1 on the odd pages; columns past the group masked. l2: the
    # L2 prefetch's page ids (a no-op hint under the interpreter, and on 5-row pages)
    lens = [1, P - 1, P, P + 1, 70]
    gscale = (1.0, 1.0) if page == P else (0.37, 2.5)
    err = _run(KVDtype.NVFP4, lens, [0, 1, W, 5, W], 1, group, 128, page, 3, gscale=gscale, variant=spec)
    assert err <= 1e-2, err


def test_decode_mma_refuses_other_pools() -> None:
    with pytest.raises(ValueError, match="mma"):
        _run(KVDtype.FP8, [5], None, 1, 2, 128, P, 1, variant="mma")
    with pytest.raises(ValueError, match="mma"):
        _run(KVDtype.NVFP4, [5], None, 1, 8, 64, P, 1, variant="mma")  # head_dim 64: groups <= 4
    with pytest.raises(ValueError, match="mma"):
        _run(KVDtype.NVFP4, [5], None, 1, 2, 64, 5, 1, variant="mma")  # head_dim 64: even pages
    with pytest.raises(ValueError, match="mma"):
        _run(KVDtype.NVFP4, [5], None, 1, 17, 128, P, 1, variant="mma")  # head_dim 128: groups <= 16
    with pytest.raises(ValueError, match="mma"):
        _run(KVDtype.NVFP4, [5], None, 1, 9, 256, P, 1, variant="mma")  # head_dim 256: groups <= 8
    with pytest.raises(ValueError, match="tpi=1"):
        _run(KVDtype.NVFP4, [5], None, 1, 6, 256, P, 1, variant="mma:tpi=2")  # head_dim 256: a tile a step


@pytest.mark.parametrize("variant", ["tok", "tok:sv=1", "tok:sv=2"])
def test_decode_tok_variants_odd_page_and_block(variant: str) -> None:
    # page 5 (not a power of two), global scales != 1, a 32-key block with several full blocks per split
    for dtype in (KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16):
        err = _run(dtype, [1, 4, 5, 6, 97], [0, 5, 10, 1, 3], 2, 4, 64, 5, 2, gscale=(0.37, 2.5),
                   variant=variant + (",bn=32,tbn=16" if ":" in variant else ":bn=32,tbn=16"))  # fmt: skip
        assert err <= 1e-2, (dtype, err)


def test_decode_configs_and_spec_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from nibblekv.kernels._common import FMT_FLOAT, FMT_FP8, FMT_NVFP4

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU's configs (the interpreter's tiles are small)
    tok = decode_config_from_spec("tok:bn=128,w=8,s=3,conv=1", KVDtype.NVFP4, 128)
    assert (tok.kernel, tok.block_n, tok.tail_block_n, tok.num_warps, tok.num_stages, tok.conv) == (
            DecodeKernel.TOK, 128, 64, 8, 3, 1)
    # the default: "tok" where a GPU run verified it (head_dim 64, 128 and 256), "paged" elsewhere on a GPU;
    # NVFP4 at head_dim 64 / 128 on a GPU: decode_mma (select_decode falls back to "tok" where it cannot run)
    assert default_kernel(FMT_NVFP4, 128, False) is DecodeKernel.MMA
    assert default_kernel(FMT_NVFP4, 64, False) is DecodeKernel.MMA  # two tokens a row (timed)
    assert default_kernel(FMT_FP8, 128, False) is DecodeKernel.TOK
    assert default_kernel(FMT_NVFP4, 256, False) is DecodeKernel.MMA  # two 128-dim halves (decode.mma256)
    assert default_kernel(FMT_FP8, 256, False) is DecodeKernel.TOK  # timed at 256 (decode.config)
    assert default_kernel(FMT_FP8, 96, False) is DecodeKernel.PAGED  # a head_dim no GPU run verified
    assert default_kernel(FMT_NVFP4, 64, True) is DecodeKernel.TOK  # the interpreter tests the new default
    mma = decode_config_from_spec("mma:w=2,tpi=1,pf=0,ppsm=16,minc=64", KVDtype.NVFP4, 128)
    assert mma == DecodeConfig(
        kernel=DecodeKernel.MMA, block_n=16, tail_block_n=64, num_warps=2, num_stages=1, conv=0, ppsm=16,
        wppsm=8, tpi=1, pf=0, minc=64, vst=1, vq=1, tin=1, tail_page_prefetch=1, tail_splits=2, balanced=2,
        bal_ppsm=12, bal_pairs=152,
    )
    # decode_mma at head_dim 64 and 128: 12 programs per SM (168 registers), 8 at 256 (248 registers, one
    # tile a step; the balanced kernel too)
    assert [base_config(DecodeKernel.MMA, FMT_NVFP4, d, False).ppsm for d in (64, 128, 256)] == [12, 12, 8]
    c256 = base_config(DecodeKernel.MMA, FMT_NVFP4, 256, False)
    assert (c256.tpi, c256.tin, c256.balanced, c256.bal_ppsm, c256.l2_ahead) == (1, 1, 2, 8, 1)
    # BF16 tok: 4 stages, 5 with the bf16 tail at head_dim 128 (s sets both, st the tail's); head_dim 64: BN 128
    bf = base_config(DecodeKernel.TOK, FMT_FLOAT, 128, False)
    assert (bf.num_stages, bf.tail_stages) == (4, 5)
    got = [decode_config_from_spec(v, KVDtype.BF16, 128).tail_stages for v in ("tok:s=3", "tok:s=3,st=6")]
    assert got == [3, 6]
    bf = base_config(DecodeKernel.TOK, FMT_FLOAT, 64, False)
    assert (bf.block_n, bf.num_stages, bf.wave_ctas, bf.tail_stages) == (128, 4, 3, None)
    assert decode_config_from_spec("mma:tin=0", KVDtype.NVFP4, 128).tin == 0
    cfg = decode_config_from_spec("mma:tpp=0,ts=4", KVDtype.NVFP4, 128)
    assert (cfg.tail_page_prefetch, cfg.tail_splits) == (0, 4)
    with pytest.raises(ValueError):
        decode_config_from_spec("nope", KVDtype.BF16, 128)
    with pytest.raises(ValueError):
        decode_config_from_spec("tok:x=1", KVDtype.BF16, 128)
    # the removed variants kq / bs, bs's options and the options measured no better than the default
    assert decode_config_from_spec("mma:lz=4", KVDtype.NVFP4, 128).lazy_rescale == 4  # off by default
    assert decode_config_from_spec("mma", KVDtype.NVFP4, 256).lazy_rescale == 0
    with pytest.raises(ValueError, match="lazy_rescale"):
        decode_config_from_spec("mma:lz=16", KVDtype.NVFP4, 128)
    for gone in ("kq", "bs", "tok:sc=3", "tok:ord=0", "mma:tma=4", "mma:pdl=1", "tok:fuse=1",
                 "mma:tw=1", "tok:tr=1", "tok:ce=0"):
        with pytest.raises(ValueError):
            decode_config_from_spec(gone, KVDtype.NVFP4, 128)


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_decode_matches_reference(dtype: KVDtype, d: int, group: int) -> None:
    tails = [0, 1, W, 5, W]
    # splits: one (a single program per request) and 3 (ragged, some splits empty for short requests)
    splits = 1 if group == 3 else 3
    assert _run(dtype, LENS, tails, 2, group, d, P, splits) <= 1e-2


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
def test_decode_no_tail_odd_page_and_scales(dtype: KVDtype) -> None:
    # page 5: per-token addressing path; global scales != 1 fold into softmax / output scales
    assert _run(dtype, [1, 4, 5, 6, 23], None, 3, 2, 64, 5, 2, gscale=(0.37, 2.5)) <= 1e-2


def test_decode_tail_only_and_long_split() -> None:
    # zero main-pool tokens with a tail, and a request long enough for several blocks per split
    assert _run(KVDtype.NVFP4, [0, 300], [W, 3], 1, 4, 64, P, 2) <= 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX runs on the GPU only")
@pytest.mark.parametrize("d", [64, 128, 256])
def test_decode_gpu_paths(d: int) -> None:
    lens = [1, 15, 16, 17, 1000, 4099]
    tails = [0, 1, W, 7, W, 0]
    # default config (inline-PTX nibble conversion, deep pipeline), then the plain-Triton conversion
    assert _run(KVDtype.NVFP4, lens, tails, 8, 4, d, P, None) <= 1e-2
    assert _run(KVDtype.NVFP4, lens, tails, 8, 4, d, P, 3, knobs=dict(conv=0, block_n=64)) <= 1e-2
    for dt in (KVDtype.FP8, KVDtype.BF16):
        assert _run(dt, lens, tails, 8, 8, d, P, None) <= 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX runs on the GPU only")
@pytest.mark.parametrize(
    "variant",
    [
        "tok",
        "rows",
        "paged",
        "tok:sv=2",
        "tok:sv=0,conv=1",
        "tok:bn=64,sv=1,conv=2",
        "tok:conv=2",
    ],
)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_decode_gpu_variants(variant: str, d: int) -> None:
    # the per-token kernel's GPU-only paths (inline-PTX conversions); d 64/256 for the
    # launcher defaults only, to keep compiles few
    if d != 128 and variant != "tok":
        pytest.skip("head_dim 64/256 run for the default per-token config only")
    lens = [1, 15, 16, 17, 1000, 4099]
    tails = [0, 1, W, 7, W, 0]
    for dt in (KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16):
        assert _run(dt, lens, tails, 8, 4, d, P, None, variant=variant) <= 1e-2, (variant, dt)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX runs on the GPU only")
@pytest.mark.parametrize("group", [6, 8, 16])
def test_decode_tok_head_dim_256_gqa_6_and_8(group: int) -> None:
    # decode_tok at head_dim 256 with the hybrid models' GQA groups (6: Qwen3.5-27B, 8: Qwen3-Next; 16:
    # Qwen3.5-397B, where NVFP4 too takes tok), its default split counts, with the bf16 tail: the GPU check
    # that gates 256 in TOK_VERIFIED_HEAD_DIMS (NVFP4 takes decode_mma at groups <= 8)
    lens = [1, 15, 16, 17, 1000, 4099]
    tails = [0, 1, W, 7, W, 0]
    for dt in (KVDtype.FP8, KVDtype.BF16, KVDtype.NVFP4):
        assert _run(dt, lens, tails, 2, group, 256, P, None, variant="tok") <= 1e-2, dt
        assert _run(dt, lens, None, 2, group, 256, P, None, variant="tok") <= 1e-2, dt


def test_decode_tok_fp8_head_dim_256_tail_tile_32() -> None:
    # FP8's `tok` default at head_dim 256 reads the bf16 tail in 32-token tiles (decode.knobs.tok_knobs);
    # the interpreter's own config takes 16: this runs the 32-token tile there too (tails of 1, 5 and W)
    lens, tails = [1, 17, 300], [W, 1, 5]
    assert _run(KVDtype.FP8, lens, tails, 2, 6, 256, P, None, variant="tok:tbn=32") <= 1e-2


GROUP_CASES = (
    [(v, g, d) for v in ("tok", "paged", None) for g in (20, 36) for d in (64, 128)]
    if DEVICE == "cuda"
    else [("tok", 20, 64)]
)


@pytest.mark.parametrize("variant,group,d", GROUP_CASES)
def test_decode_gqa_group_over_16(variant: str | None, group: int, d: int) -> None:
    # query blocks of 32 / 64 rows (BH = next_pow2(group)): decode_tok groups of 36 columns for FP8 were
    # wrong on the H200 (extend_decode) while the interpreter passed; None = the default variant
    lens, tails = [1, 17, 300], [0, W, 5]
    for dt in (KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16) if DEVICE == "cuda" else (KVDtype.FP8,):
        assert _run(dt, lens, tails, 2, group, d, P, None, variant=variant) <= 1e-2, (variant, dt)


def test_decode_gqa_group_over_16_lse_matches_a_subset_of_heads() -> None:
    # the chunked path (group 20 -> two chunks of 10 heads) fills lse_out per head: heads 3-6 of every KV
    # head's group, decoded on their own as a group of 4, give the same out and lse
    pb = make_batch(KVDtype.FP8, [17, 300], 2, 64, P, DEVICE, tail_lens=[W, 5])
    q = torch.randn(2, 2 * 20, 64, device=DEVICE).to(torch.bfloat16)
    sm = 1.0 / math.sqrt(64)
    out, lse = torch.full_like(q, float("nan")), torch.full((2, 40), float("nan"), device=DEVICE)
    decode_triton(q, pb.view(), sm, out=out, lse_out=lse,
                  config=decode_config_from_spec("tok", KVDtype.FP8, 64))  # type: ignore[arg-type]
    sub = q.unflatten(1, (2, 20))[:, :, 3:7].reshape(2, 8, 64)
    lse4 = torch.full((2, 8), float("nan"), device=DEVICE)
    out4 = decode_triton(sub, pb.view(), sm, lse_out=lse4,
                         config=decode_config_from_spec("tok", KVDtype.FP8, 64))  # type: ignore[arg-type]
    assert rel_rms(out.unflatten(1, (2, 20))[:, :, 3:7].float(), out4.unflatten(1, (2, 4)).float()) <= 1e-3
    assert torch.allclose(lse.view(2, 2, 20)[:, :, 3:7], lse4.view(2, 2, 4), atol=1e-4)


def test_combine_dim_block_splits_dims_only_for_small_grids() -> None:
    from nibblekv.kernels.decode.config import combine_dim_block

    assert combine_dim_block(32, 257, 128) == 16  # B=1 x 32 heads: 8 programs per head
    assert combine_dim_block(4096, 33, 128) == 128  # a big grid: one program per head
    assert combine_dim_block(8, 12, 64) == 64  # <= 16 slots: never split
    assert combine_dim_block(1, 300, 256) == 16


def test_combine_chunk_covers_the_acceptance_rows_slots_in_one_load() -> None:
    # one chunk = one memory round trip: GQA 8 B=8 x 32K (a row a program, 33 slots at 2112 one-warp
    # splits / 64 pairs) and decode_balanced's ~10 slots a pair at B=32 x 8K (8 heads x 64 dims) each fit
    # one; no chunk is wider than the row's slots
    from nibblekv.kernels.decode.combine import COMBINE_ELEMS, combine_chunk

    assert combine_chunk(1, 128, 33) == 64 and combine_chunk(8, 64) == 16
    assert combine_chunk(1, 128, 8) == 8 and combine_chunk(4, 64, 1) == 1
    for gp, db in ((1, 16), (4, 128), (8, 128), (16, 256)):
        ch = combine_chunk(gp, db)
        assert ch & (ch - 1) == 0 and (gp * ch * db <= COMBINE_ELEMS or ch == 1)


def test_select_decode_falls_back_where_mma_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # the table of select_decode: NVFP4 head_dim 128 -> mma (groups <= 8), mma16 (9-16), balanced (>= 152
    # pairs, with the L2 prefetch unless told), tok past 16 columns; head_dim 64 -> mma (groups <= 4), tok
    # past; an explicit mma config raises
    from nibblekv.kernels.decode.config import select_decode
    from nibblekv.kernels.decode.knobs import BALANCED_MIN_PAIRS, BALANCED_MIN_PAIRS_128

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU's choices (the interpreter's default is tok)
    pb = make_batch(KVDtype.NVFP4, [5], 8, 128, P, "cpu", via_write=False)
    assert select_decode(pb.cache, 8, 8, None).kernel is DecodeKernel.MMA
    assert select_decode(pb.cache, 16, 8, None).kernel is DecodeKernel.MMA16
    below = select_decode(pb.cache, 4, BALANCED_MIN_PAIRS_128 - 1, None)
    assert (below.kernel, below.l2_ahead) == (DecodeKernel.MMA, None)
    bal = select_decode(pb.cache, 4, BALANCED_MIN_PAIRS_128, None)
    assert (bal.kernel, bal.l2_ahead) == (DecodeKernel.BALANCED, 1)
    l2off = decode_config_from_spec("mma:l2=0", KVDtype.NVFP4, 128)
    assert select_decode(pb.cache, 4, BALANCED_MIN_PAIRS_128, None, l2off).l2_ahead == 0
    assert select_decode(pb.cache, 17, 8, None).kernel is DecodeKernel.TOK
    with pytest.raises(ValueError, match="mma"):
        select_decode(pb.cache, 17, 8, None, decode_config_from_spec("mma", KVDtype.NVFP4, 128))
    pb64 = make_batch(KVDtype.NVFP4, [5], 8, 64, P, "cpu", via_write=False)
    assert select_decode(pb64.cache, 4, 8, None).kernel is DecodeKernel.MMA
    assert select_decode(pb64.cache, 8, 8, None).kernel is DecodeKernel.TOK
    # head_dim 256 -> mma (groups <= 8, the bf16 tail in its grid), balanced (>= 208 pairs), tok past 8
    pb256 = make_batch(KVDtype.NVFP4, [5], 2, 256, P, "cpu", tail_lens=[3], via_write=False)
    for grp, pairs, kernel in ((6, 8, DecodeKernel.MMA), (8, 8, DecodeKernel.MMA),
                               (6, BALANCED_MIN_PAIRS, DecodeKernel.BALANCED)):  # fmt: skip
        cfg = select_decode(pb256.cache, grp, pairs, pb256.tail)
        assert (cfg.kernel, cfg.tail_in_grid, cfg.ppsm, cfg.bal_ppsm) == (kernel, True, 8, 8), (grp, pairs)
    assert select_decode(pb256.cache, 9, 8, None).kernel is DecodeKernel.TOK
    tin0 = decode_config_from_spec("mma:tin=0", KVDtype.NVFP4, 256)
    assert not select_decode(pb256.cache, 8, 8, pb256.tail, tin0).tail_in_grid

