"""decode_mma's token-balanced split-K (variant option ``bal=1``): the schedule's invariants and the kernel
against the fp32 reference (interpreter on CPU, GPU if present)."""

from __future__ import annotations

import math

import pytest
import torch

from nibblekv.formats.kv_view import PagedKV
from nibblekv.formats.layout import KVDtype
from nibblekv.kernels.decode.balanced import max_pair_slots, partial_slots, plan_balanced
from nibblekv.kernels.decode.launch import decode_triton
from nibblekv.kernels.reference import decode_ref
from nibblekv.kernels.testing import decode_config_from_spec, make_batch, place_scales, rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
P = 16
W = 2 * P  # tail window


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize(
    "lens,heads,warps,min_tiles",
    [([1, 15, 16, 17, 70], 3, 9, 1), ([0, 33, 0, 0, 500], 2, 8, 1), ([32768] * 3 + [1024] * 61, 8, 2112, 4),
     ([4096] * 91, 8, 2112, 4), ([5], 8, 2112, 4), ([0, 0], 2, 4, 1), ([163840] * 19, 8, 1584, 4)],
)  # fmt: skip
def test_plan_covers_every_token_once_in_unique_slots(
    lens: list[int], heads: int, warps: int, min_tiles: int, aligned: bool
) -> None:
    segs = plan_balanced(lens, heads, warps, min_tiles, heads_aligned=aligned)
    pairs = len(lens) * heads
    seen: dict[int, list[tuple[int, int]]] = {}
    at: dict[tuple[int, int], tuple[int, int]] = {}  # (chunk, request) -> tokens, the same for every head
    for w, p, lo, hi, slot in segs:
        assert 0 <= w < warps and lo < hi and lo % 16 == 0
        if aligned:
            c, b, h = w // heads, p // heads, p % heads
            assert w % heads == h and slot == (c + b) * heads + h
            assert at.setdefault((c, b), (lo, hi)) == (lo, hi)
        else:
            assert slot == w + p
        seen.setdefault(p, []).append((lo, hi))
    for p in range(pairs):  # each pair's token ranges tile [0, len) exactly, in order
        n = lens[p // heads]
        ranges = sorted(seen.get(p, []))
        assert [lo for lo, _ in ranges] == [0] + [hi for _, hi in ranges[:-1]] if n else ranges == []
        assert (ranges[-1][1] if ranges else 0) == n
        assert len(ranges) <= max_pair_slots(warps, heads)
    slots = [s for *_, s in segs]
    assert len(slots) == len(set(slots)) and max(slots, default=0) < partial_slots(warps, pairs, False)
    # equal work: no warp holds more than one chunk (ceil(total / chunks), at least min_tiles tiles)
    total = sum(-(-n // 16) for n in lens) * (1 if aligned else heads)
    chunks = warps // heads if aligned else warps
    per_warp: dict[int, int] = {}
    for w, _, lo, hi, _ in segs:
        per_warp[w] = per_warp.get(w, 0) + -(-(hi - lo) // 16)
    assert max(per_warp.values(), default=0) <= max(-(-total // chunks), min_tiles)


def _run_bal(lens: list[int], tails: list[int] | None, hkv: int, group: int, page: int, active: int | None = None,
             gscale: tuple[float, float] = (1.0, 1.0), lse: bool = False,
             spec: str = "mma:bal=1,bppsm=5,minc=16", d: int = 128) -> float:  # fmt: skip
    torch.manual_seed(hash((tuple(lens), hkv, group, page, d)) % 2**31)
    pb = make_batch(KVDtype.NVFP4, lens, hkv, d, page, DEVICE, tail_lens=tails, global_scale=gscale)
    q = torch.randn(len(lens), hkv * group, d, device=DEVICE).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    sm = 1.0 / math.sqrt(d)
    act = None if active is None else torch.tensor([active], dtype=torch.int32, device=DEVICE)
    lse_out = torch.full((len(lens), hkv * group), float("nan"), device=DEVICE) if lse else None
    cfg = decode_config_from_spec(spec, KVDtype.NVFP4, d)
    decode_triton(q, pb.view(active=act), sm, out=out, config=cfg, lse_out=lse_out)  # type: ignore[arg-type]  # fmt: skip
    n = len(lens) if active is None else active
    ref = decode_ref(q[:n].float(), pb.head(n), sm)
    if active is not None:
        assert torch.equal(out[n:], torch.zeros_like(out[n:]))  # padding rows: zeros
    if lse:
        assert lse_out is not None and not lse_out[:n].isnan().any()
    return rel_rms(out[:n], ref)


@pytest.fixture
def one_sm(monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 warps (bppsm=5 x 1 SM): chunks cross pairs, a pair spans several warps, some warps hold several pairs
    import nibblekv.kernels.decode.balanced as bal

    monkeypatch.setattr(bal, "num_sms", lambda: 1)


@pytest.mark.usefixtures("one_sm")
def test_balanced_ragged_batch_with_tails(monkeypatch: pytest.MonkeyPatch) -> None:
    # lengths 1, P-1, P, P+1 and several tiles, an empty main pool with a tail; tails 0, 1, W; GQA 3;
    # 5-token pages (per-row page lookups) and global scales != 1; combine chunks of one slot (GQA 3 padded
    # to 4 heads x 128 dims), so a pair's later slots go through the combine's loop
    import nibblekv.kernels.decode.combine as comb

    monkeypatch.setattr(comb, "COMBINE_ELEMS", 4 * 128)
    hkv = 1 if DEVICE == "cpu" else 2  # NOTE: one KV head keeps the interpreter quick
    err = _run_bal([1, P - 1, 0, P + 1, 70], [0, 1, W, 5, W], hkv, 3, 5, gscale=(0.37, 2.5), lse=True)
    assert err <= 1e-2, err


@pytest.mark.usefixtures("one_sm")
@pytest.mark.parametrize(
    "l2,pf,bulk",
    [(1, 1, 0), (1, 0, 0), (3, 1, 1)]
    if DEVICE == "cpu"
    else [(1, 1, 0), (2, 1, 0), (1, 0, 0), (2, 0, 0), (2, 1, 1), (1, 0, 1)],
)
def test_balanced_l2_prefetch(l2: int, pf: int, bulk: int) -> None:
    # variant option l2 (opt-in): an L2 prefetch of the tiles l2 steps ahead -- page ids of steps past a
    # warp's chunk clamp to its current step; a no-op hint under the interpreter (the page-id loads run).
    # pf=0: no register prefetch, each step loads its tiles (from L2, where the prefetch put them);
    # l2b=1: each tile's prefetch one bulk copy of its (page, KV head) run
    spec = f"mma:bal=1,bppsm=5,minc=16,tpi=2,l2={l2},pf={pf},l2b={bulk}"
    assert _run_bal([100, 1, P + 1, 40], [W, 0, 3, 1], 1, 4, P, spec=spec) <= 1e-2
    if bulk and DEVICE == "cuda":  # head_dim 256's segment (on CPU: test_decode_mma_head_dim_256's l2b case)
        spec256 = spec.replace("tpi=2", "tpi=1")
        assert _run_bal([37, P + 1, 1], [5, 1, 0], 1, 8, P, spec=spec256, d=256) <= 1e-2


@pytest.mark.usefixtures("one_sm")
@pytest.mark.parametrize("sms,d", [(3, 128)] if DEVICE == "cpu" else [(2, 128), (3, 128), (4, 128), (3, 256)])
def test_balanced_sms_ring(sms: int, d: int) -> None:
    # sms: the tiles through a shared-memory ring of bulk copies (ptx.ring; a global read of the same run
    # under the interpreter), several segments a warp (each opens and closes its ring), ragged lengths
    spec = f"mma:bal=1,bppsm=5,minc=16,tpi={1 if d == 256 else 2},sms={sms}"
    assert _run_bal([100, 1, P + 1, 40], [W, 0, 3, 1], 1, 8 if d == 256 else 4, P, spec=spec, d=d) <= 1e-2


def test_l2_bulk_needs_the_prefetch_and_one_run_a_page_head() -> None:
    # l2b=1 copies a (page, KV head) run: refused where no L2 prefetch runs (per-pair head_dim 128 has none
    # by default), on pages that are not one tile, and where the scales are not beside their rows
    q = torch.randn(1, 4, 128, device=DEVICE).to(torch.bfloat16)
    for spec, page, placement, msg in [
        ("mma:l2b=1", P, "page", "l2_ahead"),
        ("mma:l2=1,l2b=1", 5, "page", "16-token pages"),
        ("mma:l2=1,l2b=1", P, "apart", "page layout"),
        ("mma:sms=2", 5, "page", "16-token pages"),
        ("mma:sms=3", P, "apart", "page layout"),
        ("mma:sms=4", P, "page", "shared memory"),  # 12 programs an SM: 233,856 bytes
    ]:
        pb = make_batch(KVDtype.NVFP4, [40], 1, 128, page, DEVICE)
        view = PagedKV(place_scales(pb.cache, placement), pb.page_table, pb.lens)
        cfg = decode_config_from_spec(spec, KVDtype.NVFP4, 128)
        with pytest.raises(ValueError, match=msg):
            decode_triton(q, view, 0.1, config=cfg)


@pytest.mark.usefixtures("one_sm")
@pytest.mark.parametrize("d", [128, 256])
def test_balanced_bf16_partials(d: int) -> None:
    # pbf=1: the balanced kernel's partial outputs (and its tail slots) in bf16, merged by its combine step
    spec = "mma:bal=1,bppsm=5,minc=16,pbf=1"
    assert _run_bal([100, 1, P + 1, 40], [W, 0, 3, 1], 1, 4, P, spec=spec, d=d) <= 1e-2


@pytest.mark.usefixtures("one_sm")
def test_balanced_heads_aligned() -> None:
    # bh=1: chunks over the requests' tiles, one warp per KV head each (5 warps, 2 KV heads -> 2 chunks, the
    # 5th warp not launched); a ragged batch with tails, an empty main pool, lse_out
    spec = "mma:bal=1,bppsm=5,minc=16,bh=1"
    assert _run_bal([40, 0, P + 1], [W, 3, 1], 2, 2, P, gscale=(0.37, 2.5), lse=True, spec=spec) <= 1e-2


@pytest.mark.usefixtures("one_sm")
def test_balanced_heads_aligned_head_dim_256() -> None:
    # bh=1 at head_dim 256 with the L2 prefetch, bf16 partials and CUDA-graph padding (2 of 3 rows real)
    spec = "mma:bal=1,bppsm=5,minc=16,bh=1,l2=1,pbf=1"
    assert _run_bal([37, P + 1, 1], [5, 1, 0], 2, 2, P, active=2, spec=spec, d=256) <= 1e-2


@pytest.mark.usefixtures("one_sm")
def test_balanced_no_tail_gqa4_and_padding_rows() -> None:
    assert _run_bal([100, 1, P], None, 1, 4, P) <= 1e-2
    # CUDA-graph padding: 2 of 4 rows are requests; the padding rows' lengths must not take any warp's work
    assert _run_bal([33, 50, 1, 1], [W, 3, 0, 0], 1, 4, P, active=2) <= 1e-2


@pytest.mark.usefixtures("one_sm")
@pytest.mark.parametrize("l2", [1, 0])
@pytest.mark.parametrize("group,page", [(6, P)] if DEVICE == "cpu" else [(6, P), (8, 5), (1, 2 * P)])
def test_balanced_head_dim_256(group: int, page: int, l2: int) -> None:
    # head_dim 256 (decode.mma256's segment and in-grid tail): a ragged batch with an empty main
    # pool and odd lengths, tails 0, 1, W, 5; GQA 6 and 8 (the hybrid models), 1; lse_out; CUDA-graph padding;
    # l2: the L2 prefetch a step ahead (the default at 256; its page ids clamp inside each warp's chunk)
    lens, tails = [1, 0, P + 1, 37], [0, W, 1, 5]
    spec = f"mma:bal=1,bppsm=5,minc=16,l2={l2}"
    assert _run_bal(lens, tails, 1, group, page, gscale=(0.37, 2.5), lse=True, spec=spec, d=256) <= 1e-2
    assert _run_bal([33, 50, 1, 1], [W, 3, 0, 0], 1, group, page, active=2, spec=spec, d=256) <= 1e-2
    if DEVICE == "cuda":  # no tail, the default's 8 programs per SM
        assert _run_bal([100, 1, P, 4099], None, 2, group, page, spec="mma:bal=1", d=256) <= 1e-2


def test_balanced_option_parses() -> None:
    assert decode_config_from_spec("mma:bal=1", KVDtype.NVFP4, 128).balanced == 1
    assert decode_config_from_spec("mma", KVDtype.NVFP4, 128).balanced == 2
    assert decode_config_from_spec("mma:bal=0", KVDtype.NVFP4, 128).balanced == 0


def test_balanced_auto_turns_on_from_min_pairs() -> None:
    """``balanced=2`` (default): per-pair splits below ``bal_pairs`` (152 at head_dim 128, 208 at 256),
    token-balanced from it; never at head_dim 64 (PAIR), with several warps, or with the tail outside the
    grid."""
    from nibblekv.kernels.decode.config import _balanced
    from nibblekv.kernels.decode.knobs import BALANCED_MIN_PAIRS, BALANCED_MIN_PAIRS_128

    assert decode_config_from_spec("mma", KVDtype.NVFP4, 256).bal_pairs == BALANCED_MIN_PAIRS == 208
    cfg = decode_config_from_spec("mma", KVDtype.NVFP4, 128)
    n = cfg.bal_pairs
    assert n == BALANCED_MIN_PAIRS_128 == 152
    assert not _balanced(cfg, 0, True, True, n - 1)
    assert _balanced(cfg, 0, True, True, n)
    assert not _balanced(cfg, 1, True, True, n)
    assert not _balanced(cfg, 0, True, False, n)
    assert _balanced(cfg, 0, False, False, n)
    assert not _balanced(cfg.replace(num_warps=2), 0, False, False, n)
    assert _balanced(cfg.replace(balanced=1), 0, True, True, 1)
    assert not _balanced(cfg.replace(balanced=0), 0, True, True, 10 * n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the default variant is decode_mma only on a GPU")
@pytest.mark.parametrize("active", [None, 33])
def test_default_variant_runs_balanced_from_min_pairs_on_gpu(monkeypatch: pytest.MonkeyPatch, active: int | None) -> None:
    """No variant given, 40 requests x 8 KV heads (320 pairs, ragged, bf16 tails, CUDA-graph padding rows):
    decode_triton takes decode_balanced's kernel and matches the reference."""
    import nibblekv.kernels.decode.launch as dec

    torch.manual_seed(7)
    lens = [int(x) for x in torch.randint(1, 3000, (40,))]
    lens[3] = 20000
    tails = [int(x) for x in torch.randint(0, 65, (40,))]
    pb = make_batch(KVDtype.NVFP4, lens, 8, 128, P, DEVICE, tail_lens=tails, global_scale=(0.7, 1.3))
    q = torch.randn(40, 32, 128, device=DEVICE).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    sm = 1.0 / math.sqrt(128)
    act = None if active is None else torch.tensor([active], dtype=torch.int32, device=DEVICE)
    dec.decode_triton(q, pb.view(active=act, min_active=active), sm, out=out)  # type: ignore[arg-type]  # fmt: skip
    assert "bal" in str(getattr(dec.LAST_KERNEL["decode"], "name", dec.LAST_KERNEL["decode"]))
    n = 40 if active is None else active
    ref = decode_ref(q[:n].float(), pb.head(n), sm)
    assert rel_rms(out[:n], ref) <= 1e-2


@pytest.mark.usefixtures("one_sm")
@pytest.mark.parametrize("placement,spec", [("apart", "mma:bal=0"), ("heads", "mma:bal=1,bppsm=5,minc=16")])
def test_scales_placed_elsewhere(placement: str, spec: str) -> None:
    # place_scales (the benchmarks' --scales): the same pages with the block scales in tensors of their
    # own, or the pool's layout KV head-major (the pool's own: K and V of a (page, head) in one run of bytes,
    # every other test's); the kernels, per pair and balanced, read each through the strides they take
    torch.manual_seed(7)
    lens, hkv, g = [40, 1, P + 1], 2, 2
    pb = make_batch(KVDtype.NVFP4, lens, hkv, 128, P, DEVICE, tail_lens=[W, 3, 0], global_scale=(0.37, 2.5))
    placed = place_scales(pb.cache, placement)
    assert pb.cache.pages is not None and placed.pages is None
    assert placed.k_data.data_ptr() != pb.cache.k_data.data_ptr()
    assert placed.k_scale.is_contiguous() == (placement == "apart")  # type: ignore[union-attr]
    assert (placed.k_data.stride(0) < placed.k_data.stride(1)) == (placement == "heads")
    for a, b in ((placed.k_data, pb.cache.k_data), (placed.v_scale, pb.cache.v_scale)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    q = torch.randn(len(lens), hkv * g, 128, device=DEVICE).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    view = PagedKV(placed, pb.page_table, pb.lens, pb.tail, pb.tail_page_table, pb.tail_lens)
    cfg = decode_config_from_spec(spec, KVDtype.NVFP4, 128)
    decode_triton(q, view, 1 / math.sqrt(128), out=out, config=cfg)
    assert rel_rms(out, decode_ref(q.float(), pb.view(), 1 / math.sqrt(128))) <= 1e-2


def test_place_scales_copies_bytes_and_refuses_unknown_placements() -> None:
    pb = make_batch(KVDtype.NVFP4, [3], 1, 128, P, DEVICE)
    assert place_scales(pb.cache, "page") is pb.cache
    back = place_scales(place_scales(pb.cache, "apart"), "page")
    assert back.pages is not None and torch.equal(back.pages, pb.cache.pages)  # type: ignore[arg-type]
    beside = place_scales(pb.cache, "beside")  # K rows then their scales, K and V apart: the same bytes
    assert beside.k_scale.data_ptr() - beside.k_data.data_ptr() == P * 64  # type: ignore[union-attr]
    for a, b in ((beside.v_data, pb.cache.v_data), (beside.k_scale, pb.cache.k_scale)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="placement"):
        place_scales(pb.cache, "inside")
