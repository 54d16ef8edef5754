"""``toolforge eval``: qualify a model on multi-step tool work, with and without the
guardrails (docs/eval.md).

Scenarios are data plus graders (:mod:`.catalog`); runs go through the same turn engine users
get; results append to JSONL and resume; metrics and reports are pure functions of the JSONL.
"""

__all__: list[str] = []
