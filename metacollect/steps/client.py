"""Step 2 of the metadata map: the graphs clients submit, seen from the scheduler.

``update_graph`` does not pass dependencies, so they are read from the scheduler's
TaskState while the hook runs (once per task, not per transition). Annotations and priorities
are serialised in the flush, off the event loop.
"""

from __future__ import annotations

import array
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from metacollect.steps.base import encode_json, encode_json_each
from metacollect.store.flush import take
from metacollect.store.writer import GroupWriter

if TYPE_CHECKING:
    from distributed import Scheduler


@dataclass
class SubmittedGraph:
    """One ``update_graph`` as the hook saw it, before it becomes rows."""

    graph: int
    time: float
    client: str
    stimulus_id: str
    keys: set[Any]
    tasks: list[Any]
    annotations: dict[str, dict[Any, Any]]
    #: per task, aligned with ``tasks`` (not the scheduler's dict: it would outlive the call)
    priority: list[Any] = field(default_factory=list)
    prefixes: list[str | None] = field(default_factory=list)
    groups: list[str | None] = field(default_factory=list)
    #: per task, its Dask span's id (its TaskGroup's ``span_id``, fixed when it was submitted)
    spans: list[str | None] = field(default_factory=list)
    #: per task, its number of dependencies; their keys one after the other in
    #: ``dependencies`` (a list per task costs ~60 B more each: 60 MB at a million)
    n_dependencies: array.array[int] = field(default_factory=lambda: array.array("q"))
    dependencies: list[Any] = field(default_factory=list)
    code: list[tuple[str, str]] = field(default_factory=list)


#: tasks of a submitted graph converted and flushed at a time (bounds the writer's memory)
_SLICE = 50_000


def _write_slice(
    group: GroupWriter,
    g: SubmittedGraph,
    graph: int,
    part: slice,
    edges: slice,
    per_key: dict[Any, dict[str, Any]],
    shared: dict[str, Any],
    unencodable: Callable[[str, str], None],
) -> None:
    """The ``tasks`` and ``dependencies`` rows of one slice of a submitted graph
    (``edges``: where the slice's dependencies start and stop in ``g.dependencies``)."""
    tasks, n_deps, keys = g.tasks[part], g.n_dependencies[part], g.keys
    group.append(
        "tasks",
        {
            "graph": [graph] * len(tasks),
            "key": tasks,
            "prefix": g.prefixes[part],
            "group": g.groups[part],
            "span": g.spans[part],
            "requested": [k in keys for k in tasks],
            "priority": encode_json_each(g.priority[part], unencodable),
            "n_dependencies": np.frombuffer(n_deps, dtype=np.int64),
            "annotations": [
                encode_json({n: v for n, v in per_key[k].items() if n not in shared}, unencodable)
                if k in per_key and len(per_key[k]) > len(shared)
                else ""
                for k in tasks
            ],
        },
    )
    dst = g.dependencies[edges]
    if dst:
        src: list[Any] = []
        for k, n in zip(tasks, n_deps, strict=True):
            src.extend([k] * n)
        group.append(
            "dependencies",
            {"graph": [graph] * len(dst), "key": src, "dependency": dst},
        )


