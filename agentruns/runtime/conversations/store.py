"""Pydantic AI's `ConversationStore` over our tables (`Thread`, `ThreadMessage`).

The store's five primitives are plain ORM work; its methods are coroutines only because the base
class is: none of them ever suspends, so `run_now` drives one to its end on the calling thread
(with its connection and inside its transaction). Called from a slice it runs on the slice's
lane (`engine/lanes.py`), as every unit's database work does.

Who said a message is read from the message itself: a user prompt carries its author and sender
in `ModelRequest.metadata` (`author_metadata`); every other message is the agent's, of the run
the store was made for.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from pydantic import TypeAdapter
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.usage import RunUsage

from agentruns.models import Author, Thread, ThreadMessage
from agentruns.registry.waits.messages import ask_customer

T = TypeVar("T")
META = "agentruns"  # our key in a message's metadata
ASK_CUSTOMER = ask_customer.__name__  # the tool whose question and reply people read as said
USAGE = TypeAdapter(RunUsage)
DEFERRED = TypeAdapter(DeferredToolRequests)


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (the store's), on this thread."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a conversation store call suspended: it must not")


def author_metadata(author: str, user_id: int | None, text: str) -> dict[str, Any]:
    """Who sent a prompt, and its text as they wrote it (the prompt may be the run's whole
    input as JSON, for an agent that reads that)."""
    return {META: {"author": author, "user": user_id, "text": text}}


def dump_message(message: ModelMessage) -> Any:
    return ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]


def load_message(data: Any) -> ModelMessage:
    return ModelMessagesTypeAdapter.validate_python([data])[0]


def message_text(message: ModelMessage) -> str:
    """What people read of a message: a prompt's text (or the reply to the agent's question), a
    response's text and the questions it asks the customer (or else the tools it calls)."""
    meta = (getattr(message, "metadata", None) or {}).get(META)
    if isinstance(meta, dict) and isinstance(meta.get("text"), str):
        return meta["text"]
    if isinstance(message, ModelRequest):
        texts = [p.content for p in message.parts if isinstance(p, UserPromptPart)]
        texts += [reply["reply"] for reply in _replies(message)]
        return "\n".join(t if isinstance(t, str) else str(t) for t in texts)
    if isinstance(message, ModelResponse):
        said = ["".join(p.content for p in message.parts if isinstance(p, TextPart))]
        said += [_question(p) for p in message.parts if isinstance(p, ToolCallPart)]
        if text := "\n".join(s for s in said if s):
            return text
        calls = [p.tool_name for p in message.parts if isinstance(p, ToolCallPart)]
        return f"(calls {', '.join(calls)})" if calls else ""
    return ""


def _question(call: ToolCallPart) -> str:
    """The question of an `ask_customer` call ("" for any other call)."""
    if call.tool_name != ASK_CUSTOMER:
        return ""
    try:
        question = call.args_as_dict().get("question")
    except ValueError:  # arguments the model broke: the call was refused, not asked
        return ""
    return question if isinstance(question, str) else ""


def _replies(message: ModelRequest) -> list[dict[str, Any]]:
    """The replies to the agent's questions the request returns (`ask_customer`'s results)."""
    return [
        p.content
        for p in message.parts
        if isinstance(p, ToolReturnPart)
        and p.tool_name == ASK_CUSTOMER
        and isinstance(p.content, dict)
        and isinstance(p.content.get("reply"), str)
    ]


def _said_by(message: ModelMessage) -> tuple[str, int | None]:
    meta = (getattr(message, "metadata", None) or {}).get(META)
    if isinstance(message, ModelRequest) and isinstance(meta, dict):
        return str(meta.get("author") or Author.CUSTOMER), meta.get("user")
    if isinstance(message, ModelRequest) and (replies := _replies(message)):
        author = replies[0].get("from")
        return (author if author in (Author.CUSTOMER, Author.STAFF) else Author.CUSTOMER), None
    return Author.AGENT, None


def _record(thread: Thread) -> ConversationRecord:
    return ConversationRecord(
        conversation_id=thread.id,
        head_id=thread.head_id,
        usage=USAGE.validate_python(thread.usage) if thread.usage else RunUsage(),
        deferred_tool_requests=DEFERRED.validate_python(thread.deferred)
        if thread.deferred
        else None,
        scope=thread.scope or None,
        forked_from=thread.forked_from or None,
        forked_at=thread.forked_at or None,
        branches=list(thread.branches or []),
        revision=thread.revision,
        updated_at=thread.updated_at,
    )


