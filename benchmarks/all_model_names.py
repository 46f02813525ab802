"""Every model name uvmlab accepts, traced and estimated at one batch size: status, CPU seconds, device peak.

For each name of ``timm.list_models()`` (``--family timm``), of torchvision's classification models
(``--family torchvision``, at each model's default image size) or each Hugging Face language-model architecture
uvmlab builds (``--family hf``: every ``model_type`` transformers maps to a causal or masked LM class, from its
default config, ``workloads.hf_models.hf_type_names``), ``uvmlab.memory.estimate.estimate`` runs at batch
``-b`` on an A100-40GB (``-n`` iterations, default 2: the peak is reached in the second). A result is one of

- ``estimate``: traced and estimated (device peak in MiB);
- ``refused``: a ``UvmlabError``, the one sentence the CLI prints (exit 2), naming what is not supported;
- ``traceback``: any other exception (a bug: the CLI would print a traceback);
- ``timeout``: over ``--timeout`` seconds (the worker is killed and a fresh one goes on with the next name).

One worker process imports torch once and takes names one by one over a pipe; the parent enforces the
per-name timeout. Results are appended to ``--results`` (TSV, one line per name, so an interrupted run resumes
where it stopped) and the Markdown table (name, status, seconds, device peak, message) is written to ``--out``.
Each name's trace goes to a temporary cache that is emptied after it (nothing accumulates on disk).

Usage (long: run it in the background, e.g. ``nice -n 10``)::

    python benchmarks/all_model_names.py --family timm --results /tmp/timm.tsv --out docs/model-names-timm.md
    python benchmarks/all_model_names.py --family timm --names resnet18,vit_tiny_patch16_224   # a few names
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
HF_SEQ_LEN = 128


def family_names(family: str) -> list[str]:
    """The names of one family, as ``uvmlab estimate`` takes them (``timm:NAME``, ``torchvision:NAME``,
    ``hf:TYPE``)."""
    sys.path.insert(0, str(REPO))
    if family == "timm":
        from workloads.timm_models import list_timm_models

        return [f"timm:{n}" for n in list_timm_models()]
    if family == "torchvision":
        from workloads.torchvision_models import list_torchvision_models

        return [f"torchvision:{n}" for n in list_torchvision_models()]
    from workloads.hf_models import hf_type_names

    return [f"hf:{n}" for n in hf_type_names()]


def _hf_reference(name: str, res: dict[str, object]) -> tuple[str, dict[str, object]]:
    """Check that the model type trains in transformers itself (benchmarks/hf_trains.py; into ``res``) and return
    the workload and options of its estimate: its default config.json at the depth that trained there (else the
    fewest layers that keep every kind of layer), 128 tokens."""
    import gc

    from hf_trains import trains_in_transformers

    from workloads.hf_config import fewest_layers, read_config_text
    from workloads.hf_models import default_config_file

    t = time.process_time()
    ref = trains_in_transformers(name[3:])
    gc.collect()
    res.update(trains=ref["trains"], trains_why=ref["why"], reference_seconds=round(time.process_time() - t, 2))
    folder = Path(os.environ["UVMLAB_CACHE"]).parent / "hf-configs" / name[3:]
    path = default_config_file(name[3:], folder)  # refuses a default config transformers cannot build
    layers = ref["num_layers"]
    if layers is None:
        layers = fewest_layers(read_config_text(path.read_text()))
    res["num_layers"] = layers
    return f"hf:{path}", {"num_layers": layers, "seq_len": HF_SEQ_LEN}


def worker(batch: int, iterations: int) -> None:
    """Read workload names on stdin, print one JSON result per name on stdout (imports torch once)."""
    import gc

    from uvmlab.config import WorkloadConfig
    from uvmlab.errors import UvmlabError
    from uvmlab.gpus import get_gpu
    from uvmlab.memory.estimate import estimate

    gpu = get_gpu("A100-40GB")
    out = sys.stdout
    sys.stdout = sys.stderr  # model code that prints must not break the protocol
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        t = time.process_time()
        res: dict[str, object] = {"name": name}
        options: dict[str, object] = {}
        try:
            workload = name
            if name.startswith("hf:"):  # a model type: its default config.json, fewer layers, 128 tokens
                workload, options = _hf_reference(name, res)
            cfg = WorkloadConfig(workload=workload, batch_size=batch, optimizer="sgd", iterations=iterations,
                                 options=options)  # fmt: skip
            est = estimate(cfg, gpu)
            res.update(status="estimate", device_peak_mb=-(-est.device_peak_bytes // (1 << 20)), message="")
        except UvmlabError as exc:
            res.update(status="refused", message=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Exception as exc:  # the point is to count them
            res.update(status="traceback", message=f"{type(exc).__name__}: {str(exc).splitlines()[:1]}")
        res["seconds"] = round(time.process_time() - t - float(res.get("reference_seconds", 0)), 2)
        shutil.rmtree(os.environ["UVMLAB_CACHE"], ignore_errors=True)
        gc.collect()
        out.write(json.dumps(res) + "\n")
        out.flush()


class Worker:
    """A worker process; restarted after a timeout."""

    def __init__(self, batch: int, iterations: int, cache: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "UVMLAB_CACHE": cache, "UVMLAB_MODEL_WORKER": "1"}
        argv = [sys.executable, __file__, "--worker", "-b", str(batch), "-n", str(iterations)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)  # fmt: skip

    def ask(self, name: str, timeout: float) -> dict[str, object] | None:
        import select

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"name": name, "status": "traceback", "message": "worker died"}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def write_table(
    results: list[dict[str, object]], out: Path, family: str, batch: int, iterations: int, total: int
) -> None:
    """The Markdown table of every result, with the counts per status."""
    counts = Counter(str(r["status"]) for r in results)
    lines = [
        f"# Every {family} model name at batch {batch} (`python benchmarks/all_model_names.py --family {family}`)",
        "",
        f"Generated by benchmarks/all_model_names.py ({iterations} iterations, SGD, --dtype auto, A100-40GB, lazy "
        "module loading). CPU seconds per name on a shared 2-core machine (trace capture + estimate).",
        "",
        "Counts: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f" ({len(results)} of the family's {total} names"
        + (", visited in a random order: a random sample)." if len(results) < total else ")."),
        "",
    ]
    if family == "hf":
        lines[-1:-1] = reference_summary(results)
        lines += ["| name | trains in transformers (CPU) | layers | status | CPU s | device peak MiB | message |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
    else:
        lines += ["| name | status | CPU s | device peak MiB | message |", "|---|---|---|---|---|"]
    for r in results:
        msg = str(r.get("message", "")).replace("|", "\\|")
        peak = r.get("device_peak_mb", "")
        ref = ""
        if family == "hf":
            trains = {True: "yes", False: "no", None: "not run"}.get(r.get("trains"), "n/a")  # type: ignore[call-overload]
            why = str(r.get("trains_why", "")).replace("|", "\\|")
            ref = f" {trains + (': ' + why if why else '')} | {r.get('num_layers', '')} |"
        lines.append(f"| {r['name']} |{ref} {r['status']} | {r.get('seconds', '')} | {peak} | {msg} |")
    out.write_text("\n".join(lines) + "\n")


def reference_summary(results: list[dict[str, object]]) -> list[str]:
    """The HF family's counts over the architectures that train in transformers itself (benchmarks/hf_trains.py)."""
    trains = [r for r in results if r.get("trains") is True]
    ok = sum(r["status"] == "estimate" for r in trains)
    out = [
        f"Trains in transformers (its default config, fewer layers, small widths, one CPU forward + backward: "
        f"benchmarks/hf_trains.py): {len(trains)}; of those, {ok} estimate"
        + (f" ({ok / len(trains):.1%})." if trains else "."),
        f"Outside that set: {sum(r.get('trains') is False for r in results)} fail in transformers itself, "
        f"{sum(r.get('trains') is None for r in results)} were too large to run on this CPU (their estimates are "
        "listed too).",
    ]
    return out


