/**
 * `startStream`: one `POST /v1/stream`, its frames delivered to callbacks, client-side tools
 * run and posted back, and the stream resumed with `Last-Event-ID` after a dropped
 * connection.
 *
 * Theory of operation. One loop reads the response body with a `ReadableStream` reader,
 * feeds the bytes to `eventsource-parser`, and dispatches the parsed events one by one.
 * `pause()` and `resume()` are the gateway's commands (docs/protocol.md §7): `pause` on the
 * socket with `transport: "ws"`, else `POST /v1/streams/{id}/pause` (and `…/resume`); the
 * gateway stops reading the model, so the model really stops, and the loop goes on
 * delivering what was made before (`stream.paused`, then at most one read's frames). A
 * pause asked before the stream id is known is sent with `stream.begin`, as a cancel is.
 * A client tool runs beside the loop (the stream goes on: pings keep coming), and its
 * result is posted to `…/tool_results/{call_id}`.
 * When the body fails or ends before `done`, the loop reconnects with
 * `GET /v1/streams/{id}` and the last frame id it saw, so every frame arrives exactly once.
 *
 * With `transport: "ws"` the same loop reads one WebSocket (`GET /v1/stream/ws`,
 * socket.ts) instead: the frames are the same, tool results, approvals and cancel are sent
 * on the socket, and a dropped socket is resumed on a new one after the last frame id.
 */
import { createParser, type EventSourceMessage } from "eventsource-parser";

import { errorFromResponse, ToolForgeError } from "./errors.js";
import type {
  DoneData,
  ErrorData,
  FrameDataMap,
  JsonEndData,
  ResultEndData,
  StreamEvent,
  ToolCallData,
} from "./frames.js";
import {
  approveCall,
  baseUrlOf,
  cancelStream,
  type ConnectionOptions,
  fetchOf,
  headersOf,
  type PauseState,
  pauseStream,
  postToolResult,
  type ToolResultBody,
} from "./http.js";
import { type SocketMessage, StreamSocket, socketUrl, type WebSocketConstructor } from "./socket.js";

/** An OpenAI-style chat message (`role`: system, user, assistant, tool). */
export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  content: string | null;
  [key: string]: unknown;
}

/** A tool the caller runs itself (docs/tools.md): the model sees it like a registry tool. */
export interface ClientTool {
  name: string;
  description?: string;
  /** The JSON Schema of its arguments; the gateway validates every call against it. */
  parameters?: Record<string, unknown>;
}

/** A client-side tool call, as `onToolCall` receives it. */
export interface ToolCall {
  id: string;
  name: string;
  /** The arguments, parsed strictly and validated against the tool's `parameters`. */
  args: unknown;
  streamId: string;
  /** Aborts when the call times out (`toolTimeoutMs`) or the stream ends or fails. */
  signal: AbortSignal;
}

/** A tool call that waits for a person's approval, as `onApproval` receives it. */
export type ApprovalRequest = ToolCallData & { streamId: string };

/**
 * Progress of an OBJECT (`onJSON`) or RESULT (`onResult`) frame: `{id, schema}` when it
 * opens, `{id, delta}` for each piece of its JSON text, and `{id, end: true, value, …}`
 * at its END, where `value` is the validated value.
 */
export interface FrameUpdate {
  id: string;
  schema?: string;
  delta?: string;
  end?: boolean;
  value?: unknown;
  repaired?: boolean;
  degraded?: boolean;
}

/** Run a client-side tool: return its result (any JSON value) or throw. */
export type OnToolCall = (call: ToolCall) => unknown;
export type OnJSON = (update: FrameUpdate) => void;
export type OnResult = (update: FrameUpdate) => void;
export type OnText = (chunk: string) => void;
export type OnEvent = (event: StreamEvent) => void;
/** Decide a call that needs approval: `true` runs it, `false` refuses it. */
export type OnApproval = (call: ApprovalRequest) => boolean | Promise<boolean>;

/** How to reconnect after a dropped connection. */
export interface ResumePolicy {
  /** Reconnection attempts in a row before giving up (default 5). */
  attempts?: number;
  /** The first delay between attempts, doubled each time up to 2 s (default 200 ms). */
  delayMs?: number;
}

