"""Named models: torchvision:NAME (a sample of every family), timm:NAME, hf:ARCH; listing and options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from uvmlab.cli import main
from uvmlab.config import WorkloadConfig
from uvmlab.errors import InputError
from uvmlab.gpus import get_gpu
from uvmlab.memory.estimate import estimate
from uvmlab.trace.capture import capture_trace
from workloads.registry import load_workload, workload_identity

torchvision = pytest.importorskip("torchvision")
TV_NAMES = sorted(torchvision.models.list_models(module=torchvision.models))
SMALL_IMAGE = 64
"""Image side for the every-model test where the model allows it (meta capture cost hardly depends on it)."""


def _test_image_size(name: str) -> int:
    """The smallest image a model trains on, but at least SMALL_IMAGE: torchvision's ``min_size``, except
    Inception v3, whose auxiliary head needs its 299-px default in train mode, and the models built for a fixed
    size (ViT, Swin, MaxViT) at their min_size."""
    if name == "inception_v3":
        return 299
    meta = torchvision.models.get_model_weights(name).DEFAULT.meta
    return max(SMALL_IMAGE, meta["min_size"][0])


def test_workloads_all_lists_the_names_from_the_packages_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workloads", "--all", "--format", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in listing["builtin"]} >= {"gpt2", "resnet50"}
    rows = {r["prefix"]: r for r in listing["named"]}
    assert rows["torchvision"]["names"] == TV_NAMES and len(TV_NAMES) >= 80
    assert "llama-3.2-1b" in rows["hf"]["names"]
    timm = pytest.importorskip("timm")
    assert rows["timm"]["names"] == list(timm.list_models())


TV_SAMPLE = (
    "alexnet",
    "convnext_tiny",
    "densenet121",
    "efficientnet_b0",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "regnet_x_400mf",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5",
    "squeezenet1_0",
    "swin_v2_t",
    "vgg11_bn",
    "vit_b_32",
)
"""One torchvision classification model per architecture family (torchvision.models' modules), for CI;
``benchmarks/all_model_names.py --family torchvision`` runs all of them (docs/model-names-torchvision.md)."""


def test_the_torchvision_sample_names_one_model_of_every_family() -> None:
    """Every architecture module of torchvision.models with a classification model has a name in TV_SAMPLE (a new
    family in a later torchvision fails here until it is sampled)."""
    families = {torchvision.models.get_model_builder(n).__module__.rsplit(".", 1)[-1] for n in TV_NAMES}
    sampled = {torchvision.models.get_model_builder(n).__module__.rsplit(".", 1)[-1] for n in TV_SAMPLE}
    assert set(TV_SAMPLE) <= set(TV_NAMES)
    assert families == sampled, families - sampled


@pytest.mark.parametrize("name", TV_SAMPLE)
def test_torchvision_sample_traces_and_estimates_at_batch_8(name: str) -> None:
    """Captured on meta (1 iteration) and simulated on an A100-80GB."""
    gpu = get_gpu("A100-80GB")
    cfg = WorkloadConfig(
        f"torchvision:{name}", batch_size=8, iterations=1, options={"image_size": _test_image_size(name)}
    )
    trace = capture_trace(cfg)
    est = estimate(cfg, gpu, trace=trace)
    params = trace.header["parameter_bytes"]
    # parameters, gradients and Adam's two moments are all resident at the optimizer step
    assert est.peak_allocated_bytes >= 4 * params, name
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes, name


def test_tuple_outputs_add_the_auxiliary_losses() -> None:
    """Inception v3 and GoogLeNet return tuples in train mode: their aux heads' logits are part of the trace."""
    for name, aux in (("inception_v3", 1), ("googlenet", 2)):
        wl = load_workload(f"torchvision:{name}").build(WorkloadConfig(f"torchvision:{name}", batch_size=2), "meta")
        images, labels = wl.make_batch()
        assert images.shape[-1] == (299 if name == "inception_v3" else 224)
        out = wl.model(images)
        assert isinstance(out, tuple) and sum(o is not None for o in out[1:]) == aux
        loss = wl.loss_fn(wl.model, (images, labels))
        assert loss.dim() == 0


def test_an_output_that_is_not_class_scores_is_one_sentence() -> None:
    """An image encoder (per-token features, no classification head) cannot be trained by the image loop: an
    InputError naming the output's shape, not cross-entropy's error."""
    import torch

    from uvmlab.errors import InputError
    from workloads.torchvision_models import image_workload

    class Encoder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(2).transpose(1, 2)  # (B, tokens, channels)

    wl = image_workload("encoder", Encoder(), torch.device("meta"), 4, 8, 10)
    with pytest.raises(InputError, match=r"shape \[4, 64, 3\], not one score per class for each of the 4 images"):
        wl.loss_fn(wl.model, wl.make_batch())


def test_named_model_options_and_cli_shortcuts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = load_workload("torchvision:ResNet18")
    assert spec.name == "torchvision:resnet18" and spec.options == {"image_size": 224, "num_classes": 1000}
    wl = spec.build(WorkloadConfig("torchvision:resnet18", batch_size=3, options={"num_classes": 7}), "meta")
    assert wl.model.fc.out_features == 7 and tuple(wl.make_batch()[0].shape) == (3, 3, 224, 224)
    vit = load_workload("torchvision:vit_b_16").build(
        WorkloadConfig("torchvision:vit_b_16", options={"image_size": 384}), "meta"
    )
    assert vit.model.image_size == 384
    with pytest.raises(InputError, match="did you mean vgg19, vgg16"):
        load_workload("torchvision:vgg17").build(WorkloadConfig("torchvision:vgg17"), "meta")
    out = str(tmp_path / "X")
    argv = ["trace", "torchvision:resnet18", "-o", out, "--seq-len", "5"]
    assert main(argv) == 2
    assert "has no option seq_len" in capsys.readouterr().err
    assert main(["trace", "hf:gpt2", "-o", out, "--seq-len", "8", "--option", "seq_len=9"]) == 2
    assert "contradicts" in capsys.readouterr().err
    assert not (tmp_path / "X").exists()  # bad input makes no output folder


def test_regnet_builds_on_meta() -> None:
    """RegNet computes Python numbers from tensors in its constructor: ``with torch.device('meta')`` fails."""
    wl = load_workload("torchvision:regnet_y_400mf").build(WorkloadConfig("torchvision:regnet_y_400mf"), "meta")
    params = list(wl.model.parameters())
    assert params and all(p.device.type == "meta" for p in params)
    assert all(b.device.type == "meta" for b in wl.model.buffers())


def test_timm_model_builds_at_its_own_input_size() -> None:
    pytest.importorskip("timm")
    wl = load_workload("timm:vit_tiny_patch16_224").build(WorkloadConfig("timm:vit_tiny_patch16_224"), "meta")
    assert tuple(wl.make_batch()[0].shape) == (32, 3, 224, 224)
    assert 5.6e6 < sum(p.numel() for p in wl.model.parameters()) < 5.8e6  # ViT-Ti/16: 5.7 M (timm's model card)
    with pytest.raises(InputError, match="has no classification model"):
        load_workload("timm:no_such_net").build(WorkloadConfig("timm:no_such_net"), "meta")


@pytest.mark.parametrize(
    ("name", "millions"),
    [
        ("gpt2-medium", 354.8),  # GPT-2 medium: 355 M (openai-community/gpt2-medium model card)
        ("bert-large", 335.1),  # BERT-large: 335 M parameters (BertForMaskedLM, tied decoder)
        ("llama-3.2-1b", 1235.8),  # Llama 3.2 1B: 1.24 B (tied embeddings; meta-llama/Llama-3.2-1B)
        ("qwen2.5-0.5b", 494.0),  # Qwen2.5-0.5B: 0.49 B (Qwen/Qwen2.5-0.5B model card)
    ],
)
def test_hf_presets_have_the_published_sizes(name: str, millions: float) -> None:
    wl = load_workload(f"hf:{name}").build(WorkloadConfig(f"hf:{name}", batch_size=1), "meta")
    n = sum(p.numel() for p in wl.model.parameters())
    assert n / 1e6 == pytest.approx(millions, rel=0.01)


def test_hf_config_file_and_num_layers(tmp_path: Path) -> None:
    cfg_file = tmp_path / "config.json"
    cfg_file.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 300,
                "max_position_embeddings": 256,
            }
        )
    )
    spec = load_workload(f"hf:{tmp_path}")  # a folder holding config.json
    assert spec.options == {"seq_len": 256, "num_layers": 0}
    wl = spec.build(WorkloadConfig(f"hf:{tmp_path}", batch_size=2, options={"num_layers": 1}), "meta")
    assert type(wl.model).__name__ == "LlamaForCausalLM" and len(wl.model.model.layers) == 1
    assert wl.make_batch().shape == (2, 256)
    ident = workload_identity(f"hf:{cfg_file}")
    assert ident["workload"] == f"hf:{cfg_file.resolve()}" and len(ident["sha256"]) == 64
    cfg_file.write_text("{}")
    with pytest.raises(InputError, match="has no model_type"):
        load_workload(f"hf:{cfg_file}")
    with pytest.raises(InputError, match="neither a built-in config"):
        load_workload("hf:llama-9")


