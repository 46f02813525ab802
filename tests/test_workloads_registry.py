"""The registry, options, user workload files and the training loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from workloads.registry import WORKLOADS, load_workload
from workloads.train import PHASE_END, make_optimizer, train_step

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "tiny_mlp.py"

SEED_BATCH = {"alexnet": 128, "resnet50": 32, "resnet101": 32, "gpt2": 8, "bert": 16, "whisper-small": 16}


def test_builtin_workloads_and_seed_batch_sizes() -> None:
    assert {n: s.default_batch_size for n, s in WORKLOADS.items()} == SEED_BATCH


def test_unknown_workload_lists_the_known_ones() -> None:
    with pytest.raises(InputError, match="known workloads: alexnet, resnet50"):
        load_workload("resnet9000")


def test_unknown_option_lists_known_options() -> None:
    spec = load_workload("gpt2")
    with pytest.raises(InputError, match="no option n_layers; its options are: n_embd, n_head, n_layer"):
        spec.resolve_options(WorkloadConfig("gpt2", options={"n_layers": 2}))
    with pytest.raises(InputError, match="seq_len must be a int"):
        spec.resolve_options(WorkloadConfig("gpt2", options={"seq_len": "long"}))


@pytest.mark.parametrize(
    ("name", "expected_millions"),
    [("alexnet", 61.1), ("resnet50", 25.6), ("resnet101", 44.5), ("gpt2", 124.4), ("bert", 109.5)],
)
def test_parameter_counts_match_the_published_models(name: str, expected_millions: float) -> None:
    from workloads.info import parameter_count

    assert parameter_count(name) / 1e6 == pytest.approx(expected_millions, abs=0.06)


def test_whisper_small_has_every_dimension_set() -> None:
    wl = load_workload("whisper-small").build(WorkloadConfig("whisper-small", batch_size=1), "meta")
    c = wl.model.config
    assert (c.d_model, c.encoder_layers, c.decoder_layers, c.encoder_attention_heads, c.decoder_attention_heads) == (
        768,
        12,
        12,
        12,
        12,
    )
    assert (c.encoder_ffn_dim, c.decoder_ffn_dim, c.vocab_size, c.num_mel_bins) == (3072, 3072, 51865, 80)
    assert (c.max_source_positions, c.max_target_positions) == (1500, 448)
    features, labels = wl.make_batch()
    assert tuple(features.shape) == (1, 80, 3000) and tuple(labels.shape) == (1, 448)
    assert 240e6 < sum(p.numel() for p in wl.model.parameters()) < 245e6  # "about 244M" (openai/whisper)


def test_attention_implementation_is_honoured() -> None:
    for attn, built in (("sdpa", "sdpa"), ("eager", "eager"), ("auto", "sdpa")):  # auto: BERT has SDPA
        wl = load_workload("bert").build(WorkloadConfig("bert", attention=attn, options={"n_layer": 1}), "meta")
        assert wl.attention == built


def test_bad_option_values_are_input_errors() -> None:
    with pytest.raises(InputError, match="image_size >= 63"):
        load_workload("alexnet").build(WorkloadConfig("alexnet", options={"image_size": 32}), "meta")
    with pytest.raises(InputError, match="exceeds n_positions"):
        load_workload("gpt2").build(WorkloadConfig("gpt2", options={"seq_len": 4096}), "meta")
    with pytest.raises(InputError, match="label_len"):
        load_workload("whisper-small").build(WorkloadConfig("whisper-small", options={"label_len": 449}), "meta")
    for name, width in (("gpt2", "n_embd"), ("bert", "hidden_size"), ("whisper-small", "d_model")):
        with pytest.raises(InputError, match=f"{width} \\(100\\) must be a multiple of n_head \\(12\\)"):
            load_workload(name).build(WorkloadConfig(name, options={width: 100}), "meta")


def test_builders_get_the_resolved_batch_size() -> None:
    """A config without a batch size builds batches of the workload's default size (one source: the spec)."""
    for name, batch in (("alexnet", 128), ("gpt2", 8), ("whisper-small", 16)):
        wl = load_workload(name).build(WorkloadConfig(name, options={}), "meta")
        first = wl.make_batch()
        assert (first[0] if isinstance(first, tuple) else first).shape[0] == batch, name


