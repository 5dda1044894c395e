"""Summary statistics of a workload, in the terms the paper reports them.

The same numbers are printed by ``basin workload stats`` and used to check a
synthetic preset against the real tables, so each is defined once, here:

* percentiles are numpy's linear interpolation;
* ``prompt_tokens_*`` and ``output_tokens_p50`` run over all calls;
* ``reuse_fraction`` is reused / prompt tokens, summed over the calls that
  have a predecessor (call 0 has nothing earlier in its session to reuse, so
  counting it would only measure how long task prompts are);
* ``tool_gap_s_*`` run over the gaps between calls, i.e. every call but each
  session's last;
* ``peak_context_*`` run over sessions, each contributing its largest prompt:
  the context its last, longest prefill must find cached. This is the
  "peak context" of the paper and of ``data/derived``'s
  ``peak_prompt_tokens`` (``Session.peak_context_tokens`` also adds the final
  output, a fraction of a percent more).

A statistic with nothing to run over (no gaps in one-call sessions) is None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from basin.workload.records import Workload


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    """The headline numbers of a workload (see the module docstring)."""

    sessions: int
    calls: int
    calls_per_session_p50: float
    calls_per_session_p90: float
    prompt_tokens_p50: float
    prompt_tokens_p90: float
    reuse_fraction: float | None
    output_tokens_p50: float
    tool_gap_s_p50: float | None
    tool_gap_s_p90: float | None
    peak_context_p50: float
    peak_context_p90: float
    #: A session's largest prompt over its first: how far a predictor that
    #: sees only the first call must let it grow (a growth factor's source).
    peak_over_first_prompt_p50: float

    def to_dict(self) -> dict[str, float | int | None]:
        """The fields as a JSON-ready dict, keys named as the fields."""
        return asdict(self)


def _pct(values: list[float] | list[int], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def workload_stats(w: Workload) -> WorkloadStats:
    """Compute :class:`WorkloadStats` for ``w``."""
    calls_per_session = [s.n_calls for s in w.sessions]
    prompts = [c.prompt_tokens for s in w.sessions for c in s.calls]
    outputs = [c.output_tokens for s in w.sessions for c in s.calls]
    gaps = [c.tool_gap_s for s in w.sessions for c in s.calls[:-1]]
    peaks = [max(c.prompt_tokens for c in s.calls) for s in w.sessions]
    reused = sum(c.reused_tokens for s in w.sessions for c in s.calls[1:])
    later_prompts = sum(c.prompt_tokens for s in w.sessions for c in s.calls[1:])
    return WorkloadStats(
        sessions=len(w.sessions),
        calls=len(prompts),
        calls_per_session_p50=float(np.percentile(calls_per_session, 50)),
        calls_per_session_p90=float(np.percentile(calls_per_session, 90)),
        prompt_tokens_p50=float(np.percentile(prompts, 50)),
        prompt_tokens_p90=float(np.percentile(prompts, 90)),
        reuse_fraction=reused / later_prompts if later_prompts else None,
        output_tokens_p50=float(np.percentile(outputs, 50)),
        tool_gap_s_p50=_pct(gaps, 50),
        tool_gap_s_p90=_pct(gaps, 90),
        peak_context_p50=float(np.percentile(peaks, 50)),
        peak_context_p90=float(np.percentile(peaks, 90)),
        peak_over_first_prompt_p50=float(np.median([p / max(s.calls[0].prompt_tokens, 1)
                                                    for p, s in zip(peaks, w.sessions)])),
    )
