"""Where sweep tasks run: in this process, on a local process pool, or on Ray.

Every runner maps a picklable function over a list of picklable tasks and returns the
results in task order, calling ``on_done(index, result)`` as each task finishes (any order);
the results are the same whatever the runner (each task is deterministic). Ray is the
optional extra ``kvchain[ray]`` and is imported only by :func:`run_ray`.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from kvchain.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

OnDone = Callable[[int, Any], None]


class RayUnavailableError(ConfigError):
    """``--ray`` without the optional ``ray`` package (``pip install 'kvchain[ray]'``)."""


def default_workers() -> int:
    """Cores this process may use (``os.sched_getaffinity``; ``os.cpu_count`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_serial(fn: Callable[[T], R], tasks: Sequence[T], on_done: OnDone | None = None,
               ) -> list[R]:
    """Run the tasks one after another in this process."""
    results: list[R] = []
    for i, task in enumerate(tasks):
        results.append(fn(task))
        if on_done is not None:
            on_done(i, results[-1])
    return results


def run_local(fn: Callable[[T], R], tasks: Sequence[T], workers: int,
              on_done: OnDone | None = None) -> list[R]:
    """Run the tasks on a pool of ``workers`` processes (``spawn``: workers import
    kvchain afresh, no forked threads); ``workers == 1`` runs them in this process.

    Raises:
        ConfigError: ``workers < 1``. Errors of a task propagate (the pool is shut down).
    """
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(tasks) <= 1:
        return run_serial(fn, tasks, on_done)
    results: list[Any] = [None] * len(tasks)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=context) as pool:
        pending: dict[Future[R], int] = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                results[i] = fut.result()
                if on_done is not None:
                    on_done(i, results[i])
    return results


def require_ray() -> Any:
    """The ``ray`` module (an optional extra), imported.

    Raises:
        RayUnavailableError: ray is not installed (say so before anything is written or
            cleared: ``kvchain sweep --ray`` checks it first).
    """
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("--ray needs the optional ray package: "
                                  "pip install 'kvchain[ray]'") from None
    return ray


def run_ray(fn: Callable[[T], R], tasks: Sequence[T], address: str | None = None,
            on_done: OnDone | None = None) -> list[R]:
    """Run the tasks as Ray tasks (one CPU each): on the already initialized Ray, else
    ``ray.init(address=address)`` (``None``: start a local Ray on this machine). The
    cluster's workers must be able to import kvchain (installed there, or this machine).

    Raises:
        RayUnavailableError: ray is not installed.
    """
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(fn)
    refs = [remote.remote(t) for t in tasks]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(tasks)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            i = index[ref]
            results[i] = ray.get(ref)
            if on_done is not None:
                on_done(i, results[i])
    return results
