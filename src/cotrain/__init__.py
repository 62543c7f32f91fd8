"""cotrain: train one neural network together over the internet."""

from __future__ import annotations

from pathlib import Path


def _version() -> str:
    """The installed distribution's version; in a source tree that is not installed, pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cotrain")
    except PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        if project.get("name") == "cotrain" and project.get("version"):
            return str(project["version"])
    except (OSError, ValueError, KeyError):
        pass
    return "0+unknown"


def __getattr__(name: str):
    # computed on first use, so that importing cotrain does not read package metadata
    if name == "__version__":
        value = globals()["__version__"] = _version()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
