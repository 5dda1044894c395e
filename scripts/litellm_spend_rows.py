"""Write LiteLLM spend-log rows for a small agent loop, built by LiteLLM's own code.

The proxy stores one row per call in its ``LiteLLM_SpendLogs`` table (and
serves them at ``/spend/logs``); the row is built by
``litellm.proxy.spend_tracking.spend_tracking_utils.get_logging_payload``.
This drives three agent sessions of four calls (streamed and not) through the
LiteLLM SDK against an OpenAI-compatible engine and writes the rows that
function builds, as the JSON array ``/spend/logs`` returns. The fixtures
``tests/fixtures/logs/litellm-spend-real*.json`` were written by it against
the fake engine (``python -m tests.support.fake_upstream --port 18021 --tokens 8``):

    .venv/bin/pip install --no-deps -r bench/requirements-litellm.txt
    LITELLM_LOCAL_MODEL_COST_MAP=True .venv/bin/python scripts/litellm_spend_rows.py \\
        http://127.0.0.1:18021 rows.json [--sessions]

With ``--sessions`` each call carries ``litellm_session_id`` (one per agent
session); without it LiteLLM fills ``session_id`` with each request's own
trace id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy.spend_tracking.spend_tracking_utils import get_logging_payload


class SpendRows(CustomLogger):
    """Collects the row LiteLLM's proxy would store for every successful call."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self.rows.append(dict(get_logging_payload(kwargs, response_obj, start_time, end_time)))


async def agent_loop(base_url: str, with_sessions: bool) -> None:
    for s in range(3):
        messages: list[dict[str, str]] = [{"role": "system", "content": "You are an agent. " * 40},
                                          {"role": "user", "content": f"task {s}"}]
        for k in range(4):
            kw: dict[str, Any] = {"model": "openai/fake-model", "api_base": base_url + "/v1", "api_key": "not-used",
                                  "messages": messages}
            if with_sessions:
                kw["litellm_session_id"] = f"agent-{s}"
            if k % 2:
                stream = await litellm.acompletion(stream=True, stream_options={"include_usage": True}, **kw)
                text = ""
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
            else:
                reply = await litellm.acompletion(**kw)
                text = reply.choices[0].message.content
            messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "out " * 20}]
            await asyncio.sleep(0.05)  # the tool gap
    await asyncio.sleep(1.0)  # success callbacks run after the call returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base_url")
    parser.add_argument("out")
    parser.add_argument("--sessions", action="store_true", help="send litellm_session_id with each call")
    args = parser.parse_args()
    collector = SpendRows()
    litellm.callbacks = [collector]
    asyncio.run(agent_loop(args.base_url, args.sessions))
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(collector.rows, fh, default=str, indent=1)
    print(f"wrote {len(collector.rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
