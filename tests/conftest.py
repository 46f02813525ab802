"""Shared fixtures: the real data folder (skipped with a reason where absent) and stable console output."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]


# Property tests are reproducible in CI: a fixed seed per test (derandomize), no example database carried between
# runs, and each test's own max_examples. HYPOTHESIS_PROFILE=explore draws fresh examples (for local hunting).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile(
    "explore", derandomize=False, max_examples=200, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def real_data_dir() -> Path:
    """../shared/real-data next to the checkout, or $UVMLAB_REAL_DATA."""
    env = os.environ.get("UVMLAB_REAL_DATA")
    return Path(env) if env else REPO.parent / "shared" / "real-data"


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real-data folder; tests that need it skip with a clear reason where it is absent."""
    path = real_data_dir()
    if not path.is_dir():
        pytest.skip(
            f"real data not found at {path}; put ../shared/real-data beside the checkout or set UVMLAB_REAL_DATA"
        )
    return path


@pytest.fixture(scope="session", autouse=True)
def _private_trace_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests never read or write the user's trace cache: each session starts empty, as on a fresh machine."""
    os.environ["UVMLAB_CACHE"] = str(tmp_path_factory.mktemp("uvmlab-cache"))


@pytest.fixture(scope="module")
def module_trace_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A trace cache of the test module's own (``pytestmark = pytest.mark.usefixtures("module_trace_cache")``): its
    tests share captures, and nothing another module captured."""
    mp = pytest.MonkeyPatch()
    mp.setenv("UVMLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Sweep workers run tests/sweep_fake_run.py instead of a simulation (``UVMLAB_SWEEP_RUN_FN``): the sweep
    machinery in seconds. Returns the worker's environment."""
    import sweep_fake_run

    env = sweep_fake_run.env_for_worker()
    for key in ("UVMLAB_SWEEP_RUN_FN", "PYTHONPATH"):
        monkeypatch.setenv(key, env[key])
    return env


@pytest.fixture(autouse=True)
def _stable_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture(scope="session")
def small_advice() -> object:
    """``uvmlab advise`` of a small AlexNet (64x64 images, 10 classes, batch 16, 2 iterations) at x1.5, every
    policy and combination: shared by the advise tests (its traces capture in seconds)."""
    from uvmlab.advise.advisor import advise
    from uvmlab.config import RunConfig, WorkloadConfig

    small = WorkloadConfig("alexnet", batch_size=16, options={"image_size": 64, "num_classes": 10}, iterations=2)
    return advise(RunConfig(workload=small, oversub=1.5, mode="sim"))
