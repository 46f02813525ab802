"""Click options shared by commands: the workload options (trace, estimate, run, fragmentation, colocate),
``--format table|json[|csv]``, the path types that declare what a path is to its command (:class:`PathParam`),
and :func:`harden_numbers`, which gives every numeric option of every command uvmlab's number checks.

Every option or argument that names a file or folder has a :class:`PathParam` type saying whether the command reads
it, writes it, or both. Before any command starts, ``uvmlab.cli`` hands the paths of the command line to
:func:`check_command_paths`, which runs the one check of outputs against outputs and inputs
(:func:`uvmlab.files.outputs.check_paths`); ``tests/test_hostile_paths.py`` walks the command tree and fails for a
path option that declares no role.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from uvmlab.config import (
    ATTENTION_IMPLS,
    DTYPES,
    OPTIMIZERS,
    SDPA_BACKENDS,
    SHARD_MODES,
    WEIGHTS_DTYPES,
    ZERO_GRAD_POSITIONS,
    WorkloadConfig,
)
from uvmlab.errors import InputError
from uvmlab.files.inputs import parse_options, refuse_special
from uvmlab.numbers import parse_float, parse_int

F = TypeVar("F", bound=Callable[..., Any])

ROLES = ("input", "output", "inout")


class PathParam(click.Path):
    """A path with its role in the command: ``input`` (read), ``output`` (written) or ``inout`` (a folder the
    command reads and writes in place: ``sweep collect OUT``).

    ``folder``: the path is a folder (True), a file (False), or either (None, inputs only). ``maybe_name``: the
    value may be a name rather than a path (a built-in workload): it is a path only where one exists.
    ``path_of``: the path inside a larger value (``colocate``'s ``NAME[:BATCH][,K=V]``). ``reads``: the names
    inside an input folder the command reads, where that is not the whole folder (``report SWEEP`` reads its
    results, and writes beside them). ``beside``: folders an output file brings with it (a report page's
    ``figures/``). Conversion is click.Path's (``path_type``, ``file_okay``, ``dir_okay`` ... are passed on;
    ``folder`` only tells the check what the path is).
    """

    def __init__(
        self,
        role: str,
        *,
        folder: bool | None = None,
        maybe_name: bool = False,
        path_of: Callable[[str], str] | None = None,
        reads: tuple[str, ...] = (),
        beside: tuple[str, ...] = (),
        **kw: Any,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        super().__init__(**kw)
        self.role, self.folder, self.maybe_name = role, folder, maybe_name
        self.path_of, self.reads, self.beside = path_of, reads, beside

    def paths(self, value: Any) -> list[str]:
        """The paths in one converted ``value`` (a name that is no path gives none)."""
        text = os.fspath(value)
        if self.path_of is not None:
            text = self.path_of(text)
        if self.maybe_name and not os.path.lexists(text):
            return []
        return [text]


def job_path(text: str) -> str:
    """The workload part of a ``colocate`` job ``NAME[:BATCH][,KEY=VALUE...]`` (a name or a workload file)."""
    head = text.split(",", 1)[0]
    name, sep, batch = head.rpartition(":")
    return name if sep and batch.isdigit() else head


def check_command_paths(ctx: click.Context) -> None:
    """Check the paths of ``ctx``'s command line together (:func:`uvmlab.files.outputs.check_paths`) before the
    command runs: every output against every other output and every input, links resolved."""
    from uvmlab.files.outputs import check_paths

    outputs: list[tuple[str, str, bool]] = []
    inputs: list[tuple[str, str]] = []
    for param in ctx.command.params:
        kind = param.type
        value = ctx.params.get(param.name or "")
        if not isinstance(kind, PathParam) or value is None:
            continue
        name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
        for item in value if isinstance(value, tuple | list) else [value]:
            for path in kind.paths(item):
                if kind.role in ("input", "inout"):
                    inputs += [(name, os.path.join(path, r)) for r in kind.reads] or [(name, path)]
                if kind.role == "output":
                    outputs.append((name, path, bool(kind.folder)))
                    outputs += [(name, os.path.join(os.path.dirname(path) or ".", b), True) for b in kind.beside]
    for name, path in inputs:
        refuse_special(path, name)
    if outputs:
        check_paths(outputs, inputs)


def format_option(help: str | None = None, csv: bool = True, extra: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Add ``--format table|json|csv`` (as ``fmt``): tables (rich on a terminal, Markdown otherwise), or only JSON /
    CSV on stdout (``csv=False`` where the output is not rows); ``extra`` adds command-specific formats."""
    choices = ["table", "json", *(["csv"] if csv else []), *extra]
    default_help = "table: readable tables (Markdown when stdout is not a terminal); json: JSON only on stdout" + (
        "; csv: CSV rows only on stdout." if csv else "."
    )
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(choices),
        default="table",
        show_default=True,
        help=help or default_help,
    )


