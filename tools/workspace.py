"""The workspace pack (docs/tools.md, ``TOOL_PACKS=workspace``): state kept apart from the chat.

A workspace holds ``facts`` (authoritative state), ``draft`` (working state the model may
edit), ``locks`` (keys nothing may change implicitly) and the ``proposals`` made to facts,
with an append-only ``audit`` of every change. It lives in one SQLite file
(``WORKSPACE_DB``, default ``<ARTIFACTS_DIR>/workspace.sqlite``), so replicas that share the
file, and ``toolforge workspace`` beside a running gateway, see one state; each change is
one ``BEGIN IMMEDIATE`` transaction with its audit row.

Model-facing tools:

* ``workspace.get``: read facts, draft, locks and pending proposals (or one key of them).
* ``draft.set``: set (or, with ``null``, remove) a draft key. A locked key is refused
  (``WORKSPACE_LOCKED``).
* ``facts.propose``: propose a fact. It changes no fact: it records a pending proposal
  (superseding an earlier pending one for the key) and, because its spec says
  ``confirm_with="facts.commit"``, the gateway then calls ``facts.commit`` itself, a call
  that waits for a person's ``POST /v1/streams/{id}/approvals/{call_id}``. The model is told
  the outcome (``confirmation.confirmed``) in the proposal's result.

Hidden (``model_facing=False``, ``needs_approval=True``):

* ``facts.commit``: commit a pending proposal, exactly as proposed. The model is never shown
  it and cannot run it (the executor refuses hidden tools to the model); the gateway's
  confirming call runs only after an approval. A denied or timed-out approval leaves the
  proposal pending and every fact as it was.

Locks are the user's: ``toolforge workspace lock KEY`` (or :meth:`Workspace.lock`). The
seed's "prefer implicit context over passing identifiers" holds: there is one workspace per
gateway, never named in the arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from toolforge.core.tool_specs import PermanentToolError, ToolSpec
from toolforge.errors import ErrorCode
from toolforge.settings import Settings

__all__ = [
    "COMMIT",
    "PROPOSE",
    "CommitArgs",
    "DraftSetArgs",
    "ProposeArgs",
    "Workspace",
    "WorkspaceGetArgs",
    "pack_tools",
    "workspace_path",
]

PROPOSE: Final = "facts.propose"
COMMIT: Final = "facts.commit"
# Keys are short dotted names ("guest.name"); values any JSON of at most this size.
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_MAX_VALUE_BYTES: Final = 16 * 1024

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS facts (key TEXT PRIMARY KEY, value TEXT NOT NULL,
    updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS draft (key TEXT PRIMARY KEY, value TEXT NOT NULL,
    updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS locks (key TEXT PRIMARY KEY, reason TEXT NOT NULL,
    locked_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS proposals (id TEXT PRIMARY KEY, key TEXT NOT NULL,
    value TEXT NOT NULL, reason TEXT NOT NULL, status TEXT NOT NULL,
    created_at REAL NOT NULL, decided_at REAL);
CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL,
    actor TEXT NOT NULL, action TEXT NOT NULL, key TEXT, before TEXT, after TEXT,
    proposal_id TEXT, detail TEXT);
"""

Actor = Literal["model", "user", "gateway"]


def workspace_path(settings: Settings) -> Path:
    """``WORKSPACE_DB``, or ``<ARTIFACTS_DIR>/workspace.sqlite``."""
    return settings.workspace_db or settings.artifacts_dir / "workspace.sqlite"


def _dump(value: object) -> str:
    return orjson.dumps(value).decode()


def _load(text: str | None) -> object:
    return None if text is None else orjson.loads(text)


def _check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(
            "a key is 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
        )
    return key


def _check_value(value: object) -> object:
    size = len(orjson.dumps(value))
    if size > _MAX_VALUE_BYTES:
        raise ValueError(f"the value is {size} bytes of JSON; at most {_MAX_VALUE_BYTES}")
    return value


