"""The turn engine (sans-IO): one model conversation as a step machine.

:class:`Conversation` yields :mod:`actions <toolforge.core.engine.actions>` and receives their
results; each mode of docs/protocol.md is a :class:`~toolforge.core.engine.modes.Mode` strategy. The
runtime's ``StreamSession`` is the driver: it does the I/O the actions ask for.
docs/architecture.md draws the whole flow.
"""

from toolforge.core.engine.actions import (
    MODEL_END,
    Action,
    AskModel,
    CallModel,
    CountTokens,
    Emit,
    Finish,
    ModelEnd,
    ModelEvent,
    ModelReply,
    ReadModel,
    RefuseTool,
    RepairBody,
    RunTool,
    StopModel,
    ToolOutcome,
)
from toolforge.core.engine.conversation import (
    Conversation,
    ConversationConfig,
    ConversationStats,
    Flow,
)
from toolforge.core.engine.modes import (
    ConstrainedMode,
    Mode,
    NativeMode,
    ReaderLimits,
    SentinelMode,
    Turn,
    TurnReader,
    mode_named,
)

__all__ = [
    "MODEL_END",
    "Action",
    "AskModel",
    "CallModel",
    "ConstrainedMode",
    "Conversation",
    "ConversationConfig",
    "ConversationStats",
    "CountTokens",
    "Emit",
    "Finish",
    "Flow",
    "Mode",
    "ModelEnd",
    "ModelEvent",
    "ModelReply",
    "NativeMode",
    "ReadModel",
    "ReaderLimits",
    "RefuseTool",
    "RepairBody",
    "RunTool",
    "SentinelMode",
    "StopModel",
    "ToolOutcome",
    "Turn",
    "TurnReader",
    "mode_named",
]
