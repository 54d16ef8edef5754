/**
 * The WebSocket transport (`transport: "ws"`): one socket to `GET /v1/stream/ws` carries
 * the stream's frames and the client's commands (tool results, approvals, cancel).
 *
 * The gateway sends each frame as `{id, event, data}`, a command's answer as
 * `{type: "answer", to, answer}` and a refused message as `{type: "error", error}`
 * (docs/websocket.md). The socket offers the subprotocol `SUBPROTOCOL`: a gateway that
 * selects it sends each batch of frames as one message of JSON lines (one object per
 * line), one write per batch rather than one per frame. Every message is read as lines,
 * so a gateway that selects none (one object per message) reads the same. Answers come in the order the commands were sent, so each command
 * waits in a queue for the next answer (or refusal); frames queue for the stream's
 * reader. The API key travels as the `token` query parameter: browsers cannot set
 * headers on a WebSocket.
 */
import { ToolForgeError } from "./errors.js";

/** A WebSocket constructor: the global one (browsers, Node >= 22) or `ws`'s, undici's. */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocket;

/** The subprotocol of several frames per message, as JSON lines (`Sec-WebSocket-Protocol`). */
export const SUBPROTOCOL = "toolforge.frames.v1";

/** One message from the gateway, as parsed. */
export type SocketMessage =
  | { kind: "frame"; id: number; event: string; data: unknown }
  | { kind: "error"; error: ToolForgeError };

// A refusal on the socket carries the gateway's code, not an HTTP status: the status of
// the HTTP route that refuses the same way, so that callers can tell final from retryable.
const STATUS_BY_CODE: Record<string, number> = {
  BAD_REQUEST: 400,
  INVALID_SCHEMA: 422,
  UNKNOWN_SCHEMA: 422,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  TOOL_NOT_ALLOWED: 403,
  NOT_FOUND: 404,
  CONFLICT: 409,
  BODY_TOO_LARGE: 413,
  RATE_LIMITED: 429,
  INTERNAL: 500,
};

/** The `ToolForgeError` for the gateway's `{code, message, ...}` sent on a socket. */
export function socketError(error: Record<string, unknown>): ToolForgeError {
  const code = typeof error.code === "string" ? error.code : "BAD_REQUEST";
  const details = Array.isArray(error.details)
    ? (error.details as Record<string, string>[])
    : undefined;
  return new ToolForgeError(code, String(error.message ?? "refused"), {
    status: details ? 422 : (STATUS_BY_CODE[code] ?? 400),
    retryable: error.retryable === true,
    details,
  });
}

/** `http://host` → `ws://host/v1/stream/ws` (`https` → `wss`), with the key as `token`. */
export function socketUrl(baseUrl: string, apiKey: string | undefined): string {
  const url = new URL(`${baseUrl}/v1/stream/ws`);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (apiKey) url.searchParams.set("token", apiKey);
  return url.toString();
}

export class StreamSocket {
  private readonly ws: WebSocket;
  private readonly queue: SocketMessage[] = [];
  private readonly pending: Array<{
    resolve: (answer: unknown) => void;
    reject: (error: unknown) => void;
  }> = [];
  private wake: (() => void) | undefined;
  private closed = false;

  private constructor(ws: WebSocket) {
    this.ws = ws;
    ws.onmessage = (event: MessageEvent) => this.receive(event.data);
    ws.onclose = () => this.shut();
    ws.onerror = () => undefined; // a close follows
  }

  /** Open a socket; rejects with `CONNECTION_LOST` when it does not open (refused or unreachable). */
  static open(url: string, Ctor: WebSocketConstructor): Promise<StreamSocket> {
    return new Promise((resolve, reject) => {
      let ws: WebSocket;
      try {
        ws = new Ctor(url, [SUBPROTOCOL]);
      } catch (cause) {
        reject(new ToolForgeError("CONNECTION_LOST", `opening a socket: ${String(cause)}`, { cause }));
        return;
      }
      ws.onopen = () => resolve(new StreamSocket(ws));
      ws.onerror = () => undefined;
      ws.onclose = (event: CloseEvent) =>
        reject(
          new ToolForgeError(
            "CONNECTION_LOST",
            `the socket did not open (close code ${event.code}${event.reason ? `: ${event.reason}` : ""})`,
            { retryable: true },
          ),
        );
    });
  }

  get isOpen(): boolean {
    return !this.closed;
  }

  send(message: Record<string, unknown>): void {
    if (this.closed) throw new ToolForgeError("CONNECTION_LOST", "the socket is closed", { retryable: true });
    this.ws.send(JSON.stringify(message));
  }

  /** Send a command; resolves with its answer (the HTTP route's JSON), rejects with its refusal. */
  command(message: Record<string, unknown>): Promise<unknown> {
    return new Promise((resolve, reject) => {
      try {
        this.send(message);
      } catch (error) {
        reject(error);
        return;
      }
      this.pending.push({ resolve, reject });
    });
  }

  /** The next frame or refusal; `undefined` once the socket has closed and nothing is left. */
  async next(): Promise<SocketMessage | undefined> {
    while (this.queue.length === 0) {
      if (this.closed) return undefined;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
    }
    return this.queue.shift();
  }

  close(): void {
    this.ws.onmessage = null;
    try {
      this.ws.close();
    } catch {
      // closing twice is nothing
    }
    this.shut();
  }

  /** A message: one JSON object per line (one line unless the subprotocol was selected). */
  private receive(raw: unknown): void {
    for (const line of String(raw).split("\n")) {
      if (line) this.receiveOne(line);
    }
  }

  private receiveOne(line: string): void {
    let message: Record<string, unknown>;
    try {
      message = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.push({
        kind: "error",
        error: new ToolForgeError("PROTOCOL", "the gateway sent a socket message that is not JSON"),
      });
      return;
    }
    if (typeof message.event === "string" && typeof message.id === "number") {
      this.push({ kind: "frame", id: message.id, event: message.event, data: message.data });
    } else if (message.type === "answer") {
      this.pending.shift()?.resolve(message.answer);
    } else if (message.type === "error") {
      const error = socketError((message.error ?? {}) as Record<string, unknown>);
      const waiting = this.pending.shift();
      if (waiting) waiting.reject(error);
      else this.push({ kind: "error", error }); // a refused start or resume
    }
  }

  private push(message: SocketMessage): void {
    this.queue.push(message);
    this.wake?.();
    this.wake = undefined;
  }

  private shut(): void {
    if (this.closed) return;
    this.closed = true;
    for (const waiting of this.pending.splice(0)) {
      waiting.reject(new ToolForgeError("CONNECTION_LOST", "the socket closed", { retryable: true }));
    }
    this.wake?.();
    this.wake = undefined;
  }
}
