"""A tiny progress bar on stderr, shown only when stderr is a terminal."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.total = max(total, 1)
        self.label = label[-30:]
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.last = 0.0

    def update(self, done: int):
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < 0.1:
            return
        self.last = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% {done / 1e6:8.1f} MB")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.last = 0.0
            self.update(self.total)
            self.stream.write("\n")
            self.stream.flush()
