"""Run one scheduled batch through the model and sample: inputs -> forward -> logits -> tokens."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from nibblekv.attention.paged import PagedAttentionBackend, to_device
from nibblekv.cache.page_table import PageTable, TableUpdates
from nibblekv.cache.pool import KVPool
from nibblekv.cache.state_pool import LinearStateBatch, StatePool
from nibblekv.engine.cuda_graph import CudaGraphRunner, graph_sizes
from nibblekv.engine.request import Request, TokenLogprob, fill_placeholders
from nibblekv.engine.sampler import Sampler, top_logprobs
from nibblekv.engine.scheduler import ScheduledBatch, StepResult
from nibblekv.model import CausalLM

logger = logging.getLogger("nibblekv")

# Prompt-logprob rows turned into logits at once (bounds the [rows, vocab] float32 temporary).
PROMPT_LOGITS_ROWS: int = 256


@dataclass(frozen=True)
class PromptSlice:
    """Prompt-logprob rows ``[lo, hi)`` of batch entry ``entry``, found from ``hidden[row:]``."""

    entry: int
    lo: int
    hi: int
    row: int


@dataclass(frozen=True)
class StepPlan:
    """One step's forward as plain data: what rank 0 sends tensor-parallel workers.

    ``lists``: host inputs (ids, positions, attention metadata, page-table ``rows``);
    ``table_updates``: the page-table entries this step's sync wrote; ``sample_rows``: rows of the
    hidden states whose logits are sampled; ``prompt_slices``: the later ``compute_logits`` calls.
    """

    lists: dict[str, list[int]]
    table_updates: TableUpdates
    is_decode: bool
    bs: int
    use_graph: bool
    sample_rows: list[int]
    prompt_slices: list[PromptSlice]


def _prompt_rows(req: Request, old_len: int, new_len: int) -> range:
    """Positions of this chunk whose logits give still-missing prompt logprobs (target = next token)."""
    if not req.wants_prompt_logprobs():
        return range(0)
    return range(max(old_len, len(req.prompt_logprobs)), min(new_len, req.num_prompt_tokens - 1))


class ModelRunner:
    """Owns the attention backend, the sampler and (on CUDA) the decode CUDA graphs."""

    def __init__(
        self,
        model: CausalLM,
        pool: KVPool,
        page_table: PageTable,
        *,
        seed: int,
        use_cuda_graph: bool,
        cuda_graph_max_bs: int | None,
        cuda_graph_bs: Sequence[int] | None = None,
        max_running_requests: int,
        step_scope: Callable[[StepPlan], AbstractContextManager[None]] | None = None,
        agree: Callable[[bool], bool] | None = None,
        states: StatePool | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        """``states``: a hybrid model's linear-attention state pool (each request's ``state_slot``);
        ``eos_token_ids``: the sampler's (``min_new_tokens`` holds them back).

        ``step_scope(plan)`` is entered around every step's forward and logits (rank 0 of a
        tensor-parallel group broadcasts the plan on entry); ``agree`` turns this rank's "CUDA graphs
        captured" into the group's verdict."""
        self.model = model
        self.step_scope = step_scope
        self.pool = pool
        self.page_table = page_table
        self.states = states
        self.device = model.device
        self.backend = PagedAttentionBackend(pool)
        if self.backend.qkv_rotation is not None:
            # o_proj takes the rotated attention output directly: one matmul per layer less per step
            model.fold_output_rotation(self.backend.qkv_rotation)
        self.sampler = Sampler(self.device, seed, eos_token_ids)
        self.graphs: CudaGraphRunner | None = None
        self._used_graph = False
        if use_cuda_graph:
            sizes = graph_sizes(cuda_graph_bs, cuda_graph_max_bs, max_running_requests)
            try:
                self.graphs = CudaGraphRunner(model, self.backend, pool, page_table, sizes, states=states)
            except RuntimeError as exc:  # e.g. a kernel that syncs with the host cannot be captured
                logger.warning("CUDA graph capture failed, decoding eagerly: %s", exc)
                torch.cuda.synchronize()
        # NOTE: under TP, graphs must be all-or-none: a graphed rank gathers padded rows, an eager one not.
        if agree is not None and not agree(self.graphs is not None):
            self.graphs = None

    def release_graphs(self) -> None:
        """Free the decode CUDA graphs; later decode steps run eagerly (see ``CudaGraphRunner.release``)."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None

    @property
    def last_used_graph(self) -> bool:
        """Whether the last :meth:`run` replayed a CUDA graph (for the decode log line)."""
        return self._used_graph

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepResult:
        """Forward the batch (a CUDA graph for decode batches that fit one) and sample."""
        plan = self.plan(batch)
        with self.step_scope(plan) if self.step_scope is not None else nullcontext():
            logits, hidden = self.execute(plan)
            prompt_logprobs = self._prompt_logprobs(batch, hidden, plan.prompt_slices)
        return self._sample(batch, logits, prompt_logprobs)

    def plan(self, batch: ScheduledBatch) -> StepPlan:
        """Everything the forward needs, as plain data (syncs the page table as a side effect)."""
        lists = self._host_inputs(batch)
        bs = len(batch.reqs)
        if batch.is_decode:  # one row per request
            ends = list(range(bs))
        else:
            ends = [e - 1 for e in itertools.accumulate(g.new_len - g.old_len for g in batch.growths)]
        slices: list[PromptSlice] = []
        # NOTE: a decode batch has no prompt rows (its one position per request is past the prompt's last
        # target) and samples every entry: both per-request passes skipped on the decode path
        for i, (req, g) in enumerate(zip(batch.reqs, batch.growths) if not batch.is_decode else ()):
            rows = _prompt_rows(req, g.old_len, g.new_len)
            start = ends[i] - (g.new_len - g.old_len) + 1  # row of position g.old_len in hidden
            for lo in range(rows.start, rows.stop, PROMPT_LOGITS_ROWS):
                hi = min(lo + PROMPT_LOGITS_ROWS, rows.stop)
                slices.append(PromptSlice(i, lo, hi, start + lo - g.old_len))
        return StepPlan(
            lists=lists,
            table_updates=self.page_table.last_updates,
            is_decode=batch.is_decode,
            bs=bs,
            use_graph=bool(batch.is_decode and self.graphs is not None and self.graphs.fits(bs)),
            sample_rows=ends if batch.is_decode else [ends[i] for i in range(bs) if batch.samples(i)],
            prompt_slices=slices,
        )

    @torch.inference_mode()
    def launch(
        self, batch: ScheduledBatch, prev_tokens: torch.Tensor | None
    ) -> tuple[list[Request], torch.Tensor]:
        """Forward a decode batch and pick its tokens without waiting for them (overlap schedule):
        (the sampling requests, their tokens on the device). Placeholder inputs ``-(k + 1)`` read
        ``prev_tokens[k]``. No logprobs, no penalties (the caller checks)."""
        plan = self.plan(batch)
        logits, _ = self.execute(plan, prev_tokens)
        if batch.is_decode:  # every entry samples
            reqs = list(batch.reqs)
        else:
            reqs = [r for i, r in enumerate(batch.reqs) if batch.samples(i)]
        return reqs, self.sampler.choose(logits, reqs)

    @torch.inference_mode()
    def execute(
        self, plan: StepPlan, prev_tokens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the plan's forward: (logits of ``sample_rows``, hidden states or None after a graph).

        Calls ``compute_logits`` once here (unless there are no sample rows) and then once per
        prompt slice in :meth:`_prompt_logprobs`; tensor-parallel workers repeat that
        sequence (see :func:`execute_mirror`), since each call is a collective under TP.
        ``prev_tokens``: the device tokens that placeholder input ids stand for (overlap schedule).
        """
        self._used_graph = plan.use_graph
        if prev_tokens is not None and min(plan.lists["input_ids"], default=0) >= 0:
            prev_tokens = None
        if plan.use_graph:
            assert self.graphs is not None
            return self.graphs.replay(plan.lists, plan.bs, prev_tokens), None
        d = to_device(plan.lists, self.device)
        if prev_tokens is not None:
            d["input_ids"] = fill_placeholders(d["input_ids"], prev_tokens)
        cu = None if plan.is_decode else plan.lists["cu_seqlens"]
        self.backend.begin(d, plan.is_decode, self.page_table, cu)
        if self.states is None:
            hidden = self.model.forward(d["input_ids"], d["positions"], self.backend)
        else:  # hybrid: the linear layers' states of this batch's requests
            states = self._state_batch(plan, d)
            hidden = self.model.forward(d["input_ids"], d["positions"], self.backend, states)  # type: ignore[call-arg]
        if not plan.sample_rows:  # every rank sees the same plan, so all skip this collective together
            return hidden.new_zeros(0, 1).float(), hidden
        return self.model.compute_logits(hidden[plan.sample_rows]), hidden

    def _state_batch(self, plan: StepPlan, d: dict[str, torch.Tensor]) -> LinearStateBatch:
        """A hybrid forward's states: decode continues each request's pool row in place; an extend reads the
        rows (zeros for fresh requests), writes them back after the chunk and stores its snapshots."""
        if plan.is_decode:
            return LinearStateBatch(list(range(plan.bs + 1)), True, self.states, d["state_slots"])
        fresh = plan.lists["state_fresh"]
        snaps = list(zip(plan.lists["state_snap_entries"], plan.lists["state_snap_cuts"]))
        return LinearStateBatch(plan.lists["cu_seqlens"], False, self.states, d["state_slots"],
                                d["state_fresh"] != 0, carried=not all(fresh), snapshots=snaps,
                                snapshot_slots=plan.lists["state_snap_slots"])  # fmt: skip

    def _host_inputs(self, batch: ScheduledBatch) -> dict[str, list[int]]:
        """Token ids, positions, attention metadata and page-table rows, as Python lists."""
        if batch.is_decode:  # one token a request: no slices
            positions = [g.old_len for g in batch.growths]
            ids = [r.token_ids[p] for r, p in zip(batch.reqs, positions)]
            lists = {"input_ids": ids, "positions": positions}
        else:
            lists = {"input_ids": [], "positions": []}
            for req, g in zip(batch.reqs, batch.growths):
                lists["input_ids"].extend(req.token_ids[g.old_len : g.new_len])
                lists["positions"].extend(range(g.old_len, g.new_len))
        pairs = [(r.pages, g) for r, g in zip(batch.reqs, batch.growths)]
        lists.update(self.backend.plan(pairs, batch.is_decode))
        lists["rows"] = self.page_table.sync([r.pages for r in batch.reqs])
        if self.states is not None:
            lists["state_slots"] = [r.state_slot if r.state_slot is not None else -1 for r in batch.reqs]
            if not batch.is_decode:  # a fresh request starts from zeros (decode continues every state)
                lists["state_fresh"] = [int(g.old_len == 0) for g in batch.growths]
                lists["state_snap_entries"] = [e for e, _, _ in batch.snapshots]
                lists["state_snap_cuts"] = [k for _, k, _ in batch.snapshots]
                lists["state_snap_slots"] = [slot for _, _, slot in batch.snapshots]
        return lists

    def _sample(
        self, batch: ScheduledBatch, logits: torch.Tensor, prompt_logprobs: dict[str, list[TokenLogprob]]
    ) -> StepResult:
        reqs = [r for i, r in enumerate(batch.reqs) if batch.samples(i)]
        if not reqs:
            return StepResult([], [], prompt_logprobs)
        result = self.sampler(logits, reqs)
        return StepResult(result.token_ids, result.logprobs, prompt_logprobs)

    def _prompt_logprobs(
        self, batch: ScheduledBatch, hidden: torch.Tensor | None, slices: list[PromptSlice]
    ) -> dict[str, list[TokenLogprob]]:
        out: dict[str, list[TokenLogprob]] = {}
        for s in slices:
            assert hidden is not None  # prompt slices only come with extend batches (never graphed)
            req = batch.reqs[s.entry]
            n = int(req.params.prompt_logprobs or 0)
            lp = self.model.compute_logits(hidden[s.row : s.row + s.hi - s.lo])
            targets = torch.tensor(req.token_ids[s.lo + 1 : s.hi + 1], device=self.device)
            out.setdefault(req.request_id, []).extend(
                top_logprobs(lp.log_softmax(dim=-1), targets, [n] * (s.hi - s.lo))
            )
        return out


def execute_mirror(runner: ModelRunner, plan: StepPlan) -> None:
    """A tensor-parallel worker's step: the same forward and ``compute_logits`` calls as rank 0's
    :meth:`ModelRunner.run`, results dropped (rank 0 samples from its identical gathered logits)."""
    runner.page_table.apply(plan.table_updates)
    with torch.inference_mode():
        _, hidden = runner.execute(plan)
        for s in plan.prompt_slices:
            assert hidden is not None
            runner.model.compute_logits(hidden[s.row : s.row + s.hi - s.lo])