export interface StreamOptions extends ConnectionOptions {
  /** The user's message; give this or `messages`. */
  input?: string;
  /** The chat so far; give this or `input`. */
  messages?: ChatMessage[];
  /** Registry tools the model may call (default: all model-facing tools). */
  tools?: string[];
  /** Tools this client runs: offered to the model, run by `onToolCall`. */
  clientTools?: ClientTool[];
  /** The final RESULT frame's schema (default `AssistantReply`). */
  resultSchema?: string;
  /** Schemas the model may emit as OBJECT frames: names, or `{name, schema}`. */
  objectSchemas?: Array<string | { name: string; schema: Record<string, unknown> }>;
  mode?: "auto" | "sentinel" | "constrained" | "native";
  sampling?: { temperature?: number; seed?: number; max_tokens?: number; top_p?: number };
  profile?: "demo";
  model?: string;
  maxToolCalls?: number;
  /** A registered workflow's name or an inline definition (docs/workflows.md), where the gateway has them. */
  workflow?: string | Record<string, unknown>;
  /** `Idempotency-Key`: the same key and body replay the stored stream. */
  idempotencyKey?: string;
  /** Further request fields, sent as they are (newer gateway features). */
  extra?: Record<string, unknown>;

  onToolCall?: OnToolCall;
  onApproval?: OnApproval;
  onJSON?: OnJSON;
  onResult?: OnResult;
  onText?: OnText;
  /** Every event, pings included, before the specific callback. */
  onEvent?: OnEvent;

  /** Abort the stream: it is cancelled on the gateway and `done` rejects with `ABORTED`. */
  signal?: AbortSignal;
  /**
   * How long one client-side tool call may run; past it the call's `signal` aborts and
   * the model gets a `CLIENT_TOOL_TIMEOUT` error. Default: none here, the gateway's
   * `CLIENT_TOOL_TIMEOUT_MS` (120 s) applies.
   */
  toolTimeoutMs?: number;
  /** How long the whole stream may take; past it it is cancelled and `done` rejects with `REQUEST_TIMEOUT`. */
  requestTimeoutMs?: number;
  /**
   * Resume after a dropped connection (default on). On, the request asks the gateway to
   * keep the stream running while no client is connected (`on_disconnect: "continue"`);
   * `false` leaves the gateway's default, which cancels the stream when the client goes.
   */
  resume?: boolean | ResumePolicy;
  /**
   * `"sse"` (default): the frames over SSE, tool results and approvals as HTTP posts.
   * `"ws"`: one WebSocket for both ways (docs/websocket.md); the API key goes as the
   * `token` query parameter; `pause()` and `resume()` go on the socket.
   */
  transport?: "sse" | "ws";
  /** The WebSocket constructor for `transport: "ws"` (default: the global `WebSocket`). */
  WebSocket?: WebSocketConstructor;
}

/** What a finished stream produced. */
export interface StreamOutcome {
  streamId: string;
  /** `done.reason`: stop, length, error, cancelled, client_disconnected or shutdown. */
  reason: string;
  done: DoneData;
  /** The RESULT frame's validated value, if the stream had one. */
  result: unknown;
  resultFrame: ResultEndData | undefined;
  /** Every OBJECT frame's END, in order. */
  objects: JsonEndData[];
  /** The free text outside frames. */
  text: string;
  /** The `error` frame, if one came (then `reason` is `error`). */
  error: ErrorData | undefined;
  /** The id of the last frame (the `done`). */
  lastEventId: number;
  /** How many times the connection was resumed. */
  reconnects: number;
}

export interface StreamHandle {
  /** The gateway's stream id, once the response has started. */
  readonly streamId: string | undefined;
  /** Whether the last of `pause()` / `resume()` asked was `pause()`, and the stream runs on. */
  readonly paused: boolean;
  /**
   * Pause the model on the gateway (`pause` on the socket, else `POST …/pause`): it reads
   * no more of the model until `resume()`, or `PAUSE_MAX_S`. Events keep coming: the
   * `stream.paused` event, and what the model made before. Resolves with the gateway's
   * answer (`{stream_id, paused}`; `undefined` when sent later, with `stream.begin`).
   */
  pause(): Promise<PauseState | undefined>;
  /** Read the model again (`resume` on the socket, else `POST …/resume`): `stream.resumed`. */
  resume(): Promise<PauseState | undefined>;
  /** Cancel the stream on the gateway; `done` then resolves with reason `cancelled`. */
  cancel(): Promise<void>;
  /** Approve (or, with `false`, refuse) a tool call that waits for approval. */
  approve(callId: string, approve?: boolean): Promise<void>;
  /** Resolves when `done` arrives; rejects with a `ToolForgeError`. */
  readonly done: Promise<StreamOutcome>;
}

