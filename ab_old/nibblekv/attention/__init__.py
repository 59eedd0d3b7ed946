"""Attention backends: what a model layer calls to attend and to store its K/V."""

from nibblekv.attention.backend import AttentionBackend

__all__ = ["AttentionBackend"]
