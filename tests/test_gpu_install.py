"""Issue 43: uvmlab installs with ``pip install --no-deps`` into an environment that already has its own torch, as on
the lent GPU machine (an image with torch 2.11.0+cu130, no ``nvtx`` package, nothing fetchable there), and the kit's
steps run there against the stub CUDA runtime.

What this builds, in a fresh virtual environment (slow: about a minute and a half here, most of it installing torch):

* the environment's own torch: 2.13.0+cpu, installed ``--no-deps --no-index`` from the wheel this machine kind keeps
  on its disk (``/opt/wheels``; the test is skipped, saying so, where it is absent). It is the oldest torch that can
  be installed here without a download: PyPI's torch 2.11 for Linux is a CUDA build of several GB;
* the image's other packages: every package of the environment running this test (pandas, pyarrow, transformers,
  click, rich, filelock, ...), visible through a ``.pth`` file, except torch and what is built against it
  (torchvision, triton, functorch, torchgen), the NVIDIA wheels, and ``nvtx`` (absent from the lent machine);
* uvmlab itself: a wheel built here, installed with ``pip install --no-deps --no-index`` (the way it travels to the
  lent machine: carried as a small wheel).

Then, in that environment: ``uvmlab doctor`` (exit 0: the worker's imports work, with the NVTX fallback), and
``uvmlab collect`` through the real kit runner with the real step code against the stub runtime and the fake CuPy
(facts, the probe, a memory case on the CPU, link, streams), and the real GPU worker on the CPU against the stub.

What it does not prove: torch 2.11 itself (2.13 is the oldest reachable here; the ranges allow >= 2.4), a CUDA
build of torch (CPU only: torch.cuda is absent, so the torch-on-GPU parts of the steps do not run: snapshots, cuDNN,
the probe's interposition check), torchvision's models (the vision workloads are not run), Python 3.12 (this
machine's is 3.11), and anything on a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cuda_stub import build_cudart

REPO = Path(__file__).resolve().parents[1]
STUBS = Path(__file__).parent / "stubs"
TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
LEFT_OUT = ("torch", "torchgen", "functorch", "torchvision", "triton", "nvidia", "nvtx", "uvmlab", "workloads")
"""Top-level names of the running environment not given to the image: torch and what is built against it, the
NVIDIA wheels, nvtx (the lent machine has none), and uvmlab itself (installed from its wheel)."""
TINY_GPT2 = {"seq_len": 16, "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 128, "n_positions": 16}
MiB, GiB = 1 << 20, 1 << 30
IMAGE_ROOM = 3 * GiB
"""Free disk the image needs: torch 2.13.0+cpu unpacks to 699 MB (its wheel's file sizes); the uvmlab wheel and the
stub are small; the rest is margin for the tests running beside it (CI shares its disk: a full disk fails every test
after it)."""

pytestmark = pytest.mark.slow


def _left_out(name: str) -> bool:
    stem = name.split("-")[0].split(".")[0].lower()
    return stem.startswith(LEFT_OUT) or name.startswith(("__editable__", "_uvmlab", "distutils-precedence"))


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    if not TORCH_WHEEL.is_file():
        pytest.skip(f"{TORCH_WHEEL} is not on this machine: no torch to install without a download")
    if sys.version_info[:2] != (3, 11) or shutil.which("gcc") is None:
        pytest.skip("the torch wheel on disk is for CPython 3.11; the stub runtime needs gcc")
    d = tmp_path_factory.mktemp("image")
    free = shutil.disk_usage(d).free
    if free < IMAGE_ROOM:
        pytest.skip(f"{free / GiB:.1f} GiB free under {d}: the image needs {IMAGE_ROOM / GiB:.0f} GiB")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d / "venv")], check=True)
    py = d / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    shared = d / "image_site"
    shared.mkdir()
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    for entry in ours.iterdir():
        if not _left_out(entry.name) and not entry.name.endswith(".pth"):
            (shared / entry.name).symlink_to(entry)
    (site / "image.pth").write_text(str(shared) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", str(TORCH_WHEEL)], check=True, env=env)
    t_torch = time.monotonic() - t0
    wheels = d / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(REPO)], check=True, env=env, capture_output=True)  # fmt: skip
    wheel = next(wheels.glob("uvmlab-*.whl"))
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, env=env)
    cudart = build_cudart(d, "libcudart.so.99")  # under its own soname: the stub the shim and the steps talk to
    print(f"image built in {time.monotonic() - t0:.0f} s (torch {t_torch:.0f} s)")
    yield {"dir": d, "python": py, "cudart": cudart, "wheel": wheel}
    shutil.rmtree(d, ignore_errors=True)  # about 0.7 GB: pytest keeps its last three base folders


def _env(image: dict[str, Path], tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UVMLAB_", "FAKE_", "LD_", "PYTHON", "VIRTUAL"))}
    env.update(PATH=f"{image['python'].parent}:{env.get('PATH', '')}", UVMLAB_CACHE=str(tmp_path / "cache"))
    env.update(extra)
    return env


def test_uvmlab_installs_with_no_deps_on_the_images_own_torch_and_doctor_is_ready(image: dict, tmp_path: Path):
    py = str(image["python"])
    env = _env(image, tmp_path)
    where = subprocess.run([py, "-c", "import torch, uvmlab; print(torch.__version__, uvmlab.__file__)"], env=env,
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()  # fmt: skip
    assert where[0] == "2.13.0+cpu" and str(image["dir"]) in where[1]  # the image's torch, the installed uvmlab
    assert subprocess.run([py, "-c", "import nvtx"], env=env, capture_output=True, cwd=tmp_path).returncode != 0
    doc = subprocess.run(
        [py, "-m", "uvmlab", "doctor", "--format", "json"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert doc.returncode == 0, doc.stderr[-2000:]
    rows = {r["item"]: r for r in json.loads(doc.stdout)["checks"]}
    assert rows["worker imports"]["ok"], rows["worker imports"]
    assert "NVTX ranges: none" in rows["worker imports"]["detail"]  # a CPU torch has no NVTX: said, not fatal


_KIT = """
import json, sys
from pathlib import Path
from uvmlab.measure.gpu.detect import GpuStatus
from uvmlab.measure.gpu.kit.plan import CollectOptions, MemoryCase
from uvmlab.measure.gpu.kit.runner import collect_evidence
out, stand_in, cudart = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
status = GpuStatus(True, "", "NVIDIA H200", 12 << 30, "580.159.03", "13.0", 0, 1, free_bytes=8 << 30)
opts = CollectOptions(what=("facts", "probe", "memory", "link", "uvm"), gcn=False, factors=(0.25,),
                      cases=(MemoryCase("gpt2", 2, "sgd", False, 1, {tiny}),), kernels=("seq_stream",),
                      stream_iterations=2, link_sizes=(2 << 20,), python=stand_in, nsys=False, cudart=cudart,
                      budget_s=None)
rec = collect_evidence(opts, out, status=status)
print(json.dumps({{"failed": rec["failed_steps"], "sets": rec["sets"], "probe": rec["probe"]["balloon"]}}))
"""

_STAND_IN = """#!{python}
# The image's python; the steps that need torch on a CUDA device run their real code on the CPU (--device cpu),
# the probe against the stub (preloaded after the shim).
import os, sys
args = sys.argv[1:]
if args[:2] == ["-m", "uvmlab.measure.gpu.kit.memory_step"]:
    args = [*args, "--device", "cpu"]
if args[:2] == ["-m", "uvmlab.measure.gpu.kit.probe_step"]:
    os.environ["LD_PRELOAD"] = os.environ["LD_PRELOAD"] + ":" + {cudart!r}
    args = [*args, "--device", "cpu", "--cudart", {cudart!r}]
os.execv({python!r}, [{python!r}, *args])
"""


def test_the_kits_steps_and_the_worker_run_there_against_the_stub(image: dict, tmp_path: Path) -> None:
    py, cudart = str(image["python"]), str(image["cudart"])
    stand_in = tmp_path / "python"
    stand_in.write_text(_STAND_IN.format(python=py, cudart=cudart))
    stand_in.chmod(0o755)
    env = _env(
        image,
        tmp_path,
        PYTHONPATH=str(STUBS / "site"),  # the fake CuPy and NVML (CuPy and nvidia-ml-py are in the image)
        FAKE_CUPY_FREE_BYTES=str(2 * GiB + 64 * MiB),
        FAKE_CUDART_TOTAL_BYTES=str(12 * GiB),
        FAKE_CUDART_CONTEXT_BYTES=str(4 * GiB),
        FAKE_CUDART_PAGEABLE_ACCESS="1",
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [py, "-c", _KIT.format(tiny=TINY_GPT2), str(tmp_path / "kit"), str(stand_in), cudart],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["failed"] == [], got
    assert all(s["valid"] for s in got["sets"].values()) and set(got["sets"]) == {"memory", "link", "uvm"}
    assert got["probe"]["cuda_result"] == 0 and got["probe"]["balloon_bytes"] > 0
    # the real worker, on the image's torch, against the stub
    from uvmlab.config import RunConfig, WorkloadConfig

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    cfg = RunConfig(WorkloadConfig("gpt2", batch_size=2, iterations=2, options=TINY_GPT2), oversub=2.0, mode="gpu")
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    shim = subprocess.run(
        [py, "-m", "uvmlab", "shim", "build"], env=env, capture_output=True, text=True, check=True, cwd=tmp_path
    )
    worker_env = {**env, "LD_PRELOAD": f"{shim.stdout.strip()}:{cudart}", "UVMLAB_WARMUP_ITERATIONS": "1",
                  "UVMLAB_BALLOON_DEFER": "1", "UVMLAB_BALLOON_LEAVE_BYTES": str(1 * GiB)}  # fmt: skip
    argv = [py, "-m", "uvmlab.measure.gpu.worker", str(run), "--role", "run", "--device", "cpu", "--cudart", cudart]
    w = subprocess.run(argv, env=worker_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert str(image["dir"]) in subprocess.run([py, "-c", "import uvmlab; print(uvmlab.__file__)"], env=env,
                                               capture_output=True, text=True, cwd=tmp_path).stdout  # fmt: skip
    assert w.returncode == 0, w.stderr[-3000:]
    doc = json.loads((run / "logs" / "run.worker.json").read_text())
    assert doc["torch"] == "2.13.0+cpu" and doc["nvtx_ranges"] is None and doc["balloon_after_warmup"]["taken"]
    assert "no NVTX ranges" in w.stderr  # said once
    print(f"kit and worker in the image: {time.monotonic() - t0:.0f} s")