/** Start a stream. Callbacks fire as frames arrive; `handle.done` settles at the end. */
export function startStream(options: StreamOptions): StreamHandle {
  const run = new StreamRun(options);
  void run.run();
  return run.handle;
}

const CLIENT_CODE = /^[A-Za-z0-9_.:-]{1,64}$/;
const MAX_DELAY_MS = 2000;

class StreamRun {
  readonly handle: StreamHandle;
  private readonly opts: StreamOptions;
  private readonly conn: ConnectionOptions;
  private readonly done: Promise<StreamOutcome>;
  private settle!: { resolve: (o: StreamOutcome) => void; reject: (e: unknown) => void };
  private streamId: string | undefined;
  private lastId = 0;
  private reconnects = 0;
  private paused = false;
  /** The pause state asked before the stream id was known: sent with `stream.begin`. */
  private pendingPause: boolean | undefined;
  private connection: AbortController | undefined;
  private socket: StreamSocket | undefined;
  /** Why the run stops early (timeout, abort, a callback's error): set once. */
  private failure: unknown;
  private stopped = false;
  private finished = false;
  private cancelRequested = false;
  private readonly calls = new Set<string>();
  private readonly tools = new Set<AbortController>();
  private text = "";
  private readonly objects: JsonEndData[] = [];
  private resultFrame: ResultEndData | undefined;
  private errorData: ErrorData | undefined;
  private doneData: DoneData | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly onAbort = () =>
    this.stop(
      new ToolForgeError("ABORTED", "the stream was aborted by its signal", {
        cause: this.opts.signal?.reason,
      }),
    );

  constructor(options: StreamOptions) {
    this.opts = options;
    this.conn = { baseUrl: baseUrlOf(options), apiKey: options.apiKey, fetch: fetchOf(options) };
    this.done = new Promise<StreamOutcome>((resolve, reject) => {
      this.settle = { resolve, reject };
    });
    const self = this;
    this.handle = {
      get streamId() {
        return self.streamId;
      },
      get paused() {
        return self.paused && !self.finished;
      },
      pause: () => this.pause(),
      resume: () => this.resume(),
      cancel: () => this.cancel(),
      approve: (callId, approve = true) => this.approve(callId, approve),
      done: this.done,
    };
  }

  // -- the handle ---------------------------------------------------------------------

  private pause(): Promise<PauseState | undefined> {
    return this.setPaused(true);
  }

  private resume(): Promise<PauseState | undefined> {
    return this.setPaused(false);
  }

  /** The gateway's pause or resume: on the socket when there is one, else over HTTP. */
  private async setPaused(paused: boolean): Promise<PauseState | undefined> {
    if (this.finished || this.stopped) return undefined;
    this.paused = paused;
    if (this.socket?.isOpen) {
      try {
        return (await this.socket.command({ type: paused ? "pause" : "resume" })) as PauseState;
      } catch (error) {
        if (this.doneData !== undefined) return undefined; // the stream ended meanwhile
        throw error;
      }
    }
    if (this.streamId === undefined) {
      this.pendingPause = paused; // sent with `stream.begin` (see `deliver`)
      return undefined;
    }
    return pauseStream(this.streamId, paused, this.conn);
  }

  private async cancel(): Promise<void> {
    if (this.finished || this.cancelRequested) return;
    this.cancelRequested = true;
    if (this.socket?.isOpen) {
      // The gateway answers a cancel once the stream has ended, after its `done`, which
      // closes the socket: the answer may never be read, and the cancel has worked.
      await this.socket.command({ type: "cancel" }).catch((error: unknown) => {
        if (this.doneData === undefined) throw error;
      });
    } else if (this.streamId !== undefined) await cancelStream(this.streamId, this.conn);
    // else: posted as soon as the stream id is known (see `dispatch`)
  }

  private async approve(callId: string, approve: boolean): Promise<void> {
    if (this.streamId === undefined) {
      throw new ToolForgeError("NOT_FOUND", "the stream has not started: no call waits yet");
    }
    await this.sendApproval(this.streamId, callId, approve);
  }

  /** An approval: on the socket when there is one, else `POST …/approvals/{call_id}`. */
  private async sendApproval(streamId: string, callId: string, approve: boolean): Promise<void> {
    if (this.socket?.isOpen) {
      await this.socket.command({ type: "approve", call_id: callId, approved: approve });
      return;
    }
    await approveCall(streamId, callId, approve, this.conn);
  }

