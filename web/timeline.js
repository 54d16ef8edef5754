// The timeline: one list entry per thing that happened in a stream, built from its frames.
// Live streams and replays of past runs go through the same `add`. Everything a frame
// carries is model or tool output: it is only ever set as textContent, never as HTML.

/** Build an element: `el("span", {class: "badge"}, "text", child, …)`. Text is text. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const pretty = (value) => JSON.stringify(value, null, 2) ?? "undefined";

/** `[label, value]` rows for a summary object: nested objects become their leaves, each
 * labelled with its path (`prompt tokens details cached tokens`), lists a comma-separated
 * line, so every value shows as itself, never as `[object Object]`. */
export function summaryRows(object, prefix = "") {
  const rows = [];
  for (const [key, value] of Object.entries(object ?? {})) {
    const label = `${prefix}${key.replaceAll("_", " ")}`;
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      rows.push(...summaryRows(value, `${label} `));
    } else if (Array.isArray(value)) {
      const items = value.map((v) => (v !== null && typeof v === "object" ? JSON.stringify(v) : String(v)));
      rows.push([label, items.length ? items.join(", ") : "–"]);
    } else {
      rows.push([label, value ?? "–"]);
    }
  }
  return rows;
}
const ms = (value) =>
  typeof value !== "number" ? "–" : `${value < 10 ? value.toFixed(1) : Math.round(value)} ms`;

export class Timeline {
  /**
   * @param {HTMLOListElement} list
   * @param {{onApprove?: (callId: string, approve: boolean) => Promise<unknown>}} hooks
   */
  constructor(list, hooks = {}) {
    this.list = list;
    this.hooks = hooks;
    this.reset();
  }

  reset() {
    this.list.replaceChildren();
    this.frames = new Map(); // frame id (o1, r1) -> its entry
    this.calls = new Map(); // tool call id -> its entry
    this.last = undefined; // the last entry, to run text deltas together
  }

  /** A row: kind badge, title, the frame id and when, then a body. */
  entry(kind, title, { id, at } = {}) {
    const when = [id !== undefined ? `#${id}` : null, at !== undefined ? `+${Math.round(at)} ms` : null]
      .filter(Boolean)
      .join(" · ");
    const body = el("div", { class: "body" });
    const head = el(
      "div",
      { class: "head" },
      el("span", { class: "kind" }, kind),
      el("span", { class: "title" }, title),
      el("span", { class: "when" }, when),
    );
    const li = el("li", { class: `entry ${kind.replace(/\W+/g, "-")}`, "data-kind": kind }, head, body);
    li.body = body;
    li.head = head;
    this.list.append(li);
    li.scrollIntoView?.({ block: "nearest" });
    this.last = li;
    return li;
  }

  badge(li, text, tone = "") {
    li.head.insertBefore(el("span", { class: `badge ${tone}` }, text), li.head.lastChild);
  }

