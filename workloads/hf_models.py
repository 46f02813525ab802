"""``hf:ARCH``: a Hugging Face transformers language model from a config, with random weights and no network.

``ARCH`` is one of :data:`PRESETS` (dimensions copied from each model's public ``config.json``, cited per
entry) or the path of a ``config.json`` (or of a folder holding one). The model class is the config's
``architectures[0]`` when transformers has it, else the causal-LM (then masked-LM) class for its
``model_type``; only language-model heads are supported (the loss is the model's own, ``labels = input_ids``,
as for the built-in gpt2/bert workloads). Weights are fp32 (the checkpoints' ``torch_dtype`` is a storage
format; ``--dtype bf16`` selects bf16 autocast), except mixture-of-experts models whose experts run on grouped_mm,
which train in 16-bit weights (workloads.hf_dtype). Config fields, fewer layers, transformers' validation and the
class's sub-config: workloads.hf_config. Options: ``seq_len`` (default: 1024 for GPT-2, 512 for
BERT, 2048 for the others, never above the model's positions), ``num_layers`` (0: the config's; fewer layers
make a quick small model).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.files.inputs import read_input_text
from workloads.base import Workload, WorkloadSpec, hf_attention, positive, token_lm_workload
from workloads.hf_config import (
    build_config,
    check_layer_kinds,
    instantiate,
    layer_kinds,
    read_config_text,
    reduce_layers,
)
from workloads.hf_dtype import default_dtype, training_dtype

DEFAULT_BATCH_SIZE = 8
"""Default batch size of an ``hf:`` model (the seed study's GPT-2 batch)."""
DEFAULT_SEQ_LEN = 2048
"""Default sequence length where the preset names none (a choice: a common fine-tuning context)."""
_GPT2 = "https://huggingface.co/openai-community/{}/blob/main/config.json"
_LLAMA3_ROPE = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def _gpt2(n_embd: int, n_layer: int, n_head: int) -> dict[str, Any]:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": n_embd, "n_layer": n_layer,
            "n_head": n_head, "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257}  # fmt: skip


def _bert(hidden: int, layers: int, heads: int, ffn: int) -> dict[str, Any]:
    return {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": ffn,
            "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522}  # fmt: skip


def _llama(hidden: int, ffn: int, layers: int, heads: int, head_dim: int) -> dict[str, Any]:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
            "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": 8, "head_dim": head_dim, "vocab_size": 128256,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": dict(_LLAMA3_ROPE), "tie_word_embeddings": True, "attention_bias": False,
            "mlp_bias": False, "hidden_act": "silu"}  # fmt: skip


def _qwen25(hidden: int, ffn: int, layers: int, heads: int) -> dict[str, Any]:
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": hidden,
            "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
            "use_sliding_window": False, "hidden_act": "silu"}  # fmt: skip