def test_example_user_workload_loads_and_trains(tmp_path: Path) -> None:
    spec = load_workload(str(EXAMPLE))
    assert spec.default_batch_size == 64 and spec.source == str(EXAMPLE.resolve())
    wl = spec.build(WorkloadConfig(str(EXAMPLE), batch_size=4, options={"hidden": 32}), "cpu")
    opt = make_optimizer(wl.model, WorkloadConfig(str(EXAMPLE)))
    loss = train_step(wl, opt, WorkloadConfig(str(EXAMPLE)))
    assert loss.dim() == 0 and bool(loss.isfinite())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = 1\n", "must define build"),
        ("def build(:\n", "SyntaxError"),
        ("import no_such_module_xyz\n", "ModuleNotFoundError"),
        ("OPTIONS = [1]\ndef build(cfg, device): pass\n", "OPTIONS must be a dict"),
        ("DEFAULT_BATCH_SIZE = 0\ndef build(cfg, device): pass\n", "DEFAULT_BATCH_SIZE"),
    ],
)
def test_broken_user_files_are_input_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "w.py"
    f.write_text(text)
    with pytest.raises(InputError, match=message):
        load_workload(str(f))


def test_user_build_must_return_a_workload(tmp_path: Path) -> None:
    f = tmp_path / "bad_return.py"
    f.write_text("def build(cfg, device):\n    return 42\n")
    spec = load_workload(str(f))
    with pytest.raises(InputError, match="returned int, not a Workload"):
        spec.build(WorkloadConfig(str(f)), "meta")


def test_missing_user_file() -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_workload("./nope/missing.py")


@pytest.mark.parametrize(
    ("position", "expected"),
    [
        ("iteration_start", ["zero_grad", "data", "forward", "backward", "optimizer", PHASE_END]),
        ("before_backward", ["data", "forward", "zero_grad", "backward", "optimizer", PHASE_END]),
    ],
)
def test_train_step_phase_order(position: str, expected: list[str]) -> None:
    cfg = WorkloadConfig(str(EXAMPLE), batch_size=2, zero_grad=position, optimizer="sgd")
    wl = load_workload(str(EXAMPLE)).build(cfg, "meta")
    seen: list[tuple[str, int]] = []
    train_step(wl, make_optimizer(wl.model, cfg), cfg, lambda p, i: seen.append((p, i)), iteration=5)
    assert seen == [(p, 5) for p in expected]


def test_optimizers_use_foreach() -> None:
    wl = load_workload(str(EXAMPLE)).build(WorkloadConfig(str(EXAMPLE)), "meta")
    for name in ("sgd", "adam", "adamw"):
        opt = make_optimizer(wl.model, WorkloadConfig(str(EXAMPLE), optimizer=name))
        assert opt.defaults["foreach"] is True


def test_a_model_built_past_the_module_limit_is_refused_in_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--option n_layer=1000000000`` built modules for hours (issue 42); construction now stops at
    ``workloads.base.MAX_MODULES`` registered submodules, and the hook is gone afterwards."""
    import torch

    import workloads.base as base

    with base.module_limit("toy", limit=20):
        torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(20)])  # 20 registrations: allowed
    too_many = r"^workload toy: the model registers more than 20 submodules"
    with pytest.raises(InputError, match=too_many), base.module_limit("toy", limit=20):
        torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(21)])
    torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(30)])  # no hook left behind
    monkeypatch.setattr(base, "MAX_MODULES", 40)
    spec = load_workload("gpt2")
    spec.build(WorkloadConfig("gpt2", batch_size=1, options={"n_layer": 2, "n_embd": 8, "n_head": 2}))
    with pytest.raises(InputError, match="more than 40 submodules"):
        spec.build(WorkloadConfig("gpt2", batch_size=1, options={"n_layer": 50, "n_embd": 8, "n_head": 2}))
