"""Accuracy evals of the KV cache: ``nibblekv eval kv|study|speed|merge`` and ``nibblekv calibrate``.

* :mod:`configs` -- the KV configurations and their names;
* :mod:`paged_runner` -- teacher-forced requests through the engine's pool and paged backend;
* :mod:`kv_eval` -- prefill and decode modes against the baseline cache, in lockstep;
* :mod:`study` / :mod:`fakequant` / :mod:`quant` -- the fast fake-quantization study;
* :mod:`passkey` -- long-context retrieval; :mod:`calibrate` -- global scales;
* :mod:`speed` -- decode-step time per configuration at a long context (on the device);
* :mod:`metrics` -- KL, top-1, perplexity with bootstrap CIs; :mod:`report` -- JSON, table, plot.
"""
