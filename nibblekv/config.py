"""The engine's one configuration object and the command-line flags that fill it (SGLang names)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from nibblekv.cli_style import add_switch, non_negative_int, open_fraction, positive_float, positive_int
from nibblekv.formats import KV_DTYPE_CHOICES
from nibblekv.model.hub import is_hub_id, local
from nibblekv.model.tokenizer import has_hf_tokenizer

LOAD_FORMATS: tuple[str, ...] = ("auto", "gguf", "safetensors", "dummy")
QUANTIZATIONS: tuple[str, ...] = ("fp8",)  # --quantization (SGLang's names); see nibblekv.model.fp8
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
HICACHE_WRITE_POLICIES: tuple[str, ...] = ("write_back", "write_through")
SSM_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")  # model.hybrid_config.SSM_DTYPE_BYTES's
SCHEDULE_POLICIES: tuple[str, ...] = ("fcfs", "lpm")
# Default for --max-total-tokens when the pool is not sized from GPU memory.
CPU_DEFAULT_MAX_TOTAL_TOKENS: int = 16384
# The default prefill window covers the previous chunk up to this many tokens (bf16 pages held by the one
# chunked prefill in flight: 2 x 2112 tokens, 0.55 GiB for Llama-3.1-8B).
MAX_DEFAULT_PREFILL_CHUNK: int = 2048
DEFAULT_CUDA_GRAPH_MAX_BS: int = 512  # cap of cuda_graph_max_bs's default (capture time and memory)


def cuda_graph_batch_limit(cuda_graph_max_bs: int | None, max_running_requests: int) -> int:
    """The largest captured decode batch: ``--cuda-graph-max-bs`` if given, else every batch the scheduler
    can form (``max_running_requests``) up to ``DEFAULT_CUDA_GRAPH_MAX_BS``."""
    return min(cuda_graph_max_bs or DEFAULT_CUDA_GRAPH_MAX_BS, max_running_requests)


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes an engine; immutable once built (``dataclasses.replace`` to derive one).

    ``None`` means "choose for me": the engine resolves it once the model is loaded (KV pool size
    from memory, context length from the model, dtype from the device).
    """

    model: str | None = None  # None = the bundled SmolLM2-135M-Instruct GGUF
    load_format: str = "auto"
    dtype: str = "auto"  # model dtype: auto = bfloat16 on CUDA, float32 on CPU
    device: str = "auto"
    seed: int = 0
    kv_cache_dtype: str = "auto"  # auto = the model's dtype
    page_size: int = 16
    mem_fraction_static: float | None = None  # CUDA: fraction of GPU memory for weights + KV pool
    max_total_tokens: int | None = None  # main-pool token capacity (overrides the memory sizing)
    mem_budget_gib: float | None = None  # CPU: KV pool bytes budget instead of --max-total-tokens
    max_running_requests: int | None = None
    # admission order: first come first served, or (SGLang's lpm) the longest cached prefix first
    schedule_policy: str = "fcfs"
    chunked_prefill_size: int = 2048  # <= 0 disables chunking
    kv_recent_window: int = 64  # newest tokens kept unquantized per request; 0 = off
    kv_scales_path: str | None = None
    # NOTE: None = the measured nvfp4 default (docs/accuracy.md): on for nvfp4 (Hadamard only when
    # head_dim is a power of two), off for the other dtypes. See resolve_kv_options().
    kv_hadamard: bool | None = None  # rotate K/V (and Q, output back) by a Hadamard matrix along head_dim
    kv_quant_4over6: bool | None = None  # NVFP4 block scales: better of amax/6 and amax/4
    # bf16 copy of each request's first page (the attention sinks) in the tail pool: 0 or 1; None = the
    # measured default (1 for nvfp4, 0 otherwise); no effect without the tail. See resolve_sink_pages().
    kv_sink_pages: int | None = None
    # Tail tokens a prompt keeps unquantized while it is prefilled in chunks (its last chunk demotes them
    # down to kv_recent_window); None = min(chunked_prefill_size, 2048) + kv_recent_window, so every
    # chunk attends to the previous one in bf16. See resolve_prefill_window() and docs/accuracy.md.
    kv_prefill_window: int | None = None
    context_length: int | None = None
    # Serve --context-length past the model's max_position_embeddings (SGLang's
    # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, as a flag): the RoPE scaling in the model config or
    # --json-model-override-args must make those positions meaningful; refused without it.
    allow_long_context: bool = False
    disable_cuda_graph: bool = False
    # largest decode batch replayed from a CUDA graph (bigger ones run eagerly); None = every batch the
    # scheduler can form, up to DEFAULT_CUDA_GRAPH_MAX_BS. NOTE: eager decode is bound by Python's kernel
    # launches, more so for the quantized pools (more, and bigger, launches per layer); see the README
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: tuple[int, ...] | None = None  # the exact sizes to capture (SGLang's --cuda-graph-bs)
    tp_size: int = 1  # tensor-parallel ranks: one process per GPU (gloo processes on CPU)
    decode_log_interval: int = 40  # decode steps between "Decode batch." log lines; 0 = never
    disable_radix_cache: bool = False  # prefix reuse across requests (radix tree over main-pool pages)
    enable_hierarchical_cache: bool = False  # evicted prefix pages go to a host-memory tier
    hicache_size: float | None = None  # host tier GiB; None = twice the main pool's bytes
    hicache_write_policy: str = "write_back"  # host copy at eviction, or as soon as a page is cached
    # Schedule decode step N+1 while step N runs (engine/overlap.py). None = SGLang's default: on for one
    # CUDA GPU (measured on the H200: every step faster, docs/results.md), off elsewhere and with the host
    # tier (no GPU run has timed the pair); True forces it (the host tier too; on CPU it only exercises the
    # logic), False is --disable-overlap-schedule.
    enable_overlap_schedule: bool | None = None
    # JSON object merged into the model's HF config.json before it is built (SGLang's flag), e.g.
    # '{"num_hidden_layers": 4}' to time a few layers of a big model's shape with dummy weights
    json_model_override_args: str | None = None
    # Weight quantization at load time (SGLang's --quantization): "fp8" = per-channel FP8 linear layers with
    # dynamic per-token activation scales. None: the checkpoint's own (an FP8 checkpoint stays FP8).
    quantization: str | None = None
    # Hybrid models' recurrent (Gated DeltaNet) state dtype, SGLang's --mamba-ssm-dtype: None = the model
    # config's mamba_ssm_dtype, else float32. bfloat16 halves each request's state (Qwen3.5-27B: 147 -> 75
    # MiB); the decode kernels step it in float32 and round once a step.
    mamba_ssm_dtype: str | None = None
    # Hybrid models' state slots, SGLang's --max-mamba-cache-size: one per running request plus the prefix
    # cache's state snapshots (nibblekv.cache.state_prefix). None = twice --max-running-requests (as many
    # snapshots as running requests) with the radix cache, once without
    max_mamba_cache_size: int | None = None
    # A Jinja chat template, or the path of a file holding one (SGLang's / vLLM's --chat-template): for a
    # model without a template, or to override its own. See chat_template_text().
    chat_template: str | None = None
    # An HF tokenizer folder used instead of the model's tokenizer (SGLang's --tokenizer-path): e.g. a real
    # tokenizer for a --load-format dummy model, whose own is bytes (no tokenizer ships with a preset)
    tokenizer_path: str | None = None
    # A Hub id as --model / --tokenizer-path (org/name) is fetched at this branch, tag or commit (SGLang's
    # --revision; None = main) into this folder (--download-dir; None = the Hugging Face cache)
    revision: str | None = None
    download_dir: str | None = None

    def _check_window(self, name: str, tokens: int) -> None:
        """A window of tokens kept unquantized: >= 0 and whole pages."""
        _check(tokens >= 0, name, "must be >= 0")
        _check(tokens % self.page_size == 0, name, f"must be a multiple of page_size ({self.page_size})")

    def __post_init__(self) -> None:
        _check_choice("load_format", self.load_format, LOAD_FORMATS)
        if self.quantization is not None:
            _check_choice("quantization", self.quantization, QUANTIZATIONS)
        _check_choice("dtype", self.dtype, DTYPES)
        if self.mamba_ssm_dtype is not None:
            _check_choice("mamba_ssm_dtype", self.mamba_ssm_dtype, SSM_DTYPES)
        if self.max_mamba_cache_size is not None:
            _check(
                self.max_mamba_cache_size >= (self.max_running_requests or 1), "max_mamba_cache_size",
                "must be >= --max-running-requests (each running request holds a state slot)",
            )  # fmt: skip
        _check_choice("device", self.device, DEVICES)
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_DTYPE_CHOICES)
        _check(self.page_size >= 1, "page_size", "must be >= 1")
        if self.mem_fraction_static is not None:
            _check(0.0 < self.mem_fraction_static < 1.0, "mem_fraction_static", "must be in (0, 1)")
        if self.max_total_tokens is not None:
            _check(self.max_total_tokens >= self.page_size, "max_total_tokens", "must be >= page_size")
        if self.mem_budget_gib is not None:
            _check(self.mem_budget_gib > 0, "mem_budget_gib", "must be > 0")
        if self.max_running_requests is not None:
            _check(self.max_running_requests >= 1, "max_running_requests", "must be >= 1")
        self._check_window("kv_recent_window", self.kv_recent_window)
        if self.kv_sink_pages is not None:
            _check(self.kv_sink_pages in (0, 1), "kv_sink_pages", f"must be 0 or 1, got {self.kv_sink_pages}")
        if self.kv_prefill_window is not None:
            self._check_window("kv_prefill_window", self.kv_prefill_window)
        if self.context_length is not None:
            _check(self.context_length >= 2, "context_length", "must be >= 2")
        _check(
            self.cuda_graph_max_bs is None or self.cuda_graph_max_bs >= 1, "cuda_graph_max_bs", "must be >= 1"
        )
        _check(not self.cuda_graph_bs or min(self.cuda_graph_bs) >= 1, "cuda_graph_bs", "sizes must be >= 1")
        _check(self.tp_size >= 1, "tp_size", "must be >= 1")
        _check(self.decode_log_interval >= 0, "decode_log_interval", "must be >= 0")
        _check(
            not (self.disable_radix_cache and self.enable_hierarchical_cache),
            "enable_hierarchical_cache",
            "needs the radix cache (drop --disable-radix-cache)",
        )
        if self.hicache_size is not None:
            _check(self.hicache_size > 0, "hicache_size", "must be > 0")
        _check_choice("hicache_write_policy", self.hicache_write_policy, HICACHE_WRITE_POLICIES)
        _check_choice("schedule_policy", self.schedule_policy, SCHEDULE_POLICIES)
        self.model_overrides()  # NOTE: a bad JSON text fails here, before any weights load
        self.chat_template_text()  # NOTE: likewise a missing file or a template that does not parse
        if self.tokenizer_path is not None and not is_hub_id(self.tokenizer_path):  # NOTE: a Hub id: fetched
            _check(
                has_hf_tokenizer(Path(self.tokenizer_path).expanduser()),
                "tokenizer_path",
                f"{self.tokenizer_path}: not a folder with tokenizer.json / tokenizer_config.json",
            )
        if self.enable_overlap_schedule:
            _check(self.tp_size == 1, "enable_overlap_schedule", "is not supported with --tp-size > 1")

    def model_overrides(self) -> dict[str, Any]:
        """``json_model_override_args`` parsed (``{}`` when unset); ValueError naming the flag if it is not a
        JSON object."""
        if not self.json_model_override_args:
            return {}
        try:
            value = json.loads(self.json_model_override_args)
        except json.JSONDecodeError as e:
            raise ValueError(f"--json-model-override-args is not valid JSON: {e}") from None
        _check(isinstance(value, dict), "json_model_override_args", f"must be a JSON object, got {value!r}")
        return dict(value)

    def chat_template_text(self) -> str | None:
        """``chat_template`` as template text (read from its file when it names one); ValueError naming the
        flag when it is neither a file nor a Jinja template that parses."""
        if self.chat_template is None:
            return None
        text = self.chat_template
        path = Path(text).expanduser()
        if len(text) < 4096 and "\n" not in text and path.is_file():
            text = path.read_text()
        elif "{{" not in text and "{%" not in text:
            raise ValueError(f"--chat-template: no file {self.chat_template!r}, and not a Jinja template")
        import jinja2  # NOTE: transformers' own template engine, installed with it

        try:
            jinja2.Environment().parse(text)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"--chat-template: the template does not parse: {e} (line {e.lineno})") from None
        return text

    def overlap_schedule(self, device_type: str) -> bool:
        """Whether the engine on ``device_type`` runs the overlap schedule (resolves the ``None`` default)."""
        if self.enable_overlap_schedule is not None:
            return self.enable_overlap_schedule
        return device_type == "cuda" and self.tp_size == 1 and not self.enable_hierarchical_cache

    @property
    def chunk_tokens(self) -> int | None:
        """Prefill tokens per step, or None for unchunked."""
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else None

    def resolve_prefill_window(self) -> int:
        """``kv_prefill_window`` with its default applied (no less than ``kv_recent_window``)."""
        if self.kv_prefill_window is not None:
            return max(self.kv_prefill_window, self.kv_recent_window)
        chunk = self.chunk_tokens
        if chunk is None or self.kv_recent_window == 0:
            return self.kv_recent_window  # NOTE: unchunked prompts never grow with a prefill window
        return min(chunk, MAX_DEFAULT_PREFILL_CHUNK) + self.kv_recent_window

    def with_local_model(self) -> EngineConfig:
        """This config with a Hugging Face Hub id as ``model`` or ``tokenizer_path`` replaced by the local
        folder it was fetched into (``model.hub``; a dummy model fetches no weights). Raises
        ``model.hub.HubFetchError`` (a ValueError) naming the flag when the Hub cannot supply it."""
        model, tokenizer = self.model, self.tokenizer_path
        if model is not None:
            model = local(model, self.revision, self.download_dir, weights=self.load_format != "dummy")
        if tokenizer is not None:
            tokenizer = local(
                tokenizer, None, self.download_dir, False, "--tokenizer-path", require_config=False
            )
        if (model, tokenizer) == (self.model, self.tokenizer_path):
            return self
        return replace(self, model=model, tokenizer_path=tokenizer)

    @staticmethod
    def from_args(args: argparse.Namespace) -> EngineConfig:
        """Build from flags added by :func:`add_engine_args` (unknown attributes are ignored)."""
        names = {f.name for f in fields(EngineConfig)}
        kwargs: dict[str, Any] = {k: v for k, v in vars(args).items() if k in names}
        if kwargs.get("cuda_graph_bs") is not None:
            kwargs["cuda_graph_bs"] = tuple(kwargs["cuda_graph_bs"])
        return EngineConfig(**kwargs)


