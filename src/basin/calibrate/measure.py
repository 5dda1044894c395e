"""The measurements, phase by phase, within a time budget.

1. **probe**: the engine answers, reports usage, how many tokens a word is,
   its context length, and that a repeated prefix is served from its cache.
2. **prefill**: time to first token against prompt length, uncached (one
   fresh message) and after a cached prefix (the same first message, then a
   fresh one). Read as a colocated server, the fixed cost is paid once per
   prefill step of the engine's token budget (the chunk), as the simulator's
   colocated server charges it; read as PD, once per call.
3. **decode**: step time of single calls against context, then of batches of
   concurrent calls of short and of longer prompts against their size (each
   call's batch is how many calls were in decode beside it, averaged over its
   own decode); the context term is fitted to single calls, base and
   per-request cost to the batches (:mod:`basin.calibrate.fit`). On a
   colocated server the prefills of a batch's later calls ride in the steps
   of its earlier calls' decode; their cost (by the prefill fit) is taken
   out, since the profile's decode step is the step without prefill.
4. **prefix cache**: filled with distinct prompts, the least recently used
   one re-read after each fill; when it misses, everything is re-read from
   the newest and the cached tokens counted until the first miss: that sum is
   what the cache held.
5. **KV for running requests**: concurrent long calls, and the engine's KV
   usage gauge read while all of them decode: tokens held / usage, from the
   readings in the first third of their common decode.

Each phase ends at its share of the budget (unused time passes on); a phase
cut short says so in its record. Nothing here reads the simulator.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from basin.calibrate.client import CallRefused, CallSample, EngineClient
from basin.calibrate.engines import (
    CACHED_COUNTER,
    DECODE_TIME_HISTOGRAM,
    EXTRA_BODY,
    KV_USAGE_GAUGE,
    Declared,
    declared,
    metric_mean,
    metric_sum,
    scrape,
)
from basin.calibrate.fit import LinearFit, fit_batch, fit_context, fit_prefill, spread
from basin.calibrate.text import TextMaker
from basin.errors import BasinInputError

#: The shortest context calibration can work with: prompts of several sizes
#: and a decode of 64 tokens must fit.
MIN_CONTEXT_TOKENS = 1024
#: Share of the budget at which each phase ends (cumulative).
PHASE_ENDS = {"probe": 0.08, "prefill": 0.30, "decode": 0.55, "prefix": 0.85, "kv": 1.0}
#: How far into the budget the first round of a phase's points may run.
ESSENTIAL_ENDS = {"prefill": 0.55, "decode": 0.85}
BATCH_SIZES = (1, 2, 4, 8, 16, 32)

Message = dict[str, str]
Progress = Callable[[str, float, str], None]


@dataclass(frozen=True)
class CalibrationSettings:
    url: str
    kind: str = "generic"
    model: str | None = None
    budget_s: float = 600.0
    seed: int = 0
    #: The longest prompt sent (and fill size of the prefix cache), below the engine's context.
    max_prompt_tokens: int = 32768
    repeats: int = 3
    #: How the profile places the engine: one colocated server, or one side of a PD pair.
    topology: str = "colocated"
    #: The engine's per-step token budget as the user states it (``--chunk-tokens``).
    chunk_tokens: int | None = None
    #: The engine's limit of running requests as the user states it (``--max-running-requests``).
    max_running_requests: int | None = None


@dataclass
class Measured:
    """Everything measured, and the fits; :meth:`record` is what the profile keeps."""

    settings: CalibrationSettings
    declared: Declared = field(default_factory=Declared)
    clock: str = "wall"
    #: Wall seconds per engine-clock second (1 for a real engine's wall clock).
    wall_per_engine_s: float = 1.0
    max_prompt_tokens: int = 0
    tokens_per_word: float = 0.0
    template_tokens: int = 0
    prefill_rows: list[dict[str, Any]] = field(default_factory=list)
    single_rows: list[dict[str, Any]] = field(default_factory=list)
    batch_rows: list[dict[str, Any]] = field(default_factory=list)
    prefix: dict[str, Any] = field(default_factory=dict)
    kv: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cached_source: str = "usage.prompt_tokens_details.cached_tokens"
    decode_clock: str = "the stream's arrival times"
    observed_pages: list[int] = field(default_factory=list)
    #: The engine's per-step token budget (prefill chunk) and where it came from; None when unknown.
    chunk_tokens: int | None = None
    chunk_from: str = ""
    prefill_fit: LinearFit | None = None
    context_fit: LinearFit | None = None
    batch_fit: LinearFit | None = None
    elapsed_s: float = 0.0

    def record(self) -> dict[str, Any]:
        def grouped(rows: list[dict[str, Any]], key: str, values: tuple[str, ...]) -> list[dict[str, Any]]:
            groups: dict[Any, list[dict[str, Any]]] = {}
            for row in rows:
                groups.setdefault(row[key], []).append(row)
            return [{key: k, **{v: spread([r[v] for r in g]) for v in values}} for k, g in groups.items()]

        return {
            "engine": {"url": self.settings.url, "kind": self.settings.kind, "model": self.declared.model,
                       "declared": self.declared.record()},
            "budget_s": self.settings.budget_s, "elapsed_s": round(self.elapsed_s, 3),
            "clock": self.clock, "wall_s_per_engine_s": self.wall_per_engine_s,
            "cached_tokens_from": self.cached_source, "decode_timed_by": self.decode_clock,
            "max_prompt_tokens": self.max_prompt_tokens, "topology": self.settings.topology,
            "chunk": {"tokens": self.chunk_tokens, "from": self.chunk_from or "unknown"},
            "tokenizer": {"tokens_per_word": self.tokens_per_word, "template_tokens": self.template_tokens},
            "prefill": {"points": grouped(self.prefill_rows, "target", ("prompt_tokens", "cached_tokens", "ttft_s")),
                        "fit": self.prefill_fit.record() if self.prefill_fit else None,
                        "fixed_s_per": self.fixed_per()},
            "decode_single": {"points": grouped(self.single_rows, "target", ("prompt_tokens", "context_tokens",
                                                                             "step_s")),
                              "fit": self.context_fit.record() if self.context_fit else None},
            "decode_batch": {"points": grouped(self.batch_rows, "batch", ("effective_batch", "prompt_tokens",
                                                                          "context_tokens", "step_s",
                                                                          "prefill_in_decode_s")),
                             "fit": self.batch_fit.record() if self.batch_fit else None,
                             "fit_rows": "the batches, their context term (from single calls) taken out"},
            "prefix_cache": self.prefix,
            "kv_capacity": self.kv,
            "notes": list(self.notes),
        }

    def fixed_per(self) -> str:
        if self.prefill_steps_counted:
            return f"prefill step of at most {self.chunk_tokens} new tokens (colocated)"
        return "call"

    @property
    def prefill_steps_counted(self) -> bool:
        """Whether the prefill fit's fixed cost is per step of the chunk (a colocated server of known budget)."""
        return self.settings.topology == "colocated" and self.chunk_tokens is not None

    def prefill_steps(self, uncached: float) -> float:
        """Prefill steps of ``uncached`` new tokens: one per chunk read colocated, else one a call."""
        if not self.prefill_steps_counted or self.chunk_tokens is None:
            return 1.0
        return float(max(1, math.ceil(uncached / self.chunk_tokens)))


