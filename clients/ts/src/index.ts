/**
 * The ToolForge TypeScript SDK: `startStream` for `POST /v1/stream` (typed frames,
 * client-side tools, pause/resume, resume after a drop, timeouts) and the gateway's small
 * JSON endpoints. ESM, for Node >= 20 and browsers; its one dependency is
 * `eventsource-parser`.
 */
export * from "./frames.js";
export { ToolForgeError } from "./errors.js";
export {
  approveCall,
  cancelStream,
  type ConnectionOptions,
  getRun,
  listRuns,
  pauseStream,
  type PauseState,
  postToolResult,
  type RunDetail,
  type RunSummary,
  type ToolResultBody,
} from "./http.js";
export {
  type ApprovalRequest,
  type ChatMessage,
  type ClientTool,
  type FrameUpdate,
  type OnApproval,
  type OnEvent,
  type OnJSON,
  type OnResult,
  type OnText,
  type OnToolCall,
  type ResumePolicy,
  startStream,
  type StreamHandle,
  type StreamOptions,
  type StreamOutcome,
  type ToolCall,
} from "./stream.js";
export type { WebSocketConstructor } from "./socket.js";
