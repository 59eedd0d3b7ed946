"""The bundled SmolLM2 GGUF through our loader vs. transformers' own GGUF loader and Llama code."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nibblekv.attention.backend import AttentionBackend
from nibblekv.model import CausalLM, DenseAttention, Tokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
]
NEW_TOKENS = 32
pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_path: Path):  # -> transformers LlamaForCausalLM, fp32
    pytest.importorskip("accelerate")
    gguf = pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM

    # NOTE: transformers rebuilds gguf's tensor-name map once per submodule (~400 times, a third of
    # its load time here); memoizing it changes nothing else about how transformers reads the file.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(
            str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
        )
    return model.eval()


def test_gguf_config(smollm2: tuple[CausalLM, Tokenizer]) -> None:
    cfg = smollm2[0].config
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        "llama", 30, 9, 3, 64
    )
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (576, 1536, 49152)
    assert cfg.max_position_embeddings == 8192 and cfg.rope_theta == 100000.0
    assert cfg.tie_word_embeddings and not cfg.attention_bias and not cfg.qk_norm
    assert cfg.rope_scaling.rope_type == "default"
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1


class _AppendCache(AttentionBackend):
    """Test-only KV cache for one sequence: append this step's k/v, attend causally to all of it."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if layer_id in self.k:
            k = torch.cat([self.k[layer_id], k])
            v = torch.cat([self.v[layer_id], v])
        self.k[layer_id], self.v[layer_id] = k, v
        past = k.shape[0] - q.shape[0]
        group = q.shape[1] // k.shape[1]
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(past)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
            v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask,
        )
        return o.transpose(0, 1)


def _our_greedy(model: CausalLM, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding with a test KV cache (one forward per new token)."""
    cache, out = _AppendCache(), []
    ids, pos = torch.tensor(prompt), torch.arange(len(prompt))
    for _ in range(steps):
        nxt = int(model.compute_logits(model(ids, pos, cache)[-1:]).argmax(-1))
        out.append(nxt)
        ids, pos = torch.tensor([nxt]), pos[-1:] + 1
    return out


def _hf_greedy(hf, prompt: list[int], steps: int) -> list[int]:
    """transformers' greedy decoding with its own KV cache, never stopping at EOS."""
    out_ids: list[int] = []
    res = hf(torch.tensor([prompt]), use_cache=True)
    for _ in range(steps):
        nxt = int(res.logits[0, -1].argmax())
        out_ids.append(nxt)
        # NOTE: transformers >= 5.2x renames past_key_values to cache; the GPU box has 5.17.
        res = hf(torch.tensor([[nxt]]), past_key_values=res.past_key_values, use_cache=True)
    return out_ids


@pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")
@torch.no_grad()
def test_greedy_matches_transformers(smollm2: tuple[CausalLM, Tokenizer], hf_smollm2) -> None:
    model, tok = smollm2
    for text in PROMPTS:
        prompt = tok.apply_chat_template([{"role": "user", "content": text}])
        ours = _our_greedy(model, prompt, NEW_TOKENS)
        assert ours == _hf_greedy(hf_smollm2, prompt, NEW_TOKENS), tok.decode(ours)
        if "France" in text:
            assert "Paris" in tok.decode(ours)


@torch.no_grad()
def test_flattened_batch_equals_single_sequences(smollm2: tuple[CausalLM, Tokenizer]) -> None:
    """Two sequences laid out in one [T] batch give the same logits as each run alone."""
    model, tok = smollm2
    seqs = [tok.encode(p) for p in PROMPTS[:2]]
    ids = torch.tensor(seqs[0] + seqs[1])
    pos = torch.cat([torch.arange(len(s)) for s in seqs])
    both = model.compute_logits(model(ids, pos, DenseAttention([0, len(seqs[0]), ids.numel()])))
    alone = [model.compute_logits(model(torch.tensor(s), torch.arange(len(s)), DenseAttention.single(len(s))))
             for s in seqs]
    torch.testing.assert_close(both, torch.cat(alone), atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_logits_close_to_transformers(smollm2: tuple[CausalLM, Tokenizer], hf_smollm2) -> None:
    model, tok = smollm2
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 4)
    ours = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), DenseAttention.single(len(ids))))
    ref = hf_smollm2(torch.tensor([ids])).logits[0].float()
    diff = (ours - ref).abs().max().item()
    print(f"SmolLM2 fp32 max |logit diff| vs transformers: {diff:.2e} over {len(ids)} tokens")
    assert diff < 1e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_tokenizer_matches_transformers(smollm2: tuple[CausalLM, Tokenizer], smollm2_path: Path) -> None:
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)
    tok = smollm2[1]
    text = "Hello, world! Ünïcödé 你好 🙂 tabs\tand\nnewlines"
    assert tok.encode(text) == ref.encode(text)
    assert tok.decode(tok.encode(text)) == text
    messages = [{"role": "user", "content": "Hi there"}]
    rendered = tok.render_chat(messages)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(messages)
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> / <|im_end|> are single special tokens
    assert tok.decode(ids, skip_special_tokens=False) == rendered
    assert tok.eos_token_ids == [2] and tok.vocab_size == 49152
