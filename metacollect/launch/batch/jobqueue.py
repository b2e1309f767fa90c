"""dask-jobqueue clusters ready to collect.

:func:`jobqueue_cluster` builds a ``SLURMCluster`` / ``PBSCluster`` from jobqueue's own keyword
arguments (and ``jobqueue.yaml`` config), with what each batch system needs
(:meth:`~metacollect.batch.base.BatchSystem.prepare`); :func:`metacollect.collect` recognises
such a cluster and records its jobs (:mod:`metacollect.steps.batch`). On exit the workers are
retired and their jobs waited for (:mod:`metacollect.session.shutdown`) so their exit handlers
run.
"""

from __future__ import annotations

from typing import Any

import dask.config
from distributed.core import Status

import metacollect.config as config
from metacollect.batch import SYSTEMS, get_system
from metacollect.errors import UsageError
from metacollect.steps import darshan, terminate

__all__ = ["jobqueue_cluster"]


def jobqueue_cluster(system: str, *, darshan_store: str | None = None, **kwargs: Any) -> Any:
    """A dask-jobqueue cluster for ``system`` ("slurm" or "pbs"), ready to collect.

    Parameters
    ----------
    system
        ``"slurm"`` (``SLURMCluster``) or ``"pbs"`` (``PBSCluster``).
    **kwargs
        dask-jobqueue's own keyword arguments (``cores``, ``memory``, ``processes``, ``queue``,
        ``account``, ``walltime``, ``interface``, ``job_extra_directives``, ...); what is not
        given comes from the ``jobqueue.<system>`` config (``jobqueue.yaml``), as with
        dask-jobqueue itself. With ``system="pbs"`` on Slurm's torque wrappers, a
        ``log_directory`` is passed to ``qsub -e/-o`` (the wrappers ignore ``#PBS -e DIR/``).
    darshan_store
        With ``metacollect.darshan.enabled``, the store whose Darshan environment the job
        script prologue exports, so the workers start under Darshan (added after the user's
        own ``job_script_prologue``).

    Returns
    -------
    SLURMCluster or PBSCluster

    Examples
    --------
    >>> from distributed import Client
    >>> from metacollect import collect
    >>> cluster = jobqueue_cluster("slurm", cores=1, memory="1GB")         # doctest: +SKIP
    >>> cluster.scale(jobs=2)                                                 # doctest: +SKIP
    >>> with Client(cluster) as client, collect(client, "runs/a.zarr"):    # doctest: +SKIP
    ...     client.submit(sum, [1, 2]).result()
    """
    if system not in SYSTEMS:
        raise UsageError(f"unknown batch system {system!r}; choose one of {', '.join(SYSTEMS)}")
    batch = get_system(system)
    cls = batch.cluster_class()
    batch.prepare(kwargs)
    base = kwargs.get("job_cls") or cls.job_cls

    class ClosingJob(base):  # type: ignore[valid-type,misc]
        # dask-jobqueue's Job.close cancels the job but leaves status "running"; SpecCluster.close
        # then fails its "every worker closed" check when a retired job object is still alive.
        async def close(self) -> None:
            await super().close()
            self.status = Status.closed

    own = kwargs.get("job_script_prologue")
    if own is None:
        own = dask.config.get(f"jobqueue.{system}.job-script-prologue", default=None) or []
    ours = [terminate.JOB_SCRIPT_TRAP]
    if darshan_store is not None and config.get("darshan.enabled"):
        ours += darshan.job_script_prologue(darshan_store)
    kwargs["job_script_prologue"] = [*own, *ours]
    ClosingJob.__name__ = ClosingJob.__qualname__ = base.__name__
    kwargs["job_cls"] = ClosingJob
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise UsageError(f"cannot start a {system} cluster: {e}") from e