class GraphRecorder:
    """Buffers every ``update_graph`` of one scheduler and writes the ``client`` group."""

    def __init__(self, annotations: bool = True, code: bool = True) -> None:
        #: metacollect.capture.annotations / .source: keep annotations, code snippets
        self.keep_annotations = annotations
        self.keep_code = code
        self.n_graphs = 0
        self._graphs: list[SubmittedGraph] = []
        self._clients: list[tuple[float, str, str]] = []
        self._seen_computations: set[Any] = set()

    def update_graph(
        self,
        scheduler: Scheduler,
        client: str,
        keys: set[Any],
        tasks: list[Any],
        annotations: dict[str, dict[Any, Any]],
        priority: dict[Any, tuple[Any, ...]],
        stimulus_id: str,
    ) -> None:
        """Record one submitted graph (runs on the event loop: reads, no formatting)."""
        graph = self.n_graphs
        self.n_graphs += 1
        get = scheduler.tasks.get
        prefixes: list[str | None] = []
        groups: list[str | None] = []
        spans: list[str | None] = []
        deps = []
        n_deps = array.array("q")
        for k in tasks:
            ts = get(k)
            if ts is None:
                prefixes.append(None)
                groups.append(None)
                spans.append(None)
                n_deps.append(0)
            else:
                prefixes.append(ts.prefix.name)
                group = ts.group
                groups.append(group.name)
                # the spans extension ran before this hook: the group's span is settled
                spans.append(group.span_id)
                n_deps.append(len(ts.dependencies))
                deps.extend([d.key for d in ts.dependencies])
        code = []
        if not self.keep_annotations:
            annotations = {}
        for comp in list(scheduler.computations)[-2:] if self.keep_code else ():
            if comp.id not in self._seen_computations and comp.code:
                self._seen_computations.add(comp.id)
                for snippets in comp.code:
                    for sc in snippets:
                        code.append((str(comp.id), getattr(sc, "code", str(sc))))
        self._graphs.append(
            SubmittedGraph(
                graph,
                time.time(),
                client,
                stimulus_id,
                set(keys),
                list(tasks),
                annotations,
                [priority.get(k) for k in tasks],
                prefixes,
                groups,
                spans,
                n_deps,
                deps,
                code,
            )
        )

    def add_client(self, client: str) -> None:
        self._clients.append((time.time(), client, "add"))

    def remove_client(self, client: str) -> None:
        self._clients.append((time.time(), client, "remove"))

    def pending_spans(self) -> set[str | None]:
        """The spans of the graphs recorded and not yet taken by a flush."""
        return {s for g in list(self._graphs) for s in set(g.spans)}

    def swap(self) -> tuple[list[SubmittedGraph], list[tuple[float, str, str]]]:
        """The graphs and client events recorded so far (flush thread)."""
        return take(self._graphs), take(self._clients)

    @staticmethod
    def write(
        group: GroupWriter,
        batch: tuple[list[SubmittedGraph], list[tuple[float, str, str]]],
        on_error: Callable[[str, str], None],
    ) -> None:
        """Convert a swapped batch to the ``client`` group's tables (writer thread);
        ``on_error(where, what)`` records a value that had to be stored as a placeholder."""
        graphs, clients = batch

        def unencodable(kind: str, why: str) -> None:
            on_error(
                "annotation",
                f"an annotation or priority of type {kind} cannot be stored as JSON ({why}); "
                "stored as a placeholder naming its type",
            )

        def encode(value: Any) -> str:
            return encode_json(value, unencodable)

        if clients:
            t, c, e = zip(*clients, strict=False)
            group.append("clients", {"time": t, "client": c, "event": e})
        for g in graphs:
            graph, tasks, keys = g.graph, g.tasks, g.keys
            n_edges = len(g.dependencies)
            per_key: dict[Any, dict[str, Any]] = {}
            for name, values in g.annotations.items():
                for k, v in values.items():
                    per_key.setdefault(k, {})[name] = v
            # annotations shared by every task of the graph go once on the graph row
            shared: dict[str, Any] = {}
            if per_key and len(per_key) == len(tasks):
                first = next(iter(per_key.values()))
                shared = {
                    n: v for n, v in first.items() if all(a.get(n) == v for a in per_key.values())
                }
            group.append(
                "graphs",
                {
                    "graph": [graph],
                    "time": [g.time],
                    "client": [g.client],
                    "stimulus_id": [g.stimulus_id],
                    "n_tasks": [len(tasks)],
                    "n_keys": [len(keys)],
                    "n_dependencies": [n_edges],
                    "annotations": [encode(shared) if shared else ""],
                },
            )
            # a large graph goes in slices, each flushed before the next is converted:
            # the columns of a million tasks would otherwise all be in memory at once
            first_edge = 0
            for lo in range(0, len(tasks), _SLICE):
                part = slice(lo, lo + _SLICE)
                last_edge = first_edge + sum(g.n_dependencies[part])
                edges = slice(first_edge, last_edge)
                _write_slice(group, g, graph, part, edges, per_key, shared, unencodable)
                first_edge = last_edge
                if len(tasks) > _SLICE:
                    group.flush()
            if g.code:
                comp, text = zip(*g.code, strict=True)
                group.append(
                    "code",
                    {"graph": [graph] * len(g.code), "computation": comp, "code": text},
                )
