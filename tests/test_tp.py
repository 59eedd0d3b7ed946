"""Tensor parallelism on CPU (gloo): shard math, and ``--tp 2`` generating exactly what ``--tp 1`` does.

End-to-end engines here spawn a real worker process (rank 1) next to the test process (rank 0).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from nibblekv.engine.engine import Engine
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.model import CausalLM, ModelConfig, Tokenizer
from nibblekv.model.parallel import partition, shard_tensor

# NOTE: CPU (gloo) tests pin device="cpu": head_dim 16 is below what the GPU kernels take.
# 6 query / 3 KV heads: 2 ranks get 2 + 1 KV heads (the uneven split SmolLM2 needs); an odd vocab
# exercises the padded LM-head shard; attention_bias exercises the replicated o_proj bias.
TINY: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 16,  # NVFP4 blocks are 16 values of one head
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "vocab_size": 301,
    "max_position_embeddings": 4096,
    "attention_bias": True,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


def _config(**kw: Any) -> ModelConfig:
    return ModelConfig.from_hf({**TINY, **kw})


@pytest.fixture()
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def _no_children_left() -> None:
    """Every TP worker this test process started has exited.

    Only spawned multiprocessing children count (TP workers run ``spawn_main``): other suites' session
    fixtures (e.g. the test server) are children of this process too and outlive single tests.
    multiprocessing's resource tracker is exempt: it is shared by the whole process and leaves with
    it (test_tp_shutdown.py checks that nothing outlives rank 0).
    """
    alive = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE
        and "spawn_main" in " ".join(p.cmdline())
        and "resource_tracker" not in " ".join(p.cmdline())
    ]
    _gone, alive = psutil.wait_procs(alive, timeout=10)
    assert not alive, f"orphaned processes: {[p.cmdline() for p in alive]}"


# ---- shard math (no processes) ---------------------------------------------------------------------
def test_partition_smollm2_shape_uneven_kv_heads() -> None:
    cfg = _config(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152)
    shards = [partition(cfg, r, 2) for r in range(2)]
    assert [s.kv_heads for s in shards] == [(0, 1), (1, 3)]
    assert [s.q_heads for s in shards] == [(0, 3), (3, 9)]  # each rank keeps whole GQA groups
    assert [s.vocab for s in shards] == [(0, 24576), (24576, 49152)]
    assert [s.kv_heads for s in (partition(cfg, r, 3) for r in range(3))] == [(0, 1), (1, 2), (2, 3)]


def test_partition_replicates_kv_heads_when_fewer_than_ranks() -> None:
    cfg = _config(num_attention_heads=8, num_key_value_heads=2, hidden_size=64)
    shards = [partition(cfg, r, 4) for r in range(4)]
    assert [s.kv_heads for s in shards] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [s.q_heads for s in shards] == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_partition_refuses_unsplittable_heads() -> None:
    cfg = _config(num_attention_heads=6, num_key_value_heads=2, hidden_size=60)
    with pytest.raises(ValueError, match="cannot split 6 query / 2 KV heads"):
        partition(cfg, 0, 4)  # each KV head's 3 query heads cannot go to 2 ranks
    with pytest.raises(ValueError, match="larger than the model's 6 attention heads"):
        partition(cfg, 0, 8)


def test_vocab_shards_pad_and_reassemble() -> None:
    cfg = _config()
    full = torch.randn(cfg.vocab_size, cfg.hidden_size)
    parts = [shard_tensor("model.embed_tokens.weight", full, cfg, partition(cfg, r, 2)) for r in range(2)]
    assert parts[0].shape == parts[1].shape == (151, cfg.hidden_size)
    assert torch.equal(parts[1][-1], torch.zeros(cfg.hidden_size))  # the padding row
    assert torch.equal(torch.cat(parts)[: cfg.vocab_size], full)
    o = torch.randn(cfg.hidden_size, cfg.q_size)
    cols = [
        shard_tensor("model.layers.0.self_attn.o_proj.weight", o, cfg, partition(cfg, r, 2)) for r in range(2)
    ]
    assert [c.shape[1] for c in cols] == [2 * cfg.head_dim, 4 * cfg.head_dim]
    assert torch.equal(torch.cat(cols, dim=1), o)


# ---- end to end ------------------------------------------------------------------------------------
def _generate(engine: Engine, prompts: list[Any], params: SamplingParams) -> list[Any]:
    try:
        return engine.generate(prompts, params)
    finally:
        engine.shutdown()


def test_tp2_equals_tp1_dummy_with_logprobs_and_chunked_prefill(tiny_config: Path) -> None:
    """Chunked prefill, prompt logprobs and several requests: every collective path of a step."""
    kw: dict[str, Any] = {
        "model": str(tiny_config),
        "load_format": "dummy",
        "device": "cpu",
        "seed": 5,
        "max_total_tokens": 4096,
        "chunked_prefill_size": 24,
    }
    prompts = [list(range(1, 60)), [7, 8, 9], list(range(100, 140))]
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    ref = _generate(Engine(**kw), prompts, params)
    tp = _generate(Engine(tp_size=2, **kw), prompts, params)
    _no_children_left()
    assert [o.token_ids for o in tp] == [o.token_ids for o in ref]
    for a, b in zip(tp, ref):
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs) > 0
        got = [lp.logprob for lp in a.prompt_logprobs + a.logprobs]
        want = [lp.logprob for lp in b.prompt_logprobs + b.logprobs]
        assert got == pytest.approx(want, abs=1e-4)


@pytest.fixture(scope="module")
def smollm2_prompts(smollm2: tuple[CausalLM, Tokenizer]) -> list[list[int]]:
    tok = smollm2[1]
    texts = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers."]
    return [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]


def _smollm2_tp2(path: Path, kv: str) -> Engine:
    return Engine(
        model=str(path), tp_size=2, dtype="float32", device="cpu", kv_cache_dtype=kv, max_total_tokens=4096
    )


def test_smollm2_tp2_greedy_equals_tp1_bf16_kv(
    smollm2: tuple[CausalLM, Tokenizer], smollm2_path: Path, smollm2_prompts: list[list[int]]
) -> None:
    """SmolLM2 (9 query / 3 KV heads) split 6+3 / 2+1 across two gloo ranks: same greedy tokens."""
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    ref = _generate(
        Engine(loaded=smollm2, kv_cache_dtype="bf16", max_total_tokens=4096), smollm2_prompts, params
    )
    tp = _generate(_smollm2_tp2(smollm2_path, "bf16"), smollm2_prompts, params)
    _no_children_left()
    assert [o.token_ids for o in tp] == [o.token_ids for o in ref]
    assert all(o.completion_tokens > 5 for o in tp)


@pytest.mark.parametrize("kv", ["nvfp4", "fp8_e4m3"])
def test_tp2_quantized_kv_runs_and_matches_tp1(tiny_config: Path, kv: str) -> None:
    """Quantized pools (NVFP4 with its bf16 tail, window 16; FP8) hold each rank's own KV heads.

    Block scales are per head and global scales per layer, so the split quantizes exactly the values
    tp=1 does and the greedy tokens match.
    """
    kw: dict[str, Any] = {
        "model": str(tiny_config), "load_format": "dummy", "device": "cpu", "seed": 2, "kv_cache_dtype": kv, "kv_recent_window": 16,
        "max_total_tokens": 2048,
    }  # fmt: skip
    prompts = [list(range(3, 50)), [11, 12, 13, 14]]
    params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    ref = _generate(Engine(**kw), prompts, params)
    engine = Engine(tp_size=2, **kw)
    assert engine.pool.spec.num_kv_heads == 1  # rank 0's share of the 3 KV heads
    tp = _generate(engine, prompts, params)
    _no_children_left()
    assert [o.completion_tokens for o in tp] == [40, 40]
    assert [o.token_ids for o in tp] == [o.token_ids for o in ref]


def test_clean_shutdown_leaves_the_group_with_the_workers_then_a_second_engine_runs(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL's teardown is collective: rank 0 must destroy its group while the workers destroy theirs,
    not after joining them (that deadlocked on 2x H200, and the next TP engine in the process hung).
    gloo's teardown is local, so the order is checked directly; the workers exit 0, none killed."""
    from nibblekv.engine import tp_group

    kw: dict[str, Any] = {
        "model": str(tiny_config), "load_format": "dummy", "device": "cpu", "seed": 1, "max_total_tokens": 1024
    }
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    seen: list[list[bool]] = []
    order: list[str] = []
    real = tp_group.dist.destroy_process_group
    for _ in range(2):  # back to back in one process
        engine = Engine(tp_size=2, **kw)
        assert engine.tp is not None
        procs = list(engine.tp.procs)
        monkeypatch.setattr(
            tp_group.dist,
            "destroy_process_group",
            lambda: (seen.append([p.exitcode for p in procs]), order.append("destroy"), real())[2],
        )
        engine.tp.before_teardown(lambda: order.append("hook"))
        out = _generate(engine, [[5, 6, 7]], params)
        monkeypatch.setattr(tp_group.dist, "destroy_process_group", real)
        assert out[0].completion_tokens == 4
        assert [p.exitcode for p in procs] == [0]
    assert seen == [[None], [None]]  # the worker was still running when rank 0 left the group
    # NOTE: hooks (rank 0 frees its CUDA graphs there: NCCL's teardown hangs on a live captured graph) first
    assert order == ["hook", "destroy", "hook", "destroy"]
    _no_children_left()


