"""Tokenizers and streaming detokenization."""

from __future__ import annotations

import pytest

from nibblekv.model import ByteTokenizer, CausalLM, DetokenizeState, Tokenizer
from nibblekv.model.tokenizer import ChatRender

TEXT = "Plain ascii, then ünïcödé, 你好世界, emoji 🙂👍🏽 and \u00e9\u0301 combining."


def _stream(tok: Tokenizer, ids: list[int], prompt: list[int] | None = None) -> list[str]:
    state = DetokenizeState(tok, prompt or [])
    pieces = [state.push([i]) for i in ids]
    return [*pieces, state.finish()]


def test_byte_tokenizer_roundtrip_and_chat() -> None:
    tok = ByteTokenizer(300)
    ids = tok.encode(TEXT)
    assert ids[0] == ByteTokenizer.BOS and tok.decode(ids) == TEXT
    assert tok.encode("ab", add_special_tokens=False) == [97, 98]
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert tok.decode(chat) == "<user>: hi\n<assistant>: "
    assert tok.eos_token_ids == [257]
    with pytest.raises(ValueError):
        ByteTokenizer(100)


def test_streaming_bytes_never_emits_broken_utf8() -> None:
    tok = ByteTokenizer(300)
    pieces = _stream(tok, tok.encode(TEXT, add_special_tokens=False))
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT
    assert sum(1 for p in pieces if p == "") > 10  # multi-byte characters were held back


def test_streaming_truly_broken_bytes_flushed_at_finish() -> None:
    tok = ByteTokenizer(300)
    state = DetokenizeState(tok)
    assert state.push(list(b"ok")) == "ok"
    assert state.push([0xF0, 0x9F]) == ""  # first half of an emoji
    assert state.finish() == "\ufffd"


def test_streaming_real_tokenizer(smollm2: tuple[CausalLM, Tokenizer]) -> None:
    tok = smollm2[1]
    prompt = tok.encode("Say something:")
    ids = tok.encode(TEXT, add_special_tokens=False)
    pieces = _stream(tok, ids, prompt)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == TEXT


def test_streaming_skips_special_tokens(smollm2: tuple[CausalLM, Tokenizer]) -> None:
    tok = smollm2[1]
    ids = [*tok.encode("Hello there", add_special_tokens=False), 2]  # 2 = <|im_end|>
    assert "".join(_stream(tok, ids)) == "Hello there"


TEMPLATE = (
    "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<<assistant>>{% endif %}"
)


def test_chat_template_flag_text_file_and_errors(tmp_path) -> None:
    from nibblekv.config import EngineConfig

    assert EngineConfig(chat_template=TEMPLATE).chat_template_text() == TEMPLATE
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    assert EngineConfig(chat_template=str(path)).chat_template_text() == TEMPLATE
    with pytest.raises(ValueError, match="--chat-template: no file 'nope.jinja', and not a Jinja template"):
        EngineConfig(chat_template="nope.jinja")
    with pytest.raises(ValueError, match="--chat-template: the template does not parse"):
        EngineConfig(chat_template="{% for m in messages %}{{ m }}")  # no endfor
    with pytest.raises(ValueError, match="--chat-template: ByteTokenizer has its own fixed chat format"):
        ByteTokenizer(300).with_chat_template(TEMPLATE)


def test_chat_template_overrides_the_model_s_own(smollm2: tuple[CausalLM, Tokenizer]) -> None:
    tok = smollm2[1]
    own = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    custom = tok.with_chat_template(TEMPLATE)
    ids = custom.apply_chat_template([{"role": "user", "content": "hi"}])
    assert ids == tok.encode("<<user>>hi\n<<assistant>>", add_special_tokens=False) and ids != own
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == own  # the loaded one is untouched
    assert custom.eos_token_ids == tok.eos_token_ids and custom.vocab_size == tok.vocab_size


def test_tokenizer_path_gives_a_dummy_model_a_real_tokenizer(
    smollm2: tuple[CausalLM, Tokenizer], tmp_path
) -> None:
    import json

    from nibblekv import Engine, SamplingParams
    from nibblekv.config import EngineConfig

    tok = smollm2[1]
    folder = tmp_path / "tok"
    tok.hf.save_pretrained(str(folder))  # type: ignore[attr-defined]
    shape = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": tok.vocab_size, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    }  # fmt: skip
    config = tmp_path / "config.json"
    config.write_text(json.dumps(shape))
    kw = {"model": str(config), "load_format": "dummy", "max_total_tokens": 1024, "device": "cpu"}
    engine = Engine(**kw, tokenizer_path=str(folder))
    try:
        assert engine.tokenizer.encode("The capital of France") == tok.encode("The capital of France")
        assert set(tok.eos_token_ids) <= set(engine.tokenizer.eos_token_ids)
        out = engine.generate(["The capital of France"], SamplingParams(temperature=0, max_new_tokens=2))[0]
        assert out.prompt_tokens == len(tok.encode("The capital of France")) and out.completion_tokens >= 1
    finally:
        engine.shutdown()
    config.write_text(json.dumps({**shape, "vocab_size": 320}))
    with pytest.raises(
        ValueError, match=r"its vocabulary \(49,152 tokens\) is larger than the model's \(320\)"
    ):
        Engine(**kw, tokenizer_path=str(folder))
    with pytest.raises(ValueError, match="--tokenizer-path /nonexistent: not a folder with tokenizer.json"):
        EngineConfig(tokenizer_path="/nonexistent")


GREETING = "{{ greeting | default('') }}{% for m in messages %}[{{ m.content }}]{% endfor %}"


def test_chat_template_variables_and_an_open_final_message(smollm2: tuple[CausalLM, Tokenizer]) -> None:
    tok = smollm2[1]
    greet = tok.with_chat_template(GREETING)
    hi = [{"role": "user", "content": "hi"}]
    assert greet.render_chat(hi, ChatRender(template_kwargs={"greeting": "Hey"})) == "Hey[hi]"
    assert greet.render_chat(hi) == "[hi]"  # a template ignores variables it is not given
    turn = [*hi, {"role": "assistant", "content": "The capital of France is"}]
    open_turn = tok.render_chat(turn, ChatRender(add_generation_prompt=False, continue_final_message=True))
    closed = tok.render_chat(turn, ChatRender(add_generation_prompt=False))
    assert open_turn.endswith("The capital of France is")  # no end-of-turn after it
    assert closed.startswith(open_turn) and closed != open_turn
    ids = tok.apply_chat_template(turn, ChatRender(add_generation_prompt=False, continue_final_message=True))
    assert tok.decode(ids, skip_special_tokens=False) == open_turn
    byte = ByteTokenizer(300)
    assert byte.render_chat(turn, ChatRender(False, True)).endswith("France is")
