"""Every HF architecture that trains in transformers estimates (issue 44 section 2): data-dependent scalars from CPU
values (uvmlab.trace.known_values), fewer layers that keep every kind (workloads.hf_config), the training dtype of
MoE models on grouped_mm (workloads.hf_dtype), composite configs, MLA attention."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from uvmlab.cli import main
from uvmlab.config import WorkloadConfig, compute_dtype
from uvmlab.errors import InputError
from uvmlab.trace.capture import capture_trace
from uvmlab.trace.emulate import SdpaEmulation
from uvmlab.trace.known_values import KnownLiterals, KnownValues, UnknownValueError
from workloads.hf_config import covering_layers, read_config_text, reduce_layers

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UVMLAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _default(model_type: str, folder: Path) -> str:
    from workloads.hf_models import default_config_file

    return f"hf:{default_config_file(model_type, folder / model_type)}"


# ---- known values ---------------------------------------------------------------------------------------------------


def test_a_scalar_of_the_seeded_input_is_read_from_its_cpu_value() -> None:
    """randint on meta draws the same numbers on the CPU from the private seeded generator; ops on them, views and
    in-place writes through views are mirrored; Python reads the value, as transformers' padding checks do."""
    values = KnownValues(seed=7)
    with KnownLiterals(values), values:
        ids = torch.randint(0, 50, (3, 8), device="meta")
        first = ids[:, 0]
        first.fill_(49)  # an in-place write through a view reaches its base's value
        top = ids.max().item()
        has_pad = 3 in ids[:, [-1, 0]]  # the list index tensor is made without a dispatched op
        lengths = (ids != 0).sum(1).tolist()
        literal = torch.tensor([5, 6], device="meta").sum().item()
    gen = torch.Generator().manual_seed(7)
    ref = torch.randint(0, 50, (3, 8), generator=gen)
    ref[:, 0] = 49
    assert top == ref.max().item() == 49
    assert has_pad == (3 in ref[:, [-1, 0]])
    assert lengths == (ref != 0).sum(1).tolist()
    assert literal == 11
    assert values.counts["value reads"] >= 2 and values.counts["copies to the CPU"] == 1


def test_a_value_not_computed_from_the_inputs_alone_is_refused() -> None:
    values = KnownValues()
    weight = torch.empty(4, 4, device="meta")  # made before the mode: a parameter has no value
    with KnownLiterals(values), values:
        x = torch.randint(0, 5, (2, 4), device="meta").float()
        with pytest.raises(UnknownValueError, match="not computed from the inputs alone"):
            (x @ weight).argmax().item()
    small = KnownValues(max_elements=16)
    with KnownLiterals(small), small:
        big = torch.zeros(8, 8, device="meta")  # over max_elements: no value kept
        with pytest.raises(UnknownValueError):
            big.sum().item()
        assert torch.zeros(4, device="meta").sum().item() == 0


