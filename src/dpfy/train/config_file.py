"""Reading a training configuration from a file or a mapping: TOML, YAML or JSON, every key a
field of :class:`~dpfy.train.config.TrainConfig` and every value converted to its field's type.

A run's published ``config.json`` reads back as is: its facts about the run
(:data:`PUBLIC_ONLY`) are skipped, and its seed is null.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from dpfy._require import require, require_extra
from dpfy.train.config_fields import field_types, optional_fields

__all__ = ["PUBLIC_ONLY", "coerce", "load_config_file"]

# Keys of the published config.json that are facts about the run, not settings: read back
# (``--config config.json``) they are ignored (``spec``: the run spec make_private built).
PUBLIC_ONLY = frozenset({"reproducible", "spec"})


def coerce(values: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """Check keys and convert values to the field types (TOML writes ``lr = 4`` as an int)."""
    types = field_types()
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name in PUBLIC_ONLY:
            continue
        require(
            name in types,
            f"{source} key",
            key,
            f"one of {sorted(types)}",
            "Fix the spelling or remove the key",
        )
        kind = types[name]
        require(
            value is not None or name in optional_fields(),
            name,
            value,
            f"set (in {source})",
            "Give a value or remove the key for its default",
        )
        if value is None or isinstance(value, kind) and not isinstance(value, bool):
            out[name] = value
            continue
        ok = kind is float and isinstance(value, int) and not isinstance(value, bool)
        ok = ok or (kind is int and isinstance(value, float) and value.is_integer())
        what = "a table of KEY = VALUE options" if kind is dict else f"a {kind.__name__}"
        require(ok, name, value, f"{what} (in {source})", "Fix the value's type")
        out[name] = kind(value)
    return out


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The top-level keys of a TOML (``.toml``), YAML (``.yaml``/``.yml``) or JSON config file.

    A run's published ``config.json`` is accepted as is (its seed is null).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    require(
        suffix in (".toml", ".yaml", ".yml", ".json"),
        "config",
        str(path),
        "a .toml, .yaml, .yml or .json file",
        "Rename the file or convert it",
    )
    require(path.is_file(), "config", str(path), "an existing file", "Check the path")
    text = path.read_text()
    if suffix in (".yaml", ".yml"):
        require_extra("yaml", feature="a YAML config file")
    try:
        if suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:  # tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError
        raise ValueError(
            f"config must be valid {suffix[1:].upper()}, got a parse error in "
            f"'{path}': {str(e).splitlines()[0]}. Fix the file"
        ) from None
    require(
        isinstance(data, dict),
        "config",
        str(path),
        "a mapping of keys to values",
        "Write one `key = value` per line",
    )
    return coerce(data, source=f"config file {path.name}")
