"""Independent simulations in parallel: every caller (compare, the validation generators)
wants the same thing, results in input order whatever order they finish in, each reported as it
finishes.

Two backends do it behind one call, ``map(fn, items, on_done)``: `LocalPool`, processes on this
machine (the default), and `RayTasks`, one Ray core task per item on a Ray cluster: a private one
started on this machine for the sweep, or a running cluster of many machines joined by address.
Each item is a deterministic simulation, so the results do not depend on the backend.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tasim.core.lifecycle import TERMINATION_SIGNALS, terminate_with
from tasim.core.local_ray import init_local_ray

Item = TypeVar("Item")
Result = TypeVar("Result")

_WAKE_S = 0.2  # how often a local pool's launcher wakes to run a signal handler


class BackendUnavailable(RuntimeError):
    """The backend cannot run anything (an unreachable Ray address, a node without tasim)."""


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
    others = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), initializer=_pool_worker, initargs=(os.getpid(),))
    try:
        futures: dict[Future[Result], int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
        pending = set(futures)
        while pending:
            # A wait that wakes up: the kernel may hand Ctrl-C or SIGTERM to one of the pool's
            # threads, which does not interrupt the main thread's wait, and Python runs the handler
            # only once the main thread runs again (a run can take minutes).
            finished, pending = wait(pending, timeout=_WAKE_S, return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=futures.__getitem__):
                index = futures[future]
                done[index] = future.result()
                if on_done:
                    on_done(items[index], done[index])
    except BaseException:  # a failed run, Ctrl-C, or SIGTERM unwinding (tasim.core.lifecycle)
        # shutdown() waits for the running items, which may take minutes: end them now.
        _end_processes(set(multiprocessing.active_children()) - others)
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    return [done[i] for i in range(len(items))]


def _pool_worker(launcher: int) -> None:
    """A pool process dies with its launcher, at once on SIGTERM (a forked worker inherits the
    launcher's unwinding handler, and the pool would catch its SystemExit as a run's failure),
    and leaves Ctrl-C, which the terminal sends its whole process group, to the launcher: the
    launcher ends the pool, without a traceback from every worker."""
    terminate_with(launcher)()
    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _end_processes(processes: set[multiprocessing.process.BaseProcess], grace_s: float = 5.0) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(grace_s)
        if process.is_alive():
            process.kill()
            process.join()


class Backend(Protocol):
    @property
    def shares_files(self) -> bool:
        """Whether the items' output directories are this machine's (a Ray node may be another)."""
        ...

    def check(self) -> None:
        """Raise `BackendUnavailable` now if nothing could run (before a caller commits to work)."""

    def map(self, fn: Callable[[Item], Result], items: Sequence[Item], on_done: Callable[[Item, Result], None] | None = None) -> list[Result]: ...


@dataclass(frozen=True)
class LocalPool:
    jobs: int
    shares_files: bool = True

    def check(self) -> None:
        pass

    def map(self, fn: Callable[[Item], Result], items: Sequence[Item], on_done: Callable[[Item, Result], None] | None = None) -> list[Result]:
        return map_in_processes(fn, items, min(self.jobs, max(1, len(items))), on_done)


def _versioned(fn: Callable[[Any], Any], item: Any) -> tuple[str, Any]:
    """What a Ray task runs: the item, and the tasim version that ran it (a node with another
    tasim would give other numbers)."""
    from tasim import __version__

    return __version__, fn(item)


@dataclass(frozen=True)
class RayTasks:
    """``address``: "local" starts a private Ray cluster on 127.0.0.1 with ``cpus`` CPUs for the
    sweep and stops it after; "auto" or HOST:PORT joins a running cluster (`ray start`), whose
    nodes must run the same tasim (e.g. one container image, as verl clusters do). A task takes
    one CPU. Output files a task writes stay on its node: callers that need them back return
    them (``shares_files`` is False)."""

    address: str
    cpus: int | None = None
    shares_files: bool = False

    def map(self, fn: Callable[[Item], Result], items: Sequence[Item], on_done: Callable[[Item, Result], None] | None = None) -> list[Result]:
        import ray

        from tasim import __version__

        self.check()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # A private cluster's tasks keep their scratch files in a folder of the sweep's, removed
        # with it: a task killed mid-run (the sweep stopped) cannot remove its own.
        with tempfile.TemporaryDirectory(prefix="tasim-ray-") if self.address == "local" else contextlib.nullcontext() as scratch:
            try:
                if scratch is not None:
                    cpus = self.cpus or os.cpu_count() or 1
                    # The private cluster keeps Ray's default token authentication (it listens on
                    # 127.0.0.1 only); Ray's notice on starting it only says how to opt out.
                    notices = logging.getLogger("ray._private.authentication.authentication_token_setup")
                    level = notices.level
                    notices.setLevel(logging.ERROR)
                    try:
                        init_local_ray(
                            num_cpus=cpus,
                            include_dashboard=False,
                            log_to_driver=False,
                            configure_logging=False,
                            runtime_env={"env_vars": {"TMPDIR": scratch}},
                        )
                    finally:
                        notices.setLevel(level)
                else:
                    ray.init(address=self.address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError) as error:
                raise BackendUnavailable(f"--ray {self.address}: cannot join the Ray cluster ({str(error).splitlines()[0]})") from None
            try:
                task = ray.remote(num_cpus=1)(_versioned)
                pending = {task.remote(fn, item): index for index, item in enumerate(items)}
                done: dict[int, Result] = {}
                waiting = list(pending)
                while waiting:
                    ready, waiting = ray.wait(waiting, num_returns=1)
                    for ref in ready:
                        index = pending[ref]
                        version, result = ray.get(ref)
                        if version != __version__:
                            raise BackendUnavailable(f"--ray {self.address}: a node runs tasim {version}, this machine {__version__}")
                        done[index] = result
                        if on_done:
                            on_done(items[index], result)
                return [done[i] for i in range(len(items))]
            finally:
                ray.shutdown()

    def check(self) -> None:
        """A HOST:PORT that does not answer fails at once (Ray itself retries for a minute)."""
        if self.address in ("local", "auto") or "://" in self.address:
            return
        host, sep, port = self.address.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise BackendUnavailable(f"--ray {self.address}: expected local, auto or HOST:PORT")
        try:
            socket.create_connection((host, int(port)), timeout=3).close()
        except OSError as error:
            raise BackendUnavailable(f"--ray {self.address}: no Ray cluster answers there ({error.strerror or error})") from None
