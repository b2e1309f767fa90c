"""Step 5 of the metadata map, Darshan half: what I/O each process did (level
``process``).

See ``schema/step5-darshan.yaml`` for the layout and ``docs/darshan.md`` for the
facts this package is built on. Four parts:

- **Environment.** Darshan instruments a non-MPI process only when ``LD_PRELOAD`` names
  ``libdarshan.so`` and ``DARSHAN_ENABLE_NONMPI=1`` *when the process is exec'd*.
  :func:`find_library` finds the runtime (config ``metacollect.darshan.library``, the
  site's ``DARSHAN_*ROOT`` variables, ``darshan-config``, ``LD_LIBRARY_PATH``, the
  system library directories). :func:`darshan_environment` gives the variables - a
  per-run, per-host log directory that works for both kinds of Darshan builds
  (``DARSHAN_LOGPATH`` with its ``YYYY/M/D`` subdirectories and the flat
  ``DARSHAN_LOG_DIR_PATH``), the mmap logs into the same directory, optional DXT, and a
  generated config file (:func:`darshan_config_text`) that raises the record limits and
  keeps the interpreter's own files and helper commands out. The job id Darshan puts in
  log names is made the pid (``DARSHAN_JOBID`` names an unset variable), so that every
  log - the mmap log of a killed process too - carries the pid it is matched by.
- **Delivery at spawn.** :class:`DarshanEnviron` is a ``NannyPlugin`` with ``restart =
  True`` that puts the variables in the nanny's *pre-spawn* environment and restarts its
  worker (distributed's ``Environ`` plugin sets ``Nanny.env``, which is applied inside
  the already running child - too late for ``LD_PRELOAD``). A ``LocalCluster`` started
  under ``distributed.nanny.pre-spawn-environ`` = :func:`darshan_environment`
  (``LocalCluster(env=...)`` is too late, as ``Environ``), a dask-jobqueue
  ``job_script_prologue`` = :func:`job_script_prologue` or a batch script's ``export``
  lines have it from the start; :class:`DarshanCapture` sees that and restarts nothing.
- **Graceful shutdown.** Darshan writes its log at process exit:
  :meth:`DarshanCapture.shutdown` retires the workers, waits until they left and their
  processes are gone.
- **Ingestion.** :func:`ingest` reads every log with pydarshan *in a child process* (a
  truncated log can crash libdarshan-util: a segfault or an assert must not take the
  user's process with it), maps it to its worker by (host, pid), and writes one
  ``process`` group per log; logs that are not a worker's are kept under ``processes/``
  and labelled (nanny, scheduler, client, child, unattributed). :func:`read_io` is
  ``Run.io()``.

Modules, one concern each: :mod:`.runtime` (the library, log directories),
:mod:`.conffile` (the config file), :mod:`.environment` (the variables),
:mod:`.nanny` (the nanny plugin, worker identity), :mod:`.capture` (a session's
capture), :mod:`.logs` (finding logs, reading them in children), :mod:`.log_reader`
(the child-process script), :mod:`.matching` (logs to processes), :mod:`.process` (a log
as a process group), :mod:`.ingestion` (into the store) and :mod:`.read` (reading it back).
"""

from __future__ import annotations

from metacollect.steps.darshan.attribution import (
    SCOPES,
    attribute_segments,
    file_scope,
    file_scopes,
)
from metacollect.steps.darshan.capture import (
    DarshanCapture,
    start,
    wait_processes_gone,
)
from metacollect.steps.darshan.conffile import (
    CONFIG_KEYS,
    DARSHAN_DEFAULT_EXCLUDES,
    KNOWN_MODULES,
    LIMITED_MODULES,
    NO_EXCLUDED_DIRS,
    darshan_config_text,
    interpreter_paths,
    parse_config,
    write_config,
)
from metacollect.steps.darshan.environment import (
    darshan_environment,
    has_darshan,
    job_script_prologue,
    log_dir_of,
)
from metacollect.steps.darshan.ingestion import (
    LOG_COLUMNS,
    IngestResult,
    batch_job_ids,
    darshan_group_attrs,
    ingest,
)
from metacollect.steps.darshan.log_reader import (
    DXT_MODULES,
    LOG_MARK,
    RECORD_TABLES,
)
from metacollect.steps.darshan.logs import (
    LogFile,
    ReadResult,
    find_logs,
    parse_log_name,
    read_logs,
    remove_old_logs,
)
from metacollect.steps.darshan.matching import (
    Known,
    fork_parent,
    job_end_time,
    job_start_time,
    known_processes,
    match_log,
    table_columns,
)
from metacollect.steps.darshan.nanny import (
    PLUGIN_NAME,
    DarshanEnviron,
    nanny_status,
    worker_identity,
)
from metacollect.steps.darshan.process import (
    partial_reasons,
    process_attrs,
    write_process,
)
from metacollect.steps.darshan.read import (
    IO_BY,
    process_groups,
    read_io,
    read_records,
)
from metacollect.steps.darshan.runtime import (
    FLAT_LOG_VARIABLES,
    LIBRARY,
    NO_JOBID_VARIABLE,
    ROOT_VARIABLES,
    DarshanNotFoundError,
    Library,
    RuntimeBuild,
    default_log_dir,
    find_library,
    host_log_dir,
    make_log_dir,
    runtime_build,
    site_log_variables,
)

__all__ = [
    "CONFIG_KEYS",
    "DARSHAN_DEFAULT_EXCLUDES",
    "DXT_MODULES",
    "FLAT_LOG_VARIABLES",
    "IO_BY",
    "KNOWN_MODULES",
    "LIBRARY",
    "LIMITED_MODULES",
    "LOG_COLUMNS",
    "LOG_MARK",
    "NO_EXCLUDED_DIRS",
    "NO_JOBID_VARIABLE",
    "PLUGIN_NAME",
    "RECORD_TABLES",
    "ROOT_VARIABLES",
    "SCOPES",
    "DarshanCapture",
    "DarshanEnviron",
    "DarshanNotFoundError",
    "IngestResult",
    "Known",
    "Library",
    "LogFile",
    "ReadResult",
    "RuntimeBuild",
    "attribute_segments",
    "batch_job_ids",
    "darshan_config_text",
    "darshan_environment",
    "darshan_group_attrs",
    "default_log_dir",
    "file_scope",
    "file_scopes",
    "find_library",
    "find_logs",
    "fork_parent",
    "has_darshan",
    "host_log_dir",
    "ingest",
    "interpreter_paths",
    "job_end_time",
    "job_script_prologue",
    "job_start_time",
    "known_processes",
    "log_dir_of",
    "make_log_dir",
    "match_log",
    "nanny_status",
    "parse_config",
    "parse_log_name",
    "partial_reasons",
    "process_attrs",
    "process_groups",
    "read_io",
    "read_logs",
    "read_records",
    "remove_old_logs",
    "runtime_build",
    "site_log_variables",
    "start",
    "table_columns",
    "wait_processes_gone",
    "worker_identity",
    "write_config",
    "write_process",
]
