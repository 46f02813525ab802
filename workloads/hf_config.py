"""The config side of ``hf:`` models: reading a config.json, fewer layers, transformers' validation, the class.

- :func:`read_config_text`: a config.json as transformers writes it, whose non-finite floats are objects
  (``{"__float__": "Infinity"}``, transformers ``PreTrainedConfig._encode_special_floats``; Mamba-2's
  ``time_step_limit`` is ``(0.0, inf)``): they are decoded as transformers' own ``from_json_file`` does.
- :func:`reduce_layers`: ``num_layers N`` keeps the first N layers of every stack. The layer counts
  (:data:`LAYER_COUNT_KEYS`, also inside sub-configs such as ``text_config``) become N, per-layer lists (as long as
  a count) keep their first N entries, per-layer dicts keyed by layer index (``per_layer_config``) and lists of
  layer indices (``mlp_only_layers``) keep the entries below N.
- :func:`build_config`: transformers' config class from the fields; its validators' refusal is one sentence naming
  the field (:func:`validation_error`).
- :func:`check_layer_kinds`: a model whose layers come in kinds (``layer_types``, ``layers_block_type``,
  ``mlp_layer_types``: attention / linear-attention / Mamba / MoE layers of hybrid models) must keep one layer of
  each kind: with only linear-attention layers, transformers' hybrid caches fail ("``get_seq_length`` can only be
  called on Attention layers"). A ``num_layers`` that drops a kind is refused in one sentence naming the smallest
  that keeps them all (:func:`covering_layers`).
- :func:`instantiate`: the model class on the config, given its text sub-config when the class takes that
  (``Qwen3_5ForCausalLM`` on a ``Qwen3_5Config``), as ``AutoModelForCausalLM.from_config`` does
  (transformers ``models/auto/auto_factory.py``).

Only :func:`read_config_text` and :func:`reduce_layers` run without transformers.
"""

from __future__ import annotations

import math
from typing import Any

from uvmlab.errors import InputError
from uvmlab.files.inputs import decode_json

LAYER_COUNT_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "num_blocks",
)
"""Fields that count a stack's layers in transformers' configs (decoder-only: the first; encoder-decoder: the
encoder and decoder pairs; xLSTM's ``num_blocks``). Found by reading every default config transformers 5.24 builds."""
SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
"""transformers' JSON spellings of non-finite floats (configuration_utils ``_FLOAT_TAG_VALUES``)."""


def _decode(obj: dict[str, Any]) -> Any:
    if set(obj) == {"__float__"} and obj["__float__"] in SPECIAL_FLOATS:
        return SPECIAL_FLOATS[obj["__float__"]]
    return obj


def read_config_text(text: str, source: str = "config.json") -> Any:
    """The JSON of a config.json with transformers' special floats decoded (module docstring); the text goes
    through :func:`uvmlab.files.inputs.decode_json` (numbers checked as every JSON input's, one sentence on bad
    JSON), then the ``{"__float__": ...}`` objects are replaced."""
    return _decoded(decode_json(text, source, "a transformers config.json"))


def _decoded(value: Any) -> Any:
    if isinstance(value, dict):
        value = {k: _decoded(v) for k, v in value.items()}
        return _decode(value)
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _index_key(key: Any) -> int | None:
    text = str(key)
    return int(text) if text.isdigit() else None


def reduce_layers(fields: dict[str, Any], n: int) -> dict[str, Any]:
    """``fields`` with every stack cut to its first ``n`` layers (module docstring); sub-configs too."""
    out = dict(fields)
    counts = {k: out[k] for k in LAYER_COUNT_KEYS if _count(out.get(k))}
    for key, value in counts.items():
        out[key] = min(value, n)
    lengths = {v for v in counts.values() if v > n}
    longest = max(counts.values(), default=0)
    for name, value in fields.items():
        if name in counts:
            continue
        if isinstance(value, dict) and isinstance(value.get("model_type"), str):
            out[name] = reduce_layers(value, n)
        elif isinstance(value, list) and len(value) in lengths:
            out[name] = value[:n]  # one entry per layer
        elif isinstance(value, dict) and value and all(_index_key(k) is not None for k in value) and lengths:
            out[name] = {k: v for k, v in value.items() if (_index_key(k) or 0) < n}  # keyed by layer index
        elif (
            isinstance(value, list)
            and lengths
            and "layer" in name
            and value
            and all(_count(i) and 0 <= i < longest for i in value)
        ):
            out[name] = [i for i in value if i < n]  # layer indices
    return out


