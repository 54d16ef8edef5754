"""The one error tree of ToolForge.

Every error the gateway reports carries a stable ``code`` (the SSE ``error`` frame's
``code`` and the HTTP error body's ``code``), a human ``message`` that says what was wrong
and what to do, whether retrying can help, and the HTTP status to use when the error
happens before response headers are sent. Library exceptions are mapped onto this tree at
the boundary where they occur (``raise Ours(...) from exc``), so callers only ever catch
``ToolForgeError``.

    ToolForgeError
    ├── ModelBehaviorError          the model broke the emission contract (HTTP 502)
    │   ├── SentinelError           framing: END without BEGIN, nesting, bad attributes, ...
    │   └── JSONError               strict RFC 8259 syntax, depth and size limits
    ├── UpstreamError               the upstream is unreachable, slow or speaks bad SSE
    │   ├── OllamaModelNotFound     Ollama has no model by that name (upstream.ollama_wire)
    │   └── AdmissionRefused        no upstream slot within ADMISSION_TIMEOUT_MS (runtime.admission)
    ├── ServerError                 a managed model server could not be built, started or kept up
    ├── WorkflowError               a workflow ran out of a budget, with its context
    │   ├── StepEnforcementError    it kept calling a terminal tool before the required steps
    │   ├── PrerequisiteError       it kept calling a tool before the ones it needs
    │   ├── ToolCallError           it made no usable tool call, turn after turn
    │   ├── ToolExecutionError      the tools kept failing, and it did not recover
    │   ├── MaxIterationsError      it ran out of turns
    │   └── WorkflowCancelledError  the run was cancelled
    ├── ToolError                   a call gave no result; the model reads why (core.tool_specs)
    │   ├── ToolArgumentsError      the arguments were refused before the tool ran
    │   ├── TransientToolError      a tool's failure that may pass: retried
    │   └── PermanentToolError      a tool's failure that will not: never retried
    │       └── BookingFullError    the demo pack's full restaurant (tools.bookings)
    ├── ToolConfigError             a tool or tool source the gateway will not start with
    ├── ContextBudgetExceeded       the prompt is over budget, nothing left to compact
    ├── RedisUnavailable            REDIS_URL is set and Redis did not answer (runtime.cluster)
    ├── RemoteError                 the refusal of the replica that runs a stream, passed on
    └── RequestError                the caller misused us (4xx): bad body, too large, ...
        └── RateLimited             over an API key's rate limit (429, api.auth)

Each class lives where it is raised (the module in parentheses, or ``toolforge.errors``);
``tests/test_errors_tree.py`` checks that this drawing names every one, under its parent.

The split between "the model misbehaved" and "the caller misused us" follows
openai-agents' ModelBehaviorError / UserError: the first is worth a repair or a retry of
the model, the second never is.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ErrorCode",
    "JSONError",
    "MaxIterationsError",
    "ModelBehaviorError",
    "PrerequisiteError",
    "RequestError",
    "SentinelError",
    "ServerError",
    "StepEnforcementError",
    "ToolCallError",
    "ToolExecutionError",
    "ToolForgeError",
    "UpstreamError",
    "WorkflowCancelledError",
    "WorkflowError",
    "workflow_error",
]


class ErrorCode(StrEnum):
    """Stable error codes. Never renumber or rename: clients match on these strings."""

    # Sentinel framing (docs/protocol.md). docs/protocol.md explains each one.
    END_WITHOUT_BEGIN = "END_WITHOUT_BEGIN"
    END_ID_MISMATCH = "END_ID_MISMATCH"
    END_KIND_MISMATCH = "END_KIND_MISMATCH"
    NESTED_BEGIN = "NESTED_BEGIN"
    DUPLICATE_FRAME_ID = "DUPLICATE_FRAME_ID"
    UNKNOWN_FRAME_KIND = "UNKNOWN_FRAME_KIND"
    MALFORMED_SENTINEL = "MALFORMED_SENTINEL"
    FRAME_UNCLOSED = "FRAME_UNCLOSED"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    FRAME_TIMEOUT = "FRAME_TIMEOUT"
    # Strict JSON (RFC 8259) and its limits.
    JSON_SYNTAX = "JSON_SYNTAX"
    JSON_INCOMPLETE = "JSON_INCOMPLETE"
    JSON_TRAILING_DATA = "JSON_TRAILING_DATA"
    JSON_TOO_DEEP = "JSON_TOO_DEEP"
    JSON_TOO_LARGE = "JSON_TOO_LARGE"
    JSON_NUMBER_OUT_OF_RANGE = "JSON_NUMBER_OUT_OF_RANGE"
    JSON_INVALID_UNICODE = "JSON_INVALID_UNICODE"
    # Upstream.
    UPSTREAM_UNAVAILABLE = "UPSTREAM_UNAVAILABLE"
    UPSTREAM_TIMEOUT = "UPSTREAM_TIMEOUT"
    UPSTREAM_PROTOCOL = "UPSTREAM_PROTOCOL"
    UPSTREAM_HTTP_ERROR = "UPSTREAM_HTTP_ERROR"
    # Caller.
    BAD_REQUEST = "BAD_REQUEST"
    MODE_UNAVAILABLE = "MODE_UNAVAILABLE"
    BODY_TOO_LARGE = "BODY_TOO_LARGE"
    NOT_FOUND = "NOT_FOUND"
    # REDIS_URL is set and Redis does not answer (503; docs/deployment.md).
    REDIS_UNAVAILABLE = "REDIS_UNAVAILABLE"
    # The replica running a stream died: the resumable buffer ends with this (docs/deployment.md).
    STREAM_LOST = "STREAM_LOST"
    # A stream command between replicas of two releases (a rolling upgrade) whose wire
    # format one of them does not read: refused, never misread (503; docs/deployment.md).
    COMMAND_VERSION_UNSUPPORTED = "COMMAND_VERSION_UNSUPPORTED"
    CONFLICT = "CONFLICT"
    IDEMPOTENCY_IN_FLIGHT = "IDEMPOTENCY_IN_FLIGHT"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    INVALID_SCHEMA = "INVALID_SCHEMA"  # an inline JSON Schema that cannot be used (422)
    UNKNOWN_SCHEMA = "UNKNOWN_SCHEMA"  # a schema name nobody registered (422)
    # Access (docs/security.md).
    UNAUTHORIZED = "UNAUTHORIZED"  # no API key, or one the gateway does not know (401)
    FORBIDDEN = "FORBIDDEN"  # the key may not do this: another key's stream, a tool (403)
    RATE_LIMITED = "RATE_LIMITED"  # the key's requests per window or streams are spent (429)
    KEYS_INVALID = "KEYS_INVALID"  # API_KEYS / API_KEYS_FILE cannot be used (start-up)
    # Ours.
    INTERNAL = "INTERNAL"
    # Managed model servers (docs/servers.md).
    BACKEND_SETUP_FAILED = "BACKEND_SETUP_FAILED"  # llama-server or the model not obtainable
    SERVER_START_FAILED = "SERVER_START_FAILED"  # the process exited or never became healthy
    SERVER_CRASHED = "SERVER_CRASHED"  # a running server's process died
    BUDGET_INVALID = "BUDGET_INVALID"  # a context-budget setting that cannot be used
    # Tools (docs/tools.md): each goes back to the model in a tool envelope's ``errors``.
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"
    INVALID_JSON = "INVALID_JSON"
    TOOL_ARGS_INVALID = "TOOL_ARGS_INVALID"
    ARGUMENTS_TOO_LARGE = "ARGUMENTS_TOO_LARGE"
    TOOL_OUTPUT_TOO_LARGE = "TOOL_OUTPUT_TOO_LARGE"
    TOOL_OUTPUT_INVALID = "TOOL_OUTPUT_INVALID"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"
    TOOL_FAILED = "TOOL_FAILED"
    TOOL_APPROVAL_DENIED = "TOOL_APPROVAL_DENIED"
    TOOL_APPROVAL_TIMEOUT = "TOOL_APPROVAL_TIMEOUT"
    TOOL_CALL_LIMIT = "TOOL_CALL_LIMIT"  # more tool calls than the request's max_tool_calls
    # A client-side tool's result did not come within CLIENT_TOOL_TIMEOUT_MS (docs/tools.md).
    CLIENT_TOOL_TIMEOUT = "CLIENT_TOOL_TIMEOUT"
    # Native mode (docs/protocol.md): the upstream's tool_calls pieces do not make a call (no name,
    # one id with two names). Too many calls per turn is TOOL_CALL_LIMIT, too long
    # arguments ARGUMENTS_TOO_LARGE, as in sentinel mode.
    NATIVE_TOOL_CALL_MALFORMED = "NATIVE_TOOL_CALL_MALFORMED"
    BOOKING_FULL = "BOOKING_FULL"
    # A tool or tool source the gateway refuses at start-up (the tool rules of docs/tools.md, MCP
    # config).
    TOOL_CONFIG_INVALID = "TOOL_CONFIG_INVALID"
    # fs.read / sqlite.query refusals (docs/security.md): outside the roots, too large, a write.
    PATH_NOT_ALLOWED = "PATH_NOT_ALLOWED"
    READ_ONLY = "READ_ONLY"
    # The workspace pack (docs/tools.md): a change to a locked key; a commit that is not of a
    # pending proposal exactly as proposed.
    WORKSPACE_LOCKED = "WORKSPACE_LOCKED"
    PROPOSAL_INVALID = "PROPOSAL_INVALID"
    # docs/context.md: the prompt is over the context budget and compaction cannot cut enough.
    CONTEXT_BUDGET_EXCEEDED = "CONTEXT_BUDGET_EXCEEDED"
    # The upstream refused the prompt as longer than the model's context (llama-server's
    # exceed_context_size_error, OpenAI's and vLLM's context_length_exceeded): the
    # request's to shorten, not the upstream's fault (the proxy answers 400).
    CONTEXT_LENGTH_EXCEEDED = "CONTEXT_LENGTH_EXCEEDED"
    # Workflows (docs/workflows.md). A definition that cannot be used, and one
    # nobody registered: the caller's (422, 404).
    WORKFLOW_INVALID = "WORKFLOW_INVALID"
    WORKFLOW_NOT_FOUND = "WORKFLOW_NOT_FOUND"
    # A refused call's tool.result error (the model gets a step.nudge with it).
    STEP_REQUIRED = "STEP_REQUIRED"  # a terminal tool before every required step
    PREREQUISITE_MISSING = "PREREQUISITE_MISSING"  # a tool before its prerequisites
    # How a workflow fails: each ends the stream with error + done (done.workflow says
    # the completed and pending steps, the iterations and the last model text).
    STEP_ENFORCEMENT_EXHAUSTED = "STEP_ENFORCEMENT_EXHAUSTED"
    PREREQUISITE_EXHAUSTED = "PREREQUISITE_EXHAUSTED"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED"
    TOOL_ERRORS_EXHAUSTED = "TOOL_ERRORS_EXHAUSTED"
    MAX_ITERATIONS = "MAX_ITERATIONS"
    WORKFLOW_CANCELLED = "WORKFLOW_CANCELLED"  # the Python API's (a stream says done: cancelled)


class ToolForgeError(Exception):
    """Base of every error ToolForge raises on purpose."""

    http_status: int = 500
    retryable: bool = False

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        frame_id: str | None = None,
        details: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.frame_id = frame_id
        self.details = details

    def to_dict(self) -> dict[str, object]:
        """The ``error`` frame payload (docs/protocol.md): code, message, retryable."""
        out: dict[str, object] = {
            "code": str(self.code),
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.frame_id is not None:
            out["frame_id"] = self.frame_id
        if self.details is not None:
            out["details"] = self.details
        return out

    def __eq__(self, other: object) -> bool:
        # Errors are compared as values in tests of chunking invariance.
        if not isinstance(other, ToolForgeError):
            return NotImplemented
        return (type(self), self.code, self.message, self.frame_id) == (
            type(other),
            other.code,
            other.message,
            other.frame_id,
        )

    def __hash__(self) -> int:
        return hash((type(self), self.code, self.message, self.frame_id))


class ModelBehaviorError(ToolForgeError):
    """The model's output broke the contract; a repair or a new generation may help."""

    http_status = 502
    retryable = True


