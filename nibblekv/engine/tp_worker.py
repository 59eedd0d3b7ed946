"""A tensor-parallel worker (ranks 1..N-1): load a shard, mirror rank 0's forwards until told to stop.

Rank 0 (the process running :class:`~nibblekv.engine.engine.Engine`, see
:mod:`nibblekv.engine.tp_group`) owns the scheduler, the page allocators and the sampler. A worker owns
only its model shard, its KV pool (its own KV heads, same page ids) and a page table that it keeps
identical to rank 0's by replaying each step's table updates.

Control messages travel over a duplex pipe to rank 0 (``(kind, payload)`` tuples):

=================  =========  ==================================================================
kind               direction  payload
=================  =========  ==================================================================
``setup``          0 -> w     :class:`WorkerSetup`
``pool``           w -> 0     this rank's main-pool page count; answered by ``pool`` (the min)
``graphs``         w -> 0     whether this rank captured CUDA graphs; answered by the group verdict
``ready``          w -> 0     ``None``: the worker waits for steps
``step``           0 -> w     :class:`~nibblekv.engine.model_runner.StepPlan`
``stop``           0 -> w     ``None``: leave the loop and exit 0
``error``          w -> 0     formatted traceback, sent before exiting 1 on any failure
=================  =========  ==================================================================

Activations travel over ``torch.distributed`` (NCCL on CUDA, gloo on CPU) inside the model's layers.

A worker never outlives rank 0: the pipe reports EOF when rank 0 is gone, and a watchdog thread
exits the process when its parent changes (rank 0 killed while this rank sits in a collective).
SIGINT and SIGTERM are ignored so that Ctrl-C or a group-wide SIGTERM lets rank 0 drain and stop
the workers in order (a worker killed mid-step would break rank 0's collectives).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from nibblekv.config import EngineConfig

logger = logging.getLogger("nibblekv")

# How often a worker checks that rank 0 is still its parent.
WATCHDOG_INTERVAL_S: float = 0.2
# Upper bound on one collective of the model group (a step, or graph capture).
COLLECTIVE_TIMEOUT: timedelta = timedelta(minutes=10)


@dataclass(frozen=True)
class WorkerSetup:
    """What rank 0 decided after loading its shard; workers build the same pool and page table."""

    max_running: int
    context_len: int


def device_for(config: EngineConfig, rank: int) -> torch.device:
    """Rank ``r`` runs on ``cuda:r`` (one GPU per process) or on the CPU."""
    from nibblekv.engine.setup import resolve_device

    dev = resolve_device(config.device)
    if dev.type != "cuda":
        return torch.device("cpu")
    if rank >= torch.cuda.device_count():
        raise ValueError(
            f"--tp-size {config.tp_size} needs {config.tp_size} GPUs, found {torch.cuda.device_count()}"
        )
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def worker_up_key(rank: int) -> str:
    """The store key a worker sets right before joining the process group (rank 0 waits for them)."""
    return f"nibblekv/tp-worker-up/{rank}"


def init_distributed(rank: int, size: int, port: int, device: torch.device) -> None:
    """Join the default process group through rank 0's TCP store at ``127.0.0.1:port``."""
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=COLLECTIVE_TIMEOUT)
    store.set(worker_up_key(rank), "1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when rank 0 dies (we are reparented), even if the main thread is blocked."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(WATCHDOG_INTERVAL_S)


def _ask(conn: Connection, kind: str, payload: Any) -> Any:
    """Send ``(kind, payload)`` to rank 0 and return its answer of the same kind."""
    conn.send((kind, payload))
    got, answer = conn.recv()
    if got != kind:
        raise RuntimeError(f"protocol error: asked {kind!r}, rank 0 answered {got!r}")
    return answer


def worker_main(
    rank: int, size: int, port: int, config: EngineConfig, conn: Connection, parent_pid: int
) -> None:
    """Entry point of a spawned worker (``torch.multiprocessing`` spawn); exits 0 on ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="tp-watchdog", daemon=True).start()
    logging.basicConfig(level=logging.WARNING, format=f"[tp{rank}] %(message)s", stream=sys.stderr)
    code = 0
    try:
        _serve(rank, size, port, config, conn)
    except EOFError:
        code = 2  # rank 0 went away without a stop message: nothing left to serve
    except BaseException:  # noqa: BLE001 - report everything to rank 0, then exit non-zero
        text = traceback.format_exc()
        print(f"[tp{rank}] worker failed:\n{text}", file=sys.stderr, flush=True)
        try:
            conn.send(("error", text))
        except (OSError, ValueError):
            pass
        code = 1
    finally:
        if dist.is_initialized():
            if code == 0:  # "stop": rank 0 leaves the group now too (NCCL's teardown is collective)
                dist.destroy_process_group()
            else:  # rank 0 aborts its side on a failure: a collective teardown could wait forever
                dist.distributed_c10d._abort_process_group()
    # NOTE: os._exit skips interpreter teardown, which can hang on a gloo/NCCL thread of a dead peer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve(rank: int, size: int, port: int, config: EngineConfig, conn: Connection) -> None:
    from nibblekv.engine.gc_heap import frozen_heap
    from nibblekv.engine.model_runner import ModelRunner, execute_mirror
    from nibblekv.engine.setup import _DTYPES, build_pool, kv_rotation_planned, make_page_table
    from nibblekv.model import load_model
    from nibblekv.model.fp8 import QuantMethod
    from nibblekv.model.parallel import TPContext

    device = device_for(config, rank)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    init_distributed(rank, size, port, device)
    dtype = None if config.dtype == "auto" else _DTYPES[config.dtype]
    model, _ = load_model(
        config.model,
        load_format=config.load_format,
        dtype=dtype,
        device=device,
        seed=config.seed,
        tp=TPContext(rank, size),
        overrides=config.model_overrides(),
        quantization=QuantMethod(config.quantization) if config.quantization else None,
        kv_rotation=kv_rotation_planned(config),
    )
    kind, setup = conn.recv()
    if kind != "setup":
        raise RuntimeError(f"protocol error: expected setup, got {kind!r}")

    def agree_pool(spec: Any) -> Any:
        return replace(spec, num_pages=_ask(conn, "pool", spec.num_pages))

    pool = build_pool(config, model, setup.max_running, agree_pool, setup.context_len)
    table = make_page_table(pool, setup.max_running, setup.context_len, device)
    runner = ModelRunner(
        model,
        pool,
        table,
        seed=config.seed,
        use_cuda_graph=device.type == "cuda" and not config.disable_cuda_graph,
        cuda_graph_max_bs=config.cuda_graph_max_bs,
        cuda_graph_bs=config.cuda_graph_bs,
        max_running_requests=setup.max_running,
        agree=lambda ok: bool(_ask(conn, "graphs", ok)),
    )
    conn.send(("ready", None))
    # NOTE: a full GC pass here stalls every rank in the next collective: skip the start-up heap
    with frozen_heap():
        while True:
            kind, payload = conn.recv()
            if kind == "stop":
                # NOTE: free the captured graphs (and their NCCL work) first, or NCCL's teardown blocks
                runner.release_graphs()
                return
            if kind != "step":
                raise RuntimeError(f"protocol error: unexpected message {kind!r}")
            execute_mirror(runner, payload)