FINE_TUNING_PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "llama-2-7b": (
        {**_llama(4096, 11008, 32, 32, 128), "num_key_value_heads": 32, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False},
        "https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json",
    ),
    "llama-2-13b": (
        {**_llama(5120, 13824, 40, 40, 128), "num_key_value_heads": 40, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False},
        "https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json",
    ),
    "llama-3.1-8b": (
        {**_llama(4096, 14336, 32, 32, 128), "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0},
         "tie_word_embeddings": False},
        "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
    ),
    "mistral-7b": (
        {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
         "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "sliding_window": 4096, "tie_word_embeddings": False, "hidden_act": "silu"},
        "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json",
    ),
    "qwen2.5-7b": (
        {**_qwen25(3584, 18944, 28, 28), "num_key_value_heads": 4, "vocab_size": 152064,
         "max_position_embeddings": 131072, "tie_word_embeddings": False},
        "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json",
    ),
    "gemma-2b": (
        {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 2048,
         "intermediate_size": 16384, "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1,
         "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True},
        "https://huggingface.co/google/gemma-2b/blob/main/config.json",
    ),
    "gemma-7b": (
        {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 3072,
         "intermediate_size": 24576, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
         "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True},
        "https://huggingface.co/google/gemma-7b/blob/main/config.json",
    ),
}  # fmt: skip
"""The fine-tuning families of issue 45 (Llama 2 / 3.1, Mistral, Qwen2.5, Gemma): dimensions from each config.json
(cited); the LoRA, QLoRA and data-parallel estimates and the published-measurement comparison use them."""

PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "gpt2": (_gpt2(768, 12, 12), _GPT2.format("gpt2")),
    "gpt2-medium": (_gpt2(1024, 24, 16), _GPT2.format("gpt2-medium")),
    "gpt2-large": (_gpt2(1280, 36, 20), _GPT2.format("gpt2-large")),
    "gpt2-xl": (_gpt2(1600, 48, 25), _GPT2.format("gpt2-xl")),
    "bert-base": (
        _bert(768, 12, 12, 3072),
        "https://huggingface.co/google-bert/bert-base-uncased/blob/main/config.json",
    ),
    "bert-large": (
        _bert(1024, 24, 16, 4096),
        "https://huggingface.co/google-bert/bert-large-uncased/blob/main/config.json",
    ),
    "llama-3.2-1b": (
        _llama(2048, 8192, 16, 32, 64),
        "https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json",
    ),
    "llama-3.2-3b": (
        _llama(3072, 8192, 28, 24, 128),
        "https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json",
    ),
    "qwen2.5-0.5b": (_qwen25(896, 4864, 24, 14), "https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json"),
    "qwen2.5-1.5b": (_qwen25(1536, 8960, 28, 12), "https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json"),
    **FINE_TUNING_PRESETS,
}
"""Built-in configs: name -> (config.json fields that set the model's size and shape, source)."""
LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM")


def config_file(arch: str) -> Path | None:
    """The config.json ``arch`` names (a file, or a folder holding config.json), None for a preset name."""
    if arch.lower() in PRESETS:
        return None
    path = Path(arch).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(
            f"hf:{arch} is neither a built-in config ({', '.join(PRESETS)}) nor a config.json file or folder"
        )
    return path.resolve()


MAX_CONFIG_BYTES = 16 << 20
"""Largest transformers config.json read (16 MiB; real ones are a few KB)."""


def _read_config(path: Path) -> dict[str, Any]:
    data = read_config_text(read_input_text(path, MAX_CONFIG_BYTES, "a transformers config.json"), str(path))
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise InputError(f"hf config {path} has no model_type (a transformers config.json names one)")
    return data


def _positions(config: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def hf_spec(arch: str) -> WorkloadSpec:
    """The WorkloadSpec of ``hf:arch`` (reads a config file's JSON; imports nothing)."""
    arch = arch.strip()
    if not arch:
        raise InputError(f"hf: needs a config, e.g. hf:llama-3.2-1b; built-in configs: {', '.join(PRESETS)}")
    path = config_file(arch)
    if path is None:
        name = arch.lower()
        config, source = PRESETS[name]
    else:
        name = str(path)
        config, source = _read_config(path), str(path)
    positions = _positions(config)
    default_seq = {"gpt2": 1024, "bert": 512}.get(config["model_type"], DEFAULT_SEQ_LEN)
    if positions is not None:
        default_seq = min(default_seq, positions)
    options = {"seq_len": default_seq, "num_layers": 0}
    return WorkloadSpec(
        f"hf:{name}",
        f"{config.get('architectures', [config['model_type']])[0]} from {source}",
        DEFAULT_BATCH_SIZE,
        partial(build_hf, f"hf:{name}", config),
        options,
        source="transformers",
    )


def _model_class(config: dict[str, Any]) -> Any:
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    names = [a for a in config.get("architectures") or [] if isinstance(a, str) and a.endswith(LM_SUFFIXES)]
    mt = config["model_type"]
    names += [m[mt] for m in (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES) if mt in m]
    for n in names:
        cls = getattr(transformers, n, None)
        if cls is not None:
            return cls
    raise InputError(
        f"hf: model_type {mt!r} has no causal or masked language-model class in transformers "
        f"{transformers.__version__}; only language models are supported"
    )


def build_hf(label: str, config: dict[str, Any], cfg: WorkloadConfig, device: str, opts: dict[str, Any]) -> Workload:
    """Build the language model of ``config`` on ``device`` with random weights, in train mode."""
    import torch

    positive(label, opts, "seq_len")
    if opts["num_layers"] < 0:
        raise InputError(f"workload {label} option num_layers must be >= 0, not {opts['num_layers']}")
    fields = dict(config)
    model_type = fields.pop("model_type")
    hf_config = build_config(label, model_type, fields)
    if opts["num_layers"]:  # workloads.hf_config: every stack cut, per-layer fields with it, every kind of layer kept
        full = layer_kinds(hf_config)
        hf_config = build_config(f"{label} with num_layers {opts['num_layers']}", model_type,
                                 reduce_layers(fields, opts["num_layers"]))  # fmt: skip
        check_layer_kinds(label, full, layer_kinds(hf_config), opts["num_layers"])
    hf_config._attn_implementation = hf_attention(cfg)
    positions = _positions(config)
    if positions is not None and opts["seq_len"] > positions:
        raise InputError(f"{label} seq_len {opts['seq_len']} exceeds the model's {positions} positions")
    cls = _model_class(config)
    weights, notes = training_dtype(label, cls, hf_config, fields, cfg.dtype)  # workloads.hf_dtype: MoE on grouped_mm
    dev = torch.device(device)
    with dev, default_dtype(weights):
        model = instantiate(cls, hf_config)
    model.to(dev)  # what a constructor made on the CPU (torch.normal(mean, std, size) ignores the device context)
    model.loss_type = "ForMaskedLM" if cls.__name__.endswith("ForMaskedLM") else "ForCausalLM"
    model.train()
    vocab = model.config.get_text_config().vocab_size  # the config the class took (a sub-config: MusicGen's decoder)
    workload = token_lm_workload(label, model, dev, cfg.batch_size, opts["seq_len"], vocab)
    workload.notes.extend(notes)
    return workload


def hf_type_names() -> list[str]:
    """Every ``model_type`` transformers maps to a causal or masked language-model class: what a config.json may
    name for ``hf:`` (imports transformers)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_MASKED_LM_MAPPING_NAMES))


def default_config_file(model_type: str, folder: Path) -> Path:
    """Write transformers' default config of ``model_type`` (``AutoConfig.for_model``) as ``folder/config.json``."""
    from transformers import AutoConfig

    folder.mkdir(parents=True, exist_ok=True)
    try:
        conf = AutoConfig.for_model(model_type)
    except Exception as exc:  # transformers' config validators raise their own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"hf: transformers cannot build a default config for model_type {model_type!r}: {first}"
        ) from None
    path = folder / "config.json"
    path.write_text(conf.to_json_string())
    return path