class SentinelError(ModelBehaviorError):
    """A violation of the sentinel framing grammar (docs/protocol.md)."""


class JSONError(ModelBehaviorError):
    """Strict-JSON violation or limit, with the character offset where it was found."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        offset: int,
        frame_id: str | None = None,
    ) -> None:
        super().__init__(code, f"{message} (at character {offset})", frame_id=frame_id)
        self.offset = offset


class UpstreamError(ToolForgeError):
    """The upstream model server failed us: connect, timeouts, HTTP status, bad SSE."""

    http_status = 502
    retryable = True


class ServerError(ToolForgeError):
    """A managed model server (docs/servers.md) could not be obtained, started or kept alive."""

    http_status = 503
    retryable = True


class WorkflowError(ToolForgeError):
    """A workflow that cannot go on (docs/workflows.md): a budget ran out (steps, prerequisites,
    retries, tool errors, iterations) or it was cancelled. ``context`` is what docs/workflows.md
    asks a failure to carry: the completed and pending steps, the iteration count and the
    last raw model text (redacted), and the counter that ran out."""

    http_status = 422
    retryable = False

    def __init__(self, code: ErrorCode, message: str, *, context: dict[str, object]) -> None:
        details = [{k: _detail(v) for k, v in context.items()}]
        super().__init__(code, message, details=details)
        self.context = context


class StepEnforcementError(WorkflowError):
    """The model kept calling a terminal tool before the required steps (docs/workflows.md)."""


class PrerequisiteError(WorkflowError):
    """The model kept calling a tool without its prerequisites."""


class ToolCallError(WorkflowError):
    """The model made no usable tool call ``max_retries_per_step`` turns in a row."""


class ToolExecutionError(WorkflowError):
    """Tools failed ``max_tool_errors`` turns in a row and the model did not recover."""


class MaxIterationsError(WorkflowError):
    """``max_iterations`` model turns without a successful terminal tool."""


class WorkflowCancelledError(WorkflowError):
    """The run was cancelled (the Python API's ``cancel_event``) before it finished."""


_WORKFLOW_ERRORS: dict[ErrorCode, type[WorkflowError]] = {
    ErrorCode.STEP_ENFORCEMENT_EXHAUSTED: StepEnforcementError,
    ErrorCode.PREREQUISITE_EXHAUSTED: PrerequisiteError,
    ErrorCode.RETRIES_EXHAUSTED: ToolCallError,
    ErrorCode.TOOL_ERRORS_EXHAUSTED: ToolExecutionError,
    ErrorCode.MAX_ITERATIONS: MaxIterationsError,
    ErrorCode.WORKFLOW_CANCELLED: WorkflowCancelledError,
}


def workflow_error(code: ErrorCode, message: str, *, context: dict[str, object]) -> WorkflowError:
    """The typed :class:`WorkflowError` for ``code`` (its subclass, for the Python API)."""
    return _WORKFLOW_ERRORS.get(code, WorkflowError)(code, message, context=context)


def _detail(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)


class RequestError(ToolForgeError):
    """The caller misused the API; retrying the same request cannot help."""

    http_status = 400
    retryable = False

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        http_status: int = 400,
        frame_id: str | None = None,
        details: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(code, message, frame_id=frame_id, details=details)
        self.http_status = http_status
