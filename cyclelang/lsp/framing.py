"""The base protocol of LSP: `Content-Length: N` header lines, a blank line, N bytes of JSON.

`frames(read)` splits a byte stream into messages and never gives up on it: whatever is
wrong with one frame (no Content-Length, a length that is not a byte count or is past
`MAX_BODY`, text before the header, a body cut short by the next header, a body that is
not JSON or not an object) is a `Problem`, and reading resumes at the next
`Content-Length:` header. A refused length is never allocated: its body is skipped in
chunks while looking for that header. Pure: no threads, no JSON-RPC semantics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_BODY = 64 << 20  # bytes: a message past this is refused unread
MAX_HEADER_LINE = 8 << 10  # bytes: a longer "line" is not a header

PARSE_ERROR, INVALID_REQUEST = -32700, -32600  # JSON-RPC's codes

_HEADER = re.compile(rb"content-length:", re.IGNORECASE)
# A complete Content-Length header line. A JSON body cannot contain one: JSON strings hold no
# raw line break, and outside strings these words are not JSON. So a body in which one appears
# was cut short, and the next message starts there.
_HEADER_LINE = re.compile(rb"content-length:[ \t]*\d+[ \t]*\r?\n", re.IGNORECASE)
_KEEP_HINT = len(b"content-length:")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_KEEP = 256  # bytes kept while skipping, in case a header line straddles two reads


@dataclass(frozen=True)
class Message:
    """A well-framed body that is a JSON object."""

    obj: dict
    size: int  # the body's length in bytes


@dataclass(frozen=True)
class Problem:
    """What was wrong with one frame. `code` is set where JSON-RPC wants an error response
    (id null): -32700 for a body that is not JSON, -32600 for one that is not an object."""

    text: str
    code: int | None = None
    id: Any = None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


def _show(b: bytes, n: int = 40) -> str:
    s = b[:n].decode("utf-8", "replace")
    return repr(s + ("…" if len(b) > n else ""))


def frames(read: Callable[[], bytes], max_body: int = MAX_BODY) -> Iterator[Message | Problem]:
    """Messages and problems, in stream order, until `read()` returns b"" (end of input)."""
    buf = bytearray()
    eof = False

    def fill() -> bool:
        nonlocal eof
        if eof:
            return False
        chunk = read()
        if not chunk:
            eof = True
            return False
        buf.extend(chunk)
        return True

    skipping = False  # after a problem: discard bytes up to the next Content-Length header
    while True:
        if skipping:
            m = _HEADER_LINE.search(buf)
            if m is None:
                del buf[: max(len(buf) - _KEEP, 0)]
                if not fill():
                    return
                continue
            del buf[: m.start()]
            skipping = False

        # --- the header block ------------------------------------------------------------
        length: int | None = None
        bad: str | None = None
        seen = False
        unknown: list[str] = []
        while True:
            nl = buf.find(b"\n")
            if nl < 0 or nl > MAX_HEADER_LINE:
                if nl < 0 and len(buf) <= MAX_HEADER_LINE:
                    if fill():
                        continue
                    if buf.strip() or seen:
                        yield Problem(f"the input ended inside a message header ({_show(bytes(buf))})")
                    return
                bad = f"{_show(bytes(buf))} is not a header line (no line end in {MAX_HEADER_LINE} bytes)"
                break
            line = bytes(buf[: nl + 1])
            text = line.rstrip(b"\r\n")
            h = _HEADER.search(text)
            if h is not None and h.start() > 0:
                # text before the header: report it, and start over at the header
                yield Problem(f"skipped {_show(text[: h.start()])} before a Content-Length header")
                del buf[: h.start()]
                length, bad, seen, unknown = None, None, False, []
                continue
            del buf[: nl + 1]
            if not text.strip():
                if not seen:
                    continue  # a blank line between messages: harmless
                break
            seen = True
            name, colon, value = text.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                bad = f"{_show(text)} is not a header line"
                break
            key, value = name.decode("ascii").lower(), value.strip()
            if key == "content-length":
                if not value.isdigit():
                    bad = f"Content-Length {_show(value)} is not a number of bytes"
                elif len(value.lstrip(b"0")) > 15 or int(value) > max_body:
                    bad = f"Content-Length {_show(value, 24)} is past the limit ({_size(max_body)}): message refused unread"
                elif length is not None and length != int(value):
                    bad = f"two Content-Length headers ({length} and {int(value)})"
                else:
                    length = int(value)
                if bad is not None:
                    break
            elif key != "content-type":
                unknown.append(name.decode("ascii"))

        if bad is None and length is None:
            bad = "a message without a Content-Length header"
        if bad is not None:
            yield Problem(bad + "; skipping to the next Content-Length header")
            skipping = True
            continue
        if unknown:
            yield Problem(f"ignored unknown header {', '.join(unknown)}")

        # --- the body ----------------------------------------------------------------------
        assert length is not None
        checked = 0
        cut = None
        while True:
            end = min(len(buf), length)
            m = _HEADER_LINE.search(buf, max(checked - 64, 0), end + 64 if end == length else end)
            if m is not None and m.start() < length:
                cut = m.start()
                break
            checked = end
            if len(buf) >= length:
                break
            if not fill():
                yield Problem(f"the input ended inside a message body ({len(buf)} of {length} bytes)")
                return
        if cut is not None:
            yield Problem(f"the body ended after {cut} of its {length} bytes (the next message's header began there); "
                          "it is skipped")
            del buf[:cut]
            continue
        body = bytes(buf[:length])
        del buf[:length]
        nxt = bytes(buf[: _KEEP_HINT]).lower()  # what follows: the next header, or the rest of this body?
        out = _decode(body, more=bool(nxt) and not b"content-length:".startswith(nxt) and not nxt[:1].isspace())
        if isinstance(out, Problem) and out.code == PARSE_ERROR:
            cut = _header_start(body)
            if cut is not None:  # a length past its body: the next header starts inside
                buf[0:0] = body[cut:]
                out = Problem(f"the body ended after {cut} of its {length} bytes (the next message's header began there); "
                              "it is skipped")
        yield out


def _header_start(body: bytes) -> int | None:
    """Where a Content-Length header, or the start of one cut off at the end, begins in a body
    that is not JSON; None if nowhere."""
    m = _HEADER.search(body)
    if m is not None:
        return m.start()
    tail = body[-(_KEEP_HINT - 1):].lower()
    for i in range(len(tail)):
        if b"content-length:".startswith(tail[i:]):
            return len(body) - len(tail) + i
    return None


def _decode(body: bytes, more: bool) -> Message | Problem:
    if not body:
        return Problem("an empty message (Content-Length: 0)", PARSE_ERROR)
    try:
        obj = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        return Problem(f"the body is not UTF-8 ({e.reason} at byte {e.start})", PARSE_ERROR)
    except RecursionError:
        return Problem("the body is JSON nested too deeply to read", PARSE_ERROR)
    except ValueError as e:
        hint = ""
        if more and not body.isascii():
            hint = " (does the client count Content-Length in characters instead of bytes?)"
        elif more:
            hint = " (is Content-Length short of the body?)"
        return Problem(f"the body is not JSON: {e}{hint}", PARSE_ERROR)
    if not isinstance(obj, dict):
        return Problem(f"the body is a JSON {type(obj).__name__}, not a JSON-RPC message (an object)", INVALID_REQUEST)
    return Message(obj, len(body))
