"""The prefix cache on a tiny random hybrid (Gated DeltaNet + gated attention) model: a match ends at a state
snapshot, restores it and gives a cold run's tokens; snapshots are evicted, freed and counted."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from nibblekv import Engine, SamplingParams
from nibblekv.cache.manager import TieredCacheManager
from nibblekv.cache.state_prefix import StatePrefixCacheManager
from nibblekv.config import EngineConfig
from nibblekv.model import ByteTokenizer, ModelConfig
from nibblekv.model.hybrid import HybridCausalLM
from tests.test_engine_hybrid import TINY

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
TURN1 = [5 + (11 * j) % 240 for j in range(45)]
TURN2_TAIL = [7 + (5 * j) % 200 for j in range(21)]


@pytest.fixture(scope="module")
def model() -> HybridCausalLM:
    lm = HybridCausalLM(ModelConfig.from_hf(TINY)).float()
    lm.init_dummy(seed=0, std=0.2)
    return lm.eval()


def _engine(model: HybridCausalLM, **kw: Any) -> Engine:
    opts: dict[str, Any] = {"device": "cpu", "max_total_tokens": 2048, "decode_log_interval": 0, **kw}
    return Engine(loaded=(model, ByteTokenizer(300)), **opts)


def _cache(engine: Engine) -> StatePrefixCacheManager:
    cache = engine.scheduler.cache
    assert isinstance(cache, StatePrefixCacheManager)
    return cache


def _check(engine: Engine) -> None:
    """No request left: every page, state slot and snapshot slot accounted for."""
    _cache(engine).check([])
    assert engine.states is not None and engine.states.num_used == 0
    assert engine.pool.used_tokens() == 0


def _two_turns(engine: Engine) -> tuple[list[int], Any]:
    """An agentic turn: the second prompt is the first, its answer and a new message."""
    first = engine.generate([TURN1], GREEDY)[0]
    second = engine.generate([TURN1 + first.token_ids + TURN2_TAIL], GREEDY)[0]
    return first.token_ids, second


@pytest.mark.parametrize("kv", ["auto", "nvfp4"])
def test_second_turn_reuses_the_first_and_matches_a_cold_run(model: HybridCausalLM, kv: str) -> None:
    """fp32 KV (W = 0): the first turn's snapshot sits at its last whole page (32 of 45 tokens); nvfp4 (W = 64,
    a bf16 window and sink): at the main pool's end after the prompt, so a longer first turn. The second
    turn starts from that snapshot and decodes what the same engine without a prefix cache decodes."""
    kw: dict[str, Any] = {"kv_cache_dtype": kv, "chunked_prefill_size": 64}
    global TURN1
    saved = TURN1
    if kv == "nvfp4":
        TURN1 = [5 + (11 * j) % 240 for j in range(150)]
    try:
        warm = _engine(model, **kw)
        cold = _engine(model, disable_radix_cache=True, **kw)
        first, second = _two_turns(warm)
        cold_first, cold_second = _two_turns(cold)
    finally:
        TURN1 = saved
    cache = _cache(warm)
    point = cache.snapshot_point(150 if kv == "nvfp4" else 45)
    assert point == (96 if kv == "nvfp4" else 32)  # ceil((150 - 64) / 16) * 16; 45 // 16 * 16
    assert cache.snapshots_taken == 2  # one per prompt
    # the match ends at the first prompt's snapshot, not at the longer cached run of pages after it
    assert second.cached_tokens == point
    assert first == cold_first and second.token_ids == cold_second.token_ids
    lp = torch.tensor([t.logprob for t in second.logprobs])
    cold_lp = torch.tensor([t.logprob for t in cold_second.logprobs])
    assert torch.allclose(lp, cold_lp, atol=1e-4 if kv == "auto" else 0.05), (lp - cold_lp).abs().max()
    _check(warm)


def test_snapshots_are_taken_inside_the_forward_without_changing_chunks(model: HybridCausalLM) -> None:
    """Three nvfp4 prompts in one extend batch, whole (no chunk cut at a snapshot point): each request's
    linear layers run up to its point and on from there, the state between stored in a snapshot slot; each
    prompt's snapshot sits at its point in the tree once the prompt is in."""
    engine = _engine(model, kv_cache_dtype="nvfp4", chunked_prefill_size=1024)
    lens = (150, 200, 130)
    prompts = [[9 + (i + j) % 200 for j in range(n)] for i, n in enumerate(lens)]
    for p in prompts:
        engine.add_request(p, SamplingParams(max_new_tokens=3, ignore_eos=True))
    engine.step()
    batch = engine.last_batch
    cache = _cache(engine)
    points = [cache.snapshot_point(n) for n in lens]
    assert points == [96, 144, 80]  # ceil((L - 64) / 16) * 16
    assert batch is not None and not batch.is_decode and [g.new_len for g in batch.growths] == list(lens)
    assert [(e, k) for e, k, _ in batch.snapshots] == [(0, 96), (1, 144), (2, 80)]
    assert sorted(cache.tree.state_slots()) == sorted(slot for _, _, slot in batch.snapshots)
    for p, point in zip(prompts, points):
        assert cache.tree.peek_prefix(p + [1], ends=cache._has_state) * 16 == point
    while engine.scheduler.has_work():
        engine.step()
    _check(engine)


