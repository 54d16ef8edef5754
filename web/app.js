// The demo UI: a request form, a live timeline of the stream's frames, and past runs
// replayed from the artifacts. Built on the TypeScript SDK (served at /sdk/ from
// clients/ts/dist): startStream for the stream, approvals and cancel through its handle,
// listRuns/getRun for the replay.
import { getRun, listRuns, startStream } from "/sdk/index.js";

import { el, Timeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);
const form = $("request");
const status = $("status");
const runButton = $("run");
const pauseButton = $("pause");
const cancelButton = $("cancel");

let handle;
const timeline = new Timeline($("timeline"), {
  onApprove: (callId, approve) => handle.approve(callId, approve),
});

function setStatus(state, text = state) {
  status.dataset.state = state;
  status.textContent = text;
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function loadTools() {
  const box = $("tools");
  try {
    const { tools } = await getJSON("/v1/tools");
    $("tools-hint").remove();
    for (const tool of tools) {
      const checkbox = el("input", { type: "checkbox", name: "tool", value: tool.name, checked: true });
      const label = el("label", { class: "tool", title: tool.description ?? "" }, checkbox, ` ${tool.name}`);
      if (tool.needs_approval) label.append(el("span", { class: "badge warn" }, "approval"));
      box.append(label);
    }
  } catch (error) {
    $("tools-hint").textContent = `tools unavailable: ${error.message}`;
  }
}

async function loadWorkflows() {
  // GET /v1/workflows where the gateway has workflows; the field stays free text anyway.
  try {
    const body = await getJSON("/v1/workflows");
    const list = Array.isArray(body) ? body : body.workflows ?? [];
    $("workflows").replaceChildren(
      ...list.map((w) => el("option", { value: typeof w === "string" ? w : w.name })),
    );
  } catch {
    // no workflows here
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The runs list; `expect`: a stream that just ended, whose artifacts are written just
 * after its `done` frame, so the list is asked again until it has it (up to 3 s). */
async function loadRuns(expect) {
  const list = $("runs");
  try {
    let runs = await listRuns({ limit: 50 });
    for (let i = 0; expect && i < 15 && !runs.some((r) => r.stream_id === expect); i++) {
      await sleep(200);
      runs = await listRuns({ limit: 50 });
    }
    list.replaceChildren(
      ...runs.map((run) =>
        el(
          "li",
          {},
          el(
            "button",
            { type: "button", class: "run", "data-stream-id": run.stream_id },
            el("span", { class: `badge ${run.reason === "stop" ? "good" : "warn"}` }, run.reason ?? "?"),
            el("span", { class: "run-input" }, run.input ?? run.stream_id),
            el("span", { class: "run-meta" }, `${run.stream_id} · ${run.ended_at.replace("T", " ").replace("+00:00", "Z")}`),
          ),
        ),
      ),
    );
    if (runs.length === 0) list.append(el("li", { class: "hint" }, "no runs yet"));
  } catch (error) {
    list.replaceChildren(el("li", { class: "hint" }, `runs unavailable: ${error.message}`));
  }
}

async function replay(streamId) {
  if (handle) return; // a live stream owns the timeline
  timeline.reset();
  $("timeline-title").textContent = `Replay of ${streamId}`;
  setStatus("replay", "replaying");
  try {
    const run = await getRun(streamId);
    for (const frame of run.frames) timeline.add(frame);
    if (run.truncated) timeline.failure({ code: "TRUNCATED", message: "the run is longer than the replay reads" });
    setStatus("idle", "replayed");
  } catch (error) {
    timeline.failure(error);
    setStatus("error", error.code ?? "error");
  }
}

// A client-side tool (docs/tools.md): the model may call it, this page runs it (the SDK's
// onToolCall) and posts the result; the timeline marks its call "client".
const CLOCK = {
  name: "browser.clock",
  description: "The current date, time and time zone of the user's browser.",
  parameters: { type: "object", properties: {}, additionalProperties: false },
};

function clock() {
  return {
    iso: new Date().toISOString(),
    time_zone: Intl.DateTimeFormat().resolvedOptions().timeZone,
  };
}

function request() {
  const data = new FormData(form);
  const tools = [...form.querySelectorAll("input[name=tool]")];
  const checked = tools.filter((t) => t.checked).map((t) => t.value);
  const objects = String(data.get("objects") ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  const workflow = String(data.get("workflow") ?? "").trim();
  return {
    input: String(data.get("input") ?? ""),
    // every tool checked: leave the default (all model-facing tools)
    tools: checked.length === tools.length ? undefined : checked,
    mode: String(data.get("mode")),
    objectSchemas: objects.length ? objects : undefined,
    workflow: workflow || undefined,
    profile: $("profile").checked ? "demo" : undefined,
    clientTools: $("clock").checked ? [CLOCK] : undefined,
  };
}

async function run(event) {
  event.preventDefault();
  if (handle) return;
  timeline.reset();
  $("timeline-title").textContent = "Live";
  const started = performance.now();
  setStatus("running", "connecting");
  runButton.disabled = true;
  pauseButton.disabled = cancelButton.disabled = false;
  pauseButton.textContent = "Pause";
  handle = startStream({
    ...request(),
    onToolCall: (call) => (call.name === CLOCK.name ? clock() : Promise.reject(new Error(`no client tool ${call.name}`))),
    toolTimeoutMs: 10_000,
    onEvent: (e) => {
      if (e.event === "stream.begin") setStatus("running", "streaming");
      timeline.add(e, { at: performance.now() - started, live: true });
    },
  });
  try {
    const outcome = await handle.done;
    setStatus(outcome.reason === "stop" ? "done" : "warn", `done · ${outcome.reason}`);
  } catch (error) {
    timeline.failure(error);
    setStatus("error", error.code ?? "error");
  } finally {
    const streamId = handle.streamId;
    handle = undefined;
    runButton.disabled = false;
    pauseButton.disabled = cancelButton.disabled = true;
    loadRuns(streamId);
  }
}

form.addEventListener("submit", run);
pauseButton.addEventListener("click", () => {
  if (!handle) return;
  if (handle.paused) {
    handle.resume();
    pauseButton.textContent = "Pause";
    setStatus("running", "streaming");
  } else {
    handle.pause();
    pauseButton.textContent = "Resume";
    setStatus("paused", "paused (the model waits)");
  }
});
cancelButton.addEventListener("click", () => {
  handle?.cancel().catch((error) => timeline.failure(error));
});
$("refresh").addEventListener("click", () => loadRuns());
$("runs").addEventListener("click", (event) => {
  const button = event.target.closest("button.run");
  if (button) replay(button.dataset.streamId);
});

loadTools();
loadWorkflows();
loadRuns();
document.body.dataset.ready = "true";