  /** End the run early with `failure`: the connection closes and the stream is cancelled. */
  private stop(failure: unknown): void {
    if (this.stopped || this.finished) return;
    this.stopped = true;
    this.failure = failure;
    this.connection?.abort(failure);
    this.socket?.close();
    if (this.streamId !== undefined) {
      // Best effort: with on_disconnect "continue" the gateway would otherwise run on.
      cancelStream(this.streamId, this.conn).catch(() => undefined);
    }
  }

  // -- the loop -----------------------------------------------------------------------

  async run(): Promise<void> {
    const { signal, requestTimeoutMs } = this.opts;
    try {
      if (signal?.aborted) this.onAbort();
      signal?.addEventListener("abort", this.onAbort, { once: true });
      if (requestTimeoutMs !== undefined) {
        this.timer = setTimeout(
          () =>
            this.stop(
              new ToolForgeError(
                "REQUEST_TIMEOUT",
                `the stream did not finish within ${requestTimeoutMs} ms (requestTimeoutMs); it was cancelled`,
                { retryable: true },
              ),
            ),
          requestTimeoutMs,
        );
      }
      if (this.opts.transport === "ws") {
        let socket = await this.openSocket(false);
        while (!(await this.readSocket(socket))) {
          socket = await this.reconnect(() => this.openSocket(true));
        }
      } else {
        let response = await this.open(false);
        while (!(await this.read(response))) {
          response = await this.reconnect(() => this.open(true));
        }
      }
      this.finished = true;
      this.settle.resolve(this.outcome());
    } catch (error) {
      if (!this.stopped && this.streamId !== undefined) {
        // Given up (a lost connection, a protocol error): with on_disconnect "continue"
        // the stream would run on with nobody reading it. Best effort, as in `stop`.
        cancelStream(this.streamId, this.conn).catch(() => undefined);
      }
      this.finished = true;
      this.settle.reject(this.failure ?? error);
    } finally {
      if (this.timer !== undefined) clearTimeout(this.timer);
      signal?.removeEventListener("abort", this.onAbort);
      for (const tool of this.tools) tool.abort(new ToolForgeError("ABORTED", "the stream ended"));
    }
  }

  private body(): Record<string, unknown> {
    const o = this.opts;
    const body: Record<string, unknown> = {};
    if (o.input !== undefined) body.input = o.input;
    if (o.messages !== undefined) body.messages = o.messages;
    if (o.tools !== undefined) body.tools = o.tools;
    if (o.clientTools !== undefined && o.clientTools.length > 0) {
      body.client_tools = o.clientTools.map((t) => ({
        name: t.name,
        description: t.description ?? "",
        parameters: t.parameters ?? { type: "object" },
      }));
    }
    if (o.resultSchema !== undefined) body.result_schema = o.resultSchema;
    if (o.objectSchemas !== undefined) body.object_schemas = o.objectSchemas;
    if (o.mode !== undefined) body.mode = o.mode;
    if (o.sampling !== undefined) body.sampling = o.sampling;
    if (o.profile !== undefined) body.profile = o.profile;
    if (o.model !== undefined) body.model = o.model;
    if (o.maxToolCalls !== undefined) body.max_tool_calls = o.maxToolCalls;
    if (o.workflow !== undefined) body.workflow = o.workflow;
    if (o.resume !== false) body.on_disconnect = "continue";
    return { ...body, ...o.extra };
  }

  /** `POST /v1/stream`, or (`resuming`) `GET /v1/streams/{id}` after the last frame seen. */
  private async open(resuming: boolean): Promise<Response> {
    if (this.stopped) throw this.failure;
    this.connection = new AbortController();
    const base = this.conn.baseUrl as string;
    const init: RequestInit = resuming
      ? {
          method: "GET",
          headers: headersOf(this.conn, {
            Accept: "text/event-stream",
            "Last-Event-ID": String(this.lastId),
          }),
        }
      : {
          method: "POST",
          headers: headersOf(this.conn, {
            Accept: "text/event-stream",
            "Content-Type": "application/json",
            ...(this.opts.idempotencyKey ? { "Idempotency-Key": this.opts.idempotencyKey } : {}),
          }),
          body: JSON.stringify(this.body()),
        };
    const url = resuming
      ? `${base}/v1/streams/${encodeURIComponent(this.streamId as string)}`
      : `${base}/v1/stream`;
    let response: Response;
    try {
      response = await (this.conn.fetch as typeof fetch)(url, {
        ...init,
        signal: this.connection.signal,
        cache: "no-store",
      });
    } catch (cause) {
      if (this.stopped) throw this.failure;
      throw new ToolForgeError("CONNECTION_LOST", `${init.method} ${url}: ${String(cause)}`, {
        retryable: true,
        cause,
      });
    }
    if (!response.ok) throw await errorFromResponse(response, `${init.method} ${url}`);
    this.streamId ??= response.headers.get("X-Stream-Id") ?? undefined;
    if (response.body === null) {
      throw new ToolForgeError("PROTOCOL", `${init.method} ${url}: the response has no body`);
    }
    return response;
  }

