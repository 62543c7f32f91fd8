"""The run config as a file: reading and validating its TOML, writing it back, and :class:`ConfigError`.

:class:`ConfigFile` gives a pydantic model (:class:`cotrain.config.RunConfig`) its ``load``, ``from_toml``,
``from_dict``, ``to_toml`` and ``with_overrides``; every problem they meet is a :class:`ConfigError` whose message
starts with where the config came from and names each bad field by its dotted path (``model.hidden_size: ...``).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError


class Section(BaseModel):
    """A section of the run config: unknown fields refused, frozen, defaults validated too."""
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ConfigError(ValueError):
    """A run config that cannot be used; the message names each bad field."""


class ConfigFile:
    """Loading and dumping for a pydantic model whose fields are TOML values and sections (mixed into one: it
    calls ``model_validate`` and ``model_dump``). A dumped config loads back to an equal one."""

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "run config") -> Self:
        try:
            return cls.model_validate(data)  # type: ignore[attr-defined]
        except ValidationError as e:
            raise ConfigError(_format_errors(e, origin)) from None

    @classmethod
    def from_toml(cls, text: str, origin: str = "run config") -> Self:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{origin}: not valid TOML: {e}") from None
        return cls.from_dict(data, origin)

    @classmethod
    def load(cls, path: str | Path) -> Self:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read run config {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"run config {path} is not UTF-8 text") from None
        return cls.from_toml(text, origin=str(path))

    def to_toml(self) -> str:
        lines: list[str] = []
        top = self.model_dump(mode="python")  # type: ignore[attr-defined]
        for key, value in top.items():
            if not isinstance(value, dict):
                lines.append(f"{key} = {_toml_value(value)}")
        for section, values in top.items():
            if isinstance(values, dict):
                lines.append(f"\n[{section}]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
        return "\n".join(lines).lstrip("\n") + "\n"

    def with_overrides(self, **sections: dict[str, Any]) -> Self:
        """A copy with some fields replaced, validated again: ``cfg.with_overrides(data={"source": path})``."""
        data = self.model_dump(mode="python")  # type: ignore[attr-defined]
        for section, values in sections.items():
            if isinstance(values, dict):
                data.setdefault(section, {}).update(values)
            else:
                data[section] = values
        return type(self).from_dict(data)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _format_errors(error: ValidationError, origin: str) -> str:
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "value_error" and not item["loc"]:
            problems.append(str(item.get("ctx", {}).get("error", message)))  # names its fields itself
            continue
        elif "input" in item and not isinstance(item["input"], dict):
            message = f"{message} (got {item['input']!r})"
        problems.append(f"{field}: {message}")
    return f"{origin}: " + "; ".join(problems)
