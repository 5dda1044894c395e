"""What a prefix-cache miss costs on a running engine: a prompt's time uncached against cached.

    .venv/bin/python scripts/vllm_miss_cost.py --engine http://127.0.0.1:8100 --tokens 2000 8000 12000

For each size, ``--repeats`` fresh prompts (distinct text, so nothing is
cached) are sent once (a miss) and again (a hit, all but the last partial
block cached), one token generated each time. Prints the medians and their
ratio, with the cached tokens the engine reported. The figure that sizes the
test model in ``profiles/engines/vllm-cpu.yaml``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request

WORDS = ("agent tool file patch test build error trace module function value index cache request token "
         "branch commit review parser config server client thread queue memory buffer").split()


def served_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
        return str(json.loads(resp.read())["data"][0]["id"])


def timed_call(url: str, model: str, text: str) -> tuple[float, dict]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as resp:
        usage = json.loads(resp.read())["usage"]
    return time.perf_counter() - start, usage


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True, help="base URL of the engine, e.g. http://127.0.0.1:8100")
    ap.add_argument("--tokens", type=int, nargs="+", default=[2000, 8000, 12000],
                    help="prompt sizes in filler words (about one token each with the test model)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    model = served_model(args.engine)
    rng = random.Random(0)
    print(f"{'words':>7} {'prompt':>7} {'cached':>7} {'miss s':>8} {'hit s':>8} {'ratio':>6}")
    for size in args.tokens:
        misses, hits, cached, prompt = [], [], 0, 0
        for _ in range(args.repeats):
            text = f"{rng.random()} " + " ".join(rng.choices(WORDS, k=size))
            t_miss, _ = timed_call(args.engine, model, text)
            t_hit, usage = timed_call(args.engine, model, text)
            misses.append(t_miss)
            hits.append(t_hit)
            prompt = usage["prompt_tokens"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        miss, hit = statistics.median(misses), statistics.median(hits)
        print(f"{size:>7} {prompt:>7} {cached:>7} {miss:>8.3f} {hit:>8.3f} {miss / hit:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
