"""What ``nibblekv eval`` and ``nibblekv calibrate`` share: model loading flags and scale resolution."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from nibblekv.cache import load_kv_scales
from nibblekv.eval.calibrate import KVScales, calibrate, checkpoint_scales
from nibblekv.eval.configs import KVConfig
from nibblekv.eval.data import calibration_text, resolve_data_dir, token_windows
from nibblekv.model import CausalLM, Tokenizer, load_model

logger = logging.getLogger("nibblekv.eval")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file or HF folder (default: the bundled SmolLM2-135M)")
    p.add_argument(
        "--load-format",
        default="auto",
        choices=("auto", "gguf", "safetensors", "dummy"),
        help="auto: from --model; dummy: random weights of a preset's shape",
    )
    p.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: CUDA when available"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", *_DTYPES),
        help="model dtype (auto: bf16 on CUDA, fp32 on CPU)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="folder of *.txt: northanger_abbey.txt calibrates, the others are scored (default: the "
        "packaged opening chapters of four Austen novels)",
    )
    p.add_argument(
        "--calib-windows", type=int, default=8, help="calibration windows from northanger_abbey.txt"
    )
    p.add_argument("--calib-tokens", type=int, default=1024, help="tokens per calibration window")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(_parser=p)


def checked_data_dir(args: argparse.Namespace) -> Path:
    """``--model`` (a Hub id fetched first, ``args.model`` then its folder) and ``--data-dir`` checked before
    anything loads: a problem is a one-line error, exit 2."""
    from nibblekv.model.hub import HubFetchError, local
    from nibblekv.model.source import model_source_error

    parser: argparse.ArgumentParser = args._parser
    if args.model is not None:
        try:
            args.model = local(args.model, weights=args.load_format != "dummy")
        except HubFetchError as exc:
            parser.error(str(exc))
    problem = model_source_error(args.model, args.load_format)
    if problem:
        parser.error(problem)
    try:
        return resolve_data_dir(args.data_dir)
    except FileNotFoundError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def load(args: argparse.Namespace) -> tuple[CausalLM, Tokenizer]:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = None if args.dtype == "auto" else _DTYPES[args.dtype]
    return load_model(args.model, load_format=args.load_format, dtype=dtype, device=device)


def progress(msg: str) -> None:
    print(f"[eval] {msg}", file=sys.stderr, flush=True)


class ScaleSource:
    """Global scales for calibrated configurations, computed on first use.

    Precedence: ``--kv-scales-path`` (for unrotated K/V), then scales stored in the checkpoint, then
    calibration on ``northanger_abbey.txt``. Rotated (Hadamard) K/V always calibrate: rotation
    changes the amax, and neither a file nor a checkpoint says which basis its scales are for.
    """

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, args: argparse.Namespace) -> None:
        self.model, self.tokenizer, self.args = model, tokenizer, args
        self._cache: dict[bool, KVScales] = {}

    def windows(self) -> torch.Tensor:
        text = [("calibration", calibration_text(resolve_data_dir(self.args.data_dir)))]
        return token_windows(self.tokenizer, text, self.args.calib_windows, self.args.calib_tokens)

    def get(self, rotated: bool) -> KVScales:
        if rotated not in self._cache:
            self._cache[rotated] = self._resolve(rotated)
        return self._cache[rotated]

    def _resolve(self, rotated: bool) -> KVScales:
        n = self.model.config.num_kv_layers  # layers with KV (a hybrid model: its full-attention ones)
        if not rotated and getattr(self.args, "kv_scales_path", None):
            t = load_kv_scales(self.args.kv_scales_path, n, "cpu")
            return KVScales(
                tuple(t[:, 0].tolist()), tuple(t[:, 1].tolist()), f"file:{self.args.kv_scales_path}"
            )
        if not rotated:
            ckpt = checkpoint_scales(self.args.model, n)
            if ckpt is not None:
                return ckpt
        progress(
            f"calibrating {'rotated ' if rotated else ''}K/V scales on {self.args.calib_windows} windows"
        )
        return calibrate(self.model, self.windows(), rotate=rotated)

    def __call__(self, config: KVConfig) -> torch.Tensor | None:
        return self.get(config.hadamard).tensor() if config.calibrated else None
