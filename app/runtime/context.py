"""The context budget of a stream and the counting of its prompt (docs/context.md).

:mod:`toolforge.core.context` decides when and how to compact; this module gives it the two
facts it needs from the world:

* **the budget**, and where it came from (``stream.begin.budget_source``):
  ``server_manager`` (the decision the gateway made for the model server it manages:
  llama-server or Ollama's ``num_ctx``, :mod:`toolforge.core.budget`), ``manual``
  (``CTX_BUDGET_TOKENS`` for a remote upstream), or ``upstream`` (the remote server's own
  report: llama-server's ``/props`` n_ctx, read once at start-up). None of them: no budget,
  nothing is measured. A workflow's own ``budget_tokens`` (``workflow``) is applied per
  stream over this one, when it is the smaller (:func:`toolforge.core.context.
  workflow_context`).
* **the count**: llama-server's ``POST /tokenize`` when the upstream has it (the model's own
  tokenizer: exact), characters / 4 otherwise. :class:`TokenCounter` says which it used,
  and metrics.json says it too (``context.token_counting``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from toolforge.core.context import (
    BudgetSource,
    ContextPolicy,
    StrategyName,
    chars_per_token,
    strategy_named,
)
from toolforge.errors import UpstreamError
from toolforge.log import get_logger

__all__ = ["CHARS", "TOKENIZE", "TokenCounter", "context_policy", "reported_n_ctx"]

log = get_logger(__name__)

TOKENIZE = "llama-server /tokenize"
CHARS = "chars/4"


class TokenCounter:
    """Counts a prompt's tokens for one stream: the upstream's ``tokenize`` when it has
    one, characters / 4 otherwise (and from the first failure of ``tokenize`` on)."""

    __slots__ = ("_tokenize", "calls", "method")

    def __init__(self, upstream: object) -> None:
        tokenize = getattr(upstream, "tokenize", None)
        self._tokenize: Callable[[str], Awaitable[int]] | None = (
            tokenize if callable(tokenize) else None
        )
        self.method = TOKENIZE if self._tokenize is not None else CHARS
        self.calls = 0

    async def count(self, text: str) -> int:
        self.calls += 1
        if self._tokenize is not None:
            try:
                return await self._tokenize(text)
            except UpstreamError as exc:
                log.warning("context.tokenize_failed", code=str(exc.code), error=exc.message)
                self._tokenize = None
                self.method = f"{CHARS} (/tokenize failed: {exc.code})"
        return chars_per_token(text)


def reported_n_ctx(props: Mapping[str, Any]) -> int | None:
    """llama-server's per-slot context from its ``/props`` (``None``: not reported)."""
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
    return n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None


def context_policy(
    strategy: StrategyName | str,
    *,
    keep_recent: int = 2,
    threshold: float = 0.75,
    server_budget: Mapping[str, Any] | None = None,
    manual_tokens: int | None = None,
    reported_tokens: int | None = None,
) -> ContextPolicy | None:
    """The policy for a stream: the first budget known, in the order of the module
    docstring, with ``strategy``; ``None`` when no budget is known."""
    candidates: tuple[tuple[int | None, BudgetSource], ...] = (
        (
            server_budget.get("budget_tokens") if server_budget is not None else None,
            "server_manager",
        ),
        (manual_tokens, "manual"),
        (reported_tokens, "upstream"),
    )
    for tokens, source in candidates:
        if isinstance(tokens, int) and tokens > 0:
            return ContextPolicy(strategy_named(strategy, keep_recent), tokens, source, threshold)
    return None