  /**
   * A socket that starts the stream, or (`resuming`) resumes it after the last frame seen;
   * its first message is read here, so that a refusal rejects as an HTTP error would.
   */
  private async openSocket(resuming: boolean): Promise<StreamSocket> {
    if (this.stopped) throw this.failure;
    const Ctor = this.opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (Ctor === undefined) {
      throw new ToolForgeError(
        "BAD_REQUEST",
        'transport: "ws" needs a WebSocket: Node >= 22 and browsers have one; else pass `WebSocket` (the `ws` package\'s)',
      );
    }
    let socket: StreamSocket;
    try {
      socket = await StreamSocket.open(socketUrl(this.conn.baseUrl as string, this.conn.apiKey), Ctor);
    } catch (error) {
      throw await this.refusal(error);
    }
    this.socket = socket;
    socket.send(
      resuming
        ? { type: "resume", stream_id: this.streamId, after: this.lastId }
        : { type: "start", request: this.body() },
    );
    return socket;
  }

  /**
   * Why a socket did not open. A WebSocket API shows no handshake status, so the same
   * request is asked over HTTP: the gateway's access check answers it with its typed
   * error (a missing or unknown key); otherwise the connection was lost.
   */
  private async refusal(error: unknown): Promise<unknown> {
    try {
      const probe = await (this.conn.fetch as typeof fetch)(`${this.conn.baseUrl}/v1/stream/ws`, {
        headers: headersOf(this.conn),
        cache: "no-store",
      });
      if (probe.status === 401 || probe.status === 403) {
        return await errorFromResponse(probe, "GET /v1/stream/ws");
      }
    } catch {
      // unreachable over HTTP too: the connection is lost
    }
    return error;
  }

  /** Read one socket to its end: true once `done` arrived, false if it dropped first. */
  private async readSocket(socket: StreamSocket): Promise<boolean> {
    try {
      for (;;) {
        if (this.stopped) throw this.failure;
        const message: SocketMessage | undefined = await socket.next();
        if (this.stopped) throw this.failure;
        if (message === undefined) return false; // the socket dropped: resume
        if (message.kind === "error") throw message.error;
        this.dispatchFrame(message.id, message.event, message.data);
        if (this.doneData !== undefined) return true;
      }
    } finally {
      if (this.doneData !== undefined || this.stopped) socket.close();
    }
  }

  /** Reconnect after a drop, with backoff; throws when resuming is off or keeps failing. */
  private async reconnect<T>(open: () => Promise<T>): Promise<T> {
    const policy = this.opts.resume;
    if (policy === false || this.streamId === undefined) {
      throw new ToolForgeError(
        "CONNECTION_LOST",
        this.streamId === undefined
          ? "the connection dropped before the stream started"
          : `the connection to stream ${this.streamId} dropped after frame ${this.lastId} (resume is off)`,
        { retryable: true },
      );
    }
    const attempts = (typeof policy === "object" && policy.attempts) || 5;
    let delay = (typeof policy === "object" && policy.delayMs) || 200;
    let last: unknown;
    for (let attempt = 0; attempt < attempts; attempt++) {
      if (attempt > 0) {
        await this.sleep(delay);
        delay = Math.min(delay * 2, MAX_DELAY_MS);
      }
      try {
        const connection = await open();
        this.reconnects++;
        return connection;
      } catch (error) {
        if (this.stopped) throw this.failure;
        // 404: the stream expired (RESUME_TTL_S) or never was: trying again cannot help.
        if (error instanceof ToolForgeError && error.status !== undefined && error.status < 500) {
          throw error;
        }
        last = error;
      }
    }
    throw new ToolForgeError(
      "CONNECTION_LOST",
      `could not resume stream ${this.streamId} after frame ${this.lastId} (${attempts} attempts): ${String(last)}`,
      { retryable: true, cause: last },
    );
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }

