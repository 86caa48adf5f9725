"""Reading inputs and writing outputs without ever blocking, exhausting memory or losing what was there.

Reading: every file cyclelang reads from a path goes through `read_input`, which
opens without blocking (a FIFO with no writer does not hang), refuses anything that
is not a regular file (a FIFO, a device such as /dev/zero, a socket) and anything
above the caller's size limit, before a byte is read.

Writing: every file cyclelang writes goes through `atomic_write` (one file),
`atomic_write_all` (several, one transaction: `build -o X --weights W` commits both
or neither) or `write_folder` (the files of one folder, one transaction: `export`
writes config.json and model.safetensors together). The bytes go to a temporary
file in the target's directory, are flushed to disk, and only then renamed over the
target. An error, Ctrl-C or a caught signal (SIGTERM, SIGHUP: see `signals_raise`)
at any point leaves the old files as they were and no stray temporary behind. A
target that exists and is not a regular file (a character device such as /dev/null,
a FIFO, /dev/stdout through its symlink) is never renamed over: it is written
directly. A symlink to a regular file is followed, so the file it points to is
replaced and the link survives (`write_folder` excepted: a folder's entries are its
own, and a symlink among them is replaced, never what it points to).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile


class InputRefused(OSError):
    """A path that cannot be read as an input: not a regular file, or too large. `str()` says why."""

    def __init__(self, path: str, reason: str, too_large: bool = False):
        super().__init__(reason)
        self.path = path
        self.reason = reason
        self.too_large = too_large

    def __str__(self) -> str:
        return self.reason


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_input(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes.

    Raises InputRefused (a FIFO, device, socket or directory; a file above `limit`,
    also one that grows past it while it is read) or the OSError of opening it."""
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputRefused(path, f"it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise InputRefused(path, f"it is {st.st_size:,} bytes, above the limit of {limit:,}", too_large=True)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputRefused(path, f"it grew above the limit of {limit:,} bytes while it was read", too_large=True)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_regular(path: str | os.PathLike, limit: int) -> int:
    """The size of a regular file of at most `limit` bytes, for readers that open the file
    themselves (safetensors): raises InputRefused as `read_input` does."""
    path = os.fspath(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise InputRefused(path, f"it is {_kind(st.st_mode)}, not a regular file")
    if st.st_size > limit:
        raise InputRefused(path, f"it is {st.st_size:,} bytes, above the limit of {limit:,}", too_large=True)
    return st.st_size


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file (through links, `..`, hard links); False if either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _special(target: str) -> bool:
    """An existing target that must be written in place: not a regular file."""
    try:
        return not stat.S_ISREG(os.stat(target).st_mode)
    except FileNotFoundError:
        return False


def _write_in_place(target: str, payload: bytes) -> None:
    fd = os.open(target, os.O_WRONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        view = memoryview(payload)
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                import select

                select.select([], [fd], [])
                continue
            view = view[n:]
    finally:
        os.close(fd)


def _stage(target: str, payload: bytes) -> str:
    """A flushed temporary file beside `target` holding `payload`, with the mode the target will have."""
    directory = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(target):
            os.chmod(tmp, os.stat(target).st_mode & 0o777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    atomic_write_all([(path, data)])


def atomic_write_all(items) -> None:
    """Write every (path, data) of `items`, or none of them.

    Each payload is staged in a temporary file first; then the targets are replaced in
    order. If a replace fails (or a signal arrives) the targets already replaced get
    their old contents back (kept as hard links until the end), so the files on disk
    are either all old or all new. Special targets (devices, FIFOs) are written in place,
    after every regular file is staged."""
    items = list(items)
    staged: list[tuple[str, str | None, bytes]] = []  # (target, temporary or None for in-place, payload)
    backups: list[tuple[str, str | None]] = []  # (target, hard link to its old contents or None if it was new)
    current = None
    try:
        for path, data in items:
            current = os.fspath(path)
            payload = data.encode("utf-8") if isinstance(data, str) else data
            if _special(current):  # a device, a FIFO, /dev/stdout (stat follows its link): written in place
                staged.append((current, None, payload))
                continue
            target = os.path.realpath(current)  # follow a symlink: replace what it points to, keep the link
            staged.append((target, _stage(target, payload), payload))
        for (target, tmp, payload), (path, _) in zip(staged, items):
            current = os.fspath(path)
            if tmp is None:
                continue
            backup = None
            if len(staged) > 1 and os.path.exists(target):
                backup = tempfile.mktemp(prefix=f".{os.path.basename(target)}.", suffix=".old", dir=os.path.dirname(target) or ".")
                os.link(target, backup)
            try:
                os.replace(tmp, target)
            except BaseException:
                if backup is not None:
                    _unlink(backup)
                raise
            backups.append((target, backup))  # replaced: undone if a later step fails
        for (target, tmp, payload), (path, _) in zip(staged, items):
            current = os.fspath(path)
            if tmp is None:
                _write_in_place(target, payload)
    except BaseException as e:
        if isinstance(e, OSError) and current is not None:
            e.filename = current  # name the output the user gave, not a temporary
        for target, backup in reversed(backups):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, target)
                    _unlink(backup)
                elif len(staged) > 1:  # a new file of a transaction that did not complete
                    _unlink(target)
        for _, tmp, _ in staged:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    _unlink(tmp)
        raise
    for _, backup in backups:
        if backup is not None:
            with contextlib.suppress(OSError):
                _unlink(backup)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_new(path: str, payload: bytes) -> None:
    """A new file (never an existing one) holding `payload`, flushed to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def _sync_dir(path: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _aside(folder: str, name: str) -> str:
    """A fresh hidden name in `folder` for keeping `name`'s old entry until the end."""
    import secrets

    return os.path.join(folder, f".{name}.{secrets.token_hex(6)}.old")


def write_folder(folder: str | os.PathLike, files, remove=()) -> None:
    """Write each (name, data) of `files` into `folder` and remove each name of `remove`, all or nothing.

    A folder that does not exist is made whole beside its place (a temporary folder in its
    parent, the files written and flushed, then renamed into place), so it appears complete
    or not at all; parents it had to make are removed again on failure. Into an existing
    folder every payload is staged first (a hidden temporary beside its target); then each
    old entry is kept (a hard link, or moved aside where links are not allowed), the new files
    renamed over their names and the removed names unlinked. If any step fails, or a signal
    arrives, the old entries are put back and the temporaries removed: the folder is as it
    was. Names are entries of the folder itself: a symlink among them is replaced or removed,
    never followed (the file it points to is left alone)."""
    import shutil

    folder = os.path.normpath(os.path.abspath(os.fspath(folder)))
    items = [(name, data.encode("utf-8") if isinstance(data, str) else data) for name, data in files]
    for name in [n for n, _ in items] + list(remove):
        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a file name")
    if not os.path.lexists(folder):
        parent = os.path.dirname(folder)
        made = []
        probe = parent
        while not os.path.lexists(probe):
            made.append(probe)
            probe = os.path.dirname(probe)
        tmp = None
        try:
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", suffix=".tmp", dir=parent)
            for name, payload in items:
                _write_new(os.path.join(tmp, name), payload)
            os.chmod(tmp, 0o777 & ~_umask())
            _sync_dir(tmp)
            os.rename(tmp, folder)
            tmp = None
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for d in made:  # innermost first
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise
        _sync_dir(parent)
        return
    staged: list[tuple[str, str]] = []  # (target, temporary)
    kept: list[tuple[str, str | None]] = []  # (target, its old entry's other name, or None where there was none)
    try:
        for name, payload in items:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
            staged.append((os.path.join(folder, name), tmp))
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
        for target, tmp in staged:
            backup = None
            if os.path.lexists(target):
                backup = _aside(folder, os.path.basename(target))
                kept.append((target, backup))
                try:
                    os.link(target, backup, follow_symlinks=False)
                except OSError:
                    os.replace(target, backup)  # no hard links here: moved aside, put back on failure
            else:
                kept.append((target, None))
            os.replace(tmp, target)
        for name in remove:
            target = os.path.join(folder, name)
            if os.path.lexists(target):
                backup = _aside(folder, name)
                kept.append((target, backup))
                os.replace(target, backup)
    except BaseException:
        for target, backup in reversed(kept):
            with contextlib.suppress(OSError):
                if backup is None:
                    _unlink(target)
                elif os.path.lexists(backup):
                    if os.path.lexists(target) and os.path.samestat(os.lstat(backup), os.lstat(target)):
                        _unlink(backup)  # never replaced (rename between two links of one file does nothing)
                    else:
                        os.replace(backup, target)
        for _, tmp in staged:
            with contextlib.suppress(OSError):
                _unlink(tmp)
        raise
    for _, backup in kept:
        if backup is not None:
            with contextlib.suppress(OSError):
                _unlink(backup)
    _sync_dir(folder)


class Terminated(BaseException):
    """A caught SIGTERM or SIGHUP, raised where the program is so `finally` blocks and the
    writers' rollbacks run; the command line exits 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def signals_raise():
    """Within the block, SIGTERM and SIGHUP raise `Terminated` (in the main thread only;
    elsewhere the block runs with the handlers as they are)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signum)

    old = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
