"""A workflow run by the gateway, asked for with the official OpenAI SDK (docs/proxy.md).

    make run                                   # in one shell: the gateway on :8000
    python examples/openai_workflow.py         # in another
    python examples/openai_workflow.py http://127.0.0.1:8000/v1 "$TOOLFORGE_API_KEY"

The gateway runs the ``book_a_table`` workflow (workflows/book_a_table.json) on its own
tools: it searches first, books only a place the search returned, nudges the model when it
skips a step, and answers with the booking. The SDK sees one chat completion whose content
is the booking's JSON; ``toolforge`` in the reply is what the workflow did.
"""

from __future__ import annotations

import json
import sys

import openai

REQUEST = "Find pizza near me; book a table for 2 at 7pm if open."


def main(base_url: str, api_key: str) -> int:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
    try:
        reply = client.chat.completions.create(
            model="toolforge",
            messages=[{"role": "user", "content": REQUEST}],
            temperature=0.2,
            seed=42,
            max_tokens=384,
            extra_body={"toolforge": {"workflow": "book_a_table"}},
        )
    except openai.UnprocessableEntityError as exc:  # the model did not finish the workflow
        error = exc.body if isinstance(exc.body, dict) else {}
        print(f"the workflow failed: {error.get('code')}: {error.get('message')}")
        print(f"its context: {error.get('details')}")
        return 1
    booking = json.loads(reply.choices[0].message.content or "null")
    trace = (reply.model_extra or {}).get("toolforge", {})
    for call in trace.get("server_tools", []):
        outcome = "ok" if call["ok"] else call["error"]["code"]
        print(f"{call['name']:16} {json.dumps(call.get('args'))} -> {outcome}")
    workflow = trace.get("workflow", {})
    print(f"\nbooked: {booking}")
    print(
        f"steps {workflow.get('completed_steps')}, {workflow.get('iterations')} turns, "
        f"{workflow.get('nudges')} nudges"
    )
    return 0


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
    key = sys.argv[2] if len(sys.argv) > 2 else "none"
    sys.exit(main(url, key))