class _OutOption(click.Option):
    """An option whose ``--output`` spelling works but is left out of --help (the documented one is ``--out``)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        opts = self.opts
        self.opts = [o for o in opts if o != "--output"]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts


def simulated_gpu_option() -> Callable[[F], F]:
    """``--gpu NAME[@DRIVER]`` of a command that simulates a job (run, advise): the GPU model and its driver."""
    return click.option(
        "--gpu",
        "gpu_name",
        default="A100-80GB",
        show_default=True,
        help="GPU model, optionally NAME@DRIVER (the driver version sets the fault-path costs; see uvmlab gpus), "
        "or a GPU file FILE.json describing one that is not in the list.",
    )


def out_option(help: str, dest: str = "out", **kw: Any) -> Callable[[F], F]:
    """``-o/--out`` (as ``dest``), the one spelling of an output path everywhere; ``--output`` is a hidden alias.
    ``type`` must be a :class:`PathParam` (an output folder by default)."""
    kw.setdefault("type", PathParam("output", folder=True, path_type=str))  # a plain string, as before
    if not isinstance(kw["type"], PathParam):
        raise TypeError("out_option needs a PathParam type (what the path is to the command)")
    return click.option("-o", "--out", "--output", dest, cls=_OutOption, help=help, **kw)


def workload_options(iterations_default: int = 3) -> Callable[[F], F]:
    """Add --batch-size, --optimizer, --zero-grad, --attention, --dtype, --iterations, --checkpoint, the shortcuts
    --seq-len, --image-size and --num-classes, and --option KEY=VALUE."""

    def decorate(fn: F) -> F:
        opts = [
            click.option("--batch-size", "-b", type=int, default=None, help="Batch size [default: the workload's]."),
            click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adam", show_default=True),
            click.option(
                "--zero-grad",
                type=click.Choice(ZERO_GRAD_POSITIONS),
                default="iteration_start",
                show_default=True,
                help="Where optimizer.zero_grad() runs.",
            ),
            click.option(
                "--attention",
                type=click.Choice(ATTENTION_IMPLS),
                default="auto",
                show_default=True,
                help="Attention implementation (transformers); auto: transformers' own choice (SDPA where the "
                "model class has it, else eager).",
            ),
            click.option(
                "--dtype",
                type=click.Choice(DTYPES),
                default="auto",
                show_default=True,
                help="auto: the dtype the model trains in (fp32; bf16 weights where fp32 cannot run on a GPU: "
                "transformers MoE layers on grouped_mm); fp32; or bf16 autocast.",
            ),
            click.option(
                "--iterations",
                "-n",
                type=int,
                default=iterations_default,
                show_default=True,
                help="Training iterations.",
            ),
            click.option(
                "--checkpoint",
                default="",
                metavar="auto|CLASS",
                help="Activation checkpointing: torch.utils.checkpoint around the workload's repeated blocks (auto) "
                "or every module of class CLASS (docs/advise.md).",
            ),
            click.option("--seq-len", type=int, default=None, help="Sequence length (same as --option seq_len=N)."),
            click.option(
                "--image-size", type=int, default=None, help="Image side in pixels (same as --option image_size=N)."
            ),
            click.option("--num-classes", type=int, default=None, help="Classes (same as --option num_classes=N)."),
            click.option(
                "--option",
                "options",
                multiple=True,
                metavar="KEY=VALUE",
                help="Workload-specific setting, e.g. --option seq_len=512 (repeatable; JSON values).",
            ),
            *training_setup_options(),
        ]
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return decorate


def training_setup_options() -> list[Callable[[F], F]]:
    """--lora, --lora-targets, --qlora, --weights-dtype, --shard, --world-size, --sdpa-backend (docs/estimate.md,
    "Fine-tuning, data parallelism, long context")."""
    return [
        click.option("--lora", "lora_rank", type=int, default=0, metavar="R",
                     help="LoRA adapters of rank R through peft; the base weights are frozen.") ,
        click.option("--lora-targets", default="", metavar="NAMES",
                     help="Comma-separated modules the adapters wrap [default: peft's for the model type, e.g. "
                     "q_proj,v_proj].") ,
        click.option("--qlora", is_flag=True,
                     help="QLoRA: frozen linear weights in 4-bit NF4 with double quantization (bitsandbytes); needs "
                     "--lora.") ,
        click.option("--weights-dtype", type=click.Choice(WEIGHTS_DTYPES), default="fp32", show_default=True,
                     help="Storage dtype of the weights (bf16: from_pretrained(torch_dtype=torch.bfloat16)).") ,
        click.option("--shard", type=click.Choice(SHARD_MODES), default=None,
                     help="Data-parallel layout: one rank of DDP, DeepSpeed ZeRO-1/2/3, FSDP or FSDP2.") ,
        click.option("--world-size", type=int, default=1, show_default=True, metavar="N",
                     help="Data-parallel ranks (with --shard).") ,
        click.option("--sdpa-backend", type=click.Choice(SDPA_BACKENDS), default="auto", show_default=True,
                     help="scaled_dot_product_attention backend on CUDA (auto: PyTorch's choice).") ,
        click.option("--shard-option", "shard_options", multiple=True, metavar="KEY=VALUE",
                     help="A setting of the --shard layout, e.g. reduce_bucket_size=auto (DeepSpeed, HF's rule) or "
                     "bucket_cap_mb=50 (DDP); repeatable (docs/estimate.md).") ,
    ]  # fmt: skip


SHORTCUTS = {"seq_len": "--seq-len", "image_size": "--image-size", "num_classes": "--num-classes"}
"""Flags that set a workload option (the workload refuses it if it has no such option)."""


def workload_config(workload: str, **kw: Any) -> WorkloadConfig:
    """Build the WorkloadConfig from the values of :func:`workload_options` (validation happens in the config)."""
    options = parse_options(kw.get("options", ()))
    for key, flag in SHORTCUTS.items():
        value = kw.get(key)
        if value is None:
            continue
        if key in options and options[key] != value:
            raise InputError(f"{flag} {value} contradicts --option {key}={options[key]}")
        options[key] = value
    return WorkloadConfig(
        workload=workload,
        batch_size=kw["batch_size"],
        optimizer=kw["optimizer"],
        zero_grad=kw["zero_grad"],
        attention=kw["attention"],
        dtype=kw["dtype"],
        iterations=kw["iterations"],
        options=options,
        checkpoint=kw.get("checkpoint") or "",
        lora_rank=kw.get("lora_rank") or 0,
        lora_targets=kw.get("lora_targets") or (),
        qlora=bool(kw.get("qlora")),
        weights_dtype=kw.get("weights_dtype") or "fp32",
        shard=kw.get("shard") or "",
        world_size=kw.get("world_size") or 1,
        sdpa_backend=kw.get("sdpa_backend") or "auto",
        shard_options=parse_options(kw.get("shard_options", ()), "--shard-option"),
    )


def figure_format_option() -> Callable[[F], F]:
    """Add ``--figure-format png|svg|pdf`` (as ``figure_format``) for commands that write figures."""
    from uvmlab.files.rundir import FIGURE_FORMATS

    return click.option(
        "--figure-format",
        "figure_format",
        type=click.Choice(FIGURE_FORMATS),
        default="png",
        show_default=True,
        help="File format of the figures (svg and pdf scale for papers).",
    )


def _checked_convert(self: Any, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
    """``convert`` of a checked number type: text goes through uvmlab.numbers first (an integer of at most 19 digits
    within int64, a real that is finite), so a 5,000-digit value or ``inf`` is one short sentence quoting a prefix;
    then click's own conversion and range check run on the parsed number."""
    if isinstance(value, str):
        try:
            if isinstance(self, click.types.IntParamType):
                value = parse_int(value, "the value")
            else:
                value = parse_float(value, "the value")
        except InputError as exc:
            self.fail(str(exc)[0].upper() + str(exc)[1:] + ".", param, ctx)
    return type(self).__mro__[1].convert(self, value, param, ctx)


_CHECKED: dict[type, type] = {}


def _checked_type(t: click.ParamType) -> click.ParamType:
    """A copy of the number type ``t`` (INT, FLOAT, IntRange, FloatRange: its class, range and help kept) whose
    conversion is :func:`_checked_convert`."""
    cls = type(t)
    sub = _CHECKED.get(cls)
    if sub is None:
        sub = _CHECKED[cls] = type(f"Checked{cls.__name__}", (cls,), {"convert": _checked_convert, "checked": True})
    new = object.__new__(sub)
    new.__dict__.update(t.__dict__)
    return new


def harden_numbers(command: click.Command) -> None:
    """Give every integer and real parameter of ``command`` and its subcommands (the whole click tree when
    ``command`` is the ``uvmlab`` group) uvmlab's number checks (:func:`_checked_convert`).

    Done once, where the commands are registered (``uvmlab.cli._register``), so no option (a new one included) can
    take a number that the checks of uvmlab.numbers refuse: ``tests/test_numbers_cli.py`` walks the same tree."""
    for param in command.params:
        t = param.type
        if isinstance(t, click.types.IntParamType | click.types.FloatParamType) and not getattr(t, "checked", False):
            param.type = _checked_type(t)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            harden_numbers(sub)
