"""Step 5 of the metadata map, Yappi half: where each process spent its time.

Levels ``thread`` (``<process group>/threads``) and ``coroutine``
(``<process group>/coroutines``), see ``schema/step5-yappi.yaml`` for the layout.

- **One owner of yappi per process.** :class:`ProcessProfiler` is a module-level
  singleton with a reference count: every collector of a process (one or several
  workers, the scheduler, the client) :func:`attach`-es a :class:`ProfileSink`; the
  first attach starts yappi, the last detach stops it and frees its stats. The first
  sink owns the profile and writes it; when it leaves, the next one takes over with a
  full snapshot.
- **Per-task attribution.** Each task key maps to a small int tag (tag 0: "not in a
  task"; a new key takes one in ``Tags.__missing__``). The worker's ``active_threads``
  (filled by ``distributed`` from the task's thread around every task) sets the tag in
  a thread-local (:class:`.tags.TaggingThreads`), and yappi's tag callback, which runs on
  every profiled call, reads it with C calls only, no Python frame. Between tasks a
  thread runs under an *idle* tag, new every :data:`EPOCH_TASKS` tasks and written as
  tag 0: yappi's per-frame callee lists then stay short (see :class:`.tags.Tags`).
- **Event loop apart.** Stats of the event-loop thread go to the ``coroutines`` group
  (wall clock: a coroutine's time includes its awaits); every other thread goes to
  ``threads``.
- **Harness out of the profile.** The collectors' flush threads and the store's I/O
  threads (where the store writes run: the threads named in
  ``metacollect.store.zarrio.IO_THREAD_NAMES``, metacollect's and Zarr's, found with
  ``threading.enumerate()``) are un-profiled (``sys.setprofile(None)``, run in each
  thread through its event loop) at every write, as yappi profiles every thread it
  finds when it starts: under yappi, the I/O's asyncio machinery would cost several
  times more and dominate the profile. A task's own store calls still show as time in
  the task's thread (waiting for the I/O thread); Zarr's codec threads stay profiled.
- **Thread ids** are yappi's ``tid``, which is ``threading.get_ident()`` - the ids step
  4 records.
- **Snapshots** run in the collector's flush thread every
  ``metacollect.yappi.flush-interval``: rows that changed since the previous snapshot,
  with yappi's cumulative values. Changed rows are found without walking every task's
  stats: tag 0 rows are compared with what was last written, and only the tags of
  tasks that started, ran or finished since the last snapshot are enumerated. The final
  snapshot (teardown) writes everything.

The raw per-(thread, tag) rows come from yappi's C enumerator
(``yappi._yappi.enum_func_stats``, what ``yappi.get_func_stats`` uses underneath): the
public API merges threads and builds objects per row, too slow and too coarse here. The
enumeration does not pause yappi (see ``ProcessProfiler._enumerate``).

Modules: :mod:`.tags` (per-task tagging), :mod:`.profiler` (the process's profiler
and its snapshots), :mod:`.columns` (the stored layout and the columns of a snapshot),
:mod:`.sink` (a collector's sink; attach, detach; the harness out of the profile),
:mod:`.read` (reading the profiles back, for ``metacollect.analysis``).
"""

from metacollect.steps.yappi.columns import (
    EDGE_COLUMNS,
    FUNCTION_COLUMNS,
    KINDS,
    STAT_COLUMNS,
    THREAD_COLUMNS,
)
from metacollect.steps.yappi.profiler import ProcessProfiler
from metacollect.steps.yappi.read import (
    EDGE_KEY,
    STAT_KEY,
    latest_rows,
    profile_groups,
    read_profile,
)
from metacollect.steps.yappi.sink import (
    ProfileSink,
    attach,
    detach,
    running_profiler,
    unprofile_io_threads,
)
from metacollect.steps.yappi.tags import (
    EPOCH_TASKS,
    THREAD_TAG,
    TaggingThreads,
    Tags,
    tag_tasks,
)

__all__ = [
    "EDGE_COLUMNS",
    "EDGE_KEY",
    "EPOCH_TASKS",
    "FUNCTION_COLUMNS",
    "KINDS",
    "STAT_COLUMNS",
    "STAT_KEY",
    "THREAD_COLUMNS",
    "THREAD_TAG",
    "ProcessProfiler",
    "ProfileSink",
    "TaggingThreads",
    "Tags",
    "attach",
    "detach",
    "latest_rows",
    "profile_groups",
    "read_profile",
    "running_profiler",
    "tag_tasks",
    "unprofile_io_threads",
]
