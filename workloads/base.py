"""The workload interface: what a built-in or user workload provides.

A workload module (built-in or a user file) provides ``build(cfg, device) -> Workload``. The returned
:class:`Workload` holds the model (already on ``device``), a batch maker that creates one batch directly on the
device, and a loss function. ``WorkloadSpec`` describes a workload for the registry: its name, its default batch
size and the workload-specific ``options`` it understands (with their defaults).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from uvmlab.errors import InputError

if TYPE_CHECKING:  # torch is imported by the model modules only when a workload is built
    import torch

    from uvmlab.config import WorkloadConfig


@dataclass
class Workload:
    """A built workload: ``loss_fn(model, make_batch())`` is one forward pass plus loss.

    ``make_batch()`` returns the batch (any structure of tensors) created on ``device``.
    ``attention`` records which attention implementation the model was built with (None: no attention).
    """

    name: str
    model: torch.nn.Module
    make_batch: Callable[[], Any]
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    device: torch.device
    attention: str | None = None
    notes: list[str] = field(default_factory=list)
    checkpoint_segments: Callable[[], list[Any]] | None = None
    """Optional: the modules ``checkpoint=auto`` wraps in activation checkpointing (workloads.checkpointing);
    None: the generic repeated-blocks rule."""
    capture_modes: list[Callable[[], Any]] = field(default_factory=list)
    """Context managers a meta capture enters inside its recorder while the workload trains: emulations of what a
    library's CUDA kernels allocate that their meta kernels do not (workloads.peft_adapt.gemm_4bit_emulation)."""


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload the registry knows: a built-in model family member or a user file."""

    name: str
    description: str
    default_batch_size: int
    build_fn: Callable[[WorkloadConfig, str, dict[str, Any]], Workload]
    options: Mapping[str, Any] = field(default_factory=dict)
    """Workload-specific options and their defaults (``WorkloadConfig.options`` may override them)."""
    source: str = "builtin"
    """``builtin``, the package of a named model (``torchvision``, ``timm``, ``transformers``) or the resolved
    path of the user file."""
    program_fn: Callable[..., Any] | None = None
    """A workload program's ``program(uvm, cfg, options)`` (workloads.program); then ``build_fn`` refuses."""

    @property
    def is_program(self) -> bool:
        """The workload is a program (workloads.program), not a model trained by workloads.train."""
        return self.program_fn is not None

    def run_program(self, uvm: Any, cfg: WorkloadConfig) -> None:
        """Run the program with ``uvm`` (a workloads.program.Program), ``cfg`` and the resolved options."""
        if self.program_fn is None:
            raise InputError(f"workload {self.name} is a model, not a program")
        self.program_fn(uvm, replace(cfg, batch_size=self.batch_size(cfg)), self.resolve_options(cfg))

    def resolve_options(self, cfg: WorkloadConfig) -> dict[str, Any]:
        """The defaults overridden by ``cfg.options``; unknown keys are an InputError naming the known ones."""
        return resolve_options(self.name, self.options, cfg.options)

    def batch_size(self, cfg: WorkloadConfig) -> int:
        """The configured batch size, or this workload's default."""
        return cfg.batch_size if cfg.batch_size is not None else self.default_batch_size

    def build(self, cfg: WorkloadConfig, device: str = "meta") -> Workload:
        """Build the model on ``device`` with random weights, plus its batch maker and loss.

        ``build_fn`` receives ``cfg`` with ``batch_size`` already resolved (never None). LoRA, QLoRA and the
        weights dtype of ``cfg`` are applied after (workloads.peft_adapt); on meta the model is built and adapted
        unrecorded, then its tensors are allocated again under the recorder, as a loaded model holds them.
        """
        cfg = replace(cfg, batch_size=self.batch_size(cfg))
        from workloads.peft_adapt import adapt, adapts, rematerialize, unrecorded

        if not adapts(cfg):
            with module_limit(self.name):
                return self.build_fn(cfg, device, self.resolve_options(cfg))
        if device != "meta":
            with module_limit(self.name):
                workload = self.build_fn(cfg, device, self.resolve_options(cfg))
            workload.notes.extend(adapt(workload, cfg))
            return workload
        with unrecorded():
            with module_limit(self.name):  # the adapters are not part of the construction
                workload = self.build_fn(cfg, device, self.resolve_options(cfg))
            notes = adapt(workload, cfg)
        rematerialize(workload.model, workload.device)
        workload.notes.extend(notes)
        return workload


MAX_MODULES = 250_000
"""Submodules a model may register while it is built. The largest real models hold tens of thousands
(DeepSeek-V3: 61 layers x 256 routed experts x 3 projections = about 47,000 linear layers); an option such as
``n_layer=1000000000`` would otherwise build modules for hours before the trace starts (issue 42)."""


@contextlib.contextmanager
def module_limit(workload: str, limit: int | None = None) -> Iterator[None]:
    """Refuse, with one sentence, a model whose construction registers more than ``limit`` submodules
    (``torch.nn.modules.module.register_module_module_registration_hook``: every ``__setattr__``/``add_module`` of
    a module)."""
    from torch.nn.modules.module import register_module_module_registration_hook

    limit = MAX_MODULES if limit is None else limit
    count = 0

    def hook(module: Any, name: str, submodule: Any) -> None:
        nonlocal count
        count += 1
        if count > limit:
            raise InputError(
                f"workload {workload}: the model registers more than {limit:,} submodules while it is built "
                "(larger than any real model); lower the option that sets its depth or width"
            )

    handle = register_module_module_registration_hook(hook)
    try:
        yield
    finally:
        handle.remove()


