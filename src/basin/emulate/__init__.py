"""An OpenAI-compatible engine over HTTP whose timing is the simulator's.

``basin emulate`` serves chat completions from the simulator's own engine
model (radix cache with host tier, chunked prefill, PD transfer, decode with
KV reservation, the calibrated costs of :mod:`basin.catalog`), driven by the
wall clock or accelerated, so that the gateway, the replay client or any
agent can meet a paper-scale deployment without GPUs (docs/emulate.md).

Modules: ``config`` (settings), ``calls`` (a request body as a call: its
cache key, token counts and priority; pure), ``clock`` (wall to simulated
time), ``engine`` (the simulator's instances wired for one call at a time;
no I/O), ``exposition`` (the engine's /metrics under SGLang's or vLLM's
names), ``server`` (the aiohttp driver). It never imports the gateway.
"""
