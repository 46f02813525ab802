"""Does an ``hf:`` architecture train in transformers itself? The reference set of benchmarks/all_model_names.py.

An architecture (a ``model_type`` transformers maps to a causal or masked LM class) *trains in transformers* when,
from transformers' own default config (``AutoConfig.for_model``), cut to fewer layers (:func:`depths`: the fewest that
keep one layer of every kind, else two of every kind, else the config's own depth; the first that trains is the depth
uvmlab's estimate then builds) and made small for this machine's CPU (:func:`tiny_fields`), transformers' own Auto
class (``AutoModelForCausalLM``, else ``AutoModelForMaskedLM``) builds the model on the CPU with random weights (fp32,
seed 0), and one forward pass with ``labels = input_ids`` (batch 2 x 16 random tokens) and ``loss.backward()`` run
without an exception. No uvmlab code runs the model: the capture, the
emulations and the meta device are all out of it.

What "small" changes (:func:`tiny_fields`), so that the check fits in a few GiB on a shared 2-core machine: the
vocabulary is cut to :data:`TINY_VOCAB` tokens (special token ids above it are moved below it), expert counts to
:data:`TINY_EXPERTS` (routing at most 2 per token, one expert group), feed-forward widths to :data:`TINY_FFN`. Hidden
sizes, heads, head dimensions, layer kinds and everything else stay the config's. What this can miss: a failure
that only a full-width or full-depth model shows (a shape rule that the cut widths happen to satisfy).
"""

from __future__ import annotations

from typing import Any

TINY_VOCAB = 1024
TINY_EXPERTS = 4
TINY_FFN = 512
MAX_PARAMETERS = 500_000_000
"""Larger tiny models are narrowed (:data:`NARROW`), then not run (fp32 weights + gradients of 500 M parameters:
4 GB)."""
NARROW = 4
WIDTHS = ("hidden_size", "d_model", "n_embd", "embedding_size", "embedding_dim", "embed_dim", "dim")
"""Fields that set a model's width: divided by ``NARROW`` (when that leaves a multiple of 8) for models still too
large once small; heads and head dimensions stay, so an explicit head_dim model keeps its attention shape."""
EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "num_routed_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token", "moe_k")
GROUPS = ("n_group", "topk_group")


def _is_token_id(key: str) -> bool:
    return key.endswith(("token_id", "token_ids", "_token_index"))


def _small_ids(fields: dict[str, Any]) -> dict[str, Any]:
    """The config's special token ids at or above ``TINY_VOCAB`` moved below it (distinct values from the top down):
    an id names a token, it shapes nothing."""
    out: dict[str, Any] = {}
    free = iter(range(TINY_VOCAB - 1, 0, -1))
    moved: dict[int, int] = {}
    for key, value in fields.items():
        if not _is_token_id(key):
            continue
        values = value if isinstance(value, list) else [value]
        new = [moved.setdefault(v, next(free)) if isinstance(v, int) and not isinstance(v, bool) and v >= TINY_VOCAB
               else v for v in values]  # fmt: skip
        out[key] = new if isinstance(value, list) else new[0]
    return out


def tiny_fields(fields: dict[str, Any], narrow: int = 1) -> dict[str, Any]:
    """``fields`` (a config.json's, sub-configs included) made small for the CPU (module docstring); ``narrow`` > 1
    also divides the model width (:data:`WIDTHS`) by it where that leaves a multiple of 8."""
    out = dict(fields)
    if isinstance(fields.get("vocab_size"), int):
        out.update(_small_ids(fields))
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(value.get("model_type"), str):
            out[key] = tiny_fields(value, narrow)
        elif key in WIDTHS and isinstance(value, int) and not isinstance(value, bool) and narrow > 1:
            if value % (narrow * 8) == 0:
                out[key] = value // narrow
        elif isinstance(value, bool) or not isinstance(value, int | list):
            continue
        elif key == "vocab_size" and isinstance(value, int):
            out[key] = min(value, TINY_VOCAB)
        elif key in EXPERT_COUNTS and isinstance(value, int):
            out[key] = min(value, TINY_EXPERTS)
        elif key in EXPERTS_PER_TOKEN and isinstance(value, int):
            out[key] = min(value, 2)
        elif key in GROUPS and isinstance(value, int):
            out[key] = 1
        elif ("intermediate_size" in key or key in ("ffn_hidden_size", "d_ff", "n_inner")) and isinstance(value, int):
            out[key] = min(value, TINY_FFN)
        elif key == "vocab_size_per_layer_input" and isinstance(value, int):
            out[key] = min(value, TINY_VOCAB)
        elif "intermediate_size" in key and isinstance(value, list):
            out[key] = [min(v, TINY_FFN) if isinstance(v, int) else v for v in value]
    return out


