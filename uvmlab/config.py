"""Frozen, validated configurations: user input is checked once, here, and trusted below.

``WorkloadConfig`` says what to train (and is what trace capture takes); ``RunConfig`` says how to run it
(oversubscription factor, PCA on/off, mode, GPU). Both serialize to plain dicts for config.json and
for the sweep's stable configuration hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.numbers import parse_float, prefix
from uvmlab.units import parse_bytes

OPTIMIZERS = ("sgd", "adam", "adamw")
ZERO_GRAD_POSITIONS = ("iteration_start", "before_backward")
ATTENTION_IMPLS = ("auto", "sdpa", "eager")
"""``auto``: transformers' own choice, SDPA where the model class can dispatch it, else eager attention
(``PreTrainedModel.get_correct_attn_implementation`` with no request, transformers 5.24); ``sdpa`` refuses a class
without it."""
DTYPES = ("auto", "fp32", "bf16")
"""``auto``: the dtype the model trains in: fp32, except a model that cannot train in fp32 on a GPU (transformers'
mixture-of-experts layers on ``grouped_mm``: bf16 weights, workloads.hf_dtype); ``fp32`` asks for fp32 (refused where
the model cannot); ``bf16``: bf16 autocast."""
COMPUTE_DTYPES = ("fp32", "bf16")


def compute_dtype(dtype: str, header: dict[str, Any] | None = None) -> str:
    """``fp32`` or ``bf16``: what a run's kernels compute in, for the timing models. ``auto`` is resolved by the capture
    (the trace header's ``compute_dtype``: the dtype the model was built in), else fp32."""
    if dtype in COMPUTE_DTYPES:
        return dtype
    recorded = (header or {}).get("compute_dtype")
    return recorded if recorded in COMPUTE_DTYPES else "fp32"


WEIGHTS_DTYPES = ("fp32", "bf16")
"""Storage dtype of the model's weights (``--weights-dtype``): fp32, or bf16 as ``from_pretrained(torch_dtype=
torch.bfloat16)`` loads them (the frozen base of a LoRA fine-tune; the non-quantized modules under QLoRA)."""
SHARD_MODES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp2")
"""Data-parallel layouts of one rank (``--shard``; uvmlab.trace.shard): PyTorch DDP, DeepSpeed ZeRO stage 1/2/3,
PyTorch FSDP (FullyShardedDataParallel, FULL_SHARD) and FSDP2 (``fully_shard``)."""
SDPA_BACKENDS = ("auto", "flash", "efficient", "math")
"""``F.scaled_dot_product_attention`` backend on CUDA (``--sdpa-backend``), as ``torch.nn.attention.sdpa_kernel``
forces it: ``auto`` is PyTorch's own choice (uvmlab.trace.emulate.SdpaEmulation)."""
SHARD_OPTIONS: dict[str, tuple[str, ...]] = {
    "bucket_cap_mb": ("ddp",),
    "reduce_bucket_size": ("zero1", "zero2", "zero3"),
    "allgather_bucket_size": ("zero1", "zero2"),
    "overlap_comm": ("zero1", "zero2", "zero3"),
    "prefetch_bucket_size": ("zero3",),
    "param_persistence_threshold": ("zero3",),
    "max_reuse_distance": ("zero3",),
}
"""``--shard-option KEY=VALUE`` keys and the layouts that read them: DDP's ``bucket_cap_mb`` and DeepSpeed's
``zero_optimization`` settings (``stage3_`` prefixes dropped); ``auto`` for the three hidden-size keys is HF
Trainer's rule (uvmlab.trace.shard.zero)."""
MAX_WORLD_SIZE = 1 << 16
"""Largest ``world_size`` accepted (65,536 ranks)."""
MAX_LORA_RANK = 1 << 16
"""Largest LoRA rank accepted (65,536: above any model's hidden size, so every real rank fits; a bound, not a
source value)."""
CAPTURE_DEVICES = ("meta", "cpu")
MODES = ("sim", "gpu", "auto")
ALLOCATORS = ("pca", "nocache")


ON_WORDS = ("on", "true", "yes", "1")
OFF_WORDS = ("off", "false", "no", "0")
"""Spellings of a switch (``--pca on|off``, ``RunConfig(pca="off")``), any case; True and False themselves too."""


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise InputError(f"{name} must be one of {', '.join(choices)}, not {prefix(value)}")


def parse_on_off(name: str, value: Any) -> bool:
    """A switch as a bool: True/False, or on/off (also true/false, yes/no, 1/0 as text, any case).

    Anything else is an InputError naming ``name`` and the spellings: ``bool("off")`` is True, so a string is never
    taken by its truth value.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ON_WORDS:
            return True
        if word in OFF_WORDS:
            return False
    raise InputError(f"{name} takes on or off (or True / False), not {prefix(value)}")


def _text(name: str, value: Any, what: str) -> str:
    """``value`` as text: a str, or an os.PathLike for paths; anything else is an InputError."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise InputError(f"{name} must be {what}, not {prefix(value)}")
    return value


def _mapping(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InputError(f"{name} must be a mapping of names to values (a dict), not {prefix(value)}")
    return value


@dataclass(frozen=True)
class WorkloadConfig:
    """What to train: a built-in workload name (see ``uvmlab workloads``) or a path to a user workload file.

    ``batch_size=None`` means the workload's default (the seed study's batch size for built-ins).
    ``options`` carries workload-specific settings (e.g. ``{"seq_len": 512, "n_layer": 2}``).
    """

    workload: str
    batch_size: int | None = None
    optimizer: str = "adam"
    zero_grad: str = "iteration_start"
    attention: str = "auto"
    dtype: str = "auto"
    iterations: int = 3
    options: dict[str, Any] = field(default_factory=dict)
    accumulation_steps: int = 1
    """Gradient accumulation: micro-batches of ``batch_size`` per optimizer step (effective batch = the product)."""
    checkpoint: str = ""
    """Activation checkpointing (``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``) of the model's
    segments: "" off, ``auto`` the workload's own segments (``workloads.checkpointing``), or a module class name
    (every outermost module of that class). Left out of :meth:`to_dict` when off, so existing hashes stay."""
    lora_rank: int = 0
    """LoRA adapters of this rank through ``peft`` (workloads.peft_adapt); 0: none. The base weights are frozen."""
    lora_targets: tuple[str, ...] = ()
    """Module names the adapters wrap (peft ``target_modules``); empty: peft's default for the model type (the
    attention projections, e.g. q_proj and v_proj for Llama)."""
    qlora: bool = False
    """QLoRA: the frozen linear layers' weights in 4-bit NF4 with double quantization (bitsandbytes ``Linear4bit``),
    bf16 compute; needs ``lora_rank``."""
    weights_dtype: str = "fp32"
    """Storage dtype of the model's weights (WEIGHTS_DTYPES)."""
    shard: str = ""
    """Data-parallel layout of one rank (SHARD_MODES), "" for a single-GPU job (uvmlab.trace.shard)."""
    world_size: int = 1
    """Data-parallel ranks the job runs on (``shard`` set)."""
    sdpa_backend: str = "auto"
    """The CUDA SDPA backend (SDPA_BACKENDS)."""
    shard_options: dict[str, Any] = field(default_factory=dict)
    """Settings of the data-parallel layout (SHARD_OPTIONS), e.g. ``{"reduce_bucket_size": "auto"}``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workload", _text("workload", self.workload, "a workload name or a file path"))
        object.__setattr__(self, "options", _mapping("options", self.options))
        if self.batch_size is not None and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1
        ):
            raise InputError(f"batch size must be a whole number >= 1, not {prefix(self.batch_size)}")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("zero_grad", self.zero_grad, ZERO_GRAD_POSITIONS)
        _choice("attention", self.attention, ATTENTION_IMPLS)
        _choice("dtype", self.dtype, DTYPES)
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or self.iterations < 1:
            raise InputError(f"iterations must be a whole number >= 1, not {prefix(self.iterations)}")
        if self.iterations > MAX_ITERATIONS:
            raise InputError(
                f"iterations {prefix(self.iterations)} is over uvmlab's limit of {MAX_ITERATIONS:,} per run"
            )
        steps = self.accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1024:
            raise InputError(f"gradient accumulation steps must be a whole number from 1 to 1024, not {prefix(steps)}")
        if not isinstance(self.checkpoint, str) or not (self.checkpoint == "" or self.checkpoint.isidentifier()):
            raise InputError(
                f"checkpoint must be 'auto' or a module class name (an identifier), not {prefix(self.checkpoint)}"
            )
        self._check_training_setup()

    def _check_training_setup(self) -> None:
        """LoRA/QLoRA, weight dtype, data-parallel layout and SDPA backend (issue 45)."""
        rank = self.lora_rank
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_LORA_RANK:
            raise InputError(
                f"LoRA rank must be a whole number from 0 (no LoRA) to {MAX_LORA_RANK}, not {prefix(rank)}"
            )
        targets = self.lora_targets
        if isinstance(targets, str):
            targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        if not isinstance(targets, list | tuple) or not all(isinstance(t, str) and t for t in targets):
            raise InputError(f"LoRA targets must be module names (e.g. q_proj,v_proj), not {self.lora_targets!r}")
        object.__setattr__(self, "lora_targets", tuple(targets))
        if targets and not rank:
            raise InputError("--lora-targets needs --lora R (the adapters' rank)")
        object.__setattr__(self, "qlora", parse_on_off("qlora", self.qlora))
        if self.qlora and not rank:
            raise InputError("QLoRA trains LoRA adapters on the 4-bit base: give their rank with --lora R")
        _choice("weights dtype", self.weights_dtype, WEIGHTS_DTYPES)
        if self.shard != "":
            _choice("shard", self.shard, SHARD_MODES)
        ws = self.world_size
        if isinstance(ws, bool) or not isinstance(ws, int) or not 1 <= ws <= MAX_WORLD_SIZE:
            raise InputError(f"world size must be a whole number from 1 to {MAX_WORLD_SIZE:,}, not {ws!r}")
        if ws > 1 and not self.shard:
            raise InputError(f"--world-size {ws} needs a data-parallel layout: --shard {'|'.join(SHARD_MODES)}")
        _choice("sdpa backend", self.sdpa_backend, SDPA_BACKENDS)
        opts = _mapping("shard options", self.shard_options)
        for key, value in opts.items():
            if key not in SHARD_OPTIONS:
                raise InputError(f"unknown --shard-option {key}; known: {', '.join(SHARD_OPTIONS)}")
            if self.shard not in SHARD_OPTIONS[key]:
                raise InputError(f"--shard-option {key} applies to --shard {'/'.join(SHARD_OPTIONS[key])}")
            if key == "overlap_comm":
                opts[key] = parse_on_off(key, value)
            elif not (value == "auto" and key in AUTO_SHARD_OPTIONS) and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                what = " or auto" if key in AUTO_SHARD_OPTIONS else ""
                raise InputError(f"--shard-option {key} must be a whole number >= 1{what}, not {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (config.json, hashing); ``checkpoint`` and the training-setup fields only when not at
        their defaults (older hashes stay valid)."""
        d = asdict(self)
        for f in fields(self):
            if f.name not in OPTIONAL_KEYS:
                continue
            default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
            if d[f.name] == default:
                d.pop(f.name)
        if "lora_targets" in d:
            d["lora_targets"] = list(d["lora_targets"])
        return d

    @property
    def single_gpu(self) -> WorkloadConfig:
        """This job without its data-parallel layout: what one GPU captures (uvmlab.trace.cache)."""
        return replace(self, shard="", world_size=1, shard_options={})


OPTIONAL_KEYS = frozenset(
    {"checkpoint", "lora_rank", "lora_targets", "qlora", "weights_dtype", "shard", "world_size", "sdpa_backend",
     "shard_options"}
)  # fmt: skip
"""WorkloadConfig fields left out of ``to_dict`` at their defaults."""
AUTO_SHARD_OPTIONS = ("reduce_bucket_size", "prefetch_bucket_size", "param_persistence_threshold")
"""``--shard-option`` keys that also take ``auto`` (HF Trainer's hidden-size rule, uvmlab.trace.shard.zero)."""
MIN_OVERSUB = 1e-3
"""Smallest factor accepted: footprint / factor must stay a byte count (1e-300 overflowed to infinity)."""
MAX_ITERATIONS = 10_000
"""Most training iterations a run may ask for: capture and simulation are linear in iterations (the study used
a handful), and 10**12 was accepted and ran without an end."""


def check_oversub(value: float) -> float:
    """Validate an oversubscription factor: any finite number > 0 (<= 1 means no oversubscription)."""
    try:
        f = parse_float(value, "oversubscription factor")  # text, an int or a float; never inf, nan or a bool
    except InputError:
        f = math.nan
    if not math.isfinite(f) or f <= 0:
        raise InputError(
            f"oversubscription factor must be a finite number > 0, not {prefix(value)} "
            "(it is allocated UVM memory / available GPU memory; <= 1 means no oversubscription)"
        )
    if f > 1000:
        raise InputError(f"oversubscription factor {f:g} is not plausible (over 1000x); the study used 1.0 to 10")
    if f < MIN_OVERSUB:
        raise InputError(
            f"oversubscription factor {f:g} is not plausible (under {MIN_OVERSUB:g}); <= 1 already means everything "
            "fits, and the study used 1.0 to 10"
        )
    return f


@dataclass(frozen=True)
class AppliedPolicy:
    """A memory policy of ``uvmlab advise`` resolved into what the layers below act on (``RunConfig.applied``).

    It is set once, where the user names the policy (``uvmlab run``, ``advise``, ``sweep``:
    ``uvmlab.advise.advisor.resolve_policy``); the simulator, the estimator, the GPU path and the exports read only
    this, never the policy catalogue (``uvmlab.advise.policies``)."""

    name: str
    alloc_conf: str = ""
    """``PYTORCH_CUDA_ALLOC_CONF`` entries the policy adds."""
    release_each_iteration: bool = False
    """``torch.cuda.empty_cache()`` after each optimizer step."""
    offload_optimizer: bool = False
    """Optimizer state and step on the host (``uvmlab.trace.offload``)."""
    overlap_step: bool = False
    """With ``offload_optimizer``: the CPU step overlaps the next forward and backward (delayed parameter update)."""
    offload_activations: bool = False
    """Tensors saved for backward go to the host and back (``torch.autograd.graph.save_on_cpu``;
    ``uvmlab.trace.offload_activations``)."""
    optimizer_8bit: bool = False
    """Adam state in 8 bits, one fused step kernel (bitsandbytes ``Adam8bit``; ``uvmlab.trace.optim8bit``)."""
    gpu_refusal: str = ""
    """Why ``uvmlab run --mode gpu`` cannot apply the policy ('' when it can)."""
    gpu_env: tuple[tuple[str, str], ...] = ()
    """Environment of a real GPU run that applies the policy (shim options, PyTorch variables)."""
    gpu_notes: tuple[str, ...] = ()
    """What the policy needs on a GPU host that a plan cannot set for one process."""
    available_bytes: int | None = None
    """GPU memory of the job as given (its footprint / oversub): the policy runs on the same GPU as that job."""

    def env(self, key: str) -> str | None:
        """The policy's GPU environment value of ``key`` (None: not set)."""
        return dict(self.gpu_env).get(key)


@dataclass(frozen=True)
class RunConfig:
    """One run: a workload under UVM at an oversubscription factor, with PCA on or off."""

    workload: WorkloadConfig
    oversub: float = 1.0
    pca: bool = True
    mode: str = "auto"
    gpu: str = "A100-80GB"
    gpu_memory_bytes: int | None = None
    prefetch: bool = True
    gpu_spec: dict[str, Any] = field(default_factory=dict)
    """A GPU that is not in the list, or a listed one changed: the fields of a GPU file (``--gpu FILE.json``) and of
    ``--gpu-set KEY=VALUE`` (``uvmlab.gpus.SPEC_KEYS``), applied to ``gpu`` (or to the file's ``base``)."""
    params_file: str | None = None
    """JSON file of simulator cost parameters (uvmlab calibrate writes one)."""
    sim_options: dict[str, Any] = field(default_factory=dict)
    """Simulator knobs mirroring the UVM driver's module parameters (see uvmlab.sim.uvm.driver)."""
    policy: str | None = None
    """A memory policy of ``uvmlab advise`` (uvmlab.advise.policies), e.g. ``release-each-iteration``, as the user
    named it; ``applied`` holds what it resolves to."""
    applied: AppliedPolicy | None = field(default=None, compare=False)
    """``policy`` resolved (set by ``uvmlab.advise.advisor.resolve_policy``; not part of ``to_dict``: it follows
    from ``policy``)."""

    def __post_init__(self) -> None:
        """Check and normalise every field as the CLI does (``pca="off"`` is False, never truthy text)."""
        if not isinstance(self.workload, WorkloadConfig):
            raise InputError(
                f"workload must be a WorkloadConfig, not {prefix(self.workload)} (api.run also takes a workload name)"
            )
        if isinstance(self.oversub, bool):
            raise InputError(f"oversubscription factor must be a number > 0, not {prefix(self.oversub)}")
        object.__setattr__(self, "oversub", check_oversub(self.oversub))
        object.__setattr__(self, "pca", parse_on_off("pca", self.pca))
        object.__setattr__(self, "prefetch", parse_on_off("prefetch", self.prefetch))
        _choice("mode", self.mode, MODES)
        object.__setattr__(self, "gpu_spec", _mapping("gpu_spec", self.gpu_spec))
        get_gpu(_text("gpu", self.gpu, "a GPU name (uvmlab gpus)"), spec=self.gpu_spec)  # one sentence if bad
        memory = self.gpu_memory_bytes
        if memory is not None:
            if isinstance(memory, str):
                memory = parse_bytes(memory)
            if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
                raise InputError(
                    f"gpu_memory_bytes must be a whole number of bytes > 0 (or '40GiB'), not {prefix(memory)}"
                )
            object.__setattr__(self, "gpu_memory_bytes", memory)
        if self.params_file is not None:
            object.__setattr__(self, "params_file", _text("params_file", self.params_file, "a file path"))
        object.__setattr__(self, "sim_options", _mapping("sim_options", self.sim_options))
        if self.policy is not None:  # the name is looked up where the policy is resolved (uvmlab.run.run)
            object.__setattr__(self, "policy", _text("policy", self.policy, "a policy name (uvmlab advise)"))

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (config.json, hashing)."""
        d = asdict(self)
        d.pop("applied")
        if not d["gpu_spec"]:  # a listed GPU: the dict (and every sweep's config hash) as before GPU files
            d.pop("gpu_spec")
        d["workload"] = self.workload.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an InputError naming the known ones."""
        known = {f.name for f in fields(cls)} - {"applied"}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown run config keys {sorted(unknown)}; known keys: {sorted(known)}")
        wl = d.get("workload")
        if not isinstance(wl, dict):
            raise InputError("run config needs a 'workload' mapping")
        wknown = {f.name for f in fields(WorkloadConfig)}
        wunknown = set(wl) - wknown
        if wunknown:
            raise InputError(f"unknown workload keys {sorted(wunknown)}; known keys: {sorted(wknown)}")
        return cls(**{**d, "workload": WorkloadConfig(**wl)})

    def config_hash(self) -> str:
        """A stable 12-hex-digit hash of the configuration (names sweep run directories)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]
