"""Run one scheduled batch through the model and sample: inputs -> forward -> logits -> tokens."""

from __future__ import annotations

import itertools
import logging

import torch

from nibblekv.attention.paged import PagedAttentionBackend, build_metadata, host_metadata, to_device
from nibblekv.cache.page_table import PageTable
from nibblekv.cache.pool import KVPool
from nibblekv.engine.cuda_graph import CudaGraphRunner
from nibblekv.engine.request import Request, TokenLogprob
from nibblekv.engine.sampler import Sampler, top_logprobs
from nibblekv.engine.scheduler import ScheduledBatch, StepResult
from nibblekv.model import CausalLM

logger = logging.getLogger("nibblekv")

# Prompt-logprob rows turned into logits at once (bounds the [rows, vocab] float32 temporary).
PROMPT_LOGITS_ROWS: int = 256


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
        cuda_graph_max_bs: int,
        max_running_requests: int,
    ) -> None:
        self.model = model
        self.pool = pool
        self.page_table = page_table
        self.device = model.device
        self.backend = PagedAttentionBackend(pool)
        self.sampler = Sampler(self.device, seed)
        self.graphs: CudaGraphRunner | None = None
        self._used_graph = False
        if use_cuda_graph:
            max_bs = min(cuda_graph_max_bs, max_running_requests)
            try:
                self.graphs = CudaGraphRunner(model, self.backend, pool, page_table, max_bs)
            except RuntimeError as exc:  # e.g. a kernel that syncs with the host cannot be captured
                logger.warning("CUDA graph capture failed, decoding eagerly: %s", exc)
                torch.cuda.synchronize()

    @property
    def last_used_graph(self) -> bool:
        """Whether the last :meth:`run` replayed a CUDA graph (for the decode log line)."""
        return self._used_graph

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepResult:
        """Forward the batch (a CUDA graph for decode batches that fit one) and sample."""
        lists = self._host_inputs(batch)
        bs = len(batch.reqs)
        self._used_graph = bool(batch.is_decode and self.graphs is not None and self.graphs.fits(bs))
        if self._used_graph:
            assert self.graphs is not None
            return self._sample(batch, self.graphs.replay(lists, bs), prompt_logprobs={})
        d = to_device(lists, self.device)
        self.backend.bind(build_metadata(d, d["rows"], batch.is_decode, self.page_table))
        hidden = self.model.forward(d["input_ids"], d["positions"], self.backend)
        ends = [e - 1 for e in itertools.accumulate(g.new_len - g.old_len for g in batch.growths)]
        sample_rows = [ends[i] for i in range(bs) if batch.samples(i)]
        logits = (
            self.model.compute_logits(hidden[sample_rows]) if sample_rows else hidden.new_zeros(0, 1).float()
        )
        return self._sample(batch, logits, self._prompt_logprobs(batch, hidden, ends))

    def _host_inputs(self, batch: ScheduledBatch) -> dict[str, list[int]]:
        """Token ids, positions, attention metadata and page-table rows, as Python lists."""
        lists: dict[str, list[int]] = {"input_ids": [], "positions": []}
        for req, g in zip(batch.reqs, batch.growths):
            lists["input_ids"].extend(req.token_ids[g.old_len : g.new_len])
            lists["positions"].extend(range(g.old_len, g.new_len))
        pairs = [(r.pages, g) for r, g in zip(batch.reqs, batch.growths)]
        lists.update(host_metadata(pairs, batch.is_decode, self.pool.page_size))
        lists["rows"] = self.page_table.sync([r.pages for r in batch.reqs])
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
        self, batch: ScheduledBatch, hidden: torch.Tensor, ends: list[int]
    ) -> dict[str, list[TokenLogprob]]:
        out: dict[str, list[TokenLogprob]] = {}
        for i, (req, g) in enumerate(zip(batch.reqs, batch.growths)):
            rows = _prompt_rows(req, g.old_len, g.new_len)
            if not len(rows):
                continue
            start = ends[i] - (g.new_len - g.old_len) + 1  # row of position g.old_len in hidden
            n = int(req.params.prompt_logprobs or 0)
            found: list[TokenLogprob] = []
            for lo in range(rows.start, rows.stop, PROMPT_LOGITS_ROWS):
                hi = min(lo + PROMPT_LOGITS_ROWS, rows.stop)
                lp = self.model.compute_logits(hidden[start + lo - g.old_len : start + hi - g.old_len])
                targets = torch.tensor(req.token_ids[lo + 1 : hi + 1], device=self.device)
                found.extend(top_logprobs(lp.log_softmax(dim=-1), targets, [n] * (hi - lo)))
            out[req.request_id] = found
        return out