class Workspace:
    """One workspace over a SQLite file. Every method is synchronous and short (one
    transaction); the tools run them in a worker thread. A refusal is a
    :class:`PermanentToolError` with a stable code, which the model can read."""

    def __init__(self, path: Path, *, clock: Any = time.time) -> None:
        self.path = path
        self._clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=5.0)
        try:  # executescript commits on its own: not inside _tx
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        finally:
            db.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken up front (``BEGIN IMMEDIATE``) so that a check and
        the change it allows cannot interleave with another writer's."""
        db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def _audit(
        self,
        db: sqlite3.Connection,
        actor: Actor,
        action: str,
        key: str | None,
        before: object = None,
        after: object = None,
        proposal_id: str | None = None,
        detail: str | None = None,
    ) -> None:
        db.execute(
            "INSERT INTO audit (at, actor, action, key, before, after, proposal_id, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._clock(),
                actor,
                action,
                key,
                _dump(before),
                _dump(after),
                proposal_id,
                detail,
            ),
        )

    @staticmethod
    def _locked(db: sqlite3.Connection, key: str) -> str | None:
        row = db.execute("SELECT reason FROM locks WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    def _refuse_locked(key: str, reason: str, what: str) -> PermanentToolError:
        return PermanentToolError(
            f"{key!r} is locked ({reason or 'no reason given'}): {what} cannot change it; "
            "tell the user, who can unlock it",
            code=ErrorCode.WORKSPACE_LOCKED,
        )

    # -- reads ------------------------------------------------------------------------------

    def snapshot(self, section: str = "all", key: str | None = None) -> dict[str, Any]:
        """Facts, draft, locks and pending proposals (``section`` one of them, or
        ``all``), optionally only ``key``."""
        with self._tx() as db:
            out: dict[str, Any] = {}
            where, params = ("WHERE key = ?", (key,)) if key is not None else ("", ())
            if section in ("all", "facts"):
                rows = db.execute(f"SELECT key, value FROM facts {where} ORDER BY key", params)
                out["facts"] = {k: _load(v) for k, v in rows}
            if section in ("all", "draft"):
                rows = db.execute(f"SELECT key, value FROM draft {where} ORDER BY key", params)
                out["draft"] = {k: _load(v) for k, v in rows}
            if section in ("all", "locks"):
                rows = db.execute(f"SELECT key, reason FROM locks {where} ORDER BY key", params)
                out["locks"] = dict(rows)
            if section in ("all", "proposals"):
                sql = "SELECT id, key, value, reason FROM proposals WHERE status = 'pending'"
                sql += " AND key = ?" if key is not None else ""
                rows = db.execute(sql + " ORDER BY created_at", params)
                out["pending"] = [
                    {"proposal_id": i, "key": k, "value": _load(v), "reason": r}
                    for i, k, v, r in rows
                ]
            return out

    def audit(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` audit entries, oldest first."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT seq, at, actor, action, key, before, after, proposal_id, detail "
                "FROM audit ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            {
                "seq": seq,
                "at": at,
                "actor": actor,
                "action": action,
                "key": key,
                "before": _load(before),
                "after": _load(after),
                "proposal_id": pid,
                "detail": detail,
            }
            for seq, at, actor, action, key, before, after, pid, detail in reversed(rows)
        ]

    def proposal(self, proposal_id: str) -> dict[str, Any] | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT key, value, reason, status FROM proposals WHERE id = ?", (proposal_id,)
            ).fetchone()
        if row is None:
            return None
        key, value, reason, status = row
        return {
            "proposal_id": proposal_id,
            "key": key,
            "value": _load(value),
            "reason": reason,
            "status": status,
        }

    # -- changes ----------------------------------------------------------------------------

    def set_draft(self, key: str, value: object, *, actor: Actor = "model") -> dict[str, Any]:
        """Set draft ``key`` (``None`` removes it); refused when ``key`` is locked."""
        with self._tx() as db:
            reason = self._locked(db, key)
            if reason is not None:
                raise self._refuse_locked(key, reason, "draft.set")
            row = db.execute("SELECT value FROM draft WHERE key = ?", (key,)).fetchone()
            before = _load(row[0]) if row else None
            if value is None:
                db.execute("DELETE FROM draft WHERE key = ?", (key,))
            else:
                db.execute(
                    "INSERT INTO draft (key, value, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                    "updated_at = excluded.updated_at",
                    (key, _dump(value), self._clock()),
                )
            self._audit(db, actor, "draft.set", key, before, value)
        return {"key": key, "before": before, "after": value}

    def propose(
        self, key: str, value: object, reason: str, *, actor: Actor = "model"
    ) -> dict[str, Any]:
        """Record a pending proposal for fact ``key`` (superseding a pending one for it);
        no fact changes. Refused when ``key`` is locked."""
        with self._tx() as db:
            locked = self._locked(db, key)
            if locked is not None:
                raise self._refuse_locked(key, locked, PROPOSE)
            row = db.execute("SELECT value FROM facts WHERE key = ?", (key,)).fetchone()
            before = _load(row[0]) if row else None
            now = self._clock()
            old = db.execute(
                "SELECT id FROM proposals WHERE key = ? AND status = 'pending'", (key,)
            ).fetchall()
            for (old_id,) in old:
                db.execute(
                    "UPDATE proposals SET status = 'superseded', decided_at = ? WHERE id = ?",
                    (now, old_id),
                )
                self._audit(db, actor, "proposal.superseded", key, proposal_id=old_id)
            proposal_id = f"p_{uuid.uuid4().hex[:12]}"
            db.execute(
                "INSERT INTO proposals (id, key, value, reason, status, created_at) "
                "VALUES (?, ?, ?, ?, 'pending', ?)",
                (proposal_id, key, _dump(value), reason, now),
            )
            self._audit(db, actor, PROPOSE, key, before, value, proposal_id, reason)
        return {
            "proposal_id": proposal_id,
            "key": key,
            "value": value,
            "before": before,
            "reason": reason,
        }

    def commit(
        self, proposal_id: str, key: str, value: object, *, actor: Actor = "user"
    ) -> dict[str, Any]:
        """Make pending proposal ``proposal_id`` a fact, exactly as it was proposed
        (``key`` and ``value`` must match it: what a person approved is what commits)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT key, value, status FROM proposals WHERE id = ?", (proposal_id,)
            ).fetchone()
            if row is None:
                raise PermanentToolError(
                    f"no proposal {proposal_id!r}", code=ErrorCode.PROPOSAL_INVALID
                )
            p_key, p_value, status = row
            if status != "pending":
                raise PermanentToolError(
                    f"proposal {proposal_id!r} is {status}, not pending; propose again",
                    code=ErrorCode.PROPOSAL_INVALID,
                )
            if p_key != key or _load(p_value) != value:
                raise PermanentToolError(
                    f"proposal {proposal_id!r} was for {p_key!r} with another value; only "
                    "what was proposed can be committed",
                    code=ErrorCode.PROPOSAL_INVALID,
                )
            locked = self._locked(db, key)
            if locked is not None:  # locked after the proposal was made
                raise self._refuse_locked(key, locked, COMMIT)
            old = db.execute("SELECT value FROM facts WHERE key = ?", (key,)).fetchone()
            before = _load(old[0]) if old else None
            now = self._clock()
            db.execute(
                "INSERT INTO facts (key, value, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
                "updated_at = excluded.updated_at",
                (key, p_value, now),
            )
            db.execute(
                "UPDATE proposals SET status = 'committed', decided_at = ? WHERE id = ?",
                (now, proposal_id),
            )
            self._audit(db, actor, COMMIT, key, before, value, proposal_id)
        return {"proposal_id": proposal_id, "key": key, "value": value, "before": before}

    def lock(self, key: str, reason: str = "", *, actor: Actor = "user") -> None:
        _check_key(key)
        with self._tx() as db:
            db.execute(
                "INSERT INTO locks (key, reason, locked_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET reason = excluded.reason",
                (key, reason, self._clock()),
            )
            self._audit(db, actor, "lock", key, detail=reason or None)

    def unlock(self, key: str, *, actor: Actor = "user") -> bool:
        """Remove the lock on ``key``; whether there was one."""
        with self._tx() as db:
            gone = db.execute("DELETE FROM locks WHERE key = ?", (key,)).rowcount > 0
            if gone:
                self._audit(db, actor, "unlock", key)
        return gone


# -- the tools ------------------------------------------------------------------------------


# A key and a value, checked where the tools' arguments are parsed (TOOL_ARGS_INVALID).
Key = Annotated[str, AfterValidator(_check_key)]
Value = Annotated[Any, AfterValidator(_check_value)]


class WorkspaceGetArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    section: Literal["all", "facts", "draft", "locks", "proposals"] = "all"
    key: str | None = Field(None, description="Only this key.", max_length=128)


class DraftSetArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Key = Field(description="A dotted name, e.g. 'guest.name'.", max_length=128)
    value: Value = Field(description="Any JSON value; null removes the key from the draft.")


class ProposeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: Key = Field(description="A dotted name, e.g. 'guest.name'.", max_length=128)
    value: Value = Field(description="The fact's proposed value (any JSON).")
    reason: str = Field(description="Why, in a sentence, for the user.", max_length=500)


class CommitArgs(BaseModel):
    """What ``facts.propose`` returned: the gateway passes it on unchanged."""

    model_config = ConfigDict(extra="forbid")

    proposal_id: str = Field(max_length=64)
    key: str = Field(max_length=128)
    value: Any
    before: Any = None
    reason: str = Field("", max_length=500)


def pack_tools(settings: Settings, *, workspace: Workspace | None = None) -> list[ToolSpec[Any]]:
    """The four tools over ``workspace`` (default: the one at :func:`workspace_path`)."""
    ws = workspace or Workspace(workspace_path(settings))

    async def get(args: WorkspaceGetArgs) -> dict[str, Any]:
        return await asyncio.to_thread(ws.snapshot, args.section, args.key)

    async def draft_set(args: DraftSetArgs) -> dict[str, Any]:
        return await asyncio.to_thread(ws.set_draft, args.key, args.value)

    async def propose(args: ProposeArgs) -> dict[str, Any]:
        return await asyncio.to_thread(ws.propose, args.key, args.value, args.reason)

    async def commit(args: CommitArgs) -> dict[str, Any]:
        return await asyncio.to_thread(ws.commit, args.proposal_id, args.key, args.value)

    # Workspace values are the user's content, kept by the audit anyway; logs and
    # artifacts keep them too ("*"), like the tool results the user sees.
    everything = frozenset({"*"})
    return [
        ToolSpec(
            name="workspace.get",
            description="Read the workspace: facts (confirmed), draft (working state), "
            "locks and pending fact proposals; optionally one section or one key.",
            args_model=WorkspaceGetArgs,
            fn=get,
            retries=0,
            output_allowlist=everything,
        ),
        ToolSpec(
            name="draft.set",
            description="Set a draft key to a JSON value (null removes it). Locked keys "
            "cannot be changed.",
            args_model=DraftSetArgs,
            fn=draft_set,
            retries=0,
            output_allowlist=everything,
        ),
        ToolSpec(
            name=PROPOSE,
            description="Propose a fact. Facts change only when the user confirms; the "
            "result says whether they did (confirmation.confirmed).",
            args_model=ProposeArgs,
            fn=propose,
            retries=0,
            confirm_with=COMMIT,
            output_allowlist=everything,
        ),
        ToolSpec(
            name=COMMIT,
            description="Commit a proposed fact (the user's confirmation; never the model's).",
            args_model=CommitArgs,
            fn=commit,
            retries=0,
            needs_approval=True,
            model_facing=False,
            output_allowlist=everything,
        ),
    ]
