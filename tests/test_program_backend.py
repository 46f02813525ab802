"""uvmlab.measure.gpu.program_backend (IFACE.md B2) against the stub CUDA runtime (tests/stubs/fake_cudart.c, which
records every call with its decoded arguments): each backend call issues the right CUDA entry point with the right
arguments in the CUDA 13 (cudaMemLocation) and CUDA 12 (int device) forms, errors are one sentence naming the call
and the cudaError, host accesses refuse memory that is not managed, and the shim's prefetch-on-allocation switch
works; plus the GPU worker's glue for program files."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from uvmlab.errors import InputError, UnavailableError, UvmlabError
from uvmlab.measure.gpu import program_backend as pb
from uvmlab.measure.gpu import shim, worker
from uvmlab.measure.gpu.program_backend import CudaProgramBackend
from uvmlab.sim.uvm.advice import ADVICE

torch = pytest.importorskip("torch")  # loaded before the stub (soname libcudart.so.13): see tests/test_advise_env.py

STUBS = Path(__file__).parent / "stubs"
STREAM = 0x1234
DRIVER_TYPES = Path("/usr/local/cuda/include/driver_types.h")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None or shim.find_compiler() is None:
        pytest.skip("gcc/g++ not found: the stub CUDA runtime and the shim are C/C++")
    d = tmp_path_factory.mktemp("program_backend")
    lib = d / "libcudart.so.13"
    subprocess.run(
        ["gcc", "-O1", "-shared", "-fPIC", f"-Wl,--version-script={STUBS / 'libcudart.map'}",
         "-Wl,-soname,libcudart.so.13", "-o", str(lib), str(STUBS / "fake_cudart.c"), "-lpthread"],
        check=True, capture_output=True,
    )  # fmt: skip
    return {"cudart": lib, "shim": shim.build_shim(cache_dir=d / "cache")}


@pytest.fixture
def stub(built, tmp_path, monkeypatch):
    """The stub runtime in this process (RTLD_LOCAL), logging to tmp_path/cudart.log; CUDA 13 unless a test says."""
    for var in ("FAKE_CUDART_VERSION", "FAKE_CUDART_NO_DEVICE", "FAKE_CUDART_PAGEABLE_ACCESS", "FAKE_CUDART_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FAKE_CUDART_LOG", str(tmp_path / "cudart.log"))
    monkeypatch.setenv("FAKE_CUDART_DEVICE_COUNT", "2")  # the tests name device 1: the stub refuses an ordinal >= count
    return ctypes.CDLL(str(built["cudart"]))


def _calls(tmp_path: Path, prefix: str = "cuda") -> list[str]:
    log = tmp_path / "cudart.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [c for c in lines if c.startswith(prefix)]


def _managed(stub, nbytes: int):
    """A float32 CPU tensor over a cudaMallocManaged allocation of the stub (host memory there)."""
    p = ctypes.c_void_p()
    assert stub.cudaMallocManaged(ctypes.byref(p), ctypes.c_size_t(nbytes), ctypes.c_uint(1)) == 0
    t = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(p.value), dtype=torch.float32)
    assert t.data_ptr() == p.value
    return t


def _device(stub, nbytes: int):
    """A cudaMalloc ("device") allocation of the stub, as a tensor over its address (never dereferenced here)."""
    p = ctypes.c_void_p()
    assert stub.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0

    class _T:
        def data_ptr(self) -> int:
            return int(p.value)

    return _T()


class _Sync:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def _backend(stub, device: int = 1, **kw) -> CudaProgramBackend:
    kw.setdefault("sync", _Sync())
    return CudaProgramBackend(lib=stub, device=device, stream=lambda: STREAM, **kw)


def _hex(ptr: int) -> str:
    return f"0x{ptr:x}"


# ---- prefetch ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "gpu", "cpu"),
    [
        ("13000", "loc_type=1 loc_id=1 flags=0", "loc_type=2 loc_id=0 flags=0"),
        ("12080", "device=1", "device=-1"),
    ],
)
def test_prefetch_issues_cudamemprefetchasync_in_the_runtime_s_form(stub, tmp_path, monkeypatch, version, gpu, cpu):
    monkeypatch.setenv("FAKE_CUDART_VERSION", version)
    t = _managed(stub, 1 << 20)
    be = _backend(stub)
    assert be.version == int(version)
    be.prefetch(t, 4096, 8192, "gpu")
    be.prefetch(t, 0, 1 << 20, "cpu")
    p = t.data_ptr()
    assert _calls(tmp_path, "cudaMemPrefetchAsync") == [
        f"cudaMemPrefetchAsync ptr={_hex(p + 4096)} size=8192 {gpu} stream={_hex(STREAM)} -> 0",
        f"cudaMemPrefetchAsync ptr={_hex(p)} size=1048576 {cpu} stream={_hex(STREAM)} -> 0",
    ]
    assert be.calls["cudaMemPrefetchAsync"] == 2


def test_prefetch_to_an_unknown_place_is_refused(stub, tmp_path) -> None:
    with pytest.raises(InputError, match="'gpu' or 'cpu'"):
        _backend(stub).prefetch(_managed(stub, 4096), 0, 4096, "host")
    assert _calls(tmp_path, "cudaMemPrefetchAsync") == []


# ---- advise ------------------------------------------------------------------------------------------------------
ADVICE_13 = {
    "set_read_mostly": "advice=1 loc_type=1 loc_id=1",
    "unset_read_mostly": "advice=2 loc_type=1 loc_id=1",
    "set_preferred_location:gpu": "advice=3 loc_type=1 loc_id=1",
    "set_preferred_location:cpu": "advice=3 loc_type=2 loc_id=0",
    "unset_preferred_location": "advice=4 loc_type=1 loc_id=1",
    "set_accessed_by:gpu": "advice=5 loc_type=1 loc_id=1",
    "set_accessed_by:cpu": "advice=5 loc_type=2 loc_id=0",
    "unset_accessed_by:gpu": "advice=6 loc_type=1 loc_id=1",
    "unset_accessed_by:cpu": "advice=6 loc_type=2 loc_id=0",
}
ADVICE_12 = {k: re.sub(r"loc_type=1 loc_id=1", "device=1", re.sub(r"loc_type=2 loc_id=0", "device=-1", v))
             for k, v in ADVICE_13.items()}  # fmt: skip


@pytest.mark.parametrize(("version", "expected"), [("13000", ADVICE_13), ("12080", ADVICE_12)])
def test_every_advice_issues_cudamemadvise_with_its_enum_and_location(stub, tmp_path, monkeypatch, version, expected):
    monkeypatch.setenv("FAKE_CUDART_VERSION", version)
    assert set(expected) == set(ADVICE)
    t = _managed(stub, 64 << 10)
    be = _backend(stub)
    for advice in ADVICE:
        be.advise(t, 8192, 4096, advice)
    ptr = _hex(t.data_ptr() + 8192)
    assert _calls(tmp_path, "cudaMemAdvise") == [
        f"cudaMemAdvise ptr={ptr} size=4096 {expected[a]} -> 0" for a in ADVICE
    ]


def test_an_unknown_advice_is_one_input_error_and_no_call(stub, tmp_path) -> None:
    with pytest.raises(InputError, match=r"unknown cudaMemAdvise advice 'set_preferred_location'; known: "):
        _backend(stub).advise(_managed(stub, 4096), 0, 4096, "set_preferred_location")
    assert _calls(tmp_path, "cudaMemAdvise") == []


# ---- CUDA errors -------------------------------------------------------------------------------------------------
def _one_sentence(msg: str) -> None:
    assert "\n" not in msg and msg.count(". ") == 0, msg


def test_cuda_errors_are_one_sentence_naming_the_call_and_the_error(stub, tmp_path, monkeypatch) -> None:
    be = _backend(stub)
    dev = _device(stub, 1 << 20)  # device memory: cudaMemPrefetchAsync / cudaMemAdvise answer cudaErrorInvalidValue
    with pytest.raises(UvmlabError) as e:
        be.prefetch(dev, 0, 4096, "gpu")
    assert not isinstance(e.value, InputError)
    msg = str(e.value)
    _one_sentence(msg)
    assert msg == f"cudaMemPrefetchAsync of 4096 bytes at {_hex(dev.data_ptr())} to the GPU failed with " + (
        "cudaErrorInvalidValue (error 1)"
    )
    t = _managed(stub, 4096)
    with pytest.raises(UvmlabError, match=r"^cudaMemAdvise\(cudaMemAdviseSetAccessedBy, CPU\) of 8192 bytes at "):
        be.advise(t, 0, 8192, "set_accessed_by:cpu")  # past the end of the allocation
    with pytest.raises(UvmlabError) as e:
        be.advise(t, 0, 8192, "set_read_mostly")
    assert str(e.value).endswith("failed with cudaErrorInvalidValue (error 1)")
    monkeypatch.setenv("FAKE_CUDART_NO_DEVICE", "1")
    with pytest.raises(UvmlabError, match=r"^cudaPointerGetAttributes\(0x[0-9a-f]+\) failed with cudaErrorNoDevice"):
        be.host_access(t, 0, 4096, write=True)


def test_an_error_code_the_runtime_cannot_name_is_still_one_sentence(stub) -> None:
    be = _backend(stub)
    assert be.error_name(1) == "cudaErrorInvalidValue"
    assert be.error_name(12345) == "unrecognized error code"  # what cudaGetErrorName answers for unknown codes

    class _NoNames:
        def __getattr__(self, name):
            if name == "cudaGetErrorName":
                raise AttributeError(name)
            return getattr(stub, name)

    assert _backend(_NoNames()).error_name(7) == "cudaError 7"


# ---- host accesses -----------------------------------------------------------------------------------------------
@pytest.fixture
def moves(monkeypatch):
    """Every ctypes.memmove of the backend, as (dst, src, n), still performed."""
    seen: list[tuple[int, int, int]] = []
    real = ctypes.memmove

    def spy(dst, src, n):
        seen.append((ctypes.cast(dst, ctypes.c_void_p).value or 0, ctypes.cast(src, ctypes.c_void_p).value or 0, n))
        return real(dst, src, n)

    monkeypatch.setattr(ctypes, "memmove", spy)
    return seen


def test_a_host_write_is_a_cpu_store_of_the_same_values_after_a_sync(stub, tmp_path, moves, monkeypatch) -> None:
    monkeypatch.setattr(pb, "HOST_CHUNK_BYTES", 16 << 10)
    t = _managed(stub, 64 << 10)
    t.copy_(torch.arange(t.numel(), dtype=torch.float32))
    before = t.clone()
    sync = _Sync()
    be = _backend(stub, sync=sync)
    be.host_access(t, 4096, 40 << 10, write=True)
    assert sync.n == 1  # the device is waited for before the CPU touches managed memory
    assert torch.equal(t, before)  # the program's values are kept
    p = t.data_ptr() + 4096
    loads = [(src, n) for _dst, src, n in moves[0::2]]
    stores = [(dst, n) for dst, _src, n in moves[1::2]]
    chunks = [(p, 16 << 10), (p + (16 << 10), 16 << 10), (p + (32 << 10), 8 << 10)]
    assert loads == chunks and stores == chunks  # every byte of the range loaded, then stored, by the CPU
    assert _calls(tmp_path, "cudaPointerGetAttributes") == [f"cudaPointerGetAttributes ptr={_hex(p)} type=3 -> 0"]
    assert be.calls["host_write"] == 1


def test_a_host_read_loads_the_range_and_stores_nothing_into_it(stub, moves) -> None:
    t = _managed(stub, 8192)
    _backend(stub).host_access(t, 0, 8192, write=False)
    assert [(src, n) for _dst, src, n in moves] == [(t.data_ptr(), 8192)]
    assert all(dst != t.data_ptr() for dst, _src, _n in moves)


@pytest.mark.parametrize("kind", ["unregistered host", "device"])
def test_host_access_refuses_memory_that_is_not_managed(stub, tmp_path, moves, kind) -> None:
    t = torch.zeros(1024) if kind == "unregistered host" else _device(stub, 1 << 20)
    sync = _Sync()
    with pytest.raises(InputError) as e:
        _backend(stub, sync=sync).host_access(t, 0, 4096, write=True)
    msg = str(e.value)
    _one_sentence(msg)
    assert msg == (
        f"uvm.host_write needs managed memory, but the tensor at {_hex(t.data_ptr())} is {kind} memory "
        "(cudaPointerGetAttributes), so the program must run under uvmlab's managed-memory shim (uvmlab run FILE "
        "--mode gpu preloads it)"
    )
    assert sync.n == 0 and moves == []  # nothing touched


def test_a_baseline_backend_copies_instead_and_issues_no_hint(stub, tmp_path) -> None:
    t = torch.arange(16, dtype=torch.float32)
    be = _backend(stub, managed=False)
    be.host_access(t, 8, 16, write=True)
    be.prefetch(t, 0, 64, "gpu")
    be.advise(t, 0, 64, "set_read_mostly")
    be.prefetch_new_allocations(True)
    assert torch.equal(t, torch.arange(16, dtype=torch.float32))
    assert _calls(tmp_path, "cudaMem") == [] and _calls(tmp_path, "cudaPointerGetAttributes") == []
    assert be.calls == {"host_write": 1}


def test_a_negative_range_is_refused(stub) -> None:
    with pytest.raises(InputError, match="offset >= 0 and nbytes >= 0"):
        _backend(stub).host_access(_managed(stub, 4096), -4, 4, write=False)


# ---- kernels -----------------------------------------------------------------------------------------------------
def test_a_kernel_runs_gpu_when_given_else_the_stand_in_touches_the_declared_bytes(stub) -> None:
    be = _backend(stub)
    ran: list[str] = []
    a, b = torch.arange(8, dtype=torch.float32), torch.ones(4, 4)
    be.kernel("k", [a], [b], gpu=lambda: ran.append("gpu"))
    assert ran == ["gpu"] and torch.equal(b, torch.ones(4, 4))  # gpu() replaces the stand-in
    col = torch.ones(4, 4)[:, 1]  # a non-contiguous view: only its elements are written
    base = col._base
    be.kernel("k", [a, col], [b, col])
    assert torch.equal(a, torch.arange(8, dtype=torch.float32))  # reads are only read
    assert torch.count_nonzero(b) == 0  # writes are filled
    assert torch.count_nonzero(base) == 12 and torch.count_nonzero(base[:, 1]) == 0
    assert be.calls == {"kernel gpu()": 1, "kernel stand-in": 1}


# ---- prefetch of new allocations (the shim) ----------------------------------------------------------------------
_SWITCH_CHILD = """
import ctypes, sys
from uvmlab.measure.gpu.program_backend import CudaProgramBackend
stub = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # the runtime, as torch loads it
shim = ctypes.CDLL(sys.argv[2])                           # the CUDAPluggableAllocator route (no LD_PRELOAD)
shim.uvmlab_malloc.restype = ctypes.c_void_p
shim.uvmlab_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
be = CudaProgramBackend(lib=stub, device=0, stream=lambda: 0, sync=lambda: None, shim=shim)
print(hex(shim.uvmlab_malloc(4096, 0, 0x99)))
be.prefetch_new_allocations(True)
print(hex(shim.uvmlab_malloc(8192, 0, 0x99)))
be.prefetch_new_allocations(False)
print(hex(shim.uvmlab_malloc(16384, 0, 0x99)))
"""


@pytest.mark.parametrize("version", ["13000", "12080"])
def test_prefetch_new_allocations_switches_the_shim_s_prefetch_after_each_allocation(built, tmp_path, version):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "FAKE_CUDART_LOG": str(tmp_path / "cudart.log"), "FAKE_CUDART_VERSION": version}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", _SWITCH_CHILD, str(built["cudart"]), str(built["shim"])],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    p1, p2, p3 = proc.stdout.split()
    where = "loc_type=1 loc_id=0 flags=0" if version == "13000" else "device=0"
    assert _calls(tmp_path) == [
        f"cudaMallocManaged ptr={p1} size=4096 flags=1 -> 0",
        f"cudaMallocManaged ptr={p2} size=8192 flags=1 -> 0",
        f"cudaMemPrefetchAsync ptr={p2} size=8192 {where} stream=0x99 -> 0",  # only while switched on
        f"cudaMallocManaged ptr={p3} size=16384 flags=1 -> 0",
    ]


def test_prefetch_new_allocations_without_the_shim_is_one_sentence(stub) -> None:
    be = _backend(stub, shim=stub)  # the runtime exports no uvmlab_prefetch_on_alloc
    be.prefetch_new_allocations(False)  # nothing to switch off
    with pytest.raises(InputError) as e:
        be.prefetch_new_allocations(True)
    _one_sentence(str(e.value))
    assert "needs uvmlab's managed-memory shim" in str(e.value)


# ---- the values against the CUDA headers -------------------------------------------------------------------------
def _enum(text: str, name: str) -> int:
    m = re.search(rf"\b{name}\s*=\s*(\d+)", text)
    assert m, name
    return int(m.group(1))


def test_the_constants_are_the_cuda_headers_and_the_checked_abi_header_s() -> None:
    header = shim.ABI_HEADER.read_text()
    abi = {m[0]: int(m[1]) for m in re.findall(r"constexpr (?:int|size_t) (k\w+) = (-?\d+);", header)}
    names = {1: "SetReadMostly", 2: "UnsetReadMostly", 3: "SetPreferredLocation", 4: "UnsetPreferredLocation",
             5: "SetAccessedBy", 6: "UnsetAccessedBy"}  # fmt: skip
    assert {abi[f"kCudaMemAdvise{n}"] for n in names.values()} == set(pb.ADVICE_CODES.values())
    assert all(abi[f"kCudaMemAdvise{names[v]}"] == v for v in pb.ADVICE_CODES.values())
    assert {v: f"cudaMemAdvise{n}" for v, n in names.items()} == pb.ADVICE_ENUM_NAMES
    assert abi["kCudaMemoryTypeManaged"] == pb.MEMORY_TYPE_MANAGED
    assert abi["kCudaMemoryTypeDevice"] == pb.MEMORY_TYPE_DEVICE
    assert abi["kCudaMemoryTypeUnregistered"] == pb.MEMORY_TYPE_UNREGISTERED
    assert (abi["kCudaMemLocationTypeDevice"], abi["kCudaMemLocationTypeHost"]) == (pb.LOCATION_DEVICE,
                                                                                      pb.LOCATION_HOST)  # fmt: skip
    assert abi["kCudaCpuDeviceId"] == pb.CPU_DEVICE_ID
    assert abi["kCudaPointerAttributesBufferBytes"] == pb.POINTER_ATTRIBUTES_BUFFER_BYTES
    assert ctypes.sizeof(pb._PointerAttributes) == pb.POINTER_ATTRIBUTES_BUFFER_BYTES
    if not DRIVER_TYPES.exists():
        pytest.skip(f"{DRIVER_TYPES} is absent (the ABI header values are checked by test_gpu_shim_headers there)")
    text = DRIVER_TYPES.read_text(errors="replace")
    for value, n in names.items():
        assert _enum(text, f"cudaMemAdvise{n}") == value
    assert _enum(text, "cudaMemoryTypeManaged") == pb.MEMORY_TYPE_MANAGED
    assert _enum(text, "cudaMemLocationTypeHost") == pb.LOCATION_HOST


# ---- no GPU, and the worker's glue -------------------------------------------------------------------------------
def test_without_a_gpu_the_backend_is_one_sentence() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(UnavailableError) as e:
        CudaProgramBackend()
    _one_sentence(str(e.value))
    assert "needs a CUDA device" in str(e.value)


def test_the_worker_times_a_program_by_its_iteration_marks_or_as_a_whole(stub) -> None:
    class Spec:
        is_program = True

    assert worker.program_runner(object()) is None  # a training workload's spec
    samples: list[tuple[str, int]] = []
    be = _backend(stub)
    seen: list[tuple[object, ...]] = []

    def runner(spec, cfg, device, backend):
        seen.append((spec, cfg, device, backend))
        for it in (0, 1, -1):  # what Program.iterations() calls as each iteration starts, and after the last
            backend.mark_iteration(it)

    its = worker.run_program_job(runner, Spec, "cfg", "cuda", lambda: None, lambda p, i: samples.append((p, i)), be)
    assert seen == [(Spec, "cfg", "cuda", be)]
    assert [i["iteration"] for i in its] == [0, 1]
    assert all(i["duration_ns"] == i["end_ns"] - i["start_ns"] >= 0 for i in its)
    assert its[0]["end_ns"] == its[1]["start_ns"]
    assert samples == [("built", -1), ("end", 1)]
    whole = worker.run_program_job(
        lambda *a: None, Spec, "cfg", "cuda", lambda: None, lambda p, i: None, _backend(stub)
    )
    assert [i["iteration"] for i in whole] == [0]  # no marks: the whole program is one iteration


# ---- on a real GPU (skipped without one) ---------------------------------------------------------------------------
_GPU_CHILD = """
import sys, torch
from uvmlab.errors import InputError
from uvmlab.measure.gpu.program_backend import CudaProgramBackend
be = CudaProgramBackend()
n = 1 << 22
a = torch.arange(n // 4, device="cuda", dtype=torch.float32)
b = torch.ones(n // 4, device="cuda")
if sys.argv[1] == "device":  # no shim: plain device memory
    try:
        be.host_access(a, 0, n, write=True)
    except InputError as exc:
        print("refused:", exc)
    sys.exit(0)
for advice in ("set_read_mostly", "unset_read_mostly", "set_preferred_location:cpu", "unset_preferred_location",
               "set_accessed_by:gpu", "unset_accessed_by:gpu", "set_accessed_by:cpu", "unset_accessed_by:cpu",
               "set_preferred_location:gpu"):
    be.advise(a, 0, n, advice)
be.prefetch(a, 0, n, "cpu")
be.host_access(a, 0, n, write=True)
be.host_access(a, 4096, 4096, write=False)
be.prefetch(a, 0, n, "gpu")
be.kernel("k", [a], [b], None)
torch.cuda.synchronize()
assert torch.equal(a, torch.arange(n // 4, device="cuda", dtype=torch.float32)) and int(b.count_nonzero()) == 0
be.prefetch_new_allocations(True)
c = torch.empty(n // 4, device="cuda")
be.prefetch_new_allocations(False)
print("calls:", sorted(be.calls.items()))
"""


def test_on_a_real_gpu_under_the_shim(tmp_path) -> None:
    """Every call through the real runtime on managed memory (the shim preloaded, caching off so that the last
    tensor is its own cudaMalloc), and the refusal on device memory without the shim."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the backend is tested against the stub runtime above")
    lib = shim.build_shim(cache_dir=tmp_path / "cache")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UVMLAB_", "LD_PRELOAD"))}
    base["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    managed = {**base, "LD_PRELOAD": str(lib), "UVMLAB_ALLOC_LOG": str(tmp_path / "alloc.bin"),
               "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _GPU_CHILD, "managed"], env=managed, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "('cudaMemAdvise', 9)" in proc.stdout and "('cudaMemPrefetchAsync', 2)" in proc.stdout, proc.stdout
    log = shim.read_alloc_log(tmp_path / "alloc.bin")
    prefetched = log[log["op"] == "prefetch"]
    assert len(prefetched) == 1 and (prefetched["result"] == 0).all()  # only c, while switched on
    proc = subprocess.run([sys.executable, "-c", _GPU_CHILD, "device"], env=base, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: uvm.host_write needs managed memory" in proc.stdout and "is device memory" in proc.stdout


def test_the_worker_runs_a_program_spec_instead_of_the_training_loop(stub, tmp_path, monkeypatch) -> None:
    """run_worker end to end on the CPU with a program spec (the lead's loader and NullBackend stood in for)."""
    import workloads.registry
    from uvmlab.config import RunConfig, WorkloadConfig
    from uvmlab.files.atomic import atomic_write_json

    ran: list[int] = []

    class Spec:
        program = object()

    def run_program(spec, cfg, device, backend):
        assert spec is Spec and device == "cpu"
        for it in range(cfg.iterations):
            backend.mark_iteration(it)
            ran.append(it)
        backend.mark_iteration(-1)

    monkeypatch.setattr(workloads.registry, "load_workload", lambda name: Spec)
    monkeypatch.setattr(worker, "program_runner", lambda spec: run_program if spec is Spec else None)
    monkeypatch.setattr(worker, "program_backend", lambda is_cuda: _backend(stub))
    cfg = RunConfig(WorkloadConfig("prog.py", iterations=5), oversub=2, mode="gpu")
    atomic_write_json(tmp_path / "config.json", cfg.to_dict())
    assert worker.main([str(tmp_path), "--role", "run", "--device", "cpu", "--iterations", "2"]) == 0
    doc = json.loads((tmp_path / "logs" / "run.worker.json").read_text())
    assert ran == [0, 1]  # --iterations overrides the configured 5, as for training workloads
    assert doc["outcome"] == "ok" and [i["iteration"] for i in doc["iterations"]] == [0, 1]