  /** One SDK event (`{id, event, data}`); `live`: approval buttons work; `at`: ms since start. */
  add(event, { at, live = false } = {}) {
    const { id, data } = event;
    const meta = { id, at };
    switch (event.event) {
      case "ping":
        return;
      case "stream.begin": {
        const li = this.entry("begin", `stream ${data.stream_id}`, meta);
        const budget = data.budget_tokens ? ` · budget ${data.budget_tokens} tokens` : "";
        li.body.append(el("span", {}, `model ${data.model} · mode ${data.mode}${budget}`));
        return;
      }
      case "text.delta":
      case "reasoning.delta": {
        const kind = event.event === "text.delta" ? "text" : "reasoning";
        if (this.last?.dataset.kind !== kind) this.entry(kind, "", meta).body.append(el("p"));
        this.last.body.lastChild.append(document.createTextNode(data.chunk));
        return;
      }
      case "json.begin":
      case "result.begin": {
        const kind = event.event === "json.begin" ? "object" : "result";
        const li = this.entry(kind, `${data.id} · ${data.schema}`, meta);
        li.body.append(el("pre", { class: "streaming" }));
        this.frames.set(data.id, li);
        return;
      }
      case "json.delta":
      case "result.delta": {
        this.frames.get(data.id)?.body.lastChild.append(document.createTextNode(data.chunk));
        return;
      }
      case "json.end":
      case "result.end": {
        const li = this.frames.get(data.id) ?? this.entry(event.event, data.id, meta);
        li.body.replaceChildren(el("pre", { class: "value" }, pretty(data.value)));
        this.badge(li, data.degraded ? "degraded" : data.repaired ? "repaired" : "valid", data.degraded ? "bad" : data.repaired ? "warn" : "good");
        this.badge(li, `${data.length} B`);
        if (data.diagnostics) li.body.append(el("pre", { class: "diagnostics" }, pretty(data.diagnostics)));
        return;
      }
      case "tool.call": {
        const li = this.entry("tool.call", `${data.name}`, meta);
        this.calls.set(data.id, li);
        this.badge(li, data.id);
        this.badge(li, data.executor ?? "server", data.executor === "client" ? "warn" : "");
        if (data.rescued) this.badge(li, "rescued", "warn");
        li.body.append(el("pre", { class: "args" }, pretty(data.args)));
        if (data.needs_approval) this.approval(li, data.id, live);
        return;
      }
      case "tool.result": {
        const li = this.entry("tool.result", `${data.name}`, meta);
        this.badge(li, data.id);
        this.badge(li, data.ok ? "ok" : data.error?.code ?? "error", data.ok ? "good" : "bad");
        this.badge(li, ms(data.duration_ms));
        if (data.attempts !== 1) this.badge(li, `${data.attempts} attempts`);
        if (data.cached) this.badge(li, "cached");
        if (data.performance_warning) this.badge(li, "slow", "warn");
        li.body.append(
          data.ok
            ? el("pre", { class: "result" }, pretty(data.result))
            : el("p", { class: "error-message" }, data.error?.message ?? ""),
        );
        this.settleApproval(data.id);
        return;
      }
      case "step.nudge": {
        const li = this.entry("nudge", `${data.kind} · tier ${data.tier}`, meta);
        if (data.call_id) this.badge(li, data.call_id);
        li.body.append(el("p", {}, data.message));
        return;
      }
      case "context.compacted": {
        const li = this.entry("compacted", `phase ${data.phase}`, meta);
        li.body.append(
          el(
            "p",
            {},
            `${data.tokens_before} → ${data.tokens_after} tokens (budget ${data.budget_tokens}), ` +
              `${data.messages_before} → ${data.messages_after} messages`,
          ),
        );
        return;
      }
      case "error": {
        const li = this.entry("error", data.code, meta);
        if (data.retryable) this.badge(li, "retryable", "warn");
        li.body.append(el("p", { class: "error-message" }, data.message));
        return;
      }
      case "done": {
        const li = this.entry("done", data.reason, meta);
        this.badge(li, data.reason, data.reason === "stop" ? "good" : "warn");
        const m = data.metrics ?? {};
        const rows = [
          ["time to first token", ms(m.ttft_ms)],
          ["duration", ms(m.duration_ms)],
          ["tokens/s", m.tokens_per_s ?? "–"],
          ["frames", m.frames ?? "–"],
          ...summaryRows(data.usage),
          ...summaryRows(data.guardrails, "guardrail "),
          ...summaryRows(data.workflow, "workflow "),
        ];
        li.body.append(
          el("dl", { class: "timings" }, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
        );
        for (const pending of this.calls.values()) pending.querySelectorAll("button").forEach((b) => (b.disabled = true));
        return;
      }
      default: {
        const li = this.entry(event.event ?? "event", "", meta);
        li.body.append(el("pre", {}, pretty(data)));
      }
    }
  }

  /** An SDK error (the request failed, a timeout, a lost connection). */
  failure(error) {
    const li = this.entry("error", error.code ?? error.name ?? "error");
    li.body.append(el("p", { class: "error-message" }, error.message ?? String(error)));
  }

  approval(li, callId, live) {
    const approve = el("button", { type: "button", class: "approve", "data-call-id": callId, disabled: !live }, "Approve");
    const deny = el("button", { type: "button", class: "deny", "data-call-id": callId, disabled: !live }, "Deny");
    const note = el("span", { class: "decision" }, live ? "waiting for approval" : "needed approval");
    const decide = async (yes) => {
      approve.disabled = deny.disabled = true;
      note.textContent = yes ? "approving…" : "denying…";
      try {
        await this.hooks.onApprove?.(callId, yes);
        note.textContent = yes ? "approved" : "denied";
      } catch (error) {
        note.textContent = `not sent: ${error.message ?? error}`;
      }
    };
    approve.addEventListener("click", () => decide(true));
    deny.addEventListener("click", () => decide(false));
    li.body.append(el("div", { class: "approval" }, approve, deny, note));
  }

  settleApproval(callId) {
    const li = this.calls.get(callId);
    li?.querySelectorAll(".approval button").forEach((b) => (b.disabled = true));
  }
}