  /** Read one response to its end: true once `done` arrived, false if it dropped first. */
  private async read(response: Response): Promise<boolean> {
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    const decoder = new TextDecoder();
    const queue: EventSourceMessage[] = [];
    const parser = createParser({ onEvent: (message) => queue.push(message) });
    try {
      for (;;) {
        while (queue.length > 0) {
          if (this.stopped) throw this.failure;
          this.dispatch(queue.shift() as EventSourceMessage);
          if (this.doneData !== undefined) return true;
        }
        if (this.stopped) throw this.failure;
        let chunk: ReadableStreamReadResult<Uint8Array>;
        try {
          chunk = await reader.read();
        } catch {
          if (this.stopped) throw this.failure;
          return false; // the connection dropped: resume
        }
        if (chunk.done) return false; // ended before `done`: resume
        parser.feed(decoder.decode(chunk.value, { stream: true }));
      }
    } finally {
      reader.cancel().catch(() => undefined);
    }
  }

  /** Deliver one event: bookkeeping, then the callbacks. A callback that throws ends the run. */
  private dispatch(message: EventSourceMessage): void {
    let id: number | undefined;
    if (message.id !== undefined && message.id !== "") {
      id = Number(message.id);
      if (!Number.isInteger(id)) throw this.protocol(`a frame id that is not a number: ${message.id}`);
      if (id <= this.lastId) return; // already delivered before a reconnect
    }
    let data: unknown;
    try {
      data = JSON.parse(message.data);
    } catch {
      throw this.protocol(`event ${message.event} carries data that is not JSON`);
    }
    this.dispatchFrame(id, message.event ?? "message", data);
  }

  /** Deliver one parsed frame (an SSE event's, or a socket message's). */
  private dispatchFrame(id: number | undefined, name: string, data: unknown): void {
    if (id !== undefined && id <= this.lastId) return; // already delivered before a reconnect
    if (id !== undefined) this.lastId = id;
    const event = { id, event: name, data } as StreamEvent;
    try {
      this.opts.onEvent?.(event);
      this.deliver(event);
    } catch (error) {
      this.stop(error);
      throw error;
    }
  }

  private deliver(event: StreamEvent): void {
    const o = this.opts;
    switch (event.event) {
      case "stream.begin":
        this.streamId = event.data.stream_id;
        if (this.cancelRequested) cancelStream(this.streamId, this.conn).catch(() => undefined);
        else if (this.pendingPause !== undefined) this.sendPendingPause();
        break;
      case "text.delta":
        this.text += event.data.chunk;
        o.onText?.(event.data.chunk);
        break;
      case "json.begin":
        o.onJSON?.({ id: event.data.id, schema: event.data.schema });
        break;
      case "json.delta":
        o.onJSON?.({ id: event.data.id, delta: event.data.chunk });
        break;
      case "json.end":
        this.objects.push(event.data);
        o.onJSON?.(endUpdate(event.data));
        break;
      case "result.begin":
        o.onResult?.({ id: event.data.id, schema: event.data.schema });
        break;
      case "result.delta":
        o.onResult?.({ id: event.data.id, delta: event.data.chunk });
        break;
      case "result.end":
        this.resultFrame = event.data;
        o.onResult?.(endUpdate(event.data));
        break;
      case "tool.call":
        if (event.data.executor === "client") this.runClientTool(event.data);
        else if (event.data.needs_approval && o.onApproval) this.askApproval(event.data);
        break;
      case "error":
        this.errorData = event.data;
        break;
      case "done":
        this.doneData = event.data;
        break;
      default:
        break; // the other frames reach onEvent only
    }
  }

  /** A pause asked before the stream id was known, now that it is (best effort). */
  private sendPendingPause(): void {
    const paused = this.pendingPause as boolean;
    this.pendingPause = undefined;
    const sent = this.socket?.isOpen
      ? this.socket.command({ type: paused ? "pause" : "resume" })
      : pauseStream(this.streamId as string, paused, this.conn);
    sent.catch(() => undefined);
  }

  private protocol(message: string): ToolForgeError {
    const error = new ToolForgeError("PROTOCOL", message);
    this.stop(error);
    return error;
  }

