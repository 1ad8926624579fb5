"""Locate, load and dump ``config.json`` and ``hf_quant_config.json``.

Which file wins. vLLM reads ``config.json``'s ``quantization_config`` (top level, else
``text_config.quantization_config`` on VLM configs, else ``compression_config``) and falls
back to ``hf_quant_config.json`` only when config.json declares nothing. `quant_location`
is that lookup, written once; the declarations and the rewriters both use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpconv.errors import QuantConfigError
from mtpconv.jsonio import dumps_json, read_json

CONFIG_JSON = "config.json"
HF_QUANT_JSON = "hf_quant_config.json"

# Where config.json may declare quantization, in the order vLLM looks.
_LOCATIONS: tuple[tuple[str, ...], ...] = (
    ("quantization_config",),
    ("text_config", "quantization_config"),
    ("compression_config",),
)


@dataclass
class QuantConfigs:
    """Both files as loaded, key order preserved."""

    config: dict[str, Any]
    hf_quant: dict[str, Any] | None
    config_path: Path | None = None
    hf_quant_path: Path | None = None

    def dumped(self) -> dict[str, str]:
        """File name -> JSON text, for the files this checkpoint has (config.json first)."""
        out = {CONFIG_JSON: dumps_json(self.config)}
        if self.hf_quant is not None:
            out[HF_QUANT_JSON] = dumps_json(self.hf_quant)
        return out


@dataclass(frozen=True)
class QuantLocation:
    """Where config.json declares its quantization: the key path and the object there."""

    keys: tuple[str, ...]  # ("quantization_config",) or ("text_config", "quantization_config")
    body: dict[str, Any]  # the object itself (not a copy: rewriters edit it in place)

    @property
    def source(self) -> str:
        """The name findings and errors use for this declaration."""
        if self.keys[0] == "text_config":
            return "config.json (text_config)"
        if self.keys[0] == "compression_config":
            return "config.json (compression_config)"
        return CONFIG_JSON


def load_quant_configs(directory: Path) -> QuantConfigs:
    """Load ``config.json`` (required) and ``hf_quant_config.json`` (optional) from a checkpoint."""
    directory = Path(directory)
    config_path = directory / CONFIG_JSON
    if not config_path.is_file():
        raise QuantConfigError(f"{config_path} is missing: a checkpoint directory needs its config.json.")
    config = read_json(config_path, QuantConfigError)
    hf_quant_path: Path | None = directory / HF_QUANT_JSON
    hf_quant: dict[str, Any] | None = None
    if hf_quant_path is not None and hf_quant_path.is_file():
        hf_quant = read_json(hf_quant_path, QuantConfigError)
    else:
        hf_quant_path = None
    return QuantConfigs(
        config=config, hf_quant=hf_quant, config_path=config_path, hf_quant_path=hf_quant_path
    )


def quant_location(config: dict[str, Any]) -> QuantLocation | None:
    """Where config.json declares quantization, as vLLM looks for it; None when nowhere."""
    for keys in _LOCATIONS:
        node: Any = config
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or node.get(keys[-1]) is None:
            continue
        body = node[keys[-1]]
        if not isinstance(body, dict):
            raise QuantConfigError(f"config.json {'.'.join(keys)!r} must be an object.")
        return QuantLocation(keys, body)
    return None
