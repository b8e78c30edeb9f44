"""django-q2's task and result queues, made safe against a process killed at any moment.

q2's worker processes share a `multiprocessing.Queue` of tasks: a pipe, a reader lock (a
semaphore shared by every process), a bounded semaphore for `queue_limit` and a counter. A
process SIGKILLed inside `get()` (a failpoint, the OOM killer, an operator) can leave any of
them wrong for good:
- killed after taking the reader lock: nobody releases it, every other worker and the one q2
  respawns block on it forever (django-q2 issue #23, "When the next-in-line worker dies, the
  entire cluster stops processing tasks");
- killed between reading a message's length and its body: the pipe is out of step, and the next
  reader takes part of a body for a length and waits forever, holding the lock;
- killed after reading a message but before releasing the bounded semaphore: one slot is gone;
  `queue_limit` such deaths and the pusher blocks for good.
Python's interpreter lock widens every one of those windows: a worker's main thread woken by a
message waits for the lock while the process's run threads execute, and a run thread's crash
lands right then. With one task per process that was rare; with dozens of runs on threads in
each process (`pool.py`) a crash of any of them can hit it, and it stalled the crash tests.

`MessageQueue` keeps nothing in user space that a death can leave half-done. Each message is
one datagram on a `SOCK_SEQPACKET` socket pair, so the kernel hands it whole to exactly one of
the processes waiting in `recv` (no reader lock, no length to read apart from its body) and a
send is all or nothing (no writer lock). The queue's length is the kernel's count of what waits
in the socket (`FIONREAD`), each message padded to whole frames, so `qsize()` and the
`queue_limit` bound the pusher waits on cannot drift. A process killed at any moment either
never got the message or took it with it, like a process that died executing its task: q2's
broker delivers it again after `retry`, and the sweeper and the claimers recover runs sooner.

Installed by `qcluster` before q2 forks (`install`); written against django-q2 1.11 (pinned in
pyproject.toml), whose processes are forked (they inherit the sockets).
"""

from __future__ import annotations

import array
import fcntl
import queue
import select
import socket
import struct
import termios
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

from django_q import cluster as q2_cluster

FRAME_BYTES = 1024  # a message takes whole frames: the pending bytes count the messages
MAX_MESSAGE_BYTES = 256 * 1024  # a q2 task or result is a few hundred bytes
SEND_BUFFER_BYTES = 4 * 1024 * 1024  # asked for; the kernel caps it at net.core.wmem_max
FULL_POLL_SECONDS = 0.005  # how often a put into a full bounded queue looks again
_LENGTH = struct.Struct("!I")


class MessageTooLarge(ValueError):
    pass


class MessageQueue:
    """The part of `multiprocessing.Queue` q2 uses (put, get, qsize, empty, close,
    join_thread), on a SOCK_SEQPACKET socket pair shared by the forked processes."""

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize  # in frames; a message of a few hundred bytes is one
        self._receiver, self._sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self._buffer: bytearray | None = None  # per process, made at its first get
        self._closed = False

    # ---------------------------------------------------------------- writing
    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Send `obj` as one datagram; with `maxsize`, first wait until it fits. q2 has one
        putter per bounded queue (its pusher), so looking and then sending cannot overfill."""
        datagram = self._datagram(obj)
        if self.maxsize:
            frames = len(datagram) // FRAME_BYTES
            deadline = None if timeout is None else time.monotonic() + timeout
            while self.qsize() and self.qsize() + frames > self.maxsize:
                if not block or (deadline is not None and time.monotonic() >= deadline):
                    raise queue.Full
                time.sleep(FULL_POLL_SECONDS)
        self._sender.sendall(datagram)  # one datagram: sent whole or not at all

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, block=False)

    @staticmethod
    def _datagram(obj: Any) -> bytes:
        payload = bytes(ForkingPickler.dumps(obj))
        if len(payload) + _LENGTH.size > MAX_MESSAGE_BYTES:
            payload = bytes(ForkingPickler.dumps(_shrunk(obj, len(payload))))
        size = _LENGTH.size + len(payload)
        padded = -(-size // FRAME_BYTES) * FRAME_BYTES
        return _LENGTH.pack(len(payload)) + payload + bytes(padded - size)

    # ---------------------------------------------------------------- reading
    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message; waits for one (q2 always does). Any number of processes may wait
        at once: the kernel gives each datagram to one of them, whole."""
        if self._closed:
            raise ValueError("the queue is closed")
        if self._buffer is None:
            self._buffer = bytearray(MAX_MESSAGE_BYTES)
        if block and timeout is None:
            received = self._receiver.recv_into(self._buffer)
        else:
            received = self._receive_within(0.0 if not block else timeout)
        (length,) = _LENGTH.unpack_from(self._buffer)
        if received < _LENGTH.size + length:
            raise RuntimeError(f"a q2 message came cut: {received} of {length} bytes")
        return ForkingPickler.loads(self._buffer[_LENGTH.size : _LENGTH.size + length])

    def _receive_within(self, timeout: float) -> int:
        """`recv` without blocking, for up to `timeout` seconds. Never through the socket's
        timeout: that sets O_NONBLOCK on the descriptor every forked process shares."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                return self._receiver.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty from None
                select.select([self._receiver], [], [], left)  # another process may take it

    def get_nowait(self) -> Any:
        return self.get(block=False)

    # ---------------------------------------------------------------- state
    def qsize(self) -> int:
        """Messages waiting (frames: a message over a frame counts as several)."""
        pending = array.array("i", [0])
        fcntl.ioctl(self._receiver.fileno(), termios.FIONREAD, pending)
        return pending[0] // FRAME_BYTES

    def empty(self) -> bool:
        return self.qsize() == 0

    def full(self) -> bool:
        return bool(self.maxsize) and self.qsize() >= self.maxsize

    def close(self) -> None:
        """Sent messages stay readable by the other processes (they hold the sockets too)."""
        self._closed = True

    def join_thread(self) -> None:
        """No feeder thread: a put has reached the kernel when it returns."""

    def cancel_join_thread(self) -> None:
        pass


def _shrunk(obj: Any, size: int) -> Any:
    """A finished q2 task whose result is too large for one datagram travels with a note in
    place of the result (q2 stores results; ours are short strings); anything else is refused."""
    if isinstance(obj, dict) and "result" in obj:
        return {**obj, "result": f"(a result of {size} bytes, too large for the queue)"}
    raise MessageTooLarge(f"a q2 message of {size} bytes is over {MAX_MESSAGE_BYTES}")


def install() -> None:
    """Before the cluster starts: the sentinel (forked from this process) builds its task and
    result queues as `MessageQueue`s."""
    if q2_cluster.get_mp_context().get_start_method() != "fork":
        raise RuntimeError("agentruns' q2 queues need forked worker processes")
    q2_cluster.Queue = MessageQueue