def test_stuck_teardown_is_bounded_and_stops_the_workers(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collective teardown that never returns (NCCL with a live captured graph, pytorch#115388) must
    not hang rank 0: it gives up after DESTROY_TIMEOUT_S, logs it, and the workers still exit."""
    import threading

    from nibblekv.engine import tp_group

    release = threading.Event()
    real = tp_group.dist.destroy_process_group

    def stuck() -> None:
        release.wait(60)
        real()

    monkeypatch.setattr(tp_group, "DESTROY_TIMEOUT_S", 0.5)
    engine = Engine(
        model=str(tiny_config), load_format="dummy", device="cpu", seed=1, max_total_tokens=1024, tp_size=2
    )
    assert engine.tp is not None
    procs = list(engine.tp.procs)
    monkeypatch.setattr(tp_group.dist, "destroy_process_group", stuck)
    t0 = time.monotonic()
    _generate(engine, [[5, 6, 7]], SamplingParams(max_new_tokens=2, ignore_eos=True))
    assert time.monotonic() - t0 < 30
    assert tp_group.dist.is_initialized()  # left alone: the stuck call still owns it
    assert all(p.exitcode is not None for p in procs)
    _no_children_left()
    release.set()  # let the "stuck" teardown finish so later tests can form a group
    deadline = time.monotonic() + 30
    while tp_group.dist.is_initialized() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tp_group.dist.is_initialized()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_nccl_engines_with_cuda_graphs_back_to_back() -> None:
    """On GPUs: CUDA graphs capture NCCL all-reduces; the first engine's shutdown must free them on every
    rank before NCCL's teardown (which otherwise hangs), so a second TP engine starts in the process.
    SmolLM2's shape (head_dim 64, the kernels' GPU paths; 9/3 heads split unevenly), nvfp4 KV."""
    kw: dict[str, Any] = {
        "model": "smollm2-135m", "load_format": "dummy", "seed": 1, "device": "cuda", "kv_cache_dtype": "nvfp4"
    }
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    outs = []
    for _ in range(2):
        engine = Engine(tp_size=2, max_total_tokens=4096, **kw)
        assert engine.runner.graphs is not None
        procs = list(engine.tp.procs) if engine.tp else []
        t0 = time.monotonic()
        outs.append(_generate(engine, [[5, 6, 7], [8, 9]], params))
        assert time.monotonic() - t0 < 120
        assert [p.exitcode for p in procs] == [0]
        assert engine.runner.graphs is None
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
    _no_children_left()


def test_failed_step_aborts_instead_of_a_collective_teardown(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a step raised on rank 0 the workers may wait in a collective rank 0 never joined: a collective
    teardown would hang under NCCL, so rank 0 aborts its group (and the workers are stopped or killed)."""
    from nibblekv.engine import tp_group

    engine = Engine(
        model=str(tiny_config), load_format="dummy", device="cpu", seed=1, max_total_tokens=1024, tp_size=2
    )
    calls: list[str] = []
    real_destroy, real_abort = tp_group.dist.destroy_process_group, tp_group.dist.distributed_c10d._abort_process_group
    monkeypatch.setattr(tp_group.dist, "destroy_process_group", lambda: (calls.append("destroy"), real_destroy())[1])
    monkeypatch.setattr(
        tp_group.dist.distributed_c10d, "_abort_process_group", lambda: (calls.append("abort"), real_abort())[1]
    )

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("injected failure inside a step")

    monkeypatch.setattr(engine.runner.model, "forward", boom)
    with pytest.raises(ValueError, match="injected"):
        engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))
    engine.shutdown()
    assert calls == ["abort"] and not tp_group.dist.is_initialized()
    _no_children_left()


