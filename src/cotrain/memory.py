"""glibc's malloc, kept lean in a long-lived process: its arenas capped before threads start, and the memory the
program freed handed back to the kernel now and then. Nodes and the coordinator both call these (elsewhere than
glibc they do nothing)."""

from __future__ import annotations

import os
from typing import Callable, Optional


#: glibc's malloc arenas a process keeps at most. glibc gives threads their own arenas (up to 8 a core), and each keeps
#: the memory freed in it: a node's threads (training, the progress board, the exchange, gRPC) held 37-60 MB more in
#: a micro-bench of the demo's training step on 4 threads than on 2 arenas, with no difference in speed
MALLOC_ARENAS = 2


def limit_malloc_arenas(count: int = MALLOC_ARENAS) -> str:
    """Cap glibc's malloc arenas for this process and those it forks (hivemind's DHT process), before its threads
    start; an operator's ``MALLOC_ARENA_MAX`` is kept. -> what was done, in words (elsewhere than glibc: nothing)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return f"malloc arenas: MALLOC_ARENA_MAX={os.environ['MALLOC_ARENA_MAX']} (the environment's)"
    try:
        import ctypes

        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "malloc arenas: not glibc, left alone"
    M_ARENA_MAX = -8
    if not mallopt(M_ARENA_MAX, int(count)):
        return "malloc arenas: glibc refused the cap"
    return f"malloc arenas: at most {count}"


_malloc_trim: Optional[Callable[[int], int]] = None


def release_freed_memory() -> bool:
    """Hand back to the kernel the memory glibc's malloc keeps after the program freed it: ``malloc_trim(0)``, which
    releases the free pages inside the heap, not only at its top as malloc does by itself. -> whether glibc released
    any (elsewhere than glibc: False, nothing done).

    A node calls it at a new round, at most every 30 s (``runner.TRIM_EVERY_S``). Its freed memory is what the warm
    start's download, a state transfer, an all-reduce's buffers and a checkpoint's serialization left in the middle of the heap: in the 4-node demo a node's
    main process went from 284 to 148 MB PSS at one call, and once a round it stays at 220-226 MB while training
    (166 MB just after a call: the rest is a step's activations, about 60 MB, which every step needs again). The
    call took 5-8 ms on the demo's heap, and the step after it 10-40 ms more (its pages faulted in again): once a
    round of 40 steps it is noise; after every step it would not be."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = lambda pad: 0  # noqa: E731  (not glibc: nothing to trim this way)
    return bool(_malloc_trim(0))


#: where :func:`trace_allocations_from_env` writes its reports (a folder), and every how many seconds
TRACE_ENV, TRACE_EVERY_ENV = "COTRAIN_TRACEMALLOC", "COTRAIN_TRACEMALLOC_S"


def trace_allocations_from_env(who: str) -> Optional[str]:
    """With ``COTRAIN_TRACEMALLOC=DIR`` in the environment: trace this process's Python allocations (tracemalloc, the
    line that made each block) and, every ``COTRAIN_TRACEMALLOC_S`` seconds (300), write to ``DIR/<who>-<pid>.txt`` the allocation
    sites whose memory grew most since the first report, and the traced total; for hunting what grows over a soak
    (bench/soak.py --tracemalloc). Memory that torch, glibc or a C library allocates itself is not traced. Tracing
    slows allocation-heavy code several times over: never on by default. -> what was started, in words, or None."""
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return None
    import threading
    import time
    import tracemalloc
    from pathlib import Path

    try:
        every = max(1.0, float(os.environ.get(TRACE_EVERY_ENV, "300")))
    except ValueError:
        every = 300.0
    path = Path(folder) / f"{who}-{os.getpid()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    # one frame, grouped by line: a node holds millions of traced blocks, and grouping them by 8-frame tracebacks
    # took its report thread more than 10 minutes on 2 loaded cores (py-spy: Snapshot._group_by)
    tracemalloc.start(1)
    import linecache

    # the reports' own lines: this file's, and the source lines their tracebacks read (linecache kept 4 MB of them
    # after three reports, the largest "growth" a soak's node showed)
    ignored = [tracemalloc.Filter(False, tracemalloc.__file__),
               tracemalloc.Filter(False, "<frozen importlib._bootstrap>"), tracemalloc.Filter(False, "<unknown>"),
               tracemalloc.Filter(False, __file__), tracemalloc.Filter(False, linecache.__file__)]

    def report() -> None:
        first, started, tensors_first = None, time.time(), {}
        while True:
            time.sleep(every)
            snapshot = tracemalloc.take_snapshot().filter_traces(ignored)
            if first is None:
                first, tensors_first = snapshot, tensor_census()
                continue
            minutes = (time.time() - started) / 60
            traced = tracemalloc.get_traced_memory()[0] / 1e6
            lines = [f"{who} pid {os.getpid()}: {minutes:.0f} min, traced {traced:.1f} MB; "
                     f"growth since {every:g}s in, largest first:"]
            grown = sorted(snapshot.compare_to(first, "lineno"), key=lambda stat: stat.size_diff, reverse=True)
            for stat in grown[:25]:  # what grew, not what a moment's buffers freed since
                lines.append(f"{stat.size_diff / 1e3:+.0f} kB in {stat.count_diff:+d} blocks "
                             f"(now {stat.size / 1e3:.0f} kB)")
                lines.extend(f"    {line}" for line in stat.traceback.format()[-16:])
            lines.extend(census_lines(tensors_first, tensor_census()))
            partial = path.with_name(path.name + ".partial")  # a reader sees the last whole report
            partial.write_text("\n".join(lines) + "\n")
            os.replace(partial, path)

    threading.Thread(target=report, name="tracemalloc", daemon=True).start()
    return f"tracing allocations into {path} every {every:g}s"


def tensor_census() -> dict[tuple, tuple[int, int]]:
    """The live torch tensors the garbage collector sees (those made since ``gc.freeze`` included, the model's own
    frozen before the fork not), by (shape, dtype): (count, bytes of their storages, each storage counted once).
    Their memory is torch's, not Python's: tracemalloc sees only a tensor's small Python object. Empty without
    torch loaded."""
    import gc
    import sys
    import warnings

    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    seen, out = set(), {}
    with warnings.catch_warnings():  # isinstance on torch's deprecated module attributes warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        try:
            storage = obj.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # meta, sparse or other tensors without one storage
            continue
        if ptr in seen:
            continue
        seen.add(ptr)
        key = (tuple(obj.shape), str(obj.dtype).replace("torch.", ""))
        count, total = out.get(key, (0, 0))
        out[key] = (count + 1, total + nbytes)
    return out


def census_lines(before: dict, now: dict, top: int = 10) -> list[str]:
    """What grew between two :func:`tensor_census`, in words: the totals, and the shapes whose bytes grew most."""
    def total(census: dict) -> tuple[int, int]:
        return sum(c for c, _ in census.values()), sum(b for _, b in census.values())

    (c0, b0), (c1, b1) = total(before), total(now)
    lines = [f"live tensors (not frozen): {c1} holding {b1 / 1e6:.1f} MB, {c1 - c0:+d} and {(b1 - b0) / 1e6:+.1f} MB "
             f"since the first report; shapes that grew most:"]
    grown = sorted(now, key=lambda k: now[k][1] - before.get(k, (0, 0))[1], reverse=True)[:top]
    for key in grown:
        (c, b), (cb, bb) = now[key], before.get(key, (0, 0))
        if b > bb:
            lines.append(f"  {list(key[0])} {key[1]}: {c - cb:+d} tensors, {(b - bb) / 1e3:+.0f} kB (now {c}, "
                         f"{b / 1e3:.0f} kB)")
    return lines
