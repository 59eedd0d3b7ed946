"""``--model org/name``: a Hugging Face Hub model, fetched as SGLang's ``--model-path`` fetches Hub ids.

``huggingface_hub`` downloads into its cache (or ``--download-dir``), reuses what the cache already holds,
and honours ``HF_TOKEN`` (gated models) and ``HF_HUB_OFFLINE`` (the cache only). Only the files nibblekv
reads come down: configs, tokenizer files, chat templates and the safetensors weights (none of the
weights for ``--load-format dummy``, which needs the shape alone); never ``*.bin`` / ``*.pth`` copies or
the ``original/`` folder some repos add.
"""

from __future__ import annotations

from pathlib import Path

# NOTE: the tokenizer files of the HF formats transformers reads: tokenizer.json, *_config.json, vocab.json,
# merges.txt, sentencepiece / tiktoken models, chat_template.jinja
CONFIG_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")
WEIGHT_FILES = ("*.safetensors",)
SKIPPED = ("original/*",)


class HubFetchError(ValueError):
    """A Hub model that could not be fetched; the message names ``--model`` and the Hub's reason."""


def is_hub_id(model: str) -> bool:
    """Whether ``model`` reads as a Hub id (``org/name``) rather than a local path (which does not exist)."""
    parts = model.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not model.startswith((".", "~"))
        and not model.endswith(".gguf")
        and not Path(model).exists()
    )


def local(
    model: str,
    revision: str | None = None,
    download_dir: str | None = None,
    weights: bool = True,
    flag: str = "--model",
    require_config: bool = True,
) -> str:
    """``model`` itself, or for a Hub id the local folder :func:`fetch` put it in (the same arguments)."""
    if not is_hub_id(model):
        return model
    return str(fetch(model, revision, download_dir, weights, flag, require_config))


def fetch(
    model: str,
    revision: str | None = None,
    download_dir: str | None = None,
    weights: bool = True,
    flag: str = "--model",
    require_config: bool = True,
) -> Path:
    """The local folder of Hub model ``model`` at ``revision`` (a branch, tag or commit; None = main), its
    files fetched as needed; ``weights=False`` fetches configs and tokenizer only. Raises
    :class:`HubFetchError`, naming ``flag``, when the Hub cannot supply it (unknown or gated repo, no
    network and no cached copy, ...) or, with ``require_config``, it has no ``config.json``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    patterns = [*CONFIG_FILES, *(WEIGHT_FILES if weights else ())]
    try:
        folder = snapshot_download(
            repo_id=model,
            revision=revision,
            cache_dir=download_dir,
            allow_patterns=patterns,
            ignore_patterns=list(SKIPPED),
        )
    except (HfHubHTTPError, OSError, ValueError) as exc:  # NOTE: the Hub's own errors derive from these
        reason = " ".join(str(exc).split())  # NOTE: one line (the Hub's messages span several)
        raise HubFetchError(f"{flag} {model}: not fetched from the Hugging Face Hub: {reason}") from exc
    path = Path(folder)
    if require_config and not (path / "config.json").is_file():
        raise HubFetchError(
            f"{flag} {model}: the Hub repo has no config.json (GGUF repos: download one file)"
        )
    return path
