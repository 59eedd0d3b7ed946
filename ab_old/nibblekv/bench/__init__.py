"""Serving benchmark client (``nibblekv bench serve``): pure Python over HTTP, never imports torch."""
