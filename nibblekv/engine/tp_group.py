"""Rank 0's side of tensor parallelism: start the workers, feed them every step, stop them.

:class:`TPGroup` is created by :class:`~nibblekv.engine.engine.Engine` when ``--tp-size > 1``. The
engine process is rank 0: it runs the scheduler and the sampler and its own model shard; ranks
1..N-1 are processes spawned here (``torch.multiprocessing``, spawn) running
:func:`~nibblekv.engine.tp_worker.worker_main`. Each step rank 0 sends the step's
:class:`~nibblekv.engine.model_runner.StepPlan` down every worker's pipe, then all ranks run the same
forward, meeting in the model's collectives.

Shutdown contract: :meth:`TPGroup.shutdown` (called by ``Engine.shutdown``, at interpreter exit, and
after SIGTERM, which is turned into ``SystemExit`` at a step boundary when rank 0 still has the
default handler) sends
``stop``, waits :data:`STOP_TIMEOUT_S` and kills what is left; a worker that dies on its own is
reported as a ``RuntimeError`` by the next step. Workers also exit by themselves when rank 0 dies
(see :mod:`nibblekv.engine.tp_worker`), so no path leaves orphans.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nibblekv.cache import PoolSpec
from nibblekv.config import EngineConfig
from nibblekv.engine.model_runner import StepPlan
from nibblekv.engine.tp_worker import COLLECTIVE_TIMEOUT, WorkerSetup, device_for, worker_main, worker_up_key
from nibblekv.model.parallel import TPContext

logger = logging.getLogger("nibblekv")

STOP_TIMEOUT_S: float = 10.0  # grace for workers to leave after "stop" before they are killed
DESTROY_TIMEOUT_S: float = 60.0  # bound on rank 0's collective teardown of the process group
STARTUP_TIMEOUT: timedelta = timedelta(minutes=30)  # loading a large shard can take long


class WorkerFailed(RuntimeError):
    """A tensor-parallel worker died or reported an error."""


class TPGroup:
    """The running worker processes plus rank 0's membership in the process group."""

    def __init__(self, config: EngineConfig) -> None:
        """Spawn ranks 1..N-1 and join the group as rank 0 (blocks until every worker has joined)."""
        if dist.is_initialized():
            raise RuntimeError(
                "a torch.distributed group already exists in this process: one TP engine at a time"
            )
        self.size = config.tp_size
        self._in_step = False
        self._step_failed = False  # a step raised: the ranks may be out of step, no collective teardown
        self._pending_exit: int | None = None
        self._teardown_hooks: list[Callable[[], None]] = []
        self._old_sigterm: Any = None
        self.device = device_for(config, 0)
        self._threads = torch.get_num_threads()
        if self.device.type == "cpu":  # N processes share the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.size))
        store = dist.TCPStore(
            "127.0.0.1", 0, self.size, is_master=True, timeout=STARTUP_TIMEOUT, wait_for_workers=False
        )
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self._closed = False
        try:
            for rank in range(1, self.size):
                ours, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=worker_main,
                    args=(rank, self.size, store.port, config, theirs, os.getpid()),
                    name=f"nibblekv-tp{rank}",
                    daemon=True,  # NOTE: multiprocessing's own exit hook also reaps daemons
                )
                proc.start()
                theirs.close()  # so our recv sees EOF when the worker dies
                self.conns.append(ours)
                self.procs.append(proc)
            self._wait_for_workers(store)
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(
                backend, store=store, rank=0, world_size=self.size, timeout=COLLECTIVE_TIMEOUT
            )
        except BaseException:
            self.shutdown()
            raise
        self.context = TPContext(0, self.size)
        atexit.register(self.shutdown)
        self._install_sigterm()
        logger.info("tensor parallel: %d ranks on %s", self.size, self.device.type)

    def _wait_for_workers(self, store: dist.TCPStore) -> None:
        """Block until every worker is about to join the group, failing fast if one exits first.

        NOTE: ``init_process_group`` would wait ``COLLECTIVE_TIMEOUT`` for a worker that already died
        (say, while importing or picking its GPU), with nothing on rank 0's output meanwhile.
        """
        deadline = time.monotonic() + STARTUP_TIMEOUT.total_seconds()
        keys = [worker_up_key(rank) for rank in range(1, self.size)]
        while not store.check(keys):
            self._check_alive()
            if time.monotonic() > deadline:
                raise WorkerFailed(f"tensor-parallel workers did not start within {STARTUP_TIMEOUT}")
            time.sleep(0.05)

    def before_teardown(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` on rank 0 before it leaves the group (e.g. free CUDA graphs holding NCCL work)."""
        self._teardown_hooks.append(hook)

    # ---- start-up handshakes ----------------------------------------------------------------------
    def setup(self, max_running: int, context_len: int) -> None:
        """Tell the workers the sizes rank 0 resolved (they build the same pool and page table)."""
        self._send(("setup", WorkerSetup(max_running, context_len)))

    def agree_pool_spec(self, spec: PoolSpec) -> PoolSpec:
        """Every rank's pool gets the smallest page count any rank can hold (page ids are shared)."""
        pages = min([spec.num_pages, *self._gather("pool")])
        self._send(("pool", pages))
        return replace(spec, num_pages=pages)

    def agree_graphs(self, captured: bool) -> bool:
        """CUDA graphs are used only if every rank captured them."""
        ok = all([captured, *self._gather("graphs")])
        self._send(("graphs", ok))
        return ok

    def wait_ready(self) -> None:
        self._gather("ready")

    # ---- steps ------------------------------------------------------------------------------------
    @contextmanager
    def step(self, plan: StepPlan) -> Iterator[None]:
        """Rank 0's ModelRunner wraps each step's forward and logits in this: send the plan first.

        A SIGTERM that arrives inside is held until the step's collectives are done (leaving in the
        middle would strand the workers in a collective), then raised as ``SystemExit``.
        """
        self._check_alive()
        self._send(("step", plan))
        self._in_step = True
        try:
            yield
        except BaseException as exc:
            self._step_failed = True  # the workers may sit in a collective rank 0 never joined
            if isinstance(exc, RuntimeError):  # a collective failed: name the worker that took it down
                for rank, proc in enumerate(self.procs, start=1):
                    proc.join(2.0)
                    if not proc.is_alive():
                        raise WorkerFailed(
                            f"tensor-parallel worker {rank} died ({self._describe(rank)})"
                        ) from exc
            raise
        finally:
            self._in_step = False
        if self._pending_exit is not None:
            raise SystemExit(self._pending_exit)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._in_step:
            self._pending_exit = 128 + signum
            return
        raise SystemExit(128 + signum)

    # ---- shutdown ---------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every worker (``stop``, then kill after :data:`STOP_TIMEOUT_S`) and leave the group.

        Idempotent; safe from ``atexit`` and after a worker failure.
        """
        if self._closed:
            return
        self._closed = True
        for hook in self._teardown_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - stopping the workers matters more
                logger.exception("tensor-parallel teardown hook failed")
        healthy = not self._step_failed and all(proc.is_alive() for proc in self.procs)
        stuck = False  # our collective teardown did not return: leave the group alone
        for conn in self.conns:
            try:
                conn.send(("stop", None))
            except (OSError, ValueError):
                pass  # that worker is already gone
        if dist.is_initialized() and healthy:
            # NOTE: NCCL's teardown (ncclCommFinalize + ncclCommDestroy) is collective: rank 0 must
            # leave the group together with the workers, which do so right after "stop". Joining them
            # first deadlocked on 2x H200: each side waited for the other, the worker was
            # killed after STOP_TIMEOUT_S, and rank 0's later destroy hung for good on the dead peer.
            # Every rank frees its CUDA graphs first (the hooks above; the workers on "stop").
            stuck = not _destroy_group_within(DESTROY_TIMEOUT_S)
        for proc in self.procs:
            proc.join(STOP_TIMEOUT_S)
            if proc.is_alive():
                logger.warning("tensor-parallel worker %s did not stop; killing it", proc.name)
                proc.kill()
                proc.join(STOP_TIMEOUT_S)
        for conn in self.conns:
            conn.close()
        if dist.is_initialized() and not stuck:
            # a worker died or a step failed: no collective teardown, abort ours (a local call)
            dist.distributed_c10d._abort_process_group()
        torch.set_num_threads(self._threads)
        atexit.unregister(self.shutdown)
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)

    # ---- plumbing ---------------------------------------------------------------------------------
    def _send(self, msg: tuple[str, Any]) -> None:
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send(msg)
            except (OSError, ValueError) as exc:
                raise WorkerFailed(f"tensor-parallel worker {rank} is gone ({self._describe(rank)})") from exc

    def _gather(self, kind: str) -> list[Any]:
        """One ``kind`` message from every worker, in rank order; ``WorkerFailed`` on error or death."""
        answers: list[Any] = []
        for rank, conn in enumerate(self.conns, start=1):
            try:
                got, payload = conn.recv()
            except (EOFError, OSError) as exc:
                raise WorkerFailed(f"tensor-parallel worker {rank} died ({self._describe(rank)})") from exc
            if got == "error":
                raise WorkerFailed(f"tensor-parallel worker {rank} failed:\n{payload}")
            if got != kind:
                raise WorkerFailed(f"protocol error: worker {rank} sent {got!r}, expected {kind!r}")
            answers.append(payload)
        return answers

    def _check_alive(self) -> None:
        """Raise ``WorkerFailed`` if a worker exited or reported an error since the last step."""
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            # NOTE: between steps a worker only ever writes an error report; poll() is also true at EOF.
            if conn.poll():
                try:
                    got, payload = conn.recv()
                except (EOFError, OSError):
                    got, payload = "died", None
                if got == "error":
                    raise WorkerFailed(f"tensor-parallel worker {rank} failed:\n{payload}")
                raise WorkerFailed(f"tensor-parallel worker {rank} died ({self._describe(rank)})")
            if not proc.is_alive():
                raise WorkerFailed(f"tensor-parallel worker {rank} died ({self._describe(rank)})")

    def _install_sigterm(self) -> None:
        """Turn SIGTERM into ``SystemExit`` (so atexit stops the workers) if nobody else handles it.

        Only from the main thread and only over the default handler: a server that drains on SIGTERM
        keeps its own handler and stops the engine itself.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _describe(self, rank: int) -> str:
        proc = self.procs[rank - 1]
        proc.join(0.5)
        return "still running" if proc.exitcode is None else f"exit code {proc.exitcode}"


def _destroy_group_within(timeout_s: float) -> bool:
    """``destroy_process_group`` on a helper thread; ``False`` (logged) if it has not returned in time.

    NOTE: a teardown stuck inside NCCL cannot be interrupted; the thread is left behind (daemon) so
    that rank 0 still exits instead of hanging. The group then stays half torn down: no other TP
    engine can start in this process, which ``TPGroup.__init__`` reports.
    """
    done = threading.Event()

    def destroy() -> None:
        dist.destroy_process_group()
        done.set()

    threading.Thread(target=destroy, name="tp-destroy", daemon=True).start()
    if done.wait(timeout_s):
        return True
    logger.error(
        "tensor parallel: leaving the process group did not finish within %.0f s; "
        "continuing without it (the workers are stopped or killed next)", timeout_s
    )
    return False
