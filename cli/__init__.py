"""The ``cotrain`` program: the command line, ``cotrain demo``, ``cotrain simulate``, and the starting and stopping
of coordinator and node processes on this machine (for the demo, tests and benches).

It is the one package that knows both sides: it puts the volunteer's commands (:mod:`cotrain.node.cli`) and the
operator's (:mod:`cotrain.coordinator.cli`) under one parser. The shared library (``cotrain``) imports neither
side nor this package.
"""

from cotrain.cli.main import main

__all__ = ["main"]