def _check(ok: bool, name: str, why: str) -> None:
    if not ok:
        raise ValueError(f"--{name.replace('_', '-')} {why}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, name, f"must be one of {', '.join(choices)}, got {value!r}")


def _sink_pages(text: str) -> int:
    value = int(text)
    if value not in (0, 1):
        raise argparse.ArgumentTypeError(f"must be 0 or 1 (bf16 sink pages per request), got {value}")
    return value


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add the engine flags (shared by ``generate`` and ``serve``); see :class:`EngineConfig`."""
    d = EngineConfig()
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model", "--model-path", dest="model", default=None,
        help="GGUF file, HF directory, Hugging Face Hub id (org/name, fetched), or preset (dummy); default: "
        "SmolLM2 (--model-path: SGLang's name)",
    )  # fmt: skip
    g.add_argument(
        "--trust-remote-code", action="store_true",
        help="accepted for SGLang command lines: nibblekv implements its architectures itself and never runs "
        "a checkpoint's own code",
    )  # fmt: skip
    g.add_argument(
        "--revision", default=None,
        help="a Hub --model's branch, tag or commit (default: main)",
    )  # fmt: skip
    g.add_argument(
        "--download-dir", default=None, metavar="DIR",
        help="where a Hub --model is fetched to (default: the Hugging Face cache, HF_HUB_CACHE)",
    )  # fmt: skip
    g.add_argument(
        "--load-format", default=d.load_format, choices=LOAD_FORMATS,
        help="auto: from --model (a .gguf file or an HF folder); dummy: random weights of a preset's or a "
        "config.json's shape",
    )  # fmt: skip
    g.add_argument(
        "--json-model-override-args", default=None, metavar="JSON",
        help='JSON object merged into the model\'s HF config, e.g. \'{"num_hidden_layers": 4}\' (HF folders '
        "and dummy models)",
    )  # fmt: skip
    g.add_argument(
        "--dtype", default=d.dtype, choices=DTYPES, help="model dtype (auto: bf16 on CUDA, fp32 on CPU)"
    )
    g.add_argument(
        "--quantization", default=None, choices=QUANTIZATIONS,
        help="fp8: quantize the linear layers' weights to FP8 at load time (per-channel scales, dynamic "
        "per-token activation scales; FP8 tensor cores on Hopper). FP8 checkpoints load as FP8 without it",
    )  # fmt: skip
    g.add_argument(
        "--mamba-ssm-dtype", default=None, choices=SSM_DTYPES,
        help="hybrid models: dtype of each request's recurrent Gated DeltaNet state (default: the model "
        "config's mamba_ssm_dtype, else float32; bfloat16 halves the state, computed in float32 either way)",
    )  # fmt: skip
    g.add_argument(
        "--max-mamba-cache-size", type=positive_int, default=None,
        help="hybrid models: state slots, one per running request plus the prefix cache's state snapshots "
        "(default: twice --max-running-requests; equal to it: no prefix cache)",
    )  # fmt: skip
    g.add_argument(
        "--chat-template", default=None, metavar="TEMPLATE",
        help="a Jinja chat template, or the file holding one, used instead of the model's own (or where it "
        "has none)",
    )  # fmt: skip
    g.add_argument(
        "--tokenizer-path", default=None, metavar="DIR",
        help="an HF tokenizer folder used instead of the model's (e.g. a real one for a dummy model)",
    )  # fmt: skip
    g.add_argument("--device", default=d.device, choices=DEVICES, help="auto: CUDA when available")
    g.add_argument(
        "--seed", "--random-seed", dest="seed", type=int, default=d.seed,
        help="seed of sampling (and of dummy weights); --random-seed: SGLang's name",
    )  # fmt: skip
    g.add_argument(
        "--kv-cache-dtype", default=d.kv_cache_dtype, choices=KV_DTYPE_CHOICES,
        help="KV cache storage: auto = the model's dtype (bf16 on CUDA, fp32 on CPU); nvfp4 = 4 bits (GPU "
        "kernels tuned for Hopper; a slower reference path on CPU); fp8_e4m3 = 8 bits",
    )  # fmt: skip
    g.add_argument("--page-size", type=positive_int, default=d.page_size, help="tokens per KV page")
    g.add_argument(
        "--mem-fraction-static", type=open_fraction, default=None,
        help="CUDA: share of GPU memory for weights + KV pool (default: 0.88)",
    )  # fmt: skip
    g.add_argument(
        "--max-total-tokens", type=positive_int, default=None,
        help="KV pool capacity in tokens (default: from GPU memory on CUDA, "
        f"{CPU_DEFAULT_MAX_TOTAL_TOKENS} on CPU)",
    )  # fmt: skip
    g.add_argument("--mem-budget-gib", type=positive_float, default=None, help="KV pool budget (CPU)")
    g.add_argument(
        "--max-running-requests", type=positive_int, default=None,
        help="requests decoded together (default: 128 on CUDA, 32 on CPU)",
    )  # fmt: skip
    g.add_argument(
        "--schedule-policy", default=d.schedule_policy, choices=SCHEDULE_POLICIES,
        help="admission order: fcfs, or lpm (longest cached prefix first, while <= 128 requests wait)",
    )  # fmt: skip
    g.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size, help="<= 0: off")
    g.add_argument(
        "--kv-recent-window",
        type=non_negative_int,
        default=d.kv_recent_window,
        help="newest tokens per request kept unquantized (multiple of --page-size; 0 = off)",
    )
    g.add_argument("--kv-scales-path", default=None, help='JSON {"k_scale": [...], "v_scale": [...]}')
    add_switch(
        g, "--kv-hadamard", None, "store K/V rotated by a Hadamard matrix along head_dim (scores unchanged; "
        "default: on for nvfp4 when head_dim is a power of two; see docs/accuracy.md)",
    )  # fmt: skip
    add_switch(
        g, "--kv-quant-4over6", None,
        "NVFP4 block scales by 4over6, the better of amax/6 and amax/4 (default: on for nvfp4)",
    )  # fmt: skip
    g.add_argument(
        "--kv-sink-pages",
        type=_sink_pages,
        default=None,
        help="keep a bf16 copy of each request's first page (attention sinks) in the tail pool: 0 or 1 "
        "(default: 1 for nvfp4, 0 otherwise; needs --kv-recent-window > 0; see docs/accuracy.md)",
    )
    g.add_argument(
        "--kv-prefill-window",
        type=non_negative_int,
        default=None,
        help="tail tokens a prompt keeps unquantized while it is prefilled in chunks, so each chunk attends "
        "to the previous one in bf16; its last chunk demotes them (default: min(--chunked-prefill-size, "
        "2048) + --kv-recent-window; multiple of --page-size; see docs/accuracy.md)",
    )
    g.add_argument(
        "--context-length", type=positive_int, default=None,
        help="longest prompt + output per request (default: the model's max_position_embeddings)",
    )  # fmt: skip
    g.add_argument(
        "--allow-long-context", action="store_true",
        help="accept a --context-length beyond the model's max_position_embeddings (SGLang's "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN); give RoPE scaling for those positions in the model "
        "config or --json-model-override-args; logged at start",
    )  # fmt: skip
    g.add_argument("--disable-cuda-graph", action="store_true", help="decode eagerly (slower; for debugging)")
    g.add_argument(
        "--cuda-graph-max-bs", type=positive_int, default=d.cuda_graph_max_bs,
        help=f"largest decode batch replayed from a CUDA graph (default: --max-running-requests, at most "
        f"{DEFAULT_CUDA_GRAPH_MAX_BS})",
    )  # fmt: skip
    g.add_argument(
        "--cuda-graph-bs",
        type=positive_int,
        nargs="+",
        default=None,
        help="the decode batch sizes to capture (default: 1, 2, 4, 8, then every 8 up to --cuda-graph-max-bs)",
    )
    overlap = g.add_mutually_exclusive_group()
    overlap.add_argument(
        "--enable-overlap-schedule", dest="enable_overlap_schedule", action="store_const", const=True,
        default=None,
        help="schedule decode step N+1 while step N runs on the GPU (hides the host's per-step work; "
        "one token is computed and dropped for a request that stops; not with --tp-size > 1). Default: on "
        "for one CUDA GPU without the host tier (with it: this flag), off otherwise",
    )  # fmt: skip
    overlap.add_argument(
        "--disable-overlap-schedule", dest="enable_overlap_schedule", action="store_const", const=False,
        help="run each decode step synchronously (SGLang's flag)",
    )  # fmt: skip
    g.add_argument(
        "--tp-size", "--tp", dest="tp_size", type=positive_int, default=d.tp_size,
        help="tensor-parallel ranks (NCCL, one GPU each; gloo on CPU)",
    )  # fmt: skip
    g.add_argument(
        "--decode-log-interval", type=non_negative_int, default=d.decode_log_interval,
        help="decode steps between 'Decode batch' log lines; 0 = never",
    )  # fmt: skip
    g.add_argument("--disable-radix-cache", action="store_true", help="no prefix reuse across requests")
    g.add_argument(
        "--enable-hierarchical-cache", action="store_true", help="keep evicted prefix pages in host memory"
    )
    g.add_argument(
        "--hicache-size", type=positive_float, default=None, help="host tier GiB (default: 2x pool)"
    )
    g.add_argument("--hicache-write-policy", default=d.hicache_write_policy, choices=HICACHE_WRITE_POLICIES)