def test_auto_attention_is_transformers_own_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``auto`` (the default): SDPA where the class has it (Llama), eager where it has not (BLOOM); asking for
    ``sdpa`` on BLOOM is refused as transformers refuses it: its ValueError, one sentence and exit 2 on the CLI."""
    tiny = {"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 300}
    configs = {
        "llama": {**tiny, "model_type": "llama", "intermediate_size": 128, "num_hidden_layers": 1},
        "bloom": {**tiny, "model_type": "bloom", "n_layer": 1, "n_head": 4},
    }
    built = {}
    for name, fields in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(fields))
        wl_name = f"hf:{tmp_path / name}"
        built[name] = load_workload(wl_name).build(
            WorkloadConfig(wl_name, batch_size=1, options={"seq_len": 16}), "meta"
        )
    assert WorkloadConfig("gpt2").attention == "auto"
    assert (built["llama"].attention, built["bloom"].attention) == ("sdpa", "eager")
    bloom = f"hf:{tmp_path / 'bloom'}"
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        load_workload(bloom).build(
            WorkloadConfig(bloom, batch_size=1, attention="sdpa", options={"seq_len": 16}), "meta"
        )
    argv = ["estimate", bloom, "-b", "1", "-n", "1", "--option", "seq_len=16", "--attention", "sdpa"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "building its model" in err


def test_cache_key_of_a_named_model_uses_its_resolved_options() -> None:
    from uvmlab.trace.cache import cache_key

    base = cache_key(WorkloadConfig("hf:llama-3.2-1b"))
    assert base == cache_key(WorkloadConfig("hf:Llama-3.2-1B", batch_size=8, options={"seq_len": 2048}))
    assert base != cache_key(WorkloadConfig("hf:llama-3.2-1b", options={"seq_len": 1024}))
    assert base != cache_key(WorkloadConfig("hf:llama-3.2-1b", options={"data_dependent_fraction": 0.5}))
    assert cache_key(WorkloadConfig("torchvision:VGG16")) == cache_key(WorkloadConfig("torchvision:vgg16"))


TIMM_SAMPLE = ("vit_small_r26_s32_384", "test_vit", "test_efficientnet", "mixer_s32_224")
"""A fixed sample of timm names for CI (benchmarks/all_model_names.py runs all of them): the hybrid whose constructor
probes its CNN backbone on a CPU tensor (it failed with "Tensor on device meta is not on the expected device
cpu!" before issue 25), two of timm's test models, an MLP-mixer."""


@pytest.mark.parametrize("name", TIMM_SAMPLE)
def test_timm_sample_traces_and_estimates_at_batch_8(name: str) -> None:
    pytest.importorskip("timm")
    cfg = WorkloadConfig(f"timm:{name}", batch_size=8, optimizer="sgd", iterations=1)
    est = estimate(cfg, get_gpu("A100-40GB"), trace=capture_trace(cfg))
    assert est.peak_allocated_bytes > 0 and est.interval is not None and est.required_bytes > est.device_peak_bytes


def test_a_model_type_whose_default_config_does_not_validate_is_one_sentence(tmp_path: Path) -> None:
    """transformers 5.24's ``gemma4_assistant`` default config fails its own class validator (a
    StrictDataclassClassValidationError, not a ValueError): an InputError naming the model type, no file left."""
    pytest.importorskip("transformers")
    from uvmlab.errors import InputError
    from workloads.hf_models import default_config_file, hf_type_names

    if "gemma4_assistant" not in hf_type_names():
        pytest.skip("this transformers has no gemma4_assistant model type")
    with pytest.raises(InputError, match="gemma4_assistant"):
        default_config_file("gemma4_assistant", tmp_path / "g")
    assert not (tmp_path / "g" / "config.json").exists()
