"""OpenAI-compatible HTTP server over :class:`nibblekv.engine.AsyncEngine` (needs the ``server`` extra).

``nibblekv serve`` is in :mod:`nibblekv.server.cli`; :func:`nibblekv.server.app.build_app` builds the
app for a started engine (used by tests to serve in-process).
"""
