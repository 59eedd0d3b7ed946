"""Tokenizers: HF-backed (folders and GGUF files), a byte-level fallback for dummy models, and
incremental detokenization for streaming.

``transformers`` is imported lazily: building a tokenizer is the only thing here that needs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Message = Mapping[str, str]  # {"role": ..., "content": ...}


@dataclass(frozen=True)
class ChatRender:
    """How ``render_chat`` turns a conversation into a prompt (the fields of vLLM's chat requests)."""

    add_generation_prompt: bool = True  # the assistant's turn opened after the messages
    continue_final_message: bool = False  # the last message left open for the model to continue
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # more template variables


NEW_ASSISTANT_TURN = ChatRender()
# tokenizer_config.json classes that just run tokenizer.json
_GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


def has_hf_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds an HF tokenizer (``tokenizer.json`` or ``tokenizer_config.json``)."""
    return any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))


class Tokenizer(ABC):
    """Text <-> token ids, chat formatting and the ids that end generation."""

    eos_token_ids: list[int]
    vocab_size: int

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS etc. where the model wants them."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""

    @abstractmethod
    def render_chat(self, messages: Sequence[Message], how: ChatRender = NEW_ASSISTANT_TURN) -> str:
        """The chat template applied to ``messages`` as ``how`` says, as text (special tokens spelled out);
        a template ignores the variables of ``how.template_kwargs`` it does not use."""

    def with_chat_template(self, template: str) -> Tokenizer:
        """This tokenizer rendering chats with the Jinja ``template``; ValueError where it cannot."""
        raise ValueError(f"--chat-template: {type(self).__name__} has its own fixed chat format")

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        how: ChatRender = NEW_ASSISTANT_TURN,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Token ids of the rendered chat (``render_chat``). NOTE: the template supplies BOS itself, so by
        default none is added (``add_special_tokens``, vLLM's chat default)."""
        return self.encode(self.render_chat(messages, how), add_special_tokens=add_special_tokens)


class HFTokenizer(Tokenizer):
    """Wraps a ``transformers`` tokenizer; ``eos_token_ids`` merges the tokenizer's and the model's."""

    def __init__(self, hf: Any, extra_eos: Sequence[int] = (), chat_template: str | None = None) -> None:
        """``chat_template``: a Jinja template used instead of the tokenizer's own (``--chat-template``)."""
        self.hf = hf
        eos = [] if hf.eos_token_id is None else [int(hf.eos_token_id)]
        self.eos_token_ids = list(dict.fromkeys([*eos, *(int(i) for i in extra_eos)]))
        self.vocab_size = len(hf)
        self.chat_template = chat_template

    def with_chat_template(self, template: str) -> HFTokenizer:
        """This tokenizer rendering chats with ``template`` (a new object: the loaded one may be shared)."""
        return HFTokenizer(self.hf, self.eos_token_ids, chat_template=template)

    @staticmethod
    def from_folder(folder: str | Path, extra_eos: Sequence[int] = ()) -> HFTokenizer:
        """Tokenizer of an HF model folder (``tokenizer.json`` / ``tokenizer_config.json``).

        NOTE: a folder that declares a generic ``tokenizer.json`` tokenizer is loaded as exactly that;
        ``AutoTokenizer`` in transformers 5 may otherwise substitute the model type's own class
        (e.g. ``Qwen2Tokenizer``), which rebuilds the pipeline and can disagree with the file.
        """
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        folder = Path(folder)
        config_path = folder / "tokenizer_config.json"
        declared = (
            json.loads(config_path.read_text()).get("tokenizer_class") if config_path.is_file() else None
        )
        if declared in _GENERIC_TOKENIZERS and (folder / "tokenizer.json").is_file():
            return HFTokenizer(PreTrainedTokenizerFast.from_pretrained(str(folder)), extra_eos)
        return HFTokenizer(AutoTokenizer.from_pretrained(str(folder)), extra_eos)

    @staticmethod
    def from_gguf(path: str | Path, chat_template: str | None, extra_eos: Sequence[int] = ()) -> HFTokenizer:
        """Tokenizer stored in a GGUF file, converted by transformers once and cached on disk.

        NOTE: the conversion takes ~10 s on 2 CPU cores; the cache (``$NIBBLEKV_CACHE`` or
        ``~/.cache/nibblekv``) is keyed by the file's path, size and mtime.
        """
        from transformers import AutoTokenizer

        path = Path(path).resolve()
        cache = _tokenizer_cache_dir(path)
        if (cache / "tokenizer.json").exists():
            hf = AutoTokenizer.from_pretrained(str(cache))
        else:
            hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            if chat_template and not getattr(hf, "chat_template", None):
                hf.chat_template = chat_template
            _save_quietly(hf, cache)
        return HFTokenizer(hf, extra_eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(self, messages: Sequence[Message], how: ChatRender = NEW_ASSISTANT_TURN) -> str:
        template = self.chat_template or getattr(self.hf, "chat_template", None)
        if not template:
            raise ValueError("this tokenizer has no chat template (give one with --chat-template)")
        text = self.hf.apply_chat_template(
            [dict(m) for m in messages],
            add_generation_prompt=how.add_generation_prompt,
            continue_final_message=how.continue_final_message,
            tokenize=False,
            chat_template=template,
            **dict(how.template_kwargs),
        )
        return str(text)


class ByteTokenizer(Tokenizer):
    """Fallback for dummy (random-weight) models with no tokenizer: one token per UTF-8 byte.

    Ids 0-255 are bytes, 256 is BOS, 257 is EOS. Only for load tests and benchmarks: the text a
    random model "writes" is meaningless anyway. Chat format: ``<role>: content\\n`` per message.
    """

    BOS = 256
    EOS = 257

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 258:
            raise ValueError(f"byte tokenizer needs a vocabulary of at least 258, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_ids = [self.EOS]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # Ids >= 256 are special (or beyond the byte range of a dummy model's vocabulary): dropped.
        data = bytes(i for i in ids if 0 <= i < 256)
        return data.decode("utf-8", errors="replace")

    def render_chat(self, messages: Sequence[Message], how: ChatRender = NEW_ASSISTANT_TURN) -> str:
        text = "".join(f"<{m['role']}>: {m['content']}\n" for m in messages)
        if how.continue_final_message and messages:
            return text.removesuffix("\n")
        return text + ("<assistant>: " if how.add_generation_prompt else "")


class DetokenizeState:
    """Incremental detokenizer for streaming: :meth:`push` returns only complete new text.

    Decodes a short window of earlier tokens together with the new ones (so tokenizers that change
    spacing by context stay right) and holds text back while it ends in U+FFFD, i.e. while a
    multi-byte character is split across tokens. :meth:`finish` releases whatever is held.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-6:])  # a little left context, as vLLM does
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add generated ids; return the text they complete (possibly empty)."""
        self.ids.extend(int(i) for i in new_ids)
        return self._emit(final=False)

    def finish(self) -> str:
        """Text still held back at the end of the stream (may end in U+FFFD if bytes are truly broken)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], self.skip_special_tokens)
        full = decode(self.ids[self.prefix_offset :], self.skip_special_tokens)
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]


def _tokenizer_cache_dir(path: Path) -> Path:
    root = Path(os.environ.get("NIBBLEKV_CACHE", Path.home() / ".cache" / "nibblekv"))
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return root / "tokenizers" / f"{path.stem}-{key}"


def _save_quietly(hf: Any, cache: Path) -> None:
    """Best-effort, atomic cache write: save to a private folder, then rename it into place.

    NOTE: concurrent loaders never see a half-written folder; a read-only home just skips caching.
    """
    tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
    try:
        hf.save_pretrained(str(tmp))
        os.rename(tmp, cache)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race, or no write access