COMMON_OPTIONS: dict[str, Any] = {"data_dependent_fraction": 1.0}
"""Options every workload accepts. ``data_dependent_fraction``: the share of its upper bound that a
data-dependent op (nonzero, boolean-mask indexing, masked_select, unique) returns on the meta device
(``uvmlab.trace.emulate.DataDependentEmulation``); 1.0 is the upper bound."""


def resolve_options(name: str, defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``given`` into ``defaults``; refuse keys the workload does not know, and wrongly typed values.

    The :data:`COMMON_OPTIONS` are accepted by every workload but not passed on to it.
    """
    given = {k: v for k, v in given.items() if k not in COMMON_OPTIONS or k in defaults}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise InputError(f"workload {name} has no option {', '.join(unknown)}; its options are: {known}")
    merged = dict(defaults)
    for key, value in given.items():
        default = defaults[key]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = default is None or isinstance(value, type(default))
        if not ok:
            raise InputError(
                f"workload {name} option {key} must be a {type(default).__name__} like {default!r}, not {value!r}"
            )
        merged[key] = value
    return merged


def hf_attention(cfg: WorkloadConfig) -> str | None:
    """The ``attn_implementation`` to give transformers for ``cfg.attention``: None for ``auto``, so that
    transformers makes its own choice (SDPA where the model class can dispatch it, else eager:
    ``PreTrainedModel.get_correct_attn_implementation``); the built model's ``config._attn_implementation`` records
    the one taken (``Workload.attention``)."""
    return None if cfg.attention == "auto" else cfg.attention


def positive(name: str, opts: Mapping[str, Any], *keys: str) -> None:
    """Refuse non-positive integer options (one sentence naming the option)."""
    for key in keys:
        if opts[key] < 1:
            raise InputError(f"workload {name} option {key} must be >= 1, not {opts[key]!r}")


def multiple_of(name: str, opts: Mapping[str, Any], key: str, divisor_key: str) -> None:
    """Refuse ``opts[key]`` that is not a multiple of ``opts[divisor_key]`` (e.g. the width and the heads)."""
    if opts[key] % opts[divisor_key]:
        raise InputError(
            f"workload {name} option {key} ({opts[key]}) must be a multiple of {divisor_key} ({opts[divisor_key]})"
        )


def token_lm_workload(name: str, model: Any, dev: Any, batch: int, seq: int, vocab: int) -> Workload:
    """A language-model workload: random token ids of shape (batch, seq) are both the input and the labels."""
    import torch

    def make_batch() -> torch.Tensor:
        return torch.randint(0, vocab, (batch, seq), device=dev)

    def loss_fn(m: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return m(input_ids=ids, labels=ids).loss

    return Workload(name, model, make_batch, loss_fn, dev, attention=model.config._attn_implementation)


def common_option(cfg: WorkloadConfig, key: str) -> Any:
    """The value of a :data:`COMMON_OPTIONS` key in ``cfg`` (its default when not given)."""
    value = cfg.options.get(key, COMMON_OPTIONS[key])
    default = COMMON_OPTIONS[key]
    if isinstance(value, bool) or not isinstance(value, type(default) | int):
        raise InputError(f"option {key} must be a {type(default).__name__} like {default!r}, not {value!r}")
    return value


M = TypeVar("M")


def build_module(device: str, factory: Callable[[], M]) -> M:
    """Run ``factory()`` (which builds a model) so that the model's parameters and buffers live on ``device``.

    On ``meta``, the model is built on the CPU while every parameter and buffer is moved to meta the moment a
    module registers it (``torch.nn.modules.module`` global registration hooks), so weight initialization runs
    on meta and nothing is filled on the CPU: unlike ``with torch.device("meta")``, this also builds models
    whose constructors compute Python numbers from tensors (torchvision's RegNet ``BlockParams``, timm's
    stochastic-depth schedules ``torch.linspace(...).tolist()``). Tensors a constructor keeps outside
    parameters and buffers stay on the CPU, as they would after ``model.to("cuda")``. Other devices use
    ``with torch.device(device)``.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "meta":
        with dev:
            return factory()
    try:
        with _register_on(dev):
            return factory()
    except RuntimeError as exc:
        if "device meta" not in str(exc) and "meta tensor" not in str(exc):
            raise
    # A constructor that runs a submodule on a CPU tensor it made itself (timm's HybridEmbed probes its CNN
    # backbone with torch.zeros(1, C, H, W) to size the patch grid) meets parameters already on meta: build it
    # on the CPU instead (real weight initialization: slower, more host memory) and move it to meta after.
    return factory().to(dev)


@contextlib.contextmanager
def _register_on(dev: Any) -> Iterator[None]:
    import torch
    from torch.nn.modules.module import (
        register_module_buffer_registration_hook,
        register_module_parameter_registration_hook,
    )

    def param_hook(module: Any, name: str, param: Any) -> Any:
        if param is None or param.device == dev:
            return None
        return torch.nn.Parameter(param.to(dev), requires_grad=param.requires_grad)

    def buffer_hook(module: Any, name: str, buffer: Any) -> Any:
        if buffer is None or buffer.device == dev:
            return None
        return buffer.to(dev)

    handles = [
        register_module_parameter_registration_hook(param_hook),
        register_module_buffer_registration_hook(buffer_hook),
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