def test_snapshot_is_the_state_a_prefill_ending_there_leaves(model: HybridCausalLM) -> None:
    """The state a forward stores at a snapshot point is the state a prefill of exactly those tokens leaves
    (fp32: the two chunked recurrences differ by rounding only)."""
    prompt = [5 + (13 * j) % 240 for j in range(45)]
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    engine = _engine(model)
    engine.add_request(prompt, params)
    engine.step()
    batch = engine.last_batch
    assert batch is not None and [(e, k) for e, k, _ in batch.snapshots] == [(0, 32)]
    ref = _engine(model, disable_radix_cache=True)
    ref.add_request(prompt[:32], params)
    ref.step()
    a, b = engine.states, ref.states
    assert a is not None and b is not None
    snap, slot = batch.snapshots[0][2], ref.scheduler.running[0].state_slot
    assert torch.allclose(a.conv[:, snap], b.conv[:, slot], atol=1e-5)
    assert torch.allclose(a.recurrent[:, snap], b.recurrent[:, slot], atol=1e-5)
    assert not torch.allclose(a.recurrent[:, snap], a.recurrent[:, engine.scheduler.running[0].state_slot])


def test_no_snapshot_without_a_whole_page(model: HybridCausalLM) -> None:
    """A 9-token prompt has no page to cache: no snapshot, and a second request has no hit."""
    engine = _engine(model)
    engine.generate([[3, 4, 5, 6, 7, 8, 9, 10, 11]], GREEDY)
    out = engine.generate([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12]], GREEDY)[0]
    assert _cache(engine).snapshots_taken == 0 and out.cached_tokens == 0
    _check(engine)


def test_snapshots_evicted_lru_when_slots_run_out(model: HybridCausalLM) -> None:
    """One snapshot slot (--max-mamba-cache-size = running requests + 1): each new prompt's snapshot evicts
    the older one; a prompt whose snapshot went has no hit and still decodes what a cold run does."""
    engine = _engine(model, max_running_requests=2, max_mamba_cache_size=3)
    cold = _engine(model, max_running_requests=2, disable_radix_cache=True)
    assert engine.states is not None and engine.states.num_snapshot_slots == 1
    prompts = [[20 + i + (7 * j) % 200 for j in range(40)] for i in range(3)]
    for p in prompts:
        engine.generate([p], GREEDY)
    cache = _cache(engine)
    assert cache.snapshots_taken == 3 and cache.snapshots_dropped == 2
    # one after the other: a prefill's snapshot evicts the one slot's before the next request matches
    again = [engine.generate([prompts[i] + [1, 2, 3]], GREEDY)[0] for i in (2, 0)]
    assert [o.cached_tokens for o in again] == [32, 0]  # only the newest snapshot was left
    expect = cold.generate([prompts[2] + [1, 2, 3], prompts[0] + [1, 2, 3]], GREEDY)
    assert [o.token_ids for o in again] == [o.token_ids for o in expect]
    _check(engine)


