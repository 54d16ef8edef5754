/**
 * The SDK's one error type. Gateway errors keep the gateway's stable `code` (the codes of
 * docs/protocol.md §9: `BAD_REQUEST`, `NOT_FOUND`, …) and the HTTP `status`; errors the
 * SDK itself detects use these codes:
 *
 * | code | meaning |
 * |---|---|
 * | `REQUEST_TIMEOUT` | `requestTimeoutMs` passed before `done`; the stream was cancelled |
 * | `ABORTED` | the caller's `signal` aborted; the stream was cancelled |
 * | `CONNECTION_LOST` | the connection dropped and resuming failed (or was turned off) |
 * | `PROTOCOL` | the gateway sent something that is not the protocol (bad JSON, no stream id) |
 * | `HTTP_ERROR` | an HTTP error without the gateway's error body (a proxy in between) |
 */
export class ToolForgeError extends Error {
  /** A stable code: the gateway's, or one of the SDK's (above). */
  readonly code: string;
  /** The HTTP status, when the error is an HTTP answer. */
  readonly status: number | undefined;
  /** Whether trying again may succeed. */
  readonly retryable: boolean;
  /** The gateway's per-field details (422), when it sent them. */
  readonly details: ReadonlyArray<Record<string, string>> | undefined;

  constructor(
    code: string,
    message: string,
    options: {
      status?: number;
      retryable?: boolean;
      details?: ReadonlyArray<Record<string, string>>;
      cause?: unknown;
    } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ToolForgeError";
    this.code = code;
    this.status = options.status;
    this.retryable = options.retryable ?? false;
    this.details = options.details;
  }
}

/** The error an HTTP answer that is not 2xx carries: the gateway's `{"error": {...}}`. */
export async function errorFromResponse(response: Response, what: string): Promise<ToolForgeError> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // the body is lost with the connection: the status still says enough
  }
  try {
    const body = JSON.parse(text) as { error?: Record<string, unknown> };
    const error = body.error;
    if (error && typeof error.code === "string" && typeof error.message === "string") {
      return new ToolForgeError(error.code, error.message, {
        status: response.status,
        retryable: error.retryable === true,
        details: Array.isArray(error.details)
          ? (error.details as Record<string, string>[])
          : undefined,
      });
    }
  } catch {
    // not the gateway's JSON: described below
  }
  return new ToolForgeError(
    "HTTP_ERROR",
    `${what}: HTTP ${response.status}${text ? `: ${text.slice(0, 200)}` : ""}`,
    { status: response.status, retryable: response.status >= 500 || response.status === 429 },
  );
}
