"""Independent simulations across processes: every caller (compare, the validation generators)
wants the same thing, results in input order whatever order they finish in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def map_in_processes(
    fn: Callable[[Item], Result],
    items: Sequence[Item],
    jobs: int,
    on_done: Callable[[Item, Result], None] | None = None,
) -> list[Result]:
    """``fn`` over ``items`` in up to ``jobs`` processes (in this one for ``jobs == 1``), results
    in ``items`` order; ``on_done`` hears of each as it completes. ``fn`` must be picklable."""
    if jobs == 1:
        results = []
        for item in items:
            results.append(fn(item))
            if on_done:
                on_done(item, results[-1])
        return results
    done: dict[int, Result] = {}
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)))
    try:
        futures: dict[Future[Result], int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for future in as_completed(futures):
            index = futures[future]
            done[index] = future.result()
            if on_done:
                on_done(items[index], done[index])
    finally:
        pool.shutdown(cancel_futures=True)  # a failed run should not wait for the queued ones
    return [done[i] for i in range(len(items))]
