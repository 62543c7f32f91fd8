"""Regenerate the Python code for the control-plane protos (``make protos``).

The generated modules and their ``.pyi`` stubs are committed under ``src/cotrain/v1``; tests/test_protos.py runs
this script into a temporary folder and fails on any difference, so the committed code never drifts from the
``.proto`` files.
"""

import argparse
import pathlib
import sys

from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
PROTOS = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("cotrain/v1/*.proto"))


def generate(out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed for {PROTOS}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=PROTO_ROOT.parent / "src", help="output root")
    generate(parser.parse_args().out)
    sys.exit(0)