  // -- client-side tools and approvals ------------------------------------------------

  private runClientTool(call: ToolCallData): void {
    if (this.calls.has(call.id)) return; // a call runs once, whatever happens to the connection
    this.calls.add(call.id);
    const streamId = this.streamId as string;
    const controller = new AbortController();
    this.tools.add(controller);
    void (async () => {
      const body = await this.toolResult(call, streamId, controller);
      this.tools.delete(controller);
      if (this.finished || this.stopped) return;
      await this.post(streamId, call.id, body);
    })();
  }

  private async toolResult(
    call: ToolCallData,
    streamId: string,
    controller: AbortController,
  ): Promise<ToolResultBody> {
    const handler = this.opts.onToolCall;
    if (handler === undefined) {
      return {
        ok: false,
        error: {
          code: "CLIENT_TOOL_UNHANDLED",
          message: `the client has no onToolCall handler to run ${call.name}`,
        },
      };
    }
    const limit = this.opts.toolTimeoutMs;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<"timeout">((resolve) => {
      if (limit !== undefined) timer = setTimeout(() => resolve("timeout"), limit);
    });
    try {
      const work = Promise.resolve().then(() =>
        handler({ id: call.id, name: call.name, args: call.args, streamId, signal: controller.signal }),
      );
      const outcome = await Promise.race([work.then((value) => ({ value })), timedOut]);
      if (outcome === "timeout") {
        work.catch(() => undefined); // it may still fail after the deadline: nobody listens
        controller.abort(new ToolForgeError("CLIENT_TOOL_TIMEOUT", "toolTimeoutMs passed"));
        return {
          ok: false,
          error: {
            code: "CLIENT_TOOL_TIMEOUT",
            message: `${call.name} did not finish within ${limit} ms (the client's toolTimeoutMs)`,
          },
        };
      }
      return { ok: true, result: outcome.value === undefined ? null : outcome.value };
    } catch (error) {
      const code = (error as { code?: unknown })?.code;
      const message = error instanceof Error ? error.message : String(error);
      return {
        ok: false,
        error: {
          code: typeof code === "string" && CLIENT_CODE.test(code) ? code : "CLIENT_TOOL_FAILED",
          message: (message || `${call.name} failed`).slice(0, 4096),
        },
      };
    } finally {
      if (timer !== undefined) clearTimeout(timer);
    }
  }

  /**
   * Post a tool result (on the socket when there is one); a dropped connection is tried
   * again over HTTP, a 4xx is final.
   */
  private async post(streamId: string, callId: string, body: ToolResultBody): Promise<void> {
    if (this.socket?.isOpen) {
      try {
        await this.socket.command({ type: "tool_result", call_id: callId, ...body });
        return;
      } catch (error) {
        if (!(error instanceof ToolForgeError) || error.status !== undefined) return; // as below
      }
    }
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await postToolResult(streamId, callId, body, this.conn);
        return;
      } catch (error) {
        // 404: the gateway stopped waiting (its own timeout, the stream ended); 409: it
        // has a result already; 422: the result is refused. The stream reports each.
        if (!(error instanceof ToolForgeError) || error.status !== undefined) return;
        await this.sleep(200 * (attempt + 1));
      }
    }
  }

  private askApproval(call: ToolCallData): void {
    if (this.calls.has(call.id)) return;
    this.calls.add(call.id);
    const streamId = this.streamId as string;
    const decide = this.opts.onApproval as OnApproval;
    void (async () => {
      let approve = false;
      try {
        approve = (await decide({ ...call, streamId })) === true;
      } catch {
        approve = false; // a decision that fails is a refusal, never a silent approval
      }
      if (this.finished || this.stopped) return;
      await this.sendApproval(streamId, call.id, approve).catch(() => undefined);
    })();
  }

  private outcome(): StreamOutcome {
    const done = this.doneData as DoneData;
    return {
      streamId: this.streamId as string,
      reason: done.reason,
      done,
      result: this.resultFrame?.value,
      resultFrame: this.resultFrame,
      objects: this.objects,
      text: this.text,
      error: this.errorData,
      lastEventId: this.lastId,
      reconnects: this.reconnects,
    };
  }
}

function endUpdate(data: FrameDataMap["json.end"] | FrameDataMap["result.end"]): FrameUpdate {
  return {
    id: data.id,
    end: true,
    value: data.value,
    repaired: data.repaired,
    degraded: data.degraded,
  };
}
