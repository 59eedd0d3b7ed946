"""KV cache configurations compared by the accuracy eval, and how their names are spelled.

A configuration is a storage dtype plus the accuracy options of issue 5: calibrated global scales,
4over6 block scales, a Hadamard rotation of K/V along head_dim, bf16 sink tokens and the bf16 tail
window, and the engine's bf16 sink page (``--kv-sink-pages``). Names are what the results JSON carries
in ``config``: ``bf16`` (the unquantized baseline in the model's dtype), ``fp8_e4m3``, ``nvfp4`` (the
chosen default), ``nvfp4_plain`` and descriptive names such as ``nvfp4_w64_cal_had`` for the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# The unquantized baseline's name in the results (the issue's; it is the model's dtype).
BASELINE_NAME = "bf16"
# Tokens in one sink page: the engine's default page size (the eval's PagedRunner uses it too).
SINK_PAGE_TOKENS = 16


@dataclass(frozen=True)
class KVConfig:
    """One KV cache configuration.

    ``kv_dtype`` is an ``--kv-cache-dtype`` value (``auto`` = the model's dtype); ``window`` the bf16
    tail (``--kv-recent-window``); ``sinks`` the first tokens kept exact (fake-quant study only);
    ``sink_pages`` the engine's bf16 copy of the first page (``--kv-sink-pages``, needs the tail);
    ``calibrated`` uses per-layer global scales amax / (6 * 448) instead of 1.0; ``four_over_six``
    picks per 16-value block the better of the amax/6 and amax/4 scales; ``hadamard`` rotates K and V
    (and Q, and the output back) by the normalized Hadamard matrix of size head_dim. ``smooth_k`` /
    ``smooth_v`` subtract calibrated per-layer, per-KV-head means from K / V before quantization
    (exact: softmax ignores a per-query constant, and the V mean is added back to the output);
    fake-quant study only. ``prefill_window``: a prompt prefilled in chunks keeps the engine's default
    prefill window, the chunk + ``window`` tokens, in bf16 until its last chunk (``--kv-prefill-window``).
    """

    name: str
    kv_dtype: str = "nvfp4"
    window: int = 0
    sinks: int = 0
    calibrated: bool = False
    four_over_six: bool = False
    hadamard: bool = False
    sink_pages: int = 0
    smooth_k: bool = False
    smooth_v: bool = False
    prefill_window: bool = False

    def __post_init__(self) -> None:
        if self.kv_dtype not in ("auto", "fp8_e4m3", "nvfp4"):
            raise ValueError(f"{self.name}: kv_dtype must be auto, fp8_e4m3 or nvfp4, got {self.kv_dtype!r}")
        if self.window < 0 or self.sinks < 0:
            raise ValueError(f"{self.name}: window and sinks must be >= 0")
        if self.kv_dtype != "nvfp4" and (
            self.four_over_six or self.hadamard or self.window or self.sinks or self.smoothed
        ):
            raise ValueError(f"{self.name}: 4over6, Hadamard, tail, sinks and smoothing apply to nvfp4 only")
        if self.prefill_window and not self.window:
            raise ValueError(f"{self.name}: the prefill window (_pw) extends the bf16 tail: it needs _w<N>")
        if self.sink_pages not in (0, 1) or (self.sink_pages and not self.window):
            raise ValueError(
                f"{self.name}: a sink page (0 or 1) is kept in the bf16 tail pool: it needs _w<N>"
            )

    @property
    def sink_tokens(self) -> int:
        """The first tokens kept exact: the study's ``sinks`` or the sink page's tokens."""
        return max(self.sinks, self.sink_pages * SINK_PAGE_TOKENS)

    @property
    def smoothed(self) -> bool:
        """Whether K or V is mean-smoothed (needs calibrated means)."""
        return self.smooth_k or self.smooth_v

    @property
    def quantized(self) -> bool:
        return self.kv_dtype != "auto"

    def renamed(self, name: str) -> KVConfig:
        return replace(self, name=name)


BASELINE = KVConfig(BASELINE_NAME, kv_dtype="auto")
FP8 = KVConfig("fp8_e4m3", kv_dtype="fp8_e4m3")
NVFP4_PLAIN = KVConfig("nvfp4_plain")
# The default, chosen from the H200 run (docs/accuracy.md): the 64-token bf16 tail, 4over6 block scales
# and the Hadamard rotation (decode KL 0.0061 vs 0.0125 for the tail alone, prefill 0.0046 vs 0.0083),
# plus the bf16 sink page (the CPU chunked-prefill run in docs/accuracy.md). Calibrated scales bought
# nothing measurable and need a file: opt-in. The engine's nvfp4 default (EngineConfig with
# kv_hadamard / kv_quant_4over6 / kv_sink_pages left None) is the same configuration.
DEFAULT_NVFP4 = KVConfig(
    "nvfp4", window=64, four_over_six=True, hadamard=True, sink_pages=1, prefill_window=True
)

_NAME_RE = re.compile(r"^nvfp4((?:_(?:w\d+|s\d+|sink|cal|4o6|had|smk|smv|pw))*)$")


def parse_config(name: str) -> KVConfig:
    """A configuration from its name.

    ``bf16``, ``fp8_e4m3``, ``nvfp4`` (the default), ``nvfp4_plain``, or ``nvfp4`` followed by any of
    ``_w<N>`` (bf16 tail of N tokens), ``_s<N>`` (N sink tokens, fake-quant study only), ``_sink``
    (the engine's bf16 sink page, needs ``_w<N>``), ``_cal`` (calibrated global scales), ``_4o6``
    (4over6 block scales), ``_had`` (Hadamard rotation), ``_smk`` / ``_smv`` (K / V mean smoothing,
    fake-quant study only), ``_pw`` (the prefill window, needs ``_w<N>``), e.g. ``nvfp4_w64_cal``,
    ``nvfp4_w64_4o6_had_sink_pw``.
    """
    fixed = {c.name: c for c in (BASELINE, FP8, NVFP4_PLAIN, DEFAULT_NVFP4)}
    if name in fixed:
        return fixed[name]
    m = _NAME_RE.match(name)
    if m is None:
        raise ValueError(
            f"unknown KV configuration {name!r}: use bf16, fp8_e4m3, nvfp4, nvfp4_plain or "
            "nvfp4 with suffixes _w<N>, _s<N>, _sink, _cal, _4o6, _had, _smk, _smv, _pw"
        )
    window = sinks = 0
    flags: set[str] = set()
    for part in m.group(1).split("_")[1:]:
        if part[0] == "w" and part[1:].isdigit():
            window = int(part[1:])
        elif part[0] == "s" and part[1:].isdigit():
            sinks = int(part[1:])
        else:  # NOTE: the regex admits only the named flags here
            flags.add(part)
    return KVConfig(
        name, "nvfp4", window, sinks, "cal" in flags, "4o6" in flags, "had" in flags, int("sink" in flags),
        smooth_k="smk" in flags, smooth_v="smv" in flags, prefill_window="pw" in flags,
    )  # fmt: skip


# The full run's set: the acceptance rows, then one option at a time on plain NVFP4, the tail sweep,
# and the options stacked on the default tail.
FULL_RUN: tuple[str, ...] = (
    "bf16",
    "fp8_e4m3",
    "nvfp4",
    "nvfp4_plain",
    "nvfp4_cal",
    "nvfp4_4o6",
    "nvfp4_had",
    "nvfp4_w16",
    "nvfp4_w32",
    "nvfp4_w128",
    "nvfp4_w64_cal_4o6_had",
)
