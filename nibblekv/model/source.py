"""Checks a ``--model`` / ``--load-format`` pair before any loading, so the CLI can refuse it in one line.

:func:`~nibblekv.model.loader.load_model` makes the same decisions while it loads; this module only looks
at the file system (no weights, no tokenizer), so ``nibblekv generate`` and ``nibblekv serve`` fail at
once, before the engine starts, with a message that says what to pass instead.
"""

from __future__ import annotations

from pathlib import Path

from nibblekv.model.presets import PRESETS

_KINDS = "a .gguf file, an HF folder with config.json, or a preset name with --load-format dummy"
# NOTE: a Hub id (org/name) never gets here: the CLIs fetch it first (EngineConfig.with_local_model)


def model_source_error(model: str | None, load_format: str, overrides: bool = False) -> str | None:
    """Why ``--model model --load-format load_format`` cannot load, or None if it looks loadable.

    ``overrides``: ``--json-model-override-args`` is given (it needs an HF config, not a GGUF).
    """
    if load_format == "dummy":
        return _dummy_error(model)
    if model is None:
        from nibblekv.model.loader import bundled_model_path

        try:
            bundled_model_path()
        except FileNotFoundError as exc:
            return f"no --model given and {exc}"
        if overrides:
            return "--json-model-override-args needs an HF folder or a dummy model, not the bundled GGUF"
        return None
    path = Path(model)
    if not path.exists():
        if model in PRESETS:
            return (
                f"--model {model} is a preset, which has no weights: add --load-format dummy to run its "
                "shape with random weights, or give a .gguf file or an HF folder with config.json"
            )
        return f"--model {model}: no such file or folder (give {_KINDS})"
    is_gguf = path.is_file() and path.suffix == ".gguf"
    is_hf = path.is_dir() and (path / "config.json").is_file()
    if load_format == "gguf" and not path.is_file():
        return f"--model {model}: --load-format gguf needs a .gguf file"
    if load_format == "safetensors" and not is_hf:
        return f"--model {model}: --load-format safetensors needs an HF folder with config.json"
    if load_format == "auto" and not (is_gguf or is_hf):
        return f"--model {model} is neither a .gguf file nor an HF folder with config.json"
    if is_hf and not any(path.glob("*.safetensors")):
        return f"--model {model}: no *.safetensors weights in it (--load-format dummy for random weights)"
    if overrides and (load_format == "gguf" or is_gguf):
        return "--json-model-override-args needs an HF folder or a dummy model, not a GGUF"
    return None


def _dummy_error(model: str | None) -> str | None:
    if model is None:
        return f"--load-format dummy needs --model: a preset ({', '.join(sorted(PRESETS))}) or a config.json"
    path = Path(model)
    if path.is_dir() and not (path / "config.json").is_file():
        return f"--model {model}: the folder has no config.json"
    if not path.exists() and model not in PRESETS:
        return (
            f"--model {model}: not a file, a folder or a preset (presets: {', '.join(sorted(PRESETS))})"
        )
    return None
