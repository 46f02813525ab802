"""Issue 42 section 4: the Python API checks its arguments at its edge (uvmlab.api._check_arguments), with one
sentence naming the function and the parameter, instead of failing deep inside with an AttributeError.

Every exported function and every parameter is tried (enumerated from ``api.__all__`` and the functions'
signatures, so a new function or parameter cannot escape): a value of a type it cannot take is an InputError
before the function runs."""

from __future__ import annotations

import inspect

import pytest

from uvmlab import api
from uvmlab.errors import InputError


class Alien:
    """A value no parameter of the API takes."""

    def __repr__(self) -> str:
        return "Alien()"


def _functions() -> list[str]:
    return [n for n in api.__all__ if callable(getattr(api, n)) and not isinstance(getattr(api, n), type)]


def _module_function(name: str):  # type: ignore[no-untyped-def]
    import importlib

    return getattr(importlib.import_module(api._EXPORTS[name]), name)


UNCHECKABLE = {
    # annotated Any (or a name imported for type checkers only), so an Alien is not refused at the edge
    ("place", "settings"),
    ("estimate", "stack"),
    ("characterize_source", "cfg"),
    ("collect_evidence", "progress"),
    ("collect_evidence", "status"),
}


def _cases() -> list[tuple[str, str]]:
    out = []
    for name in _functions():
        if name in api._UNCHECKED:
            continue
        for p in inspect.signature(_module_function(name)).parameters.values():
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                out.append((name, p.name))
    return out


@pytest.mark.parametrize(("name", "param"), _cases())
def test_every_parameter_refuses_a_value_of_a_wrong_type(name: str, param: str) -> None:
    fn = getattr(api, name)
    if (name, param) in UNCHECKABLE:
        pytest.skip("annotated Any: what it takes is the function's own business")
    with pytest.raises(InputError) as info:
        fn(**{param: Alien()})
    message = str(info.value)
    assert message.startswith(f"{name}(): {param} must be ") and "Alien()" in message
    assert "\n" not in message and len(message) <= 500


def test_few_parameters_are_left_unchecked() -> None:
    cases = _cases()
    assert set(cases) >= UNCHECKABLE  # no stale entry
    assert len(cases) >= 100
    assert len(UNCHECKABLE) <= 0.06 * len(cases)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: api.estimate("resnet50", 80), "estimate(): gpu must be a GPU name"),
        (lambda: api.estimate("resnet50", None), "estimate(): gpu must be a GPU name"),
        (lambda: api.summarize(123), "summarize(): ex must be an nsys export's path"),
        (lambda: api.summarize(b"report.sqlite"), "summarize(): ex must be an nsys export's path"),
        (lambda: api.estimate(80, "A100-80GB"), "estimate(): cfg must be a workload name"),
        (lambda: api.colocate_workloads(["gpt2:8"], 80), "colocate_workloads(): gpu must be a GPU name"),
        (lambda: api.get_gpu(80), "get_gpu(): name must be text"),
        (lambda: api.estimate("resnet50", "A100-80GB", margin_bytes="2GB"), "margin_bytes must be a whole number"),
    ],
)
def test_the_issue_calls_are_one_sentence(call, words: str) -> None:  # type: ignore[no-untyped-def]
    """The issue's calls raised AttributeError deep inside; now one sentence at the edge (with the known GPUs where
    a GPU was wrong, as the CLI lists them)."""
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        call()
    if "GPU name" in words:
        assert "known GPUs: A100-80GB" in str(info.value)


def test_the_types_the_api_converts_are_still_taken(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Paths as str and os.PathLike, names, and the opened objects pass the edge (they fail later, on content)."""
    from uvmlab.gpus import get_gpu

    gpu = get_gpu("A100-80GB")
    for value in ("missing.sqlite", tmp_path / "missing.sqlite"):
        with pytest.raises(InputError, match=r"missing\.sqlite"):
            api.summarize(value)
    with pytest.raises(InputError, match="unknown workload"):
        api.estimate("no-such-workload", gpu)
    with pytest.raises(InputError, match="unknown GPU"):
        api.estimate("resnet50", "no-such-gpu")