def _geometric(low: int, high: int, n: int) -> list[int]:
    if high <= low:
        return [max(1, high)]
    return sorted({int(round(v)) for v in np.geomspace(low, high, n)})


class Calibrator:
    """Runs the phases against one engine; :meth:`run` returns :class:`Measured`."""

    def __init__(self, settings: CalibrationSettings, progress: Progress | None = None) -> None:
        self.s = settings
        self.progress = progress or (lambda phase, fraction, note: None)
        self.text = TextMaker(settings.seed)
        self.m = Measured(settings)
        self._start = 0.0
        self._client: EngineClient | None = None
        self._cached_counter: str | None = None
        #: Calls whose decode could not be timed (their stream came in a few chunks).
        self._untimed = 0
        #: The slowest prefill seen, wall seconds per uncached token (budget forecasts).
        self._wall_per_token = 0.0

    # ---------------------------------------------------------------- budget
    def _deadline(self, phase: str) -> float:
        return self._start + self.s.budget_s * PHASE_ENDS[phase]

    def _left(self, phase: str) -> float:
        return self._deadline(phase) - time.monotonic()

    def _note(self, phase: str, fraction: float, note: str) -> None:
        self.progress(phase, fraction, note)

    # ---------------------------------------------------------------- calls
    @property
    def client(self) -> EngineClient:
        assert self._client is not None
        return self._client

    async def _call(self, messages: list[Message], max_tokens: int) -> CallSample:
        """One call; when the answer has no cached count, the engine's counter is read around it."""
        before = None
        if self._cached_counter:
            before = metric_sum(await scrape(self.client), self._cached_counter)
        sample = await self.client.chat(messages, max_tokens)
        if sample.cached_tokens is None and self._cached_counter and before is not None:
            after = metric_sum(await scrape(self.client), self._cached_counter)
            if after is not None:
                sample.cached_tokens = int(round(after - before))
        if sample.cached_tokens:
            self.m.observed_pages.append(sample.cached_tokens)
        return sample

    def _user(self, tokens: int) -> list[Message]:
        return [{"role": "user", "content": self.text.text(max(1, tokens - self.text.overhead_tokens))}]

    def _after_prefix(self, prefix: str, tokens: int) -> list[Message]:
        return [{"role": "user", "content": prefix}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": self.text.text(tokens)}]

    # ---------------------------------------------------------------- run
    async def run(self) -> Measured:
        self._start = time.monotonic()
        async with EngineClient(self.s.url, self.s.model, EXTRA_BODY[self.s.kind]) as client:
            self._client = client
            await self._probe()
            await self._prefill()
            await self._decode()
            await self._prefix_capacity()
            await self._kv_capacity()
        self.m.elapsed_s = time.monotonic() - self._start
        return self.m

    # ---------------------------------------------------------------- 1 probe
    async def _probe(self) -> None:
        self._note("probe", 0.0, "reaching the engine")
        await self.client.reachable()
        d = self.m.declared = await declared(self.client, self.s.kind)
        if self.client.model is None and d.model:
            self.client.model = d.model
        if d.context_tokens is not None and d.context_tokens < MIN_CONTEXT_TOKENS:
            raise BasinInputError(
                f"--engine {self.s.url}: the engine's context length is {d.context_tokens} tokens "
                f"({d.sources.get('context_tokens')}); calibrate needs at least {MIN_CONTEXT_TOKENS}: start it "
                "with a longer context (vLLM --max-model-len, llama.cpp -c per slot, SGLang --context-length)")
        self._chunk(d)
        self._note("probe", 0.3, "learning the tokenizer")
        w1, w2 = 20, 200
        a = await self.client.chat([{"role": "user", "content": self.text.words(w1)}], 1)
        b = await self.client.chat([{"role": "user", "content": self.text.words(w2)}], 1)
        ratio = (b.prompt_tokens - a.prompt_tokens) / (w2 - w1)
        if ratio <= 0:
            raise BasinInputError(f"--engine {self.s.url}: usage.prompt_tokens did not grow with the prompt "
                                  f"({a.prompt_tokens} then {b.prompt_tokens}); the engine's usage is not a count "
                                  "of the prompt's tokens")
        self.text.learn(w2, b.prompt_tokens, int(round(a.prompt_tokens - ratio * (w1 + 1))))
        self.m.tokens_per_word = self.text.tokens_per_word
        self.m.template_tokens = self.text.overhead_tokens
        self.m.clock = b.clock
        if b.engine_ttft_s is not None and b.engine_decode_s is not None:
            engine_total = b.engine_ttft_s + b.engine_decode_s
            if engine_total > 0:
                self.m.wall_per_engine_s = min(1.0, b.latency_s / engine_total)
        if self.m.clock == "engine":
            self.m.notes.append("times are the engine's own (its answers report them), not the client's wall clock")
        out = 256 if self.m.clock == "engine" else 64
        room = (d.context_tokens or 10**9) - out - 64
        self.m.max_prompt_tokens = max(256, min(self.s.max_prompt_tokens, room))
        if b.cached_tokens is None and self.s.kind in CACHED_COUNTER:
            self._cached_counter = CACHED_COUNTER[self.s.kind]
            self.m.cached_source = f"{self._cached_counter} (the engine's counter around each call)"
        await self._check_caching()

    def _chunk(self, d: Declared) -> None:
        """The engine's per-step token budget and running limit: declared, or
        given with ``--chunk-tokens`` / ``--max-running-requests``; they must agree."""
        for flag, name, what, given in (
                ("--chunk-tokens", "chunk_tokens", "a per-step token budget", self.s.chunk_tokens),
                ("--max-running-requests", "max_running_requests", "a limit of running requests",
                 self.s.max_running_requests)):
            have = getattr(d, name)
            if given is not None and have is not None and given != have:
                raise BasinInputError(f"{flag} {given}: the engine declares {what} of {have} "
                                      f"({d.sources.get(name)}); leave the flag out or give its value")
        if self.s.max_running_requests is not None:
            d.set("max_running_requests", self.s.max_running_requests,
                  "--max-running-requests (the engine's limit, as the user gave it)")
        given = self.s.chunk_tokens
        if d.chunk_tokens is not None:
            self.m.chunk_tokens, self.m.chunk_from = d.chunk_tokens, f"declared: {d.sources.get('chunk_tokens')}"
        elif given is not None:
            self.m.chunk_tokens = given
            self.m.chunk_from = "--chunk-tokens (the engine's declared per-step token budget, as the user gave it)"

    async def _check_caching(self) -> None:
        self._note("probe", 0.6, "checking the prefix cache")
        size = min(self.m.max_prompt_tokens // 2, 1024)
        prefix = self.text.text(size)
        first = await self._call(self._after_prefix(prefix, 16), 1)
        second = await self._call(self._after_prefix(prefix, 16), 1)
        cached = second.cached_tokens
        if cached is None:
            self.m.cached_source = "none (the engine reports no cached tokens): hits told by time to first token"
            # Told by time alone: two fresh prompts against two repeats, medians, so one slow call decides nothing.
            other = await self._call(self._after_prefix(self.text.text(size), 16), 1)
            again = await self._call(self._after_prefix(prefix, 16), 1)
            cold = float(np.median([first.first_token_s(), other.first_token_s()]))
            warm = float(np.median([second.first_token_s(), again.first_token_s()]))
            if warm > 0.7 * cold:
                raise BasinInputError(
                    f"--engine {self.s.url}: a repeated {first.prompt_tokens}-token prompt was not served faster "
                    f"({cold:.3f} s fresh, {warm:.3f} s repeated) and the engine reports no cached tokens: "
                    "prefix caching looks off; start the engine with it on (vLLM --enable-prefix-caching, SGLang "
                    "without --disable-radix-cache, llama.cpp cache_prompt)")
        elif cached < 0.5 * size:
            raise BasinInputError(
                f"--engine {self.s.url}: prefix caching is off: a repeated {first.prompt_tokens}-token prompt came "
                f"back with {cached} cached tokens; start the engine with it on (vLLM --enable-prefix-caching, "
                "SGLang without --disable-radix-cache)")

    # ---------------------------------------------------------------- 2 prefill
    def _cached_of(self, sample: CallSample, assumed: int) -> int:
        return sample.cached_tokens if sample.cached_tokens is not None else assumed

    def _fits(self, phase: str, wall_s: float, essential: bool = False) -> bool:
        """Whether a call expected to take ``wall_s`` fits in what is left of
        ``phase``. An ``essential`` one (the first round of a fit's points) may
        run on to a later mark (:data:`ESSENTIAL_ENDS`), so a slow engine still
        gets a profile and prefill does not starve decode of its first round."""
        if essential:
            return wall_s <= self._start + self.s.budget_s * ESSENTIAL_ENDS[phase] - time.monotonic()
        return wall_s <= self._left(phase)

    def _wall_prefill_s(self, uncached: int) -> float:
        """A pessimistic wall time for prefilling ``uncached`` tokens: the slowest
        rate per token seen so far, scaled (0 before any measurement)."""
        return uncached * self._wall_per_token

    def _seen(self, sample: CallSample) -> None:
        new = sample.prompt_tokens - (sample.cached_tokens or 0)
        if new >= 32:
            self._wall_per_token = max(self._wall_per_token, sample.ttft_s / new)

    async def _prefill(self) -> None:
        """Uncached prompts of several sizes and suffixes after a cached prefix,
        one of each per round, so a short budget still measures both."""
        rows = self.m.prefill_rows
        sizes = _geometric(64, self.m.max_prompt_tokens, 8)
        prefix_tokens = self.m.max_prompt_tokens // 2
        prefix = self.text.text(prefix_tokens)
        warm = await self._call(self._after_prefix(prefix, 16), 1)
        self._seen(warm)
        assumed = max(0, warm.prompt_tokens - 24)
        suffixes = _geometric(32, max(64, self.m.max_prompt_tokens - warm.prompt_tokens - 64), 4)
        total = self.s.repeats * (len(sizes) + len(suffixes))
        done = 0
        for rep in range(self.s.repeats):
            for n in list(sizes):
                if n > self.m.max_prompt_tokens or not self._fits("prefill", self._wall_prefill_s(n), rep == 0):
                    continue
                try:
                    sample = await self._call(self._user(n), 1)
                except CallRefused as exc:
                    if self.m.declared.context_tokens is None and n > MIN_CONTEXT_TOKENS:
                        self.m.max_prompt_tokens = n // 2
                        self.m.notes.append(f"a {n}-token prompt was refused ({exc.message}); prompts kept "
                                            f"to {n // 2} tokens")
                        continue
                    raise BasinInputError(f"--engine {self.s.url}: a {n}-token prompt was refused ({exc})") from None
                self._seen(sample)
                rows.append({"kind": "uncached", "target": n, "prompt_tokens": sample.prompt_tokens,
                             "cached_tokens": self._cached_of(sample, 0), "ttft_s": sample.first_token_s(),
                             "wall_ttft_s": sample.ttft_s})
                done += 1
                self._note("prefill", done / total, f"uncached {sample.prompt_tokens} tokens")
            for n in suffixes:
                if not self._fits("prefill", self._wall_prefill_s(n + 16), rep == 0):
                    continue
                sample = await self._call(self._after_prefix(prefix, n), 1)
                self._seen(sample)
                rows.append({"kind": "cached prefix", "target": f"{prefix_tokens}+{n}",
                             "prompt_tokens": sample.prompt_tokens, "cached_tokens": self._cached_of(sample, assumed),
                             "ttft_s": sample.first_token_s(), "wall_ttft_s": sample.ttft_s})
                done += 1
                self._note("prefill", done / total, f"{sample.cached_tokens} cached + "
                           f"{sample.prompt_tokens - (sample.cached_tokens or 0)} new tokens")
        if len(rows) < 4:
            raise BasinInputError(f"--budget-s {self.s.budget_s:g}: too short to measure prefill ({len(rows)} calls "
                                  "in its share); give a longer budget")
        points = _medians(rows, "target", ("prompt_tokens", "cached_tokens", "ttft_s"))
        if len(points) < 3:
            raise BasinInputError(f"--budget-s {self.s.budget_s:g}: prefill was measured at {len(points)} prompt "
                                  "length(s) in its share, 3 are needed; give a longer budget")
        uncached = [r["prompt_tokens"] - r["cached_tokens"] for r in points]
        self.m.prefill_fit = fit_prefill(uncached, [r["cached_tokens"] for r in points],
                                         [r["ttft_s"] for r in points], [self.m.prefill_steps(u) for u in uncached])
        if self.m.prefill_fit["s_per_token"] <= 0:
            raise BasinInputError(f"--engine {self.s.url}: time to first token did not grow with prompt length; "
                                  "the engine cannot be measured (is it answering from a cache of whole answers?)")

    def _ttft_s(self, uncached: float, cached: float) -> float:
        return (self.m.prefill_steps(uncached) * self._fit("fixed_s") + self._compute_s(uncached, cached)
                + (uncached + cached) * self._fit("s_per_prompt_token"))

    def _fit(self, name: str) -> float:
        f = self.m.prefill_fit
        assert f is not None
        return f[name]

    def _compute_s(self, uncached: float, cached: float) -> float:
        """Prefill time of ``uncached`` tokens after ``cached`` ones, without the fixed cost."""
        return uncached * (self._fit("s_per_token") + self._fit("attention_s_per_token_position")
                           * (cached + uncached / 2.0))

    # ---------------------------------------------------------------- 3 decode
    def _decode_out(self) -> int:
        return 256 if self.m.clock == "engine" else 64

    def _step(self, sample: CallSample, prefill_in_decode_s: float = 0.0) -> float | None:
        """Mean decode step of a call, less ``prefill_in_decode_s`` of other
        calls' prefill that ran in its steps; None when it cannot be timed:
        too short, or (by the wall clock) its tokens arrived at fewer distinct
        times than half their number, as when a lagging server sends a backlog
        at once, which hides when decoding began."""
        steps = sample.output_tokens - 1
        if steps < 4:
            return None
        if sample.engine_decode_s is None and len(set(sample.chunk_s)) < 0.5 * sample.output_tokens:
            self._untimed += 1
            return None
        return max(sample.decode_s() - prefill_in_decode_s, 0.0) / steps

    def _prefill_in_decode(self, samples: list[CallSample], engine_timed: bool) -> list[float]:
        """Per call of a concurrent group, the prefill (by the fit, without its
        fixed cost) of the group's other calls whose first token came while it
        decoded: on a colocated server their chunks ran in its decode steps
        (a step's time is its decode plus its chunks). Zero read as PD, where
        prefill runs on instances of its own. By the engine's histogram only
        the group's mean decode is known, so each call gets the mean."""
        if self.s.topology != "colocated" or len(samples) < 2:
            return [0.0] * len(samples)
        firsts = [s.start_s + s.ttft_s for s in samples]
        ends = [s.start_s + s.latency_s for s in samples]
        cost = [self._compute_s(s.prompt_tokens - (s.cached_tokens or 0), s.cached_tokens or 0) for s in samples]
        out = [sum(c for j, c in enumerate(cost) if j != i and firsts[i] < firsts[j] <= ends[i])
               for i in range(len(samples))]
        if engine_timed:
            return [float(np.mean(out))] * len(out)
        return out

    async def _decode(self) -> None:
        out = self._decode_out()
        top = max(64, self.m.max_prompt_tokens - out - 64)
        sizes = _geometric(64, top, 4)
        batches = [b for b in BATCH_SIZES if b <= (self.m.declared.max_running_requests or BATCH_SIZES[-1])]
        total = self.s.repeats * len(sizes) + 4 * len(batches)
        done = 0
        wall_step = 0.0
        for rep in range(self.s.repeats):
            for n in sizes:
                if not self._fits("decode", self._wall_prefill_s(n) + out * wall_step, rep == 0):
                    continue
                sample = (await self._timed_group([self._user(n)], out))[0][0]
                wall_step = max(wall_step, (sample.latency_s - sample.ttft_s) / max(sample.output_tokens - 1, 1))
                step = self._step(sample)
                done += 1
                if step is None:
                    self.m.notes.append(f"a call asked for {out} tokens returned {sample.output_tokens}")
                    continue
                self.m.single_rows.append({"target": n, "prompt_tokens": sample.prompt_tokens,
                                           "context_tokens": sample.prompt_tokens + sample.output_tokens / 2.0,
                                           "step_s": step})
                self._note("decode", done / total, f"1 call, {sample.prompt_tokens} tokens of context")
        if len(self.m.single_rows) < 2:
            raise BasinInputError(
                f"--engine {self.s.url}: could not time decode steps (answers shorter than 5 tokens, or too short "
                "a --budget-s); the engine must honour max_tokens (ignore_eos where it stops early)")
        singles = _medians(self.m.single_rows, "target", ("context_tokens", "step_s"))
        if len(singles) < 2:
            raise BasinInputError(
                f"--engine {self.s.url}: decode steps were timed at {len(singles)} prompt length(s), 2 are needed "
                f"({self._untimed} calls could not be timed); give a longer --budget-s")
        self.m.context_fit = fit_context([r["context_tokens"] for r in singles], [r["step_s"] for r in singles])
        # Batches of short prompts, then of longer ones: a batch may pay more
        # per context token than a single call does (vLLM on a 2-core CPU:
        # three to four times), which the per-request cost then carries in part.
        long_prompt = max(64, min(2048, (self.m.max_prompt_tokens - out) // 8))
        pool = self.m.declared.kv_tokens
        for _rep in range(2):
            for prompt in (64, long_prompt):
                for b in batches:
                    if not self._fits("decode", self._wall_prefill_s(b * prompt) + 2 * out * wall_step):
                        break
                    if pool and b * (prompt + out) > 0.7 * pool:
                        break  # a batch the pool cannot hold at once would queue or be preempted
                    samples, engine_timed = await self._timed_group([self._user(prompt) for _ in range(b)], out)
                    # By the engine's clock the group's mean is known, not each call's own
                    # decode span, so the batch is taken as the whole group.
                    batch_sizes = [float(b)] * b if engine_timed else _effective_batch(samples)
                    ridden = self._prefill_in_decode(samples, engine_timed)
                    for sample, eff, extra in zip(samples, batch_sizes, ridden):
                        step = self._step(sample, extra)
                        if step is not None:
                            self.m.batch_rows.append({"batch": f"{b} x {prompt}", "calls": b, "effective_batch": eff,
                                                      "step_s": step, "prompt_tokens": sample.prompt_tokens,
                                                      "context_tokens": eff * (sample.prompt_tokens
                                                                               + sample.output_tokens / 2.0),
                                                      "prefill_in_decode_s": extra})
                    done += 1
                    self._note("decode", done / total, f"a batch of {b} x {prompt} tokens")
        if self._untimed:
            self.m.notes.append(f"{self._untimed} calls left out of the decode fits: their tokens arrived at "
                                "fewer distinct times than half their number, so their decode could not be timed")
        groups = _medians(self.m.batch_rows, "batch", ("effective_batch", "context_tokens", "step_s"))
        if len(groups) >= 2 and len({round(r["effective_batch"]) for r in groups}) >= 2:
            self.m.batch_fit = fit_batch([r["effective_batch"] for r in groups], [r["context_tokens"] for r in groups],
                                         [r["step_s"] for r in groups], self.m.context_fit["per_context_token_s"])
        else:
            self.m.notes.append("decode batches not measured (budget or a one-request engine): no per-request cost")

    async def _decode_clock(self) -> tuple[float, float] | None:
        """``(sum, count)`` of the engine's decode-time histogram, where it has one."""
        name = DECODE_TIME_HISTOGRAM.get(self.s.kind)
        if name is None:
            return None
        metrics = await scrape(self.client)
        total, count = metric_sum(metrics, name + "_sum"), metric_sum(metrics, name + "_count")
        return (total, count) if total is not None and count is not None else None

    async def _timed_group(self, calls: list[list[Message]], max_tokens: int) -> tuple[list[CallSample], bool]:
        """Concurrent calls; when the engine keeps a decode-time histogram each
        call's decode time becomes the group's mean by that clock (True)."""
        before = await self._decode_clock()
        samples = list(await asyncio.gather(*(self._call_plain(m, max_tokens) for m in calls)))
        after = await self._decode_clock() if before is not None else None
        if before is None or after is None or round(after[1] - before[1]) != len(calls):
            return samples, False
        mean = (after[0] - before[0]) / len(calls)
        for sample in samples:
            if sample.engine_decode_s is None:
                sample.engine_decode_s = mean
        self.m.decode_clock = f"{DECODE_TIME_HISTOGRAM[self.s.kind]} (the engine's own, read around each call)"
        return samples, True

    async def _call_plain(self, messages: list[Message], max_tokens: int) -> CallSample:
        """A call of a concurrent group: no counter reads around it (they would mix)."""
        return await self.client.chat(messages, max_tokens)

    # ---------------------------------------------------------------- 4 prefix cache
    def _hit(self, sample: CallSample) -> bool:
        if sample.cached_tokens is not None:
            return sample.cached_tokens >= 0.5 * sample.prompt_tokens
        miss = self._ttft_s(sample.prompt_tokens, 0)
        full = self._ttft_s(1, sample.prompt_tokens - 1)
        return sample.first_token_s() < math.sqrt(miss * full)

    async def _prefix_capacity(self) -> None:
        size = self.m.max_prompt_tokens
        declared_cache = self.m.declared.prefix_cache_tokens
        max_fills = math.ceil(3 * declared_cache / size) + 4 if declared_cache else 100_000
        order: list[tuple[list[Message], int]] = []  # least recently used first
        fills: list[int] = []
        probes: list[dict[str, Any]] = []
        miss = False
        cut = ""
        per_fill_wall = max(self._ttft_s(size, 0) * self.m.wall_per_engine_s, self._wall_prefill_s(size))
        while len(fills) < max_fills:
            if self._left("prefix") < 2 * per_fill_wall:
                cut = "the budget ran out before the cache did"
                break
            messages = self._user(size)
            sample = await self._call(messages, 1)
            order.append((messages, sample.prompt_tokens))
            fills.append(sample.prompt_tokens)
            oldest_messages, oldest_tokens = order.pop(0)
            probe = await self._call(oldest_messages, 1)
            hit = self._hit(probe)
            probes.append({"after_fill": len(fills), "held_tokens": sum(t for _, t in order) + oldest_tokens,
                           "cached_tokens": probe.cached_tokens, "hit": hit})
            order.append((oldest_messages, probe.prompt_tokens))
            shown = sum(fills)
            self._note("prefix", min(0.95, shown / declared_cache) if declared_cache else 0.5,
                       f"filled {shown} tokens" + ("" if hit else ", the oldest prompt missed"))
            if not hit:
                miss = True
                break
        else:
            cut = f"stopped after {max_fills} fills, 3x the declared cache, without a miss"
        reread: list[dict[str, Any]] = []
        held = 0
        if miss:
            for messages, tokens in reversed(order):
                if self._left("prefix") < per_fill_wall and reread:
                    cut = "the budget ran out while re-reading"
                    break
                sample = await self._call(messages, 1)
                hit = self._hit(sample)
                cached = sample.cached_tokens if sample.cached_tokens is not None else (tokens if hit else 0)
                reread.append({"prompt_tokens": sample.prompt_tokens, "cached_tokens": cached, "hit": hit})
                if not hit:
                    break
                held += cached
        lower = max((p["held_tokens"] for p in probes if p["hit"]), default=0)
        record: dict[str, Any] = {
            "fill_prompt_tokens": size, "fills": len(fills), "filled_tokens": sum(fills), "probes": probes,
            "reread": reread, "declared_tokens": declared_cache,
            "declared_from": self.m.declared.sources.get("prefix_cache_tokens"),
        }
        if miss and held > 0:
            record["measured_tokens"] = held
            record["resolution_tokens"] = size
            if declared_cache:
                record["measured_over_declared"] = held / declared_cache
        else:
            record["measured_at_least_tokens"] = lower
            record["cut_short"] = cut or "no miss"
            self.m.notes.append(f"prefix cache: {cut or 'no miss'}; at least {lower} tokens held")
        self.m.prefix = record

    # ---------------------------------------------------------------- 5 KV capacity
    async def _kv_capacity(self) -> None:
        gauge = KV_USAGE_GAUGE.get(self.s.kind)
        record: dict[str, Any] = {"declared_tokens": self.m.declared.kv_tokens,
                                  "declared_from": self.m.declared.sources.get("kv_tokens"), "gauge": gauge}
        self.m.kv = record
        metrics = await scrape(self.client)
        if gauge is None or metric_mean(metrics, gauge) is None:
            record["by_load"] = f"not measured: the engine exports no KV usage gauge ({gauge or 'none known'})"
            return
        calls = min(8, self.m.declared.max_running_requests or 8)
        wall_step = float(np.median([r["step_s"] for r in self.m.single_rows])) * self.m.wall_per_engine_s
        out = int(max(64, min(math.ceil(3.0 / max(wall_step, 1e-6)), 20_000)))
        # All calls must run at once: within the pool the engine declares or the cache was found to hold.
        pool = self.m.declared.kv_tokens or self.m.prefix.get("measured_tokens")
        prompt = max(64, self.m.max_prompt_tokens - 64)
        if pool:
            prompt = max(64, min(prompt, int(0.7 * pool / calls) - out))
        out = max(16, min(out, (self.m.declared.context_tokens or 10**9) - prompt - 16))
        cost = max(calls * self._ttft_s(prompt, 0) * self.m.wall_per_engine_s, self._wall_prefill_s(calls * prompt)) \
            + out * wall_step
        if cost > self._left("kv"):
            record["by_load"] = f"not measured: {calls} calls of {prompt} tokens would take about {cost:.0f} s"
            self.m.notes.append(record["by_load"])
            return
        self._note("kv", 0.1, f"{calls} concurrent calls of {prompt} tokens")
        scrapes: list[tuple[float, float]] = []
        done = asyncio.Event()

        async def poll() -> None:
            while not done.is_set():
                usage = metric_mean(await scrape(self.client), gauge)
                if usage is not None:
                    scrapes.append((time.monotonic(), usage))
                try:
                    await asyncio.wait_for(done.wait(), timeout=0.2)
                except TimeoutError:
                    pass

        poller = asyncio.create_task(poll())
        try:
            samples = await asyncio.gather(*(self._call_plain(self._user(prompt), out) for _ in range(calls)))
        finally:
            done.set()
            await poller
        estimates = []  # (share of the decode done, estimate)
        for t, usage in scrapes:
            held = 0.0
            for s in samples:
                first, last = s.start_s + s.ttft_s, s.start_s + s.latency_s
                if not first <= t <= last or usage <= 0:
                    held = -1.0
                    break
                share = (t - first) / max(last - first, 1e-9)
                held += s.prompt_tokens + 1 + share * max(s.output_tokens - 1, 0)
            if held > 0:
                progress = (t - max(s.start_s + s.ttft_s for s in samples)) / max(
                    min(s.latency_s - s.ttft_s for s in samples), 1e-9)
                estimates.append((progress, held / usage))
        # Read early in the decode: the prompts are then nearly all that is held,
        # and how an engine accounts the tokens generated so far (a page at a
        # time, reserved ahead, or updated only at its own events) matters least.
        early = [e for p, e in estimates if p <= 1 / 3] or [e for _, e in estimates[:1]]
        record.update({"calls": calls, "prompt_tokens": prompt, "output_tokens": out,
                       "gauge_readings": len(scrapes), "estimates_tokens": spread([e for _, e in estimates]),
                       "early_estimates_tokens": spread(early)})
        if early:
            record["measured_tokens"] = int(np.median(early))
            if self.m.declared.kv_tokens:
                record["measured_over_declared"] = record["measured_tokens"] / self.m.declared.kv_tokens
        else:
            record["by_load"] = "no gauge reading fell while every call was decoding"
        self._note("kv", 1.0, "done")


def _medians(rows: list[dict[str, Any]], key: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per value of ``key`` with the median of each field: the fits
    take each measured point once, robust to a straggling call."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return [{key: k, **{f: float(np.median([r[f] for r in g])) for f in fields}} for k, g in groups.items()]


def _effective_batch(samples: list[CallSample]) -> list[float]:
    """Each call's batch: how many calls of the group were decoding beside it, averaged over its decode (wall)."""
    spans = [(s.start_s + s.ttft_s, s.start_s + s.latency_s) for s in samples]
    out = []
    for a0, a1 in spans:
        length = max(a1 - a0, 1e-9)
        out.append(sum(max(0.0, min(a1, b1) - max(a0, b0)) for b0, b1 in spans) / length)
    return out


async def calibrate(settings: CalibrationSettings, progress: Progress | None = None) -> Measured:
    """Measure the engine of ``settings``."""
    return await Calibrator(settings, progress).run()