def _entry(row: ThreadMessage) -> ConversationEntry:
    return ConversationEntry(id=row.id, parent_id=row.parent_id, message=load_message(row.message))


HISTORY_SQL = (
    "WITH RECURSIVE chain(id, parent_id, depth) AS ("
    " SELECT id, parent_id, 0 FROM {table} WHERE id = %s"
    " UNION ALL SELECT m.id, m.parent_id, chain.depth + 1 FROM {table} m"
    " JOIN chain ON m.id = chain.parent_id"
    ") SELECT id FROM chain ORDER BY depth DESC"
)


class ThreadStore(ConversationStore):
    """The conversations of threads. `agent`: the agent of a thread this store creates;
    `run_id`: the run whose answer it saves (its messages are that run's)."""

    def __init__(self, *, agent: str = "", run_id: Any = None) -> None:
        self.agent, self.run_id = agent, run_id

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        thread = Thread.objects.filter(id=conversation_id).first()
        return None if thread is None else _record(thread)

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        threads = Thread.objects.order_by("-updated_at")
        if scope is not None:
            threads = threads.filter(scope=scope)
        return [_record(t) for t in threads[:limit]]

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        fields = {
            "head_id": record.head_id,
            "revision": record.revision,
            "usage": USAGE.dump_python(record.usage, mode="json"),
            "deferred": DEFERRED.dump_python(record.deferred_tool_requests, mode="json")
            if record.deferred_tool_requests is not None
            else None,
            "scope": record.scope or "",
            "forked_from": record.forked_from or "",
            "forked_at": record.forked_at or "",
            "branches": list(record.branches),
            "updated_at": _aware(record.updated_at),
        }
        try:
            with transaction.atomic():
                if expected_revision is None:
                    thread = Thread(id=record.conversation_id, agent=self.agent, **fields)
                    thread.save(force_insert=True)
                else:
                    thread = (
                        Thread.objects.select_for_update().filter(id=record.conversation_id).first()
                    )
                    if thread is None or thread.revision != expected_revision:
                        raise ConversationConflict(record.conversation_id)
                self._insert(thread, new_entries)
                if expected_revision is not None:
                    Thread.objects.filter(id=thread.id).update(**fields)
                if (
                    record.head_id is not None
                    and not ThreadMessage.objects.filter(id=record.head_id).exists()
                ):
                    raise ConversationConflict(record.conversation_id)
        except IntegrityError:
            raise ConversationConflict(record.conversation_id) from None

    def _insert(self, thread: Thread, entries: Sequence[ConversationEntry]) -> None:
        rows = []
        for entry in entries:
            author, user_id = _said_by(entry.message)
            rows.append(
                ThreadMessage(
                    id=entry.id,
                    thread=thread,
                    parent_id=entry.parent_id,
                    message=dump_message(entry.message),
                    author=author,
                    user_id=user_id,
                    run_id=self.run_id,
                    text=message_text(entry.message),
                )
            )
        # in order: each row's parent is stored before it (the foreign key is checked per row
        # on SQLite)
        for row in rows:
            row.save(force_insert=True)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        """Deletes the thread and the messages it stored: a fork's messages that lead into
        them keep them (the delete is refused as a conflict)."""
        with transaction.atomic():
            thread = Thread.objects.select_for_update().filter(id=conversation_id).first()
            if thread is None or thread.revision != expected_revision:
                raise ConversationConflict(conversation_id)
            Thread.objects.filter(id=conversation_id).update(head=None)
            try:
                with transaction.atomic():
                    ThreadMessage.objects.filter(thread_id=conversation_id).delete()
                    Thread.objects.filter(id=conversation_id).delete()
            except IntegrityError:
                raise ConversationConflict(conversation_id) from None

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        row = ThreadMessage.objects.filter(id=entry_id).first()
        if row is None:
            raise LookupError(entry_id)
        return _entry(row)

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        """One query for the chain up to `head_id` (recursive), then its rows."""
        if head_id is None:
            return []
        ids = history_ids(head_id)
        if limit is not None:
            ids = ids[len(ids) - limit :] if limit else []
        rows = {r.id: r for r in ThreadMessage.objects.filter(id__in=ids)}
        if len(rows) != len(ids) or not ids:
            raise LookupError(head_id)
        return [_entry(rows[i]) for i in ids]


def history_ids(head_id: str) -> list[str]:
    """The ids of the entries from the first one up to `head_id`, in order."""
    sql = HISTORY_SQL.format(table=ThreadMessage._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [head_id])
        return [row[0] for row in cursor.fetchall()]


def _aware(when: datetime) -> datetime:
    return when if timezone.is_aware(when) else timezone.make_aware(when)
