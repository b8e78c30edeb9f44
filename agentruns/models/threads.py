"""Conversations (issue 33): a thread is a chain of messages, one run per turn.

A `Thread` is Pydantic AI's `ConversationRecord` over our tables: the newest message of its
history (`head`), its usage, the branches it left, whom it forked from. A `ThreadMessage` is a
`ConversationEntry`: one Pydantic AI message, stored once, pointing at the message before it
(a fork shares the entries before the point it forked at). Each message says who said it
(`customer`, `staff` or the `agent`), the user that sent it, and the run it belongs to.

A `ThreadTurn` is one message posted to the thread and the run that answers it: posted while
another run of the thread is active, it waits (its run in the thread's line,
`runtime/dispatch/thread_line.py`) and enters the history when its run begins, so the history a
run is given never changes under it (`runtime/conversations/`). A run parked for a person or a
system lets the next turn go, except in a chat (`Thread.chat`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from agentruns.models.runs import Run


class Author(models.TextChoices):
    CUSTOMER = "customer"
    STAFF = "staff"
    AGENT = "agent"


class Thread(models.Model):
    id = models.CharField(primary_key=True, max_length=128)
    agent = models.CharField(max_length=100)
    head = models.ForeignKey(
        "ThreadMessage", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # changes on every save (the store's compare-and-set)
    revision = models.CharField(max_length=64)
    usage = models.JSONField(default=dict, blank=True)
    deferred = models.JSONField(null=True, blank=True)  # deferred tool requests, as JSON
    scope = models.CharField(max_length=200, blank=True, default="")
    forked_from = models.CharField(max_length=128, blank=True, default="")
    forked_at = models.CharField(max_length=64, blank=True, default="")
    branches = models.JSONField(default=list, blank=True)
    # a chat's thread (the AI SDK's useChat, `api/chat.py`): a turn parked for a person keeps
    # the thread, because the chat continues the parked assistant message in place and its chunk
    # cursor counts the turns one after the other; any other thread's next turn passes it
    chat = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"thread {self.id} ({self.agent})"


class ThreadMessage(models.Model):
    id = models.CharField(primary_key=True, max_length=64)  # the entry's id (a UUID7)
    # the thread that stored it (a fork's thread reads it through `parent` links, not this)
    thread = models.ForeignKey(
        Thread, on_delete=models.CASCADE, related_name="stored_messages", db_index=False
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    message = models.JSONField()  # one Pydantic AI ModelMessage (ModelMessagesTypeAdapter)
    author = models.CharField(max_length=16, choices=Author.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    text = models.TextField(blank=True, default="")  # what people read of it
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["thread", "created_at"], name="threadmsg_thread_idx")]

    def __str__(self) -> str:
        return f"{self.author} message {self.id}"


class ThreadTurn(models.Model):
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="turns")
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="thread_turn")
    author = models.CharField(max_length=16, choices=Author.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    text = models.TextField()
    # the sender's own id of the message (the AI SDK's UIMessage id): a repeated post is one turn
    client_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    multitask = models.CharField(max_length=16, default="enqueue")
    # the message's entry once it entered the history (its run began); null: waiting
    entry = models.ForeignKey(
        ThreadMessage, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # the run's answer is stored (once)
    answered = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["thread", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["thread", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="threadturn_unique_client_id",
            )
        ]

    def __str__(self) -> str:
        return f"turn of {self.thread_id}: run {self.run_id}"


class ThreadKey(models.Model):
    """The thread `POST /api/runs {"thread": true}` made for a user's Idempotency-Key: its id is
    random (nobody can predict it, so nobody can make it first), and this row finds it again
    for the same user, agent and key, so a repeat of the request is the same thread and run."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    agent = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "agent", "key"], name="threadkey_unique_key")
        ]

    def __str__(self) -> str:
        return f"{self.key} of user {self.user_id}: thread {self.thread_id}"
