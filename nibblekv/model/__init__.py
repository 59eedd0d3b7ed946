"""The model layer: config, the decoder (:class:`CausalLM`), loaders and tokenizers.

Heavy optional dependencies (``gguf``, ``transformers``) are imported only by the loaders that need them.
"""

from nibblekv.model.causal_lm import CausalLM
from nibblekv.model.config import ModelConfig, RopeScaling
from nibblekv.model.dense import DenseAttention
from nibblekv.model.loader import bundled_model_path, load_model, tokenizer_for
from nibblekv.model.tokenizer import ByteTokenizer, DetokenizeState, HFTokenizer, Tokenizer

__all__ = [
    "ByteTokenizer",
    "CausalLM",
    "DenseAttention",
    "DetokenizeState",
    "HFTokenizer",
    "ModelConfig",
    "RopeScaling",
    "Tokenizer",
    "bundled_model_path",
    "load_model",
    "tokenizer_for",
]
