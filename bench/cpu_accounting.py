"""CPU accounting for benchmarks: per process (children included, reaped or alive), per part of ``serve``, the
whole machine's busy time, and the CPU reference every figure is also given in.

The machine's speed changes from day to day, so a run prints ``cpu_reference()`` (``sum(range(1000))``) beside its
figures: CPU per event divided by it compares across days.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any


def _own_cpu(process: Any) -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's CPU seconds)."""
    times = process.cpu_times()
    return times.user + times.system, times.children_user + times.children_system


def tree_cpu(pid: int, *, own: bool = True, below: bool = True) -> float:
    """CPU seconds of ``pid`` (``own``) and of everything below it, exited children included (``below``).

    A child that exited and was reaped counts in its parent's children times; a live one counts its own.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        total = 0.0
        mine, reaped = _own_cpu(root)
        total += (mine if own else 0.0) + (reaped if below else 0.0)
        if below:
            for child in root.children(recursive=True):
                with suppress(psutil.NoSuchProcess):
                    mine, reaped = _own_cpu(child)
                    total += mine + reaped
        return total
    except psutil.NoSuchProcess:
        return 0.0


def serve_parts(serve_pid: int) -> dict[str, list[int]]:
    """The direct children of ``serve`` by role."""
    import psutil

    parts: dict[str, list[int]] = {"ingest API": [], "delivery": [], "runner": [], "pruner": []}
    with suppress(psutil.NoSuchProcess):
        for child in psutil.Process(serve_pid).children():
            with suppress(psutil.NoSuchProcess):
                command = " ".join(child.cmdline())
                if "uvicorn" in command:
                    parts["ingest API"].append(child.pid)
                elif "delivery_worker" in command:
                    parts["delivery"].append(child.pid)
                elif "deployments.serve" in command:
                    parts["runner"].append(child.pid)
                elif "serving.pruner" in command:
                    parts["pruner"].append(child.pid)
    return parts


@dataclass
class Processes:
    """The pids whose CPU is reported."""

    serve: int | None = None
    prefect_server: int | None = None
    postgres: int | None = None
    receiver: int | None = None
    generator: list[int] = field(default_factory=list)
    generator_cpu: float = 0.0

    def cpu(self) -> dict[str, float]:
        figures: dict[str, float] = {}
        if self.serve:
            parts = serve_parts(self.serve)
            figures["ingest API"] = sum(tree_cpu(pid) for pid in parts["ingest API"])
            figures["delivery worker"] = sum(tree_cpu(pid) for pid in parts["delivery"])
            # Flow runs the runner starts are processes of their own: before delivery workers existed, these were
            # the scheduled deliver runs.
            figures["runner"] = sum(tree_cpu(pid, below=False) for pid in parts["runner"])
            figures["runner's flow runs"] = sum(tree_cpu(pid, own=False) for pid in parts["runner"])
            figures["serve supervisor"] = tree_cpu(self.serve, below=False)
        if self.prefect_server:
            figures["Prefect server"] = tree_cpu(self.prefect_server)
        if self.postgres:
            figures["PostgreSQL"] = tree_cpu(self.postgres)
        if self.receiver:
            figures["receiver"] = tree_cpu(self.receiver)
        figures["generator"] = self.generator_cpu + sum(tree_cpu(pid) for pid in self.generator)
        return figures


def cpu_reference() -> str:
    """The time of a fixed pure-Python workload, printed beside every run's figures: this machine (a VM sharing its
    host) has run the same code 1.5-2x slower at some hours than at others, so figures from two runs compare only
    where this one is alike."""
    import timeit

    best = min(timeit.repeat("sum(range(1000))", number=2000, repeat=15)) / 2000
    return f"CPU reference sum(range(1000)) {best * 1e6:.1f} µs"


def machine_busy() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, all CPU seconds): other users' load shows here too."""
    import psutil

    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times)
    return total - idle, total