def validation_error(label: str, exc: Exception) -> InputError:
    """One sentence for a config that transformers refuses, with what it names (its validators name the field:
    ``Validation error for field 'time_step_limit'``, then the reason)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    head = lines[0] if lines else type(exc).__name__
    detail = lines[1] if len(lines) > 1 else ""
    if len(detail) > 200:
        detail = detail[:197] + "..."
    return InputError(f"{label}: transformers' config validation refuses it: {head.rstrip(':')}" + (
        f" ({detail})" if detail else ""))  # fmt: skip


def build_config(label: str, model_type: str, fields: dict[str, Any]) -> Any:
    """transformers' config object of ``model_type`` from ``fields`` (without ``model_type``)."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise InputError(f"{label}: transformers has no model_type {model_type!r}")
    try:
        return CONFIG_MAPPING[model_type].from_dict(fields)
    except Exception as exc:  # a config class refuses with its own types (StrictDataclass...Error, ValueError, ...)
        raise validation_error(label, exc) from None


def layer_kinds(config: Any) -> dict[str, list[str]]:
    """The per-layer kind lists of a config object: its list attributes of strings, one per layer."""
    try:
        text = config.get_text_config()
    except ValueError:  # several text sub-configs (MusicGen's text encoder and decoder): the config's own fields
        text = config
    layers = next((getattr(text, k) for k in LAYER_COUNT_KEYS if _count(getattr(text, k, None))), None)
    if not layers:
        return {}
    kinds = {}
    for name in dir(text):
        if name.startswith("_") or "layer" not in name:
            continue
        try:
            value = getattr(text, name)
        except Exception:  # a property that needs other fields: not a per-layer list
            continue
        if isinstance(value, list | tuple) and len(value) == layers and all(isinstance(v, str) for v in value):
            kinds[name] = list(value)
    return kinds


def covering_layers(kinds: dict[str, list[str]], minimum: int = 1, each: int = 1) -> int:
    """The fewest first layers (at least ``minimum``) that hold ``each`` layers of every kind of every list (or all of
    a kind's layers when it has fewer)."""
    need = minimum
    for values in kinds.values():
        for kind in set(values):
            where = [i for i, v in enumerate(values) if v == kind]
            need = max(need, where[min(each, len(where)) - 1] + 1)
    return need


def check_layer_kinds(label: str, full: dict[str, list[str]], reduced: dict[str, list[str]], n: int) -> None:
    """Refuse a ``num_layers`` whose first ``n`` layers lack a kind of layer the full config has (one sentence)."""
    for name, values in full.items():
        missing = sorted(set(values) - set(reduced.get(name, values[:n])))
        if missing:
            raise InputError(
                f"{label}: num_layers {n} keeps no {', '.join(missing)} layer of {name} (the model's "
                f"kinds of layer: {', '.join(sorted(set(values)))}); take num_layers >= {covering_layers(full)} "
                "or 0 (the config's own)"
            )


def instantiate(cls: Any, config: Any) -> Any:
    """``cls(config)``, given the sub-config whose class ``cls`` takes when that is not the config's own (module
    docstring; MusicGen's causal LM takes the ``decoder`` sub-config)."""
    wanted = getattr(cls, "config_class", None)
    if wanted is not None and not isinstance(config, wanted):
        for key, sub in getattr(config, "sub_configs", {}).items():
            if sub is wanted and getattr(config, key, None) is not None:
                return cls(getattr(config, key))
    return cls(config)


def fewest_layers(config: dict[str, Any], minimum: int = 2, each: int = 1) -> int:
    """The smallest ``num_layers`` (at least ``minimum``) that keeps ``each`` layers of every kind of ``config`` (a
    config.json's fields, with ``model_type``): what a quick build of the architecture takes
    (benchmarks/all_model_names.py)."""
    fields = dict(config)
    model_type = fields.pop("model_type")
    return covering_layers(layer_kinds(build_config(model_type, model_type, fields)), minimum, each)