def test_unsplittable_tp_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({**TINY, "num_attention_heads": 3, "num_key_value_heads": 1, "hidden_size": 48})
    )
    with pytest.raises(ValueError, match="cannot split 3 query / 1 KV heads"):
        Engine(model=str(path), load_format="dummy", device="cpu", tp_size=2, max_total_tokens=1024)
    _no_children_left()
    # the process group was torn down: a new TP engine can start in this process
    outs = _generate(
        Engine(**_tiny_kw(tmp_path)), [[1, 2, 3]], SamplingParams(max_new_tokens=3, ignore_eos=True)
    )
    assert outs[0].completion_tokens == 3
    _no_children_left()


def _tiny_kw(tmp_path: Path) -> dict[str, Any]:
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(TINY))
    return {"model": str(ok), "load_format": "dummy", "device": "cpu", "tp_size": 2, "max_total_tokens": 1024}


def _worker_dies_at_start(rank: int, size: int, port: int, config: Any, conn: Any, parent_pid: int) -> None:
    """Stands in for ``worker_main`` in a spawned worker: reports an error and exits before joining."""
    conn.send(("error", f"worker {rank} could not start (test)"))
    os._exit(1)


def test_worker_dying_before_the_group_forms_fails_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rank 0 must not sit in init_process_group for COLLECTIVE_TIMEOUT waiting for a dead worker
    from nibblekv.engine import tp_group

    monkeypatch.setattr(tp_group, "worker_main", _worker_dies_at_start)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="worker 1 could not start"):
        Engine(**_tiny_kw(tmp_path))
    assert time.monotonic() - t0 < 60
    _no_children_left()
