#!/bin/bash
# metacollect batch wrapper for PBS (qsub): submit with `qsub metacollect-pbs.sh`
# (arguments for the workflow: set WORKFLOW_ARGS, qsub passes none).
#
# What it does, inside the allocation:
#   1. `metacollect batch start` creates the store: run metadata, step 1 (job, config) and the
#      allocation itself (job id, nodes, PBS_*/SLURM_* env; the script too where Slurm runs it);
#   2. starts `dask scheduler --preload metacollect.launch.preload` (collects steps 2-4; the
#      workers get their collector from the scheduler) and `dask worker`s on this node;
#   3. runs your workflow with DASK_SCHEDULER_ADDRESS set: a bare `Client()` connects to it;
#   4. `metacollect batch stop`: records each worker's PBS_* environment, waits until no task is
#      left, retires the workers (their exit handlers, e.g. Darshan's, run) and closes the
#      scheduler, waits for the worker processes to exit and marks the
#      store complete. A job ended by its walltime or qdel (SIGTERM to all its processes): the
#      workers take their final flush and die of the signal, the scheduler closes on it, and
#      this script, which outlives it, waits for them and seals the store "interrupted"
#      (`metacollect batch finalize --signal SIGTERM`). All of that must fit in the grace
#      before SIGKILL (kill_delay); cut short, the store stays readable, status "incomplete",
#      with everything flushed until then (`metacollect doctor` seals it). The signal during
#      `batch stop` cuts the stop short: the store is then sealed by the workflow's exit code.
#
# What it produces: the store $STORE (default $PBS_O_WORKDIR/metacollect-<jobid>.zarr), the
# scheduler file and the job's output files.
#
# What to edit: the #PBS lines (resources, walltime, queue, account) and the variables below
# (or pass them with `qsub -v WORKFLOW=pipeline.py`). Workers run on the first node only; for
# several nodes start more `dask worker --scheduler-file` with your site's launcher (pbsdsh,
# mpiexec). `metacollect jobscript pbs --help` renders this script from options.
# Works with PBS Pro/OpenPBS, Torque, and Slurm's torque wrappers (slurm-wlm-torque).
#PBS -N metacollect
#PBS -l select=1:ncpus=2:mem=4GB
#PBS -l walltime=00:30:00
##PBS -q workq
##PBS -A myproject

cd "${PBS_O_WORKDIR:-$PWD}" || exit 1
WORKFLOW=${WORKFLOW:-workflow.py}          # your Dask script (its Client() connects to this cluster)
STORE=${STORE:-$PWD/metacollect-${PBS_JOBID:-local}.zarr}   # the store to write
WORKERS_PER_NODE=${WORKERS_PER_NODE:-1}    # dask worker processes per node
THREADS_PER_WORKER=${THREADS_PER_WORKER:-${NCPUS:-1}}
MEMORY_LIMIT=${MEMORY_LIMIT:-auto}         # per worker process, e.g. 4GB
INTERFACE=${INTERFACE:-}                   # network interface, e.g. ib0 (empty: default)
PYTHON=${PYTHON:-python}                   # the Python that has metacollect installed
FLUSH_INTERVAL=${FLUSH_INTERVAL:-}         # how often collectors flush, e.g. 5s (empty: config)
WORKFLOW_ARGS=${WORKFLOW_ARGS:-}                # arguments for the workflow
# ---- no need to edit below this line --------------------------------------------------------
set -uo pipefail
export METACOLLECT_BATCH_SYSTEM=${METACOLLECT_BATCH_SYSTEM:-pbs}
if [ -n "$FLUSH_INTERVAL" ]; then export DASK_METACOLLECT__FLUSH_INTERVAL=$FLUSH_INTERVAL; fi
JOBID=${PBS_JOBID:-${SLURM_JOB_ID:-$$}}
SCHEDULER_FILE=${SCHEDULER_FILE:-$PWD/metacollect-scheduler-$JOBID.json}
IFACE=(); if [ -n "$INTERFACE" ]; then IFACE=(--interface "$INTERFACE"); fi

# The end of the job (walltime, scancel, qdel) sends SIGTERM to every process in it, and the
# batch system kills what is left the moment this script exits: it waits instead for the
# scheduler and workers to take their final flushes and end, then seals the store.
TERMINATED=
trap 'TERMINATED=1' TERM
"$PYTHON" -m metacollect batch start "$STORE" --job-script "$0" || exit $?
"$PYTHON" -m dask scheduler --scheduler-file "$SCHEDULER_FILE" --dashboard-address :0 "${IFACE[@]}" \
    --preload metacollect.launch.preload --metacollect-store "$STORE" &
SCHEDULER_PID=$!
for _ in $(seq 240); do [ -s "$SCHEDULER_FILE" ] && break; sleep 0.5; done
if [ ! -s "$SCHEDULER_FILE" ]; then echo "metacollect: the scheduler did not start" >&2; exit 1; fi
WORKER=("$PYTHON" -m dask worker --scheduler-file "$SCHEDULER_FILE" --nworkers "$WORKERS_PER_NODE"
        --nthreads "$THREADS_PER_WORKER" --memory-limit "$MEMORY_LIMIT" "${IFACE[@]}")
"${WORKER[@]}" &
WORKERS_PID=$!
DASK_SCHEDULER_ADDRESS=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$SCHEDULER_FILE")
export DASK_SCHEDULER_ADDRESS

# shellcheck disable=SC2086
if [ -z "$TERMINATED" ]; then "$PYTHON" "$WORKFLOW" $WORKFLOW_ARGS "$@"; STATUS=$?; else STATUS=143; fi
if [ -n "$TERMINATED" ]; then  # SIGTERM: the workflow (128 + 15) and the cluster end on it;
    # the seal starts now (its imports overlap the cluster's end) and waits for it first
    "$PYTHON" -m metacollect batch finalize "$STORE" --exit-code "$STATUS" --signal SIGTERM \
        --wait-pid "$SCHEDULER_PID" --worker-launcher "$WORKERS_PID"
    rm -f "$SCHEDULER_FILE"
    exit "$STATUS"
fi

# retire the workers, close the scheduler, wait until both exited (exit handlers ran), finalise
"$PYTHON" -m metacollect batch stop "$STORE" --scheduler-file "$SCHEDULER_FILE" \
    --wait-pid "$WORKERS_PID" --wait-pid "$SCHEDULER_PID" --exit-code "$STATUS"
if [ -n "$TERMINATED" ]; then  # the job ended during the stop, which it may have cut short:
    # the cluster ends on the signal; a store not sealed yet is sealed once it has
    "$PYTHON" -m metacollect batch finalize "$STORE" --exit-code "$STATUS" \
        --wait-pid "$SCHEDULER_PID" --worker-launcher "$WORKERS_PID"
fi
kill "$WORKERS_PID" "$SCHEDULER_PID" 2>/dev/null; wait
rm -f "$SCHEDULER_FILE"
exit "$STATUS"
