"""Pick a model backend by name from the workspace's ``model:`` settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evidence_pipeline.authoring.backends.base import BACKEND_NAMES, ModelBackend
from evidence_pipeline.authoring.backends.openai import OpenAIBackend
from evidence_pipeline.authoring.backends.pi import PiBackend
from evidence_pipeline.authoring.backends.structural import StructuralBackend
from evidence_runtime.errors import ConfigError


def make_backend(name: str, settings: Mapping[str, Any]) -> ModelBackend:
    """Build the backend ``name`` from its settings (``thoth.yaml`` ``model:`` section).

    Settings may be flat or namespaced by backend (``pi: {...}``, ``openai: {...}``); keys that
    belong to another backend are ignored, unknown keys are a :class:`ConfigError`.
    """
    if name not in BACKEND_NAMES:
        raise ConfigError(f"unknown model backend {name!r} (choose one of: "
                          f"{', '.join(BACKEND_NAMES)})", field="model.backend")
    own = _settings_for(name, settings)
    if name == "structural":
        return StructuralBackend()
    if name == "pi":
        return PiBackend.from_settings(own)
    return OpenAIBackend.from_settings(own)


_KNOWN_KEYS: dict[str, frozenset[str]] = {
    "pi": frozenset({"command", "provider", "model", "thinking", "timeout_s", "extensions",
                     "agent_dir"}),
    "openai": frozenset({"base_url", "model", "api_key_env", "timeout_s", "max_tokens"}),
    "structural": frozenset(),
}


def _settings_for(name: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    all_known = frozenset().union(*_KNOWN_KEYS.values())
    own: dict[str, Any] = {}
    for key, value in settings.items():
        if key == "backend":
            continue
        if key in BACKEND_NAMES:
            if not isinstance(value, Mapping):
                raise ConfigError(f"model.{key} must be a mapping of settings",
                                  field=f"model.{key}")
            continue
        if key not in all_known:
            raise ConfigError(f"unknown model setting {key!r}", field=f"model.{key}")
        if key in _KNOWN_KEYS[name]:
            own[key] = value
    nested = settings.get(name)
    if isinstance(nested, Mapping):
        for key, value in nested.items():
            if key not in _KNOWN_KEYS[name]:
                raise ConfigError(f"unknown setting {key!r} for the {name} backend (known: "
                                  f"{', '.join(sorted(_KNOWN_KEYS[name])) or 'none'})",
                                  field=f"model.{name}.{key}")
            own[key] = value
    return own
