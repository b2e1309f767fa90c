"""Per-task tagging: which task a profiled call ran for.

Each task key maps to a small int tag (tag 0: "not in a task"); the worker's
``active_threads`` sets the running task's tag in a thread-local, and yappi's tag
callback reads it with C calls only. This module's code runs in the task threads,
around every task: its frames are left out of the profile (see ``columns.HIDDEN_FILES``).
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Worker


# -- the tag callback ------------------------------------------------------------------
class Tags(dict[Any, int]):
    """Task key -> tag; a key seen for the first time takes the next tag.

    Also the *idle* tags of task threads: what a thread runs between tasks is tagged
    with its idle tag, and the idle tag changes every :data:`EPOCH_TASKS` tasks. yappi
    keeps a frame's callees in a linked list walked on every call: a frame entered
    between tasks (``_run_task``) calls the first functions of each task, a new callee
    per task and tag, so with one idle tag its list, and every call it makes, grows
    with the number of tasks run (quadratic in the tasks of the run). A new idle
    tag every few dozen tasks starts a new, short list. Idle tags are written as tag 0.
    """

    def __init__(self) -> None:
        super().__init__()
        self[None] = 0
        self._next = itertools.count(1).__next__
        #: (tag, key, thread, time) of tags created since the profiler last took them;
        #: a deque: appended by task threads, drained by the snapshot, both atomic
        self.new: collections.deque[tuple[int, Any, int, float]] = collections.deque()
        #: every idle tag; the current one of each task thread; tasks done per thread
        self.idle: set[int] = set()
        self.idle_of: dict[int, int] = {}
        self.done: dict[int, int] = {}
        #: idle tags no thread uses any more (appended by task threads, drained by
        #: the snapshot)
        self.retired: collections.deque[int] = collections.deque()

    def __missing__(self, key: Any) -> int:
        tag = self[key] = self._next()
        self.new.append((tag, key, threading.get_ident(), time.time()))
        return tag

    def task_done(self, ident: int) -> int:
        """Count a task done by thread ``ident``; return the thread's idle tag."""
        n = self.done[ident] = self.done.get(ident, 0) + 1
        idle = self.idle_of.get(ident, 0)
        if n % EPOCH_TASKS == 0:
            if idle:
                self.retired.append(idle)
            idle = self._next()
            self.idle.add(idle)
            self.idle_of[ident] = idle
        return idle


#: tasks a thread runs under one idle tag (see :class:`Tags`): a frame's callee list
#: stays under ~6 per task times this
EPOCH_TASKS = 64


class ThreadTag(threading.local):
    """The yappi tag of what this thread runs; 0 in a thread that never set one."""

    tag = 0


THREAD_TAG = ThreadTag()
#: yappi's tag callback, called on every profiled call: C calls only (a partial, an
#: attrgetter, a thread-local's getattr), no Python frame. Per thread, not a
#: context variable: the idle tag must outlive the task's copied context, as the
#: frames that start the next task (``_run_task``) are entered outside it.
tag_now = functools.partial(operator.attrgetter("tag"), THREAD_TAG)


class TaggingThreads(dict[int, Any]):
    """A worker's ``active_threads`` that also sets the running task's yappi tag.

    distributed's ``_run_task`` (and ``_run_actor``) put ``{thread: key}`` in it from
    the task's own thread right before running the task, and delete it right after:
    the tag is set and cleared there, in that thread, once per task. Installed once per
    worker and switched off (``tags = None``) when the profile stops, never swapped
    back: a task running at a swap would delete its entry from the other dict.
    """

    def __init__(self, threads: dict[int, Any], tags: Tags, label: Any = None) -> None:
        super().__init__(threads)
        self.tags: Tags | None = tags
        self.label = label  # key -> what a tag stands for (None: the key)
        #: entries of tasks that started before the swap, and the dict they started
        #: in: their end deletes them there, :meth:`prune` does it here
        self.inherited = dict(threads)
        self.source = threads

    def __setitem__(self, ident: int, key: Any) -> None:
        super().__setitem__(ident, key)
        self.inherited.pop(ident, None)
        tags, label = self.tags, self.label
        if tags is not None:
            try:
                tag = tags[key if label is None else label(key)]
            except Exception:  # never break a task: it runs untagged
                return
            THREAD_TAG.tag = tag

    def __delitem__(self, ident: int) -> None:
        super().__delitem__(ident)
        tags = self.tags
        THREAD_TAG.tag = 0 if tags is None else tags.task_done(ident)

    def __missing__(self, ident: int) -> Any:
        # a task handed the old dict before the swap registers there (untagged):
        # Worker.get_current_task still finds it
        return self.source[ident]

    def prune(self) -> None:
        """Drop inherited entries whose task ended (call under the worker's lock)."""
        for ident, key in list(self.inherited.items()):
            if self.source.get(ident) is not key:
                del self.inherited[ident]
                if dict.get(self, ident) is key:
                    dict.__delitem__(self, ident)


def tag_tasks(worker: Worker, tags: Tags | None, label: Any = None) -> None:
    """Tag ``worker``'s tasks with ``tags`` from now on, or stop (``None``); ``label``
    maps a key to what its tag stands for (``None``: the key)."""
    with worker.active_threads_lock:
        threads = worker.active_threads
        if isinstance(threads, TaggingThreads):
            threads.tags, threads.label = tags, label
        elif tags is not None:
            worker.active_threads = TaggingThreads(threads, tags, label)


def thread_name() -> str | None:
    """yappi's context name callback: the calling thread's name, looked up in threading's
    registry (``current_thread`` would make a dummy Thread for a thread it does not know)."""
    # threading._active is undeclared in typeshed: the registry current_thread reads
    t = threading._active.get(threading.get_ident())  # type: ignore[attr-defined]
    return t.name if t is not None else None
