"""What tools/gpu_check/timings.py measures with and writes to: :class:`Timer` (medians of
CUDA-event timed calls, the host clock on CPU, within the check's deadline) and :class:`Report`
(markdown sections rewritten after every case, so a run stopped by its time limit leaves what
it measured), and the number formats of its tables."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from gpu_common import sync

import torch

__all__ = ["Report", "Timer", "fmt", "times"]


class Timer:
    def __init__(self, device: torch.device, deadline: float) -> None:
        self.device, self.deadline = device, deadline

    def us(self, fn, groups: int = 5, inner: int = 4, warmup: int = 3) -> float:
        """Time of one call in microseconds: the median over `groups` of the mean of `inner`
        back-to-back calls (so the GPU time, or the host's launch time when that is longer,
        which is what an eager caller gets)."""
        for _ in range(warmup):
            fn()
        sync(self.device)
        times = []
        for _ in range(groups):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000 / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                times.append((time.perf_counter() - t0) * 1e6 / inner)
            if time.monotonic() > self.deadline:
                break
        return statistics.median(times)

    def slow_us(self, fn) -> float:
        """For host-bound references: one warm-up and at most three timed calls (one when a call
        takes over a second)."""
        t0 = time.monotonic()
        fn()
        sync(self.device)
        return self.us(fn, groups=1 if time.monotonic() - t0 > 1.0 else 3, inner=1, warmup=0)

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Report:
    def __init__(self, path: Path | None, header: str) -> None:
        self.path, self.header, self.sections = path, header, []

    def section(self, title: str, note: str, columns: list[str]) -> list[list[str]]:
        rows: list[list[str]] = []
        self.sections.append((title, note, columns, rows))
        return rows

    def write(self) -> str:
        parts = [self.header]
        for title, note, columns, rows in self.sections:
            parts += [f"\n## {title}\n", note, "", "| " + " | ".join(columns) + " |",
                      "|" + "---|" * len(columns)]
            parts += ["| " + " | ".join(row) + " |" for row in rows]
        text = "\n".join(parts) + "\n"
        if self.path:
            self.path.write_text(text)
        return text


def fmt(us: float | None) -> str:
    if us is None:
        return "-"
    if us >= 10_000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} us" if us >= 1 else f"{us:.2f} us"


def times(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x"
