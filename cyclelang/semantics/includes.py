"""Reading a spec's files: the main file and its includes, within the limits (depth, files,
bytes) and the allowed roots; each file is parsed once (`resolve._Resolver` reads the result).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from .. import ir
from ..diagnostics import Collector, CycleError
from ..syntax import ast
from ..syntax.parser import MAX_SOURCE_BYTES, parse_module

MAX_INCLUDE_DEPTH = 16
MAX_INCLUDE_FILES = 256  # distinct files a spec reads through its includes (each is read once)
MAX_INCLUDE_BYTES = 4 << 20  # bytes of spec text in all, the file itself and everything it includes


# --- reading files and includes --------------------------------------------------------


@dataclass
class _Loader:
    root: Path
    include_path: tuple[Path, ...]
    sources: dict[str, str] = field(default_factory=dict)
    out: Collector = field(default_factory=Collector)
    stack: list[Path] = field(default_factory=list)
    included: set[Path] = field(default_factory=set)  # every file read: an include of one already read adds nothing
    bytes_read: int = 0

    def read_text(self, path: Path, display: str, span: ir.Span | None) -> str | None:
        from ..io import InputRefused, read_input

        try:
            data = read_input(path, MAX_SOURCE_BYTES)  # never blocks on a FIFO, never reads /dev/zero
        except InputRefused as e:
            where = span or ir.Span(file=display, line=1, column=1, end_line=1, end_column=2)  # the spec itself: its start
            if e.too_large:
                self.out.error("E0010", f"'{display}' is larger than {MAX_SOURCE_BYTES // 1024} KiB", where, "split it into files joined with include")
            else:
                self.out.error("E0112", f"'{display}' cannot be a spec: {e}", span, "give the path of a .cycle file")
            return None
        except FileNotFoundError:
            self.out.error("E0105", f"no such file: '{display}'", span)
            return None
        except IsADirectoryError:
            self.out.error("E0105", f"'{display}' is a directory, not a spec", span)
            return None
        except OSError as e:
            self.out.error("E0105", f"cannot read '{display}': {e.strerror or e}", span)
            return None
        self.bytes_read += len(data)
        if self.bytes_read > MAX_INCLUDE_BYTES:
            self.out.error("E0113", f"the spec and its includes are more than {MAX_INCLUDE_BYTES >> 20} MiB of text in all", span,
                           "a spec is a page of text; include each shared file once")
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            prefix = data[: e.start].decode("utf-8", "replace")
            line = prefix.count("\n") + 1
            col = len(prefix) - (prefix.rfind("\n") + 1) + 1
            self.sources[display] = data.decode("utf-8", "replace")
            self.out.error("E0001", f"the file is not valid UTF-8 (byte 0x{data[e.start]:02X})", ir.Span(file=display, line=line, column=col, end_line=line, end_column=col + 1), "save the spec as UTF-8")
            return None
        if text.startswith("\ufeff"):
            text = text[1:]
        self.sources[display] = text
        return text

    def parse_text(self, text: str, display: str) -> ast.Module | None:
        try:
            return parse_module(text, display)
        except CycleError as e:
            self.out.diagnostics.extend(e.diagnostics)
            self.sources.update(e.sources)
            return None

    def read_main(self, path: Path, display: str) -> ast.Module | None:
        text = self.read_text(path, display, None)
        if text is None:
            return None
        self.stack.append(path.resolve())
        return self.parse_text(text, display)

    def read_include(self, inc: ast.Include, from_display: str) -> tuple[ast.Module, str] | None:
        raw = inc.path
        if not raw or raw.startswith(("/", "\\", "~")) or (len(raw) > 1 and raw[1] == ":") or "\x00" in raw:
            self.out.error("E0107", f"include path '{raw}' must be relative to the spec", inc.span, "name a file in the spec's directory tree")
            return None
        if len(self.stack) > MAX_INCLUDE_DEPTH:
            self.out.error("E0111", f"includes nest deeper than {MAX_INCLUDE_DEPTH} files", inc.span)
            return None
        base = self.stack[-1].parent if self.stack else self.root
        try:
            target = (base / raw).resolve()
        except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13)
            self.out.error("E0105", f"cannot read include '{raw}': its symbolic links loop", inc.span)
            return None
        allowed = (self.root, *self.include_path)
        if not any(_inside(target, a) for a in allowed):
            self.out.error("E0107", f"include '{raw}' leaves the spec's directory", inc.span, "keep included files beside the spec or below it, or allow a directory with --include-path")
            return None
        if target in self.stack:
            chain = " -> ".join(p.name for p in [*self.stack[self.stack.index(target):], target])
            self.out.error("E0106", f"include cycle: {chain}", inc.span, "remove one of the includes")
            return None
        if target in self.included:  # read once: a second include of a file adds nothing (a diamond, or a fan-out bomb)
            return None
        if len(self.included) >= MAX_INCLUDE_FILES:
            self.out.error("E0113", f"the spec includes more than {MAX_INCLUDE_FILES} files", inc.span, "a spec is a page of text; gather shared templates in a few files")
            return None
        self.included.add(target)
        display = posixpath.normpath(posixpath.join(posixpath.dirname(from_display.replace(os.sep, "/")), raw))
        text = self.read_text(target, display, inc.span)
        if text is None:
            return None
        module = self.parse_text(text, display)
        if module is None:
            return None
        self.stack.append(target)
        return module, display

    def done_include(self) -> None:
        self.stack.pop()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False