def test_bart_and_convbert_estimate_and_the_trace_says_how_scalars_were_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' default BART and ConvBERT configs call ``.item()`` on their inputs' padding (they were refused
    with 'Tensor.item() cannot be called on meta tensors' before issue 44)."""
    for model_type in ("bart", "convbert"):
        wl = _default(model_type, tmp_path)
        argv = ["trace", wl, "-b", "2", "-n", "1", "--option", "num_layers=1", "--option", "seq_len=16"]
        assert main([*argv, "-o", str(tmp_path / f"{model_type}-trace")]) == 0, model_type
        capsys.readouterr()
        header = json.loads((tmp_path / f"{model_type}-trace" / "trace.json").read_text())
        assert any("uvmlab.trace.known_values" in n and "value reads" in n for n in header["notes"])


def test_a_router_value_is_one_sentence_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JetMoE's router reads its experts' token counts with ``.tolist()``: they come from the weights, which a meta
    capture has no values of: one sentence, exit 2."""
    wl = _default("jetmoe", tmp_path)
    argv = ["estimate", wl, "-b", "2", "-n", "1", "--option", "num_layers=1", "--option", "seq_len=16"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert "UnknownValueError" in err and "not computed from the inputs alone" in err


# ---- configs ---------------------------------------------------------------------------------------------------------


def test_special_floats_and_every_stack_cut() -> None:
    text = '{"model_type": "mamba2", "time_step_limit": [0.0, {"__float__": "Infinity"}], "x": {"__float__": "NaN"}}'
    data = read_config_text(text)
    assert data["time_step_limit"] == [0.0, math.inf] and math.isnan(data["x"])
    fields = {
        "model_type": "m",
        "encoder_layers": 6,
        "decoder_layers": 6,
        "layer_types": ["a", "b", "a", "b", "a", "b"],
        "per_layer_config": {"1": {"w": 1}, "4": {"w": 2}},
        "mlp_only_layers": [0, 3, 5],
        "time_step_limit": [0.0, 1.0],
        "text_config": {"model_type": "t", "num_hidden_layers": 4, "intermediate_size": [1, 2, 3, 4]},
    }
    cut = reduce_layers(fields, 2)
    assert (cut["encoder_layers"], cut["decoder_layers"]) == (2, 2)
    assert cut["layer_types"] == ["a", "b"] and cut["per_layer_config"] == {"1": {"w": 1}}
    assert cut["mlp_only_layers"] == [0] and cut["time_step_limit"] == [0.0, 1.0]
    assert cut["text_config"]["num_hidden_layers"] == 2 and cut["text_config"]["intermediate_size"] == [1, 2]
    kinds = {"layer_types": ["lin", "lin", "lin", "full", "lin", "lin", "lin", "full"]}
    assert covering_layers(kinds, 2) == 4 and covering_layers(kinds, 2, each=2) == 8


def test_a_mamba2_config_json_with_infinity_builds(tmp_path: Path) -> None:
    """transformers writes Mamba-2's ``time_step_limit`` (0.0, inf) as ``{"__float__": "Infinity"}``; read as plain
    JSON its validator refused the field (StrictDataclassFieldValidationError before issue 44)."""
    from workloads.registry import load_workload

    wl = _default("mamba2", tmp_path)
    assert "__float__" in Path(wl[3:]).read_text()
    built = load_workload(wl).build(WorkloadConfig(wl, batch_size=1, options={"num_layers": 1, "seq_len": 8}), "meta")
    assert built.model.config.time_step_limit[1] == math.inf


def test_a_hybrid_keeps_an_attention_layer_or_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3.5's text model has three linear-attention layers, then a full-attention one: two layers would have no
    attention layer and transformers' hybrid cache fails ('get_seq_length can only be called on Attention layers');
    its default (composite) config builds the causal LM on its text sub-config."""
    wl = _default("qwen3_5", tmp_path)
    base = ["estimate", wl, "-b", "2", "-n", "1", "--option", "seq_len=16", "--format", "json"]
    assert main([*base, "--option", "num_layers=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "keeps no full_attention layer" in err and "num_layers >= 4" in err
    assert main([*base, "--option", "num_layers=4"]) == 0
    assert json.loads(capsys.readouterr().out)["device_peak_bytes"] > 0


def test_a_reduced_config_that_transformers_refuses_is_one_sentence_naming_the_field(tmp_path: Path) -> None:
    from workloads.registry import load_workload

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba2", "time_step_limit": "fast", "num_hidden_layers": 2}))
    with pytest.raises(InputError, match=r"transformers' config validation refuses it.*time_step_limit"):
        load_workload(f"hf:{path}").build(WorkloadConfig(f"hf:{path}", batch_size=1), "meta")


# ---- dtype -----------------------------------------------------------------------------------------------------------


def test_moe_on_grouped_mm_trains_in_bf16_and_fp32_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mixtral's experts run on grouped_mm, which takes no fp32 on CUDA: ``--dtype auto`` (the default) builds bf16
    weights and says so; ``--dtype fp32`` is one sentence, exit 2 (before issue 44: 'Expected mat_a to be BFloat16')."""
    wl = _default("mixtral", tmp_path)
    cfg = WorkloadConfig(wl, batch_size=2, iterations=1, optimizer="sgd", options={"num_layers": 1, "seq_len": 16})
    trace = capture_trace(cfg)
    assert trace.header["compute_dtype"] == "bf16"
    assert trace.header["parameter_bytes"] == 2 * trace.header["parameter_count"]
    assert any("weights in bfloat16" in n and "mixture-of-experts" in n for n in trace.header["notes"])
    argv = ["estimate", wl, "-b", "2", "-n", "1", "--option", "num_layers=1", "--option", "seq_len=16"]
    assert main([*argv, "--dtype", "fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot train in fp32 on a GPU" in err and "grouped_mm" in err
    dense = capture_trace(WorkloadConfig("gpt2", batch_size=1, iterations=1, options={"n_layer": 1, "seq_len": 8}))
    assert dense.header["compute_dtype"] == "fp32"
    assert compute_dtype("auto", trace.header) == "bf16" and compute_dtype("auto", dense.header) == "fp32"
    assert compute_dtype("fp32", trace.header) == "fp32" and compute_dtype("auto", None) == "fp32"


def test_mla_attention_takes_the_memory_efficient_kernel() -> None:
    """Multi-head latent attention's values have a smaller head dim than its queries: CUDA's flash attention needs
    one head dim for q, k and v (sdp_utils.cpp check_head_dim_size_flash), so SDPA takes the memory-efficient kernel,
    whose output has the values' head dim (the flash meta kernel gave the queries')."""
    q = torch.empty(2, 4, 16, 24, device="meta", dtype=torch.bfloat16)
    v = torch.empty(2, 4, 16, 16, device="meta", dtype=torch.bfloat16)
    sdpa = SdpaEmulation()
    with sdpa:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, v, is_causal=True)
    assert out.shape == (2, 4, 16, 16) and sdpa.counts == {"efficient": 1}
    with sdpa:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert sdpa.counts["flash"] == 1


def test_forcing_flash_on_mla_is_refused_naming_the_head_dims() -> None:
    """``--sdpa-backend flash`` where the values' head dim differs (MLA): PyTorch has no flash kernel for it
    (sdp_utils.cpp check_head_dim_size_flash), so the capture refuses in one sentence naming the three head dims."""
    q = torch.empty(2, 4, 16, 24, device="meta", dtype=torch.bfloat16)
    v = torch.empty(2, 4, 16, 16, device="meta", dtype=torch.bfloat16)
    with pytest.raises(InputError, match="head dims 24/24/16"), SdpaEmulation("flash"):
        torch.nn.functional.scaled_dot_product_attention(q, q, v, is_causal=True)
    with SdpaEmulation("flash") as sdpa:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert sdpa.counts == {"flash": 1}