def test_interleaved_sessions_keep_their_own_snapshots(model: HybridCausalLM) -> None:
    """Four agentic sessions, four snapshot slots, turns interleaved (every session's first turn, then every
    second turn): each second turn's snapshot replaces the one its own first turn left, which it supersedes,
    not another session's, so every second turn hits (plain LRU dropped the next session's before it came)."""
    engine = _engine(model, max_running_requests=4, max_mamba_cache_size=8)
    firsts = [[20 + 3 * i + (7 * j) % 200 for j in range(40)] for i in range(4)]
    answers = [engine.generate([p], GREEDY)[0].token_ids for p in firsts]
    seconds = [p + a + [1 + i, 2, 3] for i, (p, a) in enumerate(zip(firsts, answers))]
    hits = [engine.generate([p], GREEDY)[0].cached_tokens for p in seconds]
    assert hits == [32] * 4 and _cache(engine).snapshots_dropped == 4
    ends = sorted(_cache(engine).tree.peek_prefix(p + [9], ends=_cache(engine)._has_state) for p in seconds)
    assert ends == [3] * 4  # each session's second prompt (55 tokens) left its snapshot at 48
    _check(engine)


def test_preemption_and_abort_keep_snapshots_accounted(model: HybridCausalLM) -> None:
    """A pool too small for the batch: requests are preempted and resume from their own snapshots; one is
    aborted mid-prefill, its snapshot taken but not in the tree yet (nvfp4: the prefill window keeps the
    prompt's pages in the tail until its last chunk). Tokens equal a cold run's, nothing leaks."""
    prompts = [[5 + (7 * i + 3 * j) % 250 for j in range(n)] for i, n in enumerate((40, 19, 70, 33))]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    engine = _engine(model, max_total_tokens=112, chunked_prefill_size=32)
    cold = _engine(model, max_total_tokens=112, chunked_prefill_size=32, disable_radix_cache=True)
    outs = engine.generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in cold.generate(prompts, params)]
    _check(engine)
    nv = _engine(model, kv_cache_dtype="nvfp4", chunked_prefill_size=128)
    rid = nv.add_request([8 + j % 100 for j in range(150)], params)
    nv.step()  # the first chunk (128 tokens) holds the snapshot point, 96
    assert nv.last_batch is not None and nv.last_batch.snapshots[0][1] == 96
    assert len(_cache(nv)._taken) == 1 and not nv.scheduler.cache.tree.state_slots()
    nv.abort(rid)
    _check(nv)


def test_max_mamba_cache_size_below_running_requests_is_refused() -> None:
    """Both given: the config refuses the pair; only the slots: the CLI names the default they are below."""
    from nibblekv.engine.setup import state_slots_error

    with pytest.raises(ValueError, match="max-mamba-cache-size"):
        EngineConfig(max_running_requests=8, max_mamba_cache_size=4)
    problem = state_slots_error(EngineConfig(device="cpu", max_mamba_cache_size=4))
    assert problem is not None and "(default 32 here)" in problem
    assert state_slots_error(EngineConfig(device="cpu", max_mamba_cache_size=32)) is None


def test_start_up_lines_name_what_hybrid_models_leave_out(
    model: HybridCausalLM, caplog: pytest.LogCaptureFixture
) -> None:
    """The host tier is dropped (its pages would come back without states); no snapshot slot: no radix cache."""
    with caplog.at_level(logging.INFO, logger="nibblekv"):
        tiered = _engine(model, enable_hierarchical_cache=True)
        plain = _engine(model, max_running_requests=4, max_mamba_cache_size=4)
    assert "Host KV tier is not used for hybrid linear-attention models" in caplog.text
    assert isinstance(tiered.scheduler.cache, StatePrefixCacheManager)
    assert "Radix cache is disabled for hybrid linear-attention models" in caplog.text
    assert type(plain.scheduler.cache) is TieredCacheManager
    assert plain.states is not None and plain.states.num_snapshot_slots == 0