@click.command()
@click.option("--family", type=click.Choice(["timm", "torchvision", "hf"]), default="timm", show_default=True)
@click.option("--names", default="", help="Comma-separated names (without the family prefix) instead of all.")
@click.option("-b", "--batch", default=8, show_default=True)
@click.option("-n", "--iterations", default=2, show_default=True)
@click.option("--timeout", default=300.0, show_default=True, help="Seconds per name.")
@click.option("--results", type=click.Path(path_type=Path), default=None, help="TSV of results (resumable).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Markdown table to write.")
@click.option("--shuffle", "seed", type=int, default=None, help="Visit the names in a random order of this seed "
              "(a run stopped early is then a random sample; the table stays sorted by name).")  # fmt: skip
@click.option("--render", is_flag=True, help="Only write --out from the names already in --results (a run still going "
              "on, or stopped: the table says how many of the family's names it covers).")  # fmt: skip
@click.option("--worker", "is_worker", is_flag=True, hidden=True)
def main(family: str, names: str, batch: int, iterations: int, timeout: float, results: Path | None,
         out: Path | None, seed: int | None, render: bool, is_worker: bool) -> None:  # fmt: skip
    """Trace and estimate every model name of a family; print the counts, write the table."""
    if is_worker:
        worker(batch, iterations)
        return
    todo = [f"{family}:{n}" for n in names.split(",") if n] if names else family_names(family)
    order = list(todo)
    if seed is not None:
        import random

        random.Random(seed).shuffle(order)
    done: dict[str, dict[str, object]] = {}
    if results is not None and results.is_file():
        for line in results.read_text().splitlines():
            r = json.loads(line)
            done[str(r["name"])] = r
    if render:
        rows = [done[n] for n in sorted(todo) if n in done]
        print("counts:", dict(Counter(str(r["status"]) for r in rows)), f"({len(rows)} of {len(todo)} names)")
        if out is not None:
            write_table(rows, out, family, batch, iterations, len(todo))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the worker is killed too (finally below)
    cache = tempfile.mkdtemp(prefix="uvmlab-names-")
    w = Worker(batch, iterations, cache)
    try:
        for i, name in enumerate(order):
            if name in done:
                continue
            t = time.monotonic()
            r = w.ask(name, timeout)
            if r is None:
                w.kill()
                w = Worker(batch, iterations, cache)
                r = {"name": name, "status": "timeout", "seconds": round(time.monotonic() - t, 1),
                     "message": f"over {timeout:g} s"}  # fmt: skip
            done[name] = r
            if results is not None:
                with results.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
            print(f"[{i + 1}/{len(todo)}] {name}: {r['status']} {r.get('seconds')} s {r.get('message', '')}"[:200],
                  flush=True)  # fmt: skip
    finally:
        w.kill()
        shutil.rmtree(cache, ignore_errors=True)
    rows = [done[n] for n in sorted(todo) if n in done]
    counts = Counter(str(r["status"]) for r in rows)
    print("counts:", dict(counts))
    if out is not None:
        write_table(rows, out, family, batch, iterations, len(todo))


if __name__ == "__main__":
    main()
