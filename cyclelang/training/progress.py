"""A run's bookkeeping: metrics.jsonl (appended record by record), the stop flag that SIGINT and SIGTERM
set, and the lines and the progress bar on stderr."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from pathlib import Path

from . import checkpoint


class Metrics:
    """metrics.jsonl: appended line by line (rank 0), kept in memory for the plot and the result."""

    def __init__(self, path: Path, write: bool):
        self.path, self.write, self.records = path, write, []
        self.f = None

    def resume(self, step: int, say=None) -> None:
        """Keep the records up to `step` (a run killed after its checkpoint logged a few more). Lines
        that are not records (a partial last line, damage) are skipped and `say` is told."""
        from .plot import parse_metrics

        say = say or (lambda line: None)
        raw = b""
        try:
            if os.path.lexists(self.path) and not os.path.isfile(self.path) or os.path.islink(self.path):
                say(f"{self.path} is not a file: it is written anew")
            else:
                raw = self.path.read_bytes()
        except FileNotFoundError:
            pass
        except OSError as e:
            say(f"{self.path} cannot be read ({e.strerror or e}): it is written anew")
        self.records = [r for r in parse_metrics(raw, str(self.path), say) if r["step"] <= step]
        if self.write:
            checkpoint.replace_file(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.records).encode("utf-8"))

    def add(self, record: dict) -> None:
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.records.append(record)
        if self.write:
            if self.f is None:
                self.f = open(self.path, "a", encoding="utf-8")
            self.f.write(json.dumps(record, sort_keys=True) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


def _emit(line: str) -> None:
    """One line on stderr from anywhere, a signal handler included (a write the handler
    interrupted makes the buffered stream refuse a second one: then straight to fd 2)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (RuntimeError, ValueError, AttributeError, OSError):
        try:
            os.write(2, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


class Stop:
    """SIGINT / SIGTERM: the first is acknowledged at once (a line on stderr) and sets a flag; the
    run finishes the step it is in, writes a checkpoint and stops. A second stops at once
    (KeyboardInterrupt; the last checkpoint stays)."""

    def __init__(self, say=_emit, last=lambda: None):
        self.flag = False
        self.signum: int | None = None
        self.current = 0  # the step running, or just finished and not yet checked
        self.say, self.last = say, last
        self.old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.old[sig] = signal.signal(sig, self._set)
            except ValueError:  # not the main thread: no handler, Ctrl-C raises as usual
                pass
        return self

    def _set(self, signum, frame):
        if self.flag:  # a second Ctrl-C: stop now (the last checkpoint stays)
            raise KeyboardInterrupt
        self.flag, self.signum = True, signum
        what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        last = self.last()
        kept = f"the last checkpoint, {last}, stays" if last else "there is no checkpoint yet"
        try:
            self.say(f"cyclec train: {what}: stopping after step {self.current} (the one running), then writing a checkpoint; "
                     f"{what} again stops at once ({kept})")
        except Exception:  # never let the acknowledgement break the run
            _emit(f"cyclec train: {what}: stopping after step {self.current}")

    def __exit__(self, *exc):
        for sig, old in self.old.items():
            signal.signal(sig, old)


def _progress(total: int, initial: int, show: bool):
    if not show:
        return None  # no bar: tqdm is not needed
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, file=sys.stderr, unit="step", dynamic_ncols=True, leave=True)


def _log(line: str, bar) -> None:
    if bar is not None and not bar.disable:
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)
