"""One process that has imported torch, hivemind and cotrain once, and forks every node started on this machine.

A node is a Python process with torch and hivemind loaded: about 190 MB of memory before it does anything (torch's
operator tables and the modules' objects), and hivemind forks its DHT process from it. Started one by one
(``python -m cotrain.cli node join ...``), 32 nodes on one machine hold 32 copies of that image. Forked from one
process that loaded it (a zygote, as Android starts its apps), they share its pages until they write to them: the
image is paid once, and a node's proportional memory (PSS, :mod:`cotrain.footprint`) is what it adds of its own.
:func:`cotrain.cli.launch.start_node` uses it for ``cotrain demo`` and the benches when given a :class:`Zygote`.

The zygote is a plain process of this machine's user, and a node forked from it runs ``cotrain.cli.main`` with its
arguments exactly as ``python -m cotrain.cli`` would, except for what the zygote already decided: the modules are
imported and environment variables read at import (``OMP_NUM_THREADS``, ``HIVEMIND_*``) are read once, by the zygote.
A request's ``env`` is applied before the node's own code runs.

Protocol (JSON lines; the zygote reads requests on its stdin and writes replies on its stdout):

- ``{"id": N, "args": [...], "log": PATH, "env": {...}, "cwd": PATH}`` -> ``{"id": N, "pid": PID}``: a node, in a
  session of its own (its process group: stopping it stops its DHT process and libp2p daemon), its stdin on
  /dev/null, its stdout and stderr appended to ``log``;
- when a node exits: ``{"exit": PID, "code": C}`` (C as ``subprocess`` gives it: -N for a signal).

The zygote ends when its stdin closes (the launcher closed it, or died); the nodes it forked are then killed
(Linux's parent-death signal), so a crashed launcher leaves no node behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Optional, Sequence

#: what a node imports before it does anything: loaded once here, shared by every node forked from here.
#: ``torch._dynamo`` too: torch imports it at the first call of an optimizer's step (and of the other methods it
#: marks ``_disable_dynamo``): 1.5-1.8 s of CPU and about 69 MB of memory, which a node importing it after the fork
#: would hold as its own
PRELOAD = ("torch", "torch._dynamo", "hivemind", "grpc", "cotrain.cli.main", "cotrain.node.runner", "cotrain.tasks")


class ZygoteError(RuntimeError):
    pass


# ---- the zygote process --------------------------------------------------------------------------------------------
def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _name_process(name: str) -> None:
    """What ``top`` and ``ps -o comm`` show for this process (15 bytes at most; its command line stays the
    zygote's). Linux only."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(15, name.encode()[:15])  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _run_node(request: dict, wake_fds: Sequence[int]) -> None:
    """In the forked child: become the node the request asks for; never returns."""
    code = 1
    try:
        for fd in wake_fds:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the zygote ignores it; a node is Python's own
        os.setsid()
        from cotrain.averaging.dht import kill_me_with_parent

        kill_me_with_parent()
        _name_process(f"cotrain {request['args'][0] if request['args'] else ''}".strip())
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        sys.stdout.reconfigure(line_buffering=True)
        os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
        if request.get("cwd"):
            os.chdir(request["cwd"])
        import numpy as np

        np.random.seed()  # numpy's global generator was seeded once, in the zygote: every node would draw alike
        from cotrain.cli.main import main

        sys.argv = ["cotrain", *request["args"]]
        try:
            code = main(list(request["args"]))
        except SystemExit as e:
            if isinstance(e.code, str):
                print(f"cotrain: {e.code}", file=sys.stderr)
                code = 2
            else:
                code = int(e.code or 0)
    except BaseException:  # noqa: BLE001 - the node's own crash: its traceback goes to its log, as python's would
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(int(code) & 0xFF if isinstance(code, int) else 1)


def serve() -> None:
    """The zygote's loop: preload, say ready, fork a node per request, report each exit, end at EOF."""
    import gc
    import importlib

    from cotrain.memory import limit_malloc_arenas, release_freed_memory

    limit_malloc_arenas()  # what a node does first, here before the preloads' threads allocate (the nodes inherit it)
    for name in PRELOAD:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # the nodes' collectors then never walk (and so never copy) the pages of what was loaded here
    release_freed_memory()  # what the imports freed: no node needs a copy of those pages
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's exit wakes select() through the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the launcher, which stops the nodes itself
    stdin = sys.stdin.buffer
    _reply({"ready": os.getpid()})
    buffered = b""
    while True:
        readable, _, _ = select.select([stdin.fileno(), wake_r], [], [], 1.0)
        if wake_r in readable:
            os.read(wake_r, 4096)
        while True:  # reap every node that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if stdin.fileno() not in readable:
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            return  # the launcher closed our stdin or died: our nodes die with us
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            request = None
            try:
                request = json.loads(line)
                args = request["args"]
                if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                    raise ValueError("args: a list of strings")
                if not isinstance(request.get("log"), str):
                    raise ValueError("log: a path")
            except (ValueError, KeyError, TypeError) as e:  # a launcher's bug: said to it, and the zygote goes on
                _reply({"id": request.get("id") if isinstance(request, dict) else None, "error": str(e)})
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_node(request, (wake_r, wake_w))
            _reply({"id": request.get("id"), "pid": pid})


# ---- the launcher's side -------------------------------------------------------------------------------------------
class ZygoteChild:
    """A node forked by the zygote, with the part of :class:`subprocess.Popen` that :class:`~cotrain.cli.launch.Proc`
    uses. It is not this process's child: its exit code comes from the zygote."""

    def __init__(self, zygote: "Zygote", pid: int):
        self._zygote, self.pid = zygote, pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self._zygote._exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        code = self._zygote._wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"node {self.pid}", timeout)
        self.returncode = code
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class Zygote:
    """Start the zygote (a few seconds: it imports torch and hivemind) and fork nodes from it with :meth:`spawn`.
    ``log_path``: where the zygote's own stderr goes. Close it (or use ``with``) to stop it; nodes still running then
    are killed with it."""

    def __init__(self, log_path: Path, timeout: float = 120.0):
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen([sys.executable, "-m", "cotrain.cli.zygote"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, start_new_session=True,
                                      env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._cond = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}
        self._ready = False
        self._closed = False
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready or self._closed, timeout):
                self.close()
                raise ZygoteError(f"the zygote did not start within {timeout:.0f}s (see {log_path})")
            if not self._ready:
                self.close()
                raise ZygoteError(f"the zygote exited while starting (see {log_path})")

    def _read(self) -> None:
        for line in self.popen.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            with self._cond:
                if "ready" in message:
                    self._ready = True
                elif "exit" in message:
                    self._exits[int(message["exit"])] = int(message["code"])
                elif isinstance(message.get("id"), int):  # a refusal of a line no spawn() sent has no id
                    self._replies[message["id"]] = message
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def spawn(self, args: Sequence[str], log_path: Path, env: Optional[dict] = None,
              timeout: float = 30.0) -> ZygoteChild:
        """Fork ``cotrain ARGS`` from the zygote, its output appended to ``log_path``."""
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._cond:
            if self._closed:
                raise ZygoteError("the zygote has exited")
            request_id = self._next_id
            self._next_id += 1
        request = {"id": request_id, "args": list(args), "log": str(log_path.resolve()), "env": env or {},
                   "cwd": os.getcwd()}
        self.popen.stdin.write((json.dumps(request) + "\n").encode())
        self.popen.stdin.flush()
        with self._cond:
            if not self._cond.wait_for(lambda: request_id in self._replies or self._closed, timeout):
                raise ZygoteError(f"the zygote did not fork {' '.join(args[:2])} within {timeout:.0f}s")
            reply = self._replies.pop(request_id, None)
        if reply is None:
            raise ZygoteError("the zygote exited before forking")
        if "error" in reply:
            raise ZygoteError(f"the zygote refused the request: {reply['error']}")
        return ZygoteChild(self, int(reply["pid"]))

    def _exit_code(self, pid: int) -> Optional[int]:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            return -signal.SIGKILL if self._closed else None  # the zygote gone: its nodes were killed with it

    def _wait_exit(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._closed, timeout)
        return self._exit_code(pid)

    def close(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._reader.join(timeout)
        self._log.close()

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    serve()