def depths(fields: dict[str, Any]) -> list[int]:
    """The layer counts to try, fewest first (module docstring); 0: the config's own."""
    from workloads.hf_config import LAYER_COUNT_KEYS, fewest_layers

    full = max((v for k, v in fields.items() if k in LAYER_COUNT_KEYS and isinstance(v, int)), default=0)
    cuts = sorted({fewest_layers(fields, 2, each) for each in (1, 2)})
    return [n for n in cuts if n < full] + [0]


def trains_in_transformers(model_type: str) -> dict[str, Any]:
    """{"trains": True / False / None, "why": what failed at each depth tried, "parameters": of the tiny model that
    trained, "num_layers": the depth that trained (0: the config's own), else the fewest tried}. Each depth of
    :func:`depths` is tried until one trains. False: every depth failed in transformers; None: a depth failed and the
    next could not be run here (too large even when small), so whether the architecture trains is not known."""
    from transformers import AutoConfig

    from workloads.hf_config import read_config_text

    try:
        fields = read_config_text(AutoConfig.for_model(model_type).to_json_string())
        ladder = depths(fields)
    except Exception as exc:  # transformers' own config classes refuse their default
        return {"trains": False, "why": f"its default config: {_first_line(exc)}", "parameters": None,
                "num_layers": None}  # fmt: skip
    tried = []
    for n in ladder:
        result = _train_once(model_type, fields, n)
        if result["trains"] is True:
            return result
        tried.append(result)
    unknown = any(r["trains"] is None for r in tried)
    return {"trains": None if unknown else False, "why": "; ".join(r["why"] for r in tried), "parameters": None,
            "num_layers": ladder[0]}  # fmt: skip


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0][:160]


def _train_once(model_type: str, fields: dict[str, Any], layers: int) -> dict[str, Any]:
    """Build the tiny model at ``layers`` (0: all) and train one step (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from workloads.hf_config import build_config, reduce_layers

    where = f"{layers or 'all'} layers"
    auto = AutoModelForCausalLM if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModelForMaskedLM
    cut = reduce_layers(fields, layers) if layers else fields
    n = 0
    for narrow in (1, NARROW):
        small = tiny_fields(cut, narrow)
        small.pop("model_type")
        try:
            config = build_config(model_type, model_type, small)
            with torch.device("meta"):
                n = sum(p.numel() for p in auto.from_config(config).parameters())
        except Exception as exc:  # transformers refuses the config or fails to build the model
            if narrow > 1:  # narrowing is ours: its failure says nothing about the architecture
                return {"trains": None, "why": f"{where}: not run: {n / 1e6:.0f} M parameters when small"}
            return {"trains": False, "why": f"{where}: building: {_first_line(exc)}"}
        if n <= MAX_PARAMETERS:
            break
    if n > MAX_PARAMETERS:
        return {"trains": None, "why": f"{where}: not run: {n / 1e6:.0f} M parameters when small"}
    try:
        torch.manual_seed(0)
        model = auto.from_config(config)
        model.train()
        ids = torch.randint(0, model.config.get_text_config().vocab_size, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
    except Exception as exc:  # the point is to record what transformers does
        return {"trains": False, "why": f"{where}: training one step: {_first_line(exc)}"}
    return {"trains": True, "why": "", "parameters": n, "num_layers": layers}