@pytest.mark.parametrize(
    "flags", [{}, {"disable_radix_cache": True}, {"max_mamba_cache_size": 40}, {"max_mamba_cache_size": 300}]
)
def test_planner_counts_the_snapshot_slots_as_the_engine_does(flags: dict[str, Any]) -> None:
    """``nibblekv plan``'s resident requests equal the engine's sizing for Qwen3.5-27B at 32K in 70 GiB with
    the prefix cache's snapshots (default: one per running request), without them, and with a fixed
    number of state slots (40 caps the running requests)."""
    from types import SimpleNamespace

    from nibblekv.engine.setup import resident_capacity
    from nibblekv.formats import KVDtype
    from nibblekv.model.presets import PRESETS
    from nibblekv.planner.engine_fit import EngineOptions, resident_requests
    from nibblekv.planner.shape import shape_from_config

    context, page = 32768 + 1024 + 16, 16
    per_request = (-(-(32768 + 1024) // page) + 1) * page
    model = SimpleNamespace(
        config=ModelConfig.from_hf(PRESETS["qwen3.5-27b"]), dtype=torch.bfloat16, device=torch.device("cpu")
    )
    counts = {}
    for kv in ("fp8_e4m3", "nvfp4"):
        cfg = EngineConfig(kv_cache_dtype=kv, mem_budget_gib=70.0, chunked_prefill_size=8192, **flags)
        engine_n = resident_capacity(cfg, model, per_request, context)  # type: ignore[arg-type]
        opts = EngineOptions(page_size=page, kv_recent_window=cfg.kv_recent_window, chunked_prefill_size=8192,
                             **flags)  # fmt: skip
        shape = shape_from_config(PRESETS["qwen3.5-27b"], "qwen3.5-27b")
        assert (
            resident_requests(shape, KVDtype(kv), int(70 * (1 << 30)), per_request, context, opts) == engine_n
        )
        counts[kv] = engine_n
    if flags.get("max_mamba_cache_size") == 40:
        assert counts["nvfp4"] == 40  # every state slot a running request's: no snapshot left
    assert counts["fp8_e4m3"] >= 1


SYSTEM = [5 + (13 * j) % 240 for j in range(300)]


def _question(i: int) -> list[int]:
    return [3 + i + (17 * j) % 200 for j in range(27)]


def _nodes(cache: StatePrefixCacheManager) -> list[Any]:
    """Every node of the tree but the root."""
    out, todo = [], list(cache.tree.root.children.values())
    while todo:
        node = todo.pop()
        out.append(node)
        todo += node.children.values()
    return out


def _depth(node: Any) -> int:
    """Tokens from the root to the end of ``node``."""
    n = 0
    while node is not None:
        n += len(node.key)
        node = node.parent
    return n


def test_shared_system_prompt_gets_a_branch_snapshot(model: HybridCausalLM) -> None:
    """Requests sharing a 300-token system prompt, one after another: the first leaves its end snapshot only;
    the second finds the prompt's pages at a branch of the tree (inside the first one's edge) and takes a
    snapshot there too (288: its last whole shared page), in the same forward as its end snapshot (320 of
    327: three passes of the linear layers); the third resumes from it. The branch snapshot is the state a
    prefill of those 288 tokens leaves, and every request decodes what an engine without a prefix cache
    decodes."""
    engine = _engine(model)
    cold = _engine(model, disable_radix_cache=True)
    prompts = [SYSTEM + _question(i) for i in range(3)]
    outs = [engine.generate([prompts[0]], GREEDY)[0]]
    engine.add_request(prompts[1], GREEDY)
    done = engine.step()
    batch = engine.last_batch
    assert batch is not None and [(e, k) for e, k, _ in batch.snapshots] == [(0, 288), (0, 320)]
    while engine.scheduler.has_work():
        done += engine.step()
    outs += [o for o in done if o.finished]
    outs += [engine.generate([prompts[2]], GREEDY)[0]]
    assert [o.cached_tokens for o in outs] == [0, 0, 288]
    cache = _cache(engine)
    assert cache.snapshots_taken == 1 + 2 + 1  # end; branch + end; end
    assert [o.token_ids for o in outs] == [o.token_ids for o in cold.generate(prompts, GREEDY)]
    assert cache.tree.peek_prefix(SYSTEM + [1] * 20, ends=cache._has_state) * 16 == 288
    ref = _engine(model, disable_radix_cache=True)
    ref.add_request(SYSTEM[:288], SamplingParams(max_new_tokens=2, ignore_eos=True))
    ref.step()
    a, b = engine.states, ref.states
    assert a is not None and b is not None
    snap = next(n.state for n in _nodes(cache) if n.state is not None and _depth(n) == 288)
    slot = ref.scheduler.running[0].state_slot
    assert torch.allclose(a.conv[:, snap], b.conv[:, slot], atol=1e-5)
    assert torch.allclose(a.recurrent[:, snap], b.recurrent[:, slot], atol=1e-4)
    _check(engine)


def test_branch_snapshot_outlives_the_ends_below_it(model: HybridCausalLM) -> None:
    """Two snapshot slots, five requests sharing the system prompt: the branch point's snapshot has end
    snapshots below it, but it serves every request sharing the prompt, so those ends are dropped before it
    (taking it for superseded, as an agent's earlier turn, left the fourth and fifth requests no hit)."""
    engine = _engine(model, max_running_requests=2, max_mamba_cache_size=4)
    assert engine.states is not None and engine.states.num_snapshot_slots == 2
    outs = [engine.generate([SYSTEM + _question(i)], GREEDY)[0] for i in range(5)]
    assert [o.cached_tokens for o in outs] == [0, 0, 288, 288, 288]
    _check(engine)


def test_snapshot_split_passes() -> None:
    """Three sequences (5, 7 and 4 tokens): the first cut at 2 and 4, the second at 3, the third not. Pass 0
    runs every sequence to its first point; pass 1 the cut ones on, after storing their states; pass 2 the
    first one's rest."""
    from nibblekv.cache.state_pool import SnapshotSplit

    sp = SnapshotSplit.of([0, 5, 12, 16], [(0, 4), (0, 2), (1, 3)], [7, 6, 9], torch.device("cpu"))
    got = [
        (
            p.rows.tolist(),
            p.cu,
            None if p.seqs is None else p.seqs.tolist(),
            None if p.slots is None else p.slots.tolist(),
        )
        for p in sp.parts
    ]
    assert got == [
        ([0, 1, 5, 6, 7, 12, 13, 14, 15], [0, 2, 5, 9], None, None),
        ([2, 3, 8, 9, 10, 11], [0, 2, 6], [0, 1], [6, 9]),
        ([4], [0, 1], [0], [7]),
    ]


def test_unmatched_end_snapshots_go_before_a_branch_snapshot(model: HybridCausalLM) -> None:
    """Two snapshot slots; three requests on one system prompt, one on another, then a fourth on the first:
    the new prompt's end snapshot takes the slot of an end snapshot no one resumed from, not the (least
    recently used) branch snapshot the fourth request starts from."""
    engine = _engine(model, max_running_requests=2, max_mamba_cache_size=4)
    other = [7 + (29 * j) % 230 for j in range(300)]
    prompts = [SYSTEM + _question(i) for i in range(3)] + [other + _question(3), SYSTEM + _question(4)]
    outs = [engine.generate([p], GREEDY)[0] for p in prompts]
    assert [o.cached_tokens for o in outs] == [0, 0, 288, 0, 288]
    _check(engine)


def test_one_branch_snapshot_for_requests_admitted_together(model: HybridCausalLM) -> None:
    """Two requests on a cached system prompt admitted in one batch both leave the tree at its branch
    point: only the first takes a snapshot there (the second's would be a duplicate, freed on arrival)."""
    engine = _engine(model)
    engine.generate([SYSTEM + _question(0)], GREEDY)
    for i in (1, 2):
        engine.add_request(SYSTEM + _question(i), GREEDY)
    engine.step()
    batch = engine.last_batch
    assert batch is not None and [(e, k) for e, k, _ in batch.snapshots] == [(0, 288), (0, 320), (1, 320)]
    while engine.scheduler.has_work():
        engine.step()
    assert engine.generate([SYSTEM + _question(3)], GREEDY)[0].cached_tokens == 288
    _check(engine)
