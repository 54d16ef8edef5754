/**
 * The gateway's plain JSON endpoints (everything but the streams): cancel, approvals,
 * client-tool results, the run list. Each is one `fetch`; errors are `ToolForgeError`s.
 */
import { errorFromResponse, ToolForgeError } from "./errors.js";

/** Where the gateway is and how to reach it: shared by every call of the SDK. */
export interface ConnectionOptions {
  /**
   * The gateway's base URL. Default: the page's origin in a browser (the demo UI is served
   * by the gateway), else `http://127.0.0.1:8000`.
   */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer <apiKey>` when the gateway has API keys (docs/security.md). */
  apiKey?: string;
  /** A `fetch` to use instead of the global one (a proxy agent, instrumentation). */
  fetch?: typeof fetch;
}

/** One past run, as `GET /v1/runs` lists it (newest first). */
export interface RunSummary {
  stream_id: string;
  /** When the run's artifacts were written (ISO 8601, UTC). */
  ended_at: string;
  reason: string | null;
  model: string | null;
  mode: string | null;
  /** The request's input (or its last user message), shortened. */
  input: string | null;
  frames: number | null;
  duration_ms: number | null;
}

/** A past run's frames and files, as `GET /v1/runs/{stream_id}` returns them. */
export interface RunDetail {
  stream_id: string;
  /** Every numbered frame as it was sent: `{id, event, data}` (frames.ndjson). */
  frames: Array<{ id: number; event: string; data: unknown }>;
  prompt: unknown;
  result: unknown;
  tool_logs: unknown;
  metrics: unknown;
}

export function baseUrlOf(options: ConnectionOptions): string {
  const base =
    options.baseUrl ??
    (globalThis as { location?: { origin?: string } }).location?.origin ??
    "http://127.0.0.1:8000";
  return base.replace(/\/+$/, "");
}

export function headersOf(options: ConnectionOptions, extra: Record<string, string> = {}) {
  const headers: Record<string, string> = { ...extra };
  if (options.apiKey) headers.Authorization = `Bearer ${options.apiKey}`;
  return headers;
}

export function fetchOf(options: ConnectionOptions): typeof fetch {
  return options.fetch ?? globalThis.fetch.bind(globalThis);
}

const segment = (value: string) => encodeURIComponent(value);

async function call<T>(
  options: ConnectionOptions,
  method: "GET" | "POST",
  path: string,
  body?: unknown,
  signal?: AbortSignal,
): Promise<T> {
  let response: Response;
  try {
    response = await fetchOf(options)(baseUrlOf(options) + path, {
      method,
      headers: headersOf(
        options,
        body === undefined ? {} : { "Content-Type": "application/json" },
      ),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (cause) {
    throw new ToolForgeError("CONNECTION_LOST", `${method} ${path}: ${String(cause)}`, {
      retryable: true,
      cause,
    });
  }
  if (!response.ok) throw await errorFromResponse(response, `${method} ${path}`);
  return (await response.json()) as T;
}

/** `POST /v1/streams/{id}/cancel`: stop a running stream; resolves once it has ended. */
export function cancelStream(streamId: string, options: ConnectionOptions = {}) {
  return call<{ stream_id: string; cancelled: boolean; reason: string | null }>(
    options,
    "POST",
    `/v1/streams/${segment(streamId)}/cancel`,
  );
}

/** What `POST /v1/streams/{id}/pause` and `…/resume` answer: the state after the command. */
export interface PauseState {
  stream_id: string;
  paused: boolean;
}

/**
 * `POST /v1/streams/{id}/pause` (`paused: true`) or `…/resume` (`false`): the gateway
 * stops reading the model, or reads it again (docs/protocol.md §7).
 */
export function pauseStream(streamId: string, paused: boolean, options: ConnectionOptions = {}) {
  return call<PauseState>(
    options,
    "POST",
    `/v1/streams/${segment(streamId)}/${paused ? "pause" : "resume"}`,
  );
}

/** `POST /v1/streams/{id}/approvals/{call_id}`: run (`true`) or refuse a waiting call. */
export function approveCall(
  streamId: string,
  callId: string,
  approve: boolean,
  options: ConnectionOptions = {},
) {
  return call<{ stream_id: string; call_id: string; approved: boolean }>(
    options,
    "POST",
    `/v1/streams/${segment(streamId)}/approvals/${segment(callId)}`,
    { approve },
  );
}

/** The body of a client-side tool's result (docs/tools.md). */
export type ToolResultBody =
  | { ok: true; result: unknown }
  | { ok: false; error: { code?: string; message: string } };

/** `POST /v1/streams/{id}/tool_results/{call_id}`: a client-side tool's result. */
export function postToolResult(
  streamId: string,
  callId: string,
  body: ToolResultBody,
  options: ConnectionOptions = {},
  signal?: AbortSignal,
) {
  return call<{ stream_id: string; call_id: string; accepted: boolean }>(
    options,
    "POST",
    `/v1/streams/${segment(streamId)}/tool_results/${segment(callId)}`,
    body,
    signal,
  );
}

/** `GET /v1/runs`: the past runs in the gateway's artifacts, newest first. */
export async function listRuns(
  options: ConnectionOptions & { limit?: number } = {},
): Promise<RunSummary[]> {
  const query = options.limit === undefined ? "" : `?limit=${options.limit}`;
  const body = await call<{ runs: RunSummary[] }>(options, "GET", `/v1/runs${query}`);
  return body.runs;
}

/** `GET /v1/runs/{stream_id}`: one past run's frames and files, for a replay. */
export function getRun(streamId: string, options: ConnectionOptions = {}): Promise<RunDetail> {
  return call<RunDetail>(options, "GET", `/v1/runs/${segment(streamId)}`);
}
