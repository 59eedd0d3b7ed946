"""The offline engine.

Request path: ``generate -> scheduler.schedule -> model_runner.run -> sampler -> scheduler.postprocess``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nibblekv.cache.prefix import PrefixCacheManager
from nibblekv.config import EngineConfig
from nibblekv.engine.long_context import check_context_length
from nibblekv.engine.model_runner import ModelRunner
from nibblekv.engine.output import OutputProcessor
from nibblekv.engine.overlap import OverlapLoop
from nibblekv.engine.request import Request, RequestOutput
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.engine.scheduler import ScheduledBatch, Scheduler
from nibblekv.engine.setup import (
    _DTYPES,
    DEFAULT_MAX_RUNNING,
    build_cache_manager,
    build_pool,
    build_state_pool,
    kv_rotation_planned,
    make_page_table,
    resolve_device,
)
from nibblekv.engine.stats import EngineStats, decode_log_line, prefill_log_line
from nibblekv.model import CausalLM, Tokenizer, load_model, tokenizer_for
from nibblekv.model.fp8 import QuantMethod, has_fp8_weights, weight_bytes

if TYPE_CHECKING:
    from nibblekv.engine.tp_group import TPGroup

logger = logging.getLogger("nibblekv")

Prompt = str | Sequence[int]


class Engine:
    """Load a model, size the KV pool, and generate: ``Engine(model=..., kv_cache_dtype="nvfp4")``.

    ``loaded=(model, tokenizer)`` reuses an already loaded model (tests, benchmarks comparing KV
    dtypes); then ``config.model``, ``load_format``, ``dtype`` and ``device`` are taken from it.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        loaded: tuple[CausalLM, Tokenizer] | None = None,
        **overrides: Any,
    ) -> None:
        self.config = replace(config or EngineConfig(), **overrides).with_local_model()
        self.tp: TPGroup | None = None  # tensor-parallel workers (ranks 1..N-1), when --tp-size > 1
        try:
            self._setup(loaded)
        except BaseException:
            self.shutdown()
            raise

    def _setup(self, loaded: tuple[CausalLM, Tokenizer] | None) -> None:
        cfg = self.config
        if cfg.tp_size > 1:
            if loaded is not None:
                raise ValueError("--tp-size > 1 loads its shards itself; loaded= cannot be combined with it")
            if cfg.enable_hierarchical_cache:
                raise ValueError("--enable-hierarchical-cache is not supported with --tp-size > 1")
            from nibblekv.engine.tp_group import TPGroup

            self.tp = TPGroup(cfg)
        t0 = time.perf_counter()
        if loaded is None:
            device = self.tp.device if self.tp is not None else resolve_device(cfg.device)
            dtype = None if cfg.dtype == "auto" else _DTYPES[cfg.dtype]
            loaded = load_model(
                cfg.model,
                load_format=cfg.load_format,
                dtype=dtype,
                device=device,
                seed=cfg.seed,
                tp=self.tp.context if self.tp is not None else None,
                overrides=cfg.model_overrides(),
                quantization=QuantMethod(cfg.quantization) if cfg.quantization else None,
                kv_rotation=kv_rotation_planned(cfg),
            )
        self.model, self.tokenizer = loaded
        if cfg.tokenizer_path is not None:
            self.tokenizer = tokenizer_for(self.model, cfg.tokenizer_path)
        template = cfg.chat_template_text()
        if template is not None:
            self.tokenizer = self.tokenizer.with_chat_template(template)
            logger.info("Chat template from --chat-template (%d characters)", len(template))
        self.device = self.model.device
        logger.info(
            "Load weight end. Time elapsed: %.1f s, dtype=%s, quantization=%s, mem usage=%.2f GB",
            time.perf_counter() - t0, self.model.dtype, "fp8" if has_fp8_weights(self.model) else None,
            weight_bytes(self.model) / (1 << 30),
        )  # fmt: skip
        mc = self.model.config
        self.context_len = check_context_length(cfg, mc.max_position_embeddings, mc.rope_scaling)
        self.max_running = cfg.max_running_requests or DEFAULT_MAX_RUNNING.get(self.device.type, 32)
        if self.tp is not None:
            self.tp.setup(self.max_running, self.context_len)
        agree = self.tp.agree_pool_spec if self.tp else None
        self.pool = build_pool(cfg, self.model, self.max_running, agree, self.context_len)
        for line in self.pool.startup_lines(self.max_running, self.context_len):
            logger.info(line)
        self.page_table = make_page_table(self.pool, self.max_running, self.context_len, self.device)
        table_mib = (self.page_table.main.nbytes + self.page_table.tail.nbytes) / (1 << 20)
        logger.info(
            "Page table: %d rows x %d pages, %.1f MiB (taken from the KV budget)",
            self.max_running, self.page_table.main.shape[1], table_mib,
        )  # fmt: skip
        # NOTE: after the KV pool, which was sized from free memory less these states' bytes
        self.states = build_state_pool(cfg, self.model, self.max_running)
        if self.states is not None:
            logger.info(self.states.startup_line())
            if cfg.enable_hierarchical_cache:  # its pages would come back without the linear layers' states
                logger.info(
                    "Host KV tier is not used for hybrid linear-attention models (%s)", mc.architecture
                )
                self.config = cfg = replace(cfg, enable_hierarchical_cache=False)
            if not cfg.disable_radix_cache and self.states.num_snapshot_slots == 0:
                # a cached prefix's KV is useless without the linear layers' state at its end
                logger.info(
                    "Radix cache is disabled for hybrid linear-attention models: --max-mamba-cache-size "
                    "leaves no slot for state snapshots"
                )
                self.config = cfg = replace(cfg, disable_radix_cache=True)
        eos_ids = [*self.model.config.eos_token_ids, *self.tokenizer.eos_token_ids]
        self.scheduler = Scheduler(
            build_cache_manager(cfg, self.pool, self.page_table, self.states),
            max_running_requests=self.max_running,
            chunk_tokens=cfg.chunk_tokens,
            eos_token_ids=eos_ids,
            policy=cfg.schedule_policy,
            states=self.states,
        )
        self.runner = ModelRunner(
            self.model,
            self.pool,
            self.page_table,
            seed=cfg.seed,
            use_cuda_graph=self.device.type == "cuda" and not cfg.disable_cuda_graph,
            cuda_graph_max_bs=cfg.cuda_graph_max_bs,
            cuda_graph_bs=cfg.cuda_graph_bs,
            max_running_requests=self.max_running,
            step_scope=self.tp.step if self.tp else None,
            agree=self.tp.agree_graphs if self.tp else None,
            states=self.states,
            eos_token_ids=eos_ids,
        )
        if self.tp is not None:
            self.tp.before_teardown(self.runner.release_graphs)
            self.tp.wait_ready()
        self.outputs = OutputProcessor(self.tokenizer)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._live: dict[str, Request] = {}
        self.last_batch: ScheduledBatch | None = None  # for benchmarks and tests
        self.stream = False  # True: step() returns an output for every request it advanced
        self._overlap = (
            OverlapLoop(self.scheduler, self.runner, self.stats, self.note_batch, self.run_batch)
            if cfg.overlap_schedule(self.device.type)
            else None
        )
        logger.info("overlap schedule: %s", "on" if self._overlap is not None else "off")

    @property
    def overlap_schedule(self) -> bool:
        """Whether decode step N+1 is scheduled while step N runs (``EngineConfig.overlap_schedule``)."""
        return self._overlap is not None

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent; also runs at interpreter exit)."""
        if self.tp is not None:
            self.tp.shutdown()

    @property
    def max_total_num_tokens(self) -> int:
        return self.pool.spec.max_total_num_tokens

    def cache_stats(self) -> dict[str, float]:
        """Prefix-cache totals; the hit rate is cached / looked-up prompt tokens at admission."""
        cache = self.scheduler.cache
        if not isinstance(cache, PrefixCacheManager):
            return {"cache_hit_rate": 0.0, "cached_tokens_total": 0, "host_cached_tokens_total": 0}
        return {
            "cache_hit_rate": cache.stats.hit_rate,
            "cached_tokens_total": cache.stats.hit_tokens,
            "host_cached_tokens_total": cache.stats.host_hit_tokens,
        }

    # ---- requests -------------------------------------------------------------------------------
    def make_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> Request:
        """Tokenize and validate (``ValueError`` for an empty or too-long prompt); does not enqueue."""
        params = params or SamplingParams()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._live:
            raise ValueError(f"request id {rid!r} is already in use")
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if params.logit_bias and params.logit_bias[-1][0] >= vocab:
            raise ValueError(f"logit_bias token id {params.logit_bias[-1][0]} is out of range [0, {vocab})")
        if len(ids) >= self.context_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, but the context length is {self.context_len} "
                "(prompt plus at least one new token must fit)"
            )
        if len(ids) + 1 > self.pool.capacity_tokens():
            raise ValueError(
                f"the prompt has {len(ids)} tokens, more than the KV cache holds "
                f"(max_total_num_tokens={self.max_total_num_tokens}); raise --max-total-tokens"
            )
        max_new = min(params.max_new_tokens, self.context_len - len(ids))
        return Request(rid, ids, params, max_new_tokens=max_new)

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        return self.enqueue(self.make_request(prompt, params, request_id))

    def enqueue(self, req: Request) -> str:
        self._live[req.request_id] = req
        self.stats.prompt_tokens += req.num_prompt_tokens
        self.scheduler.add(req)
        return req.request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its pages; its final output, or None if it is unknown/done."""
        req = self._live.get(request_id)
        if req is None or req.finished:
            return None
        self.scheduler.finish(req, "abort")
        self.scheduler.take_finished()  # NOTE: emitted here; the next step must not emit it again
        self.stats.aborted_requests += 1
        return self._emit(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def flush_cache(self) -> bool:
        """Drop every cached prefix page (device and host tier), as SGLang's ``/flush_cache``; refused
        (False) while any request runs or waits. True also without a prefix cache (nothing to drop)."""
        if self.has_unfinished():
            return False
        if isinstance(self.scheduler.cache, PrefixCacheManager):
            logger.info("Cache flushed successfully! (%d device pages freed)", self.scheduler.cache.flush())
        return True

    # ---- the loop -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run and postprocess one batch; outputs of every request it advanced or ended."""
        early = self._overlap.before_schedule() if self._overlap is not None else []
        batch = self.scheduler.schedule()
        advanced = self._overlap.step(batch) if self._overlap is not None else self.run_batch(batch)
        touched = list(dict.fromkeys([*early, *advanced, *self.scheduler.take_finished()]))
        if batch is None and not touched and self.scheduler.has_work():
            # NOTE: cannot happen by construction (add-time checks + preemption); fail loudly if it does.
            raise RuntimeError("scheduler stalled: requests wait but none can run")
        # NOTE: offline, a running request needs its text only to look for stop strings; skipping the
        # rest keeps the per-step host work off the decode critical path.
        return [self._emit(r) for r in touched if self.stream or r.finished or r.params.stop]

    def run_batch(self, batch: ScheduledBatch | None) -> list[Request]:
        """Forward, sample and postprocess ``batch`` synchronously; the requests it advanced."""
        if batch is None:
            return []
        self.runner.backend.loads = batch.loads  # host-tier copies this forward reads
        result = self.runner.run(batch)
        advanced = self.scheduler.postprocess(batch, result)
        self.note_batch(batch)
        return advanced

    def _emit(self, req: Request) -> RequestOutput:
        if self.outputs.update(req):
            self.scheduler.finish(req, "stop")
            self.scheduler.take_finished()
        out = self.outputs.output(req)
        if req.finished and self._live.pop(req.request_id, None) is not None:
            self.stats.finished_requests += 1
        return out

    def note_batch(self, batch: ScheduledBatch) -> None:
        """Record a launched batch: ``last_batch``, stats and the SGLang-style log lines."""
        self.last_batch = batch
        s = self.scheduler
        usage = self.pool.token_usage()
        if not batch.is_decode:
            # NOTE: INFO like SGLang's scheduler; decode_log_interval=0 (benchmarks) silences both lines.
            (logger.info if self.config.decode_log_interval else logger.debug)(
                prefill_log_line(
                    len(batch.reqs),
                    batch.num_tokens,
                    usage,
                    len(s.running),
                    len(s.waiting),
                    batch.num_cached_tokens,
                )
            )
            return
        self.stats.record_decode(len(batch.reqs))
        every = self.config.decode_log_interval
        if every and self.stats.decode_steps % every == 0:
            line = decode_log_line(
                len(s.running), self.pool.used_tokens(), usage, self.runner.last_used_graph,
                self.stats.take_throughput(), len(s.waiting),
            )  # fmt: skip
            logger.info(line)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run prompts to completion; one output per prompt, in order (a single prompt: a list of one)."""
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
        batch: list[Prompt] = [prompts] if single else list(prompts)  # type: ignore[list-item]
        params = sampling_params if isinstance(sampling_params, Sequence) else [sampling_params] * len(batch)
        if len(params) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(params)} sampling params")
        reqs = [self.make_request(p, sp) for p, sp in zip(batch, params)]  # validate all before enqueuing
        for r in reqs:
            self.enqueue(r)
        done: dict[str, RequestOutput] = {}
        bar = _progress(len(reqs)) if use_tqdm else None
        while len(done) < len(reqs):
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [done[r.request_id] for r in reqs]


def _progress(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="generate", unit="req")
