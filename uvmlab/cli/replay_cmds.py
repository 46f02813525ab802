"""CLI: ``uvmlab replay`` (replay a real PyTorch memory snapshot through the caching allocator simulator)."""

from __future__ import annotations

import click

from uvmlab.cli.options import PathParam, format_option


def _fmt_div(d: dict | None) -> str:
    if not d:
        return "-"
    exp, got = d.get("expected"), d.get("got")
    exp = hex(exp) if isinstance(exp, int) else exp
    got = hex(got) if isinstance(got, int) else got
    return f"event {d['event']} {d['action']}: expected {exp}, got {got}"


def _same(a: int, b: int) -> str:
    from uvmlab.units import format_bytes

    return f"{format_bytes(a)} (same)" if a == b else f"{format_bytes(a)} / {format_bytes(b)}"


@click.command("replay")
@click.argument("snapshot", type=PathParam("input", folder=False, dir_okay=False, path_type=str))
@format_option()
@click.option("--device", type=int, default=None, help="Replay only this device (default: every device with a trace).")
@click.option(
    "--alloc-conf",
    default=None,
    help="PYTORCH_CUDA_ALLOC_CONF to simulate instead of the snapshot's own allocator_settings.",
)
@click.option(
    "--tie-break",
    type=click.Choice(["address", "block_counter", "segment_counter"]),
    default="address",
    show_default=True,
    help="Order of equal-size free blocks (PyTorch <= 2.12: address; newer main: counters).",
)
def replay(snapshot: str, fmt: str, device: int | None, alloc_conf: str | None, tie_break: str) -> None:
    """Replay SNAPSHOT (a torch.cuda.memory._dump_snapshot pickle) through the allocator simulator.

    Rebuilds the allocator state at the start of the recorded trace, replays every alloc/free, and compares
    with what the real allocator did: allocation addresses, the segment_alloc/free (map/unmap) sequence, peak
    reserved, peak requested and the final blocks. Exit code 0 when identical, 1 on a divergence (the first one
    is reported), 2 when the file is not a usable snapshot.

    \b
    Terms:
      format G1..G6        the snapshot layout generation (see uvmlab snapshot show --help)
      sim / real           the simulated allocator / what PyTorch's allocator recorded
      segment events       segment_alloc and segment_free: cudaMalloc / cudaFree of whole segments
      peak requested       bytes the program asked for (before rounding); allocated adds the rounding
      segments before the trace (blocks inferred)
                           the state the trace starts from, rebuilt by undoing the trace on the
                           snapshot's final state: segments alive before recording began, and how
                           many of their blocks had sizes the trace's events had to supply
      empty_cache bursts   segment releases the trace shows without a cause in it, replayed as
                           torch.cuda.empty_cache() calls
      device capacity      memory inferred from the trace's OOM events, when it has some
    """
    from uvmlab.console import print_csv, print_table, say
    from uvmlab.errors import UvmlabError
    from uvmlab.files.atomic import to_json
    from uvmlab.memory.replay import replay_snapshot
    from uvmlab.units import format_bytes

    report = replay_snapshot(snapshot, device=device, alloc_conf=alloc_conf, tie_break=tie_break)
    if fmt == "json":
        click.echo(to_json(report.to_dict()), nl=False)
    else:
        devs = report.devices
        metrics = [
            ("trace events", [d.events for d in devs]),
            ("alloc addresses same", [f"{d.allocs_matched}/{d.allocs} ({d.address_match_pct:.1f}%)" for d in devs]),
            (
                "segment events sim/real",
                [
                    f"{d.segment_events_sim}/{d.segment_events_real} {'same' if d.segment_sequence_equal else 'DIFFER'}"
                    for d in devs
                ],
            ),
            ("peak reserved sim", [format_bytes(d.peak_reserved_sim) for d in devs]),
            ("peak reserved real", [format_bytes(d.peak_reserved_real) for d in devs]),
            ("peak requested sim/real", [_same(d.peak_requested_sim, d.peak_requested_real) for d in devs]),
            ("peak allocated (sim)", [format_bytes(d.peak_allocated_sim) for d in devs]),
            ("final blocks", ["same" if d.final_blocks_equal else "DIFFER" for d in devs]),
            (
                "segments before the trace (blocks inferred)",
                [f"{d.initial_segments} ({d.initial_blocks_inferred})" for d in devs],
            ),
            ("empty_cache bursts emulated", [d.release_bursts for d in devs]),
            (
                "OOMs sim/real (device capacity)",
                [
                    f"{d.ooms_sim}/{d.ooms_real}"
                    + (f" ({format_bytes(d.capacity_bytes)} inferred)" if d.capacity_bytes is not None else "")
                    for d in devs
                ],
            ),
            ("identical", ["yes" if d.identical else "NO" for d in devs]),
            ("first divergence", [_fmt_div(d.first_divergence) for d in devs]),
        ]
        columns = ["", *[f"device {d.device}" for d in devs]]
        if fmt == "csv":
            print_csv(("replay", ["metric", *columns[1:]], [[name, *vals] for name, vals in metrics]))
        else:
            say(
                f"{report.path}\nformat {report.format_generation} (the snapshot's layout generation: see "
                f"uvmlab snapshot show); PYTORCH_CUDA_ALLOC_CONF simulated: {report.alloc_conf!r}\n"
            )
            title = "Replay vs the real allocator (sim = simulated, real = recorded)"
            print_table(title, columns, [[name, *vals] for name, vals in metrics])
            for d in report.devices:
                for n in d.notes:
                    say(f"device {d.device}: {n}")
    if not report.identical:
        bad = next(d for d in report.devices if not d.identical)
        raise UvmlabError(f"replay of {snapshot} diverged on device {bad.device}: {_fmt_div(bad.first_divergence)}")


COMMANDS = [replay]
