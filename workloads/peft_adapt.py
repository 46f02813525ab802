"""LoRA and QLoRA fine-tuning through the real ``peft`` and ``bitsandbytes`` libraries, on any device, meta included.

What a practitioner's fine-tuning script does, in the order it does it (``WorkloadConfig.lora_rank``, ``qlora``,
``weights_dtype``):

1. **Weights dtype.** The model's floating weights and buffers are cast to ``weights_dtype``, as
   ``from_pretrained(torch_dtype=torch.bfloat16)`` loads them.
2. **QLoRA** (Dettmers et al., "QLoRA", NeurIPS'23, arXiv 2305.14314): every ``nn.Linear`` except the ones
   transformers keeps in full precision (the output embedding / ``lm_head`` and tied weights:
   ``HfQuantizer.get_modules_to_not_convert``) becomes a bitsandbytes ``Linear4bit`` through transformers' own
   ``replace_with_bnb_linear``, with the QLoRA recipe's ``BitsAndBytesConfig``: NF4, double quantization
   (``bnb_4bit_use_double_quant=True``), bf16 compute, ``uint8`` storage. Each weight is then quantized by
   ``Params4bit._quantize``, i.e. ``bitsandbytes.functional.quantize_4bit`` (bitsandbytes 0.50, ``functional.py``):
   the packed weight is ``uint8`` of ``ceil(n / 2)`` bytes for n elements (two 4-bit codes a byte), the block
   statistics one ``absmax`` per 64 elements, double-quantized to ``uint8`` with an fp32 ``absmax`` per 256 blocks
   (``quantize_blockwise(absmax - offset, blocksize=256)``), a 16-entry fp32 NF4 code per weight, an fp32
   ``offset`` scalar and the 256-entry fp32 dynamic map shared by all weights. bitsandbytes' ops have meta
   kernels (``bitsandbytes/_ops.py`` ``register_fake``), so this runs on the meta device.
3. **LoRA**: ``peft.get_peft_model(model, LoraConfig(r=R, target_modules=...))``; without targets peft's default
   for the model type (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``: ``q_proj``/``v_proj`` for Llama,
   Mistral, Qwen2 and Gemma). peft freezes every base weight (``requires_grad=False``: no gradient, no optimizer
   state) and keeps the adapters in fp32 (``autocast_adapter_dtype=True``, its default); the adapters are the
   only trainable parameters, so the optimizer (``workloads.train.make_optimizer``) holds state for them alone.

On ``meta`` the model is built and adapted with uvmlab's recorder paused, then every tensor it keeps is made
again under the recorder (:func:`rematerialize`): the trace holds the loaded model (4-bit weights, bf16 base,
fp32 adapters) allocated once at setup, as a from_pretrained load leaves it, and not the full-precision model
that only the CPU-side construction made. Approximation: the load's own transient (one full-precision weight at a
time, quantized on the GPU) is not in the trace.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from uvmlab.errors import InputError
from workloads.packages import package_version

if TYPE_CHECKING:
    import torch

    from uvmlab.config import WorkloadConfig
    from workloads.base import Workload

QLORA_BLOCKSIZE = 64
"""bitsandbytes' 4-bit block size (``Params4bit`` default ``blocksize=64``; the QLoRA paper's)."""
QLORA_NESTED_BLOCKSIZE = 256
"""Block size of the double quantization of the absmax values (``quantize_4bit``: ``blocksize=256``)."""


def adapts(cfg: WorkloadConfig) -> bool:
    """Whether ``cfg`` changes the model after it is built (LoRA, QLoRA or a weights dtype)."""
    return bool(cfg.lora_rank or cfg.qlora or cfg.weights_dtype != "fp32")


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Run without the dispatch modes around (uvmlab's recorder and emulations): the CPU-side construction."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def adapt(workload: Workload, cfg: WorkloadConfig) -> list[str]:
    """Apply the weights dtype, QLoRA and LoRA of ``cfg`` to ``workload.model`` in place; the trace notes."""
    import torch

    notes: list[str] = []
    model = workload.model
    if cfg.weights_dtype == "bf16":
        model.to(torch.bfloat16)
        notes.append("weights stored in bf16 (from_pretrained(torch_dtype=torch.bfloat16))")
    if cfg.qlora:
        notes.append(_quantize(model, workload.device))
        workload.capture_modes.append(gemm_4bit_emulation)
    if cfg.lora_rank:
        workload.model, note = _lora(model, cfg)
        notes.append(note)
    return notes


def _quantize(model: Any, device: torch.device) -> str:
    """Replace the linear layers by bitsandbytes ``Linear4bit`` (QLoRA's NF4 + double quantization) and quantize."""
    try:
        import bitsandbytes as bnb
        from transformers import BitsAndBytesConfig
        from transformers.integrations.bitsandbytes import replace_with_bnb_linear
        from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    except ImportError as exc:
        raise InputError(f"QLoRA needs bitsandbytes (pip install 'uvmlab[peft]'): {exc}") from None
    import torch

    qconfig = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    quantizer = Bnb4BitHfQuantizer(qconfig)
    keep = quantizer.get_modules_to_not_convert(model, None, getattr(model, "_keep_in_fp32_modules", None))
    originals = {n: (m.weight, m.bias) for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    replace_with_bnb_linear(model, modules_to_not_convert=keep, quantization_config=qconfig)
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit) or name not in originals:
            continue
        weight, bias = originals[name]
        source = weight.detach().to(device=device, dtype=torch.bfloat16)
        packed = bnb.nn.Params4bit(
            source,
            requires_grad=False,
            blocksize=QLORA_BLOCKSIZE,
            compress_statistics=True,
            quant_type="nf4",
            quant_storage=torch.uint8,
            module=module,
        )
        module.weight = packed._quantize(device)
        if bias is not None:  # the new module's bias was made on meta: the original's values
            module.bias = torch.nn.Parameter(bias.detach().to(device), requires_grad=False)
        count += 1
    if not count:
        raise InputError("QLoRA found no nn.Linear layer to quantize in this model")
    model.is_loaded_in_4bit = True
    return (
        f"QLoRA: {count} linear layers in 4-bit NF4 with double quantization (bitsandbytes Linear4bit, "
        f"block {QLORA_BLOCKSIZE}), bf16 compute; kept in full precision: {', '.join(keep) or 'none'}"
    )


def _lora(model: Any, cfg: WorkloadConfig) -> tuple[Any, str]:
    """Wrap ``model`` in peft's LoRA (rank ``cfg.lora_rank``, targets ``cfg.lora_targets`` or peft's default)."""
    try:
        from peft import LoraConfig, get_peft_model
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULT_TARGETS
    except ImportError as exc:
        raise InputError(f"--lora needs peft (pip install 'uvmlab[peft]'): {exc}") from None
    targets = list(cfg.lora_targets) or None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if targets is None and model_type not in DEFAULT_TARGETS:
        raise InputError(
            f"peft has no default LoRA targets for this model ({model_type or type(model).__name__}); "
            "name the modules with --lora-targets, e.g. --lora-targets q_proj,v_proj"
        )
    task = "CAUSAL_LM" if hasattr(model, "config") and hasattr(model, "generate") else None
    lcfg = LoraConfig(r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, target_modules=targets, task_type=task)
    try:
        with warnings.catch_warnings():  # peft asks transformers a deprecated question (is_gradient_checkpointing)
            warnings.simplefilter("ignore", FutureWarning)
            peft_model = get_peft_model(model, lcfg)
    except ValueError as exc:  # peft's own refusal (e.g. no module matches the targets)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"peft refused the LoRA config: {first}") from None
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    chosen = sorted(peft_model.peft_config["default"].target_modules)
    return peft_model, (
        f"LoRA rank {cfg.lora_rank} (peft {package_version('peft')}) on {', '.join(chosen)}: {trainable:,} trainable "
        f"of {total:,} parameters; base weights frozen"
    )


def rematerialize(model: Any, device: torch.device) -> int:
    """Give every parameter, buffer and bitsandbytes quantization-state tensor of ``model`` a new storage on
    ``device`` (``torch.empty_like``), keeping sharing (tied weights, the shared dynamic map); the tensors' count.

    Under uvmlab's recorder these are the setup allocations of the loaded model."""
    import torch

    with unrecorded():  # reading the old tensors must not show them to the recorder
        targets = _tensor_slots(model)
    storages: dict[int, Any] = {}
    for old, _assign in targets:
        key = old.untyped_storage()._cdata  # the old tensors stay alive in targets: no address reuse
        if key not in storages:
            storages[key] = torch.empty_like(old, device=device)  # recorded: only its output is tracked
    with unrecorded():
        for old, assign in targets:
            key = old.untyped_storage()._cdata  # the old tensors stay alive in targets: no address reuse
            assign(storages[key])
    return len(storages)


def _tensor_slots(model: Any) -> list[tuple[Any, Any]]:
    """(tensor, setter) for every parameter, buffer and bitsandbytes quantization-state tensor of ``model``
    (each parameter once)."""
    import torch

    slots: list[tuple[Any, Any]] = []
    seen: set[int] = set()

    def set_param(p: Any) -> Any:
        def assign(new: Any) -> None:
            with torch.no_grad():
                p.data = new

        return assign

    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                slots.append((p.data, set_param(p)))
        for name, b in module.named_buffers(recurse=False):
            if b is not None:
                slots.append((b, lambda new, m=module, n=name: m._buffers.__setitem__(n, new)))
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        while state is not None and id(state) not in seen:
            seen.add(id(state))
            for attr in ("absmax", "code", "offset"):
                value = getattr(state, attr, None)
                if isinstance(value, torch.Tensor):
                    slots.append((value, lambda new, s=state, a=attr: setattr(s, a, new)))
            state = getattr(state, "state2", None)
    return slots


def qlora_weight_bytes(numel: int) -> dict[str, int]:
    """Device bytes of one 4-bit weight of ``numel`` elements in bitsandbytes' layout (module docstring): the
    packed codes, the double-quantized absmax, its fp32 absmax, the NF4 code and the offset (the shared 256-entry
    dynamic map is not counted)."""
    blocks = -(-numel // QLORA_BLOCKSIZE)
    nested = -(-blocks // QLORA_NESTED_BLOCKSIZE)
    return {
        "packed": (numel + 1) // 2,
        "absmax_uint8": blocks,
        "nested_absmax_fp32": 4 * nested,
        "nf4_code_fp32": 4 * 16,
        "offset_fp32": 4,
    }


GEMM_4BIT_CUSTOM_MAX_M = 1536
"""Rows of the input above which bitsandbytes' CUDA ``gemm_4bit`` takes the dequantize + ``F.linear`` fallback
(``bitsandbytes/backends/cuda/ops.py``, ``_gemm_4bit_custom_max_m = 1536`` on CUDA, bitsandbytes 0.50)."""


def gemm_4bit_emulation() -> Any:
    """A dispatch mode routing ``bitsandbytes::gemm_4bit`` on meta to what its CUDA kernel allocates (the meta
    kernel returns only the output): :class:`Gemm4bitEmulation`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Gemm4bitEmulation(TorchDispatchMode):
        """bitsandbytes' CUDA dispatch of ``gemm_4bit`` (``backends/cuda/ops.py``), on meta tensors:

        - M (rows of A) > :data:`GEMM_4BIT_CUSTOM_MAX_M`, or K not a multiple of the block size:
          ``_dequant_linear_fallback``: with double quantization an fp32 absmax buffer
          (``torch.empty_like(absmax_8bit, dtype=torch.float32)``, written by ``dequantize_blockwise``) and
          ``absmax_dq + absmax_offset`` (a second one), then the whole weight dequantized into
          ``torch.empty(shapeB, dtype=A.dtype)`` and ``F.linear``: a temporary of the full weight in the compute
          dtype per call, the largest QLoRA buffer of a training step;
        - otherwise the fused ``cgemm_4bit_*`` kernel: ``A.contiguous()`` and the output only. APPROXIMATION: the
          per-architecture heuristic ``_gemm_4bit_use_custom_cuda`` that can still choose the fallback for small M
          is taken to choose the fused kernel.
        """

        def __init__(self) -> None:
            super().__init__()
            self.counts = {"fallback": 0, "fused": 0}
            self.gemm_op = _gemm_op()  # looked up once: every op of the capture passes here

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is self.gemm_op and args and args[0].device.type == "meta":
                return self._gemm(*args, **kwargs)
            return func(*args, **kwargs)

        def _gemm(
            self,
            A: Any,
            B: Any,
            shapeB: Any,
            absmax: Any,
            blocksize: int,
            quant_type: str,
            bias: Any = None,
            absmax_8bit: Any = None,
            absmax_code: Any = None,
            absmax_offset: Any = None,
        ) -> Any:
            import torch

            K = A.shape[-1]
            M = A.numel() // max(K, 1)
            ops = torch.ops.bitsandbytes
            if M > GEMM_4BIT_CUSTOM_MAX_M or K % blocksize:
                self.counts["fallback"] += 1
                # the ops that return their output allocate what the fallback's empty/empty_like do (bitsandbytes'
                # own fakes of the .out overloads compare a torch.Size with a list and always fail)
                if absmax_8bit is not None:
                    absmax_dq = ops.dequantize_blockwise(
                        absmax_8bit, absmax, absmax_code, QLORA_NESTED_BLOCKSIZE, torch.float32
                    )
                    absmax = absmax_dq + absmax_offset
                B_dq = ops.dequantize_4bit(B, absmax, blocksize, quant_type, list(shapeB), A.dtype)
                return torch.nn.functional.linear(A, B_dq, bias)
            self.counts["fused"] += 1
            return self.gemm_op(A.contiguous(), B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit,
                              absmax_code, absmax_offset)  # fmt: skip

    return Gemm4bitEmulation()


def _gemm_op() -> Any:
    import torch

    return torch.ops.bitsandbytes.gemm_4bit.default
