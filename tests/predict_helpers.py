"""A toy workload for the predictor tests: peaks that follow two words and the text length."""

from __future__ import annotations

import math

import numpy as np

from basin.workload.records import Call, Session, Workload

WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega parser django numpy "
         "server client cache index query build test docs config error crash import export").split()


def toy_workload(n_tasks: int, reruns: int = 2, seed: int = 0, magic: bool = False, with_text: bool = True,
                 prompt_jitter: int = 0, calls: int = 1) -> Workload:
    """Sessions whose log peak depends on two words and the text length.

    ``magic``: every task text also carries a token of its own (``zq<task>``),
    a perfect identifier of the task's peak that no other task shares.
    ``prompt_jitter``: each session's first prompt gains up to that many
    tokens at random (0: none, and no draw). ``calls=3`` splits each session
    into three calls (the growth fit needs prefixes).
    """
    rng = np.random.default_rng(seed)
    sessions = []
    for t in range(n_tasks):
        words = list(rng.choice(WORDS, size=int(rng.integers(8, 40))))
        text = " ".join(words) + (f" zq{t:04d}" if magic else "")
        size = 2000 * math.exp(0.8 * ("django" in words) + 0.5 * ("crash" in words) + 0.01 * len(words))
        for r in range(reruns):
            first = 500 + 3 * len(text) + (int(rng.integers(0, prompt_jitter)) if prompt_jitter else 0)
            peak_tokens = int(size * math.exp(0.2 * rng.standard_normal())) + first
            if calls == 1:
                turns: tuple[Call, ...] = (Call(first, first, peak_tokens - first),)
            else:
                mid = first + (peak_tokens - first) // 2
                turns = (Call(first, first, 10), Call(mid, mid - first - 10, 10),
                         Call(peak_tokens - 10, peak_tokens - mid - 20, 10))
            sessions.append(Session(f"s{t:03d}-{r}", turns, task_text=text if with_text else None))
    return Workload("toy", tuple(sessions))
