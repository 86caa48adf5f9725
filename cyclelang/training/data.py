"""Propellant for a real run: text files, folders of them, or pre-tokenized arrays, memory-mapped.

A corpus is one token stream: the inputs in the order given (a folder's files sorted by
path), each memory-mapped, so a corpus larger than memory works and nothing is copied:

- text, byte-level (the default): a file's bytes are its tokens 0..255, mapped as they
  lie on disk (`np.memmap`, uint8). Bits per byte is the loss in bits.
- text with `--tokenizer`: a `tokenizers` JSON file or a transformers tokenizer folder.
  Each file is encoded once, a block of whole lines at a time, into a token file under
  the run folder (`tokens/`, keyed by the file's and the tokenizer's hashes) that is
  mapped like a pre-tokenized one; bits per byte uses the corpus's bytes per token.
- pre-tokenized: `.npy` (any integer dtype, 1-D, `np.load(mmap_mode="r")`) or `.bin`
  (raw uint16 as nanoGPT writes it, or `--bin-dtype`). Every id is checked against
  the feed's vocab before training.

The held-out split is the stream's last `holdout` fraction. Batches are stateless: the
window starts of step s, micro-step m come from `np.random.default_rng([seed, s, m])`,
so the data order is (seed, step) and a resumed run reads exactly the batches the
uninterrupted one would; a rank of a distributed run takes its rows of the global batch.
"""

from __future__ import annotations

import codecs
import hashlib
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..diagnostics import CycleError, Diagnostic
from ..ir import Span

SNIFF = 1 << 16  # bytes read to tell text from binary
TEXT_BLOCK = 1 << 20  # bytes of whole lines encoded at once by a tokenizer
EVAL_STREAM = 1 << 40  # the eval windows' seed stream, apart from every training step's


def _at(path) -> Span:
    return Span(file=str(path), line=1, column=1, end_line=1, end_column=1)


def data_error(code: str, message: str, path=None, help: str | None = None) -> CycleError:
    return CycleError([Diagnostic(code, "error", message, _at(path) if path is not None else None, help)])


def looks_binary(head: bytes) -> str | None:
    """Why these first bytes are not text (a NUL, bytes that are not UTF-8), or None."""
    nul = head.find(bytes(1))
    if nul >= 0:
        return f"it holds a NUL byte at offset {nul}"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character cut at the end is fine
    except UnicodeDecodeError as e:
        return f"byte {e.start} is not UTF-8 text"
    return None


@dataclass
class Tokenizer:
    """A text tokenizer: `encode(list of str) -> list of id lists`, its vocab size and a hash."""

    name: str
    vocab: int
    digest: str
    encode: object = field(repr=False)


def byte_level() -> Tokenizer:
    return Tokenizer("bytes", 256, "bytes", None)


def load_tokenizer(path: str) -> Tokenizer:
    """A `tokenizers` JSON file, or a transformers tokenizer folder (read locally, never downloaded)."""
    p = Path(path)
    try:
        if p.is_dir():
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            digest = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(p.iterdir()) if f.is_file())).hexdigest()[:16]
            return Tokenizer(f"transformers:{p.name}", len(tok), digest,
                             lambda texts: tok(texts, add_special_tokens=False)["input_ids"])
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_file(str(p))
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        return Tokenizer(f"tokenizers:{p.name}", tok.get_vocab_size(with_added_tokens=True), digest,
                         lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)])
    except ImportError as e:
        raise data_error("E0504", f"--tokenizer {path} needs the {e.name} package", path, f"pip install {e.name}") from None
    except CycleError:
        raise
    except Exception as e:  # the libraries raise their own types for a bad file
        raise data_error("E0504", f"cannot read --tokenizer {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", path,
                         "give a tokenizers JSON file (tokenizer.json) or a folder saved by a transformers tokenizer") from None


def _files(path: str) -> list[tuple[Path, bool]]:
    """(file, named explicitly) for one --data argument: a file, or a folder's files sorted by path."""
    p = Path(path)
    if p.is_file():
        return [(p, True)]
    if p.is_dir():
        out = sorted(f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts))
        return [(f, False) for f in out]
    raise data_error("E0501", f"--data {path} does not exist", None, "give text files, folders of them, or .bin/.npy token arrays")


_SPACE = re.compile(rb"[ \t\r\f\v]+(?=[^ \t\r\f\v\n])")


def _cut(buf: bytes) -> int:
    """Where to end a piece of `buf` (a full block without a newline), in (0, len(buf)): before
    the last blank that leads a word in its second half (where byte-level pre-tokenizers cut:
    ' word' is one pre-token), else between two characters (never inside one: a UTF-8
    continuation byte is 0b10xxxxxx)."""
    last = None
    for last in _SPACE.finditer(buf, len(buf) // 2):
        pass
    if last is not None and last.end() - 1 > 0:
        return last.end() - 1  # the run of blanks but its last one, which leads the next word
    for p in range(len(buf) - 1, max(0, len(buf) - 5), -1):
        if buf[p] & 0xC0 != 0x80:
            return p
    return len(buf) - 1  # not UTF-8 here: the decoder names the byte


def text_pieces(f, size: int = TEXT_BLOCK):
    """(byte offset, piece) of a binary file, each piece at most 2 x `size` bytes: whole lines
    where a line fits, else cut before a word, else between characters. Memory stays bounded
    whatever the file's line lengths (a 64 MB file without a newline is 64 pieces of 1 MiB)."""
    if size < 8:
        raise ValueError("a piece is at least 8 bytes")
    rest, offset = b"", 0
    while True:
        chunk = f.read(size)
        block = rest + chunk
        if not chunk:
            if block:
                yield offset, block
            return
        cut = block.rfind(b"\n") + 1  # whole lines only, so no token straddles two pieces
        if not cut and len(block) >= size:
            cut = _cut(block)
        if cut:
            yield offset, block[:cut]
            offset += cut
        rest = block[cut:]


def _digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(TEXT_BLOCK):
            h.update(chunk)
    return h.hexdigest()


def _cached(out: Path) -> bool:
    """A token file of an earlier run that is still what was written (its sha256 beside it)."""
    try:
        return out.is_file() and (out.parent / (out.name + ".sha256")).read_text("ascii").strip() == _digest_file(out)
    except (OSError, UnicodeDecodeError):
        return False


def _tokenize(path: Path, tok: Tokenizer, cache: Path, staging, text_block: int = TEXT_BLOCK) -> tuple[Path, Path]:
    """Encode one text file into a token file under `cache` (once: the name holds both hashes).
    A new file is written into `staging()` (a temporary folder the caller renames into place);
    returns (its final path, where it is now). The encoding reads `text_block` bytes at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(TEXT_BLOCK):
            h.update(chunk)
    dtype = np.uint16 if tok.vocab <= 1 << 16 else np.uint32
    final = cache / f"{h.hexdigest()[:16]}-{tok.digest}.{np.dtype(dtype).name}"
    if _cached(final):
        return final, final
    out = staging() / final.name
    digest = hashlib.sha256()
    with open(path, "rb") as f, open(out, "wb") as g:
        for offset, piece in text_pieces(f, text_block):
            try:
                text = piece.decode("utf-8")
            except UnicodeDecodeError as e:
                raise data_error("E0503", f"the data file {path} is not UTF-8 text: byte {offset + e.start} "
                                 f"(0x{piece[e.start]:02x}) {'starts no character' if e.reason == 'invalid start byte' else 'breaks a character'}",
                                 path, "convert it to UTF-8 (iconv -f LATIN1 -t UTF-8, say), or train on its bytes without --tokenizer") from None
            ids = np.asarray(tok.encode([text])[0], dtype=dtype)
            b = ids.tobytes()
            digest.update(b)
            g.write(b)
        g.flush()
        os.fsync(g.fileno())
    (out.parent / (out.name + ".sha256")).write_text(digest.hexdigest() + "\n", "ascii")
    return final, out


@dataclass
class Corpus:
    """The token stream (memory-mapped segments), its split and what bits per byte needs."""

    segments: list[np.ndarray]
    holdout: float
    bytes_per_token: float | None  # None: pre-tokenized, the bytes are unknown
    sources: list[str]
    tokenizer: str
    skipped: list[str] = field(default_factory=list)  # a folder's empty or binary files, left out

    def __post_init__(self):
        self.ends = np.cumsum([len(s) for s in self.segments]).tolist()
        self.total = self.ends[-1] if self.ends else 0
        self.split = self.total - int(math.ceil(self.total * self.holdout)) if self.holdout > 0 else self.total

    def fingerprint(self) -> dict:
        """What a resumed run checks it is reading the same stream with."""
        return {"tokens": self.total, "split": self.split, "sources": self.sources, "tokenizer": self.tokenizer}

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the stream, across segment ends, as int64."""
        out = np.empty(length, dtype=np.int64)
        i = int(np.searchsorted(self.ends, start, side="right"))
        done = 0
        while done < length:
            lo = start + done - (self.ends[i - 1] if i else 0)
            take = min(length - done, len(self.segments[i]) - lo)
            out[done : done + take] = self.segments[i][lo : lo + take]
            done += take
            i += 1
        return out

    def windows(self, split: str, starts_rng: np.random.Generator, rows: int, seq: int) -> np.ndarray:
        """(rows, seq + 1) windows at seeded starts inside one split."""
        lo, hi = (0, self.split) if split == "train" else (self.split, self.total)
        starts = starts_rng.integers(lo, hi - seq, size=rows, endpoint=False)
        return np.stack([self.read(int(s), seq + 1) for s in starts])

    def batch(self, seed: int, step: int, micro: int, rows: int, seq: int, part: slice = slice(None)) -> np.ndarray:
        """The global batch of (step, micro): `rows` windows; a rank takes `part` of the rows."""
        return self.windows("train", np.random.default_rng([seed, step, micro]), rows, seq)[part]

    def eval_batch(self, seed: int, i: int, rows: int, seq: int, part: slice = slice(None)) -> np.ndarray:
        return self.windows("val", np.random.default_rng([seed, EVAL_STREAM, i]), rows, seq)[part]

    def check_windows(self, seq: int, path_hint: str) -> None:
        for name, n in (("training", self.split), ("held-out", self.total - self.split)):
            if n < seq + 2:
                raise data_error("E0506", f"the {name} split holds {n} tokens, too few for windows of {seq + 1}", None,
                                 f"give more data than {self.total} tokens, a smaller --seq, or another --holdout ({path_hint})")


def load(paths, vocab: int, *, tokenizer: str | None = None, cache: Path | None = None, holdout: float = 0.1,
         bin_dtype: str = "uint16", text_block: int = TEXT_BLOCK) -> Corpus:
    """The corpus of `paths` for a feed of `vocab` tokens (see the module's docstring). With a
    tokenizer, new token files are written into a temporary folder beside `cache` and moved
    into it only when every file is encoded: a failure (bad UTF-8, a full disk, Ctrl-C)
    leaves `cache` as it was (and no `cache` or parent folder that this call made)."""
    made: list[Path] = []  # folders this call created, removed again if it fails
    staged: list[Path] = []

    def staging() -> Path:
        if not staged:
            missing = [p for p in [cache.parent, *cache.parent.parents] if not p.exists()]
            for p in reversed(missing):
                p.mkdir()
                made.append(p)
            staged.append(Path(tempfile.mkdtemp(prefix=f".{cache.name}.", suffix=".tmp", dir=cache.parent)))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staged[0], 0o777 & ~umask)  # a folder like any other once renamed (mkdtemp makes it private)
        return staged[0]

    try:
        corpus, mapped = _load(paths, vocab, tokenizer, cache, holdout, bin_dtype, text_block, staging)
        if staged:
            if not cache.exists():
                os.replace(staged[0], cache)
            else:
                for f in staged[0].iterdir():
                    os.replace(f, cache / f.name)
        made.clear()
    finally:
        if staged and staged[0].exists():
            shutil.rmtree(staged[0], ignore_errors=True)
        for p in reversed(made):  # the deepest first
            try:
                p.rmdir()
            except OSError:
                pass
    for i, path in mapped:
        corpus.segments[i] = np.memmap(path, dtype=np.uint16 if path.suffix == ".uint16" else np.uint32, mode="r")
    return corpus


def _load(paths, vocab, tokenizer, cache, holdout, bin_dtype, text_block, staging) -> tuple[Corpus, list[tuple[int, Path]]]:
    if not 0.0 <= holdout < 1.0:
        raise data_error("E0507", f"--holdout must be in [0, 1), not {holdout}")
    tok = load_tokenizer(tokenizer) if tokenizer else byte_level()
    if tok.vocab > vocab:
        raise data_error("E0505", f"the tokenizer {tok.name} has {tok.vocab} tokens, more than the feed's vocab of {vocab}",
                         tokenizer, f"use a tokenizer of at most {vocab} tokens, or give the spec `feed tokens vocab={tok.vocab}`")
    segments, sources, text_bytes, text_tokens, skipped = [], [], 0, 0, []
    mapped: list[tuple[int, Path]] = []  # (segment, token file) mapped once the token folder is in place
    pretokenized = False
    for given in paths:
        for f, explicit in _files(given):
            try:
                size = f.stat().st_size
                if f.suffix in (".npy", ".bin"):
                    arr = _token_array(f, bin_dtype, vocab)
                    pretokenized = True
                else:
                    if size == 0:
                        if explicit:
                            raise data_error("E0502", f"the data file {f} is empty", f, "give a file with text in it")
                        skipped.append(f"{f} (empty)")
                        continue
                    with open(f, "rb") as fh:
                        why = looks_binary(fh.read(SNIFF))
                    if why:
                        if explicit:
                            raise data_error("E0503", f"the data file {f} is not text: {why}", f,
                                             "give UTF-8 text, or tokens as a .npy or .bin array")
                        skipped.append(f"{f} (not text)")
                        continue
                    if tok.encode is None:
                        arr = np.memmap(f, dtype=np.uint8, mode="r")
                    else:
                        if cache is None:
                            raise ValueError("a tokenizer needs a cache folder for the token files")
                        out, where = _tokenize(f, tok, cache, staging, text_block)
                        dt = np.uint16 if tok.vocab <= 1 << 16 else np.uint32
                        # a stand-in of the right length (no memory) until the token folder is in place
                        arr = np.broadcast_to(np.zeros(1, dt), (where.stat().st_size // np.dtype(dt).itemsize,))
                        if len(arr):
                            mapped.append((len(segments), out))
                    text_bytes += size
                    text_tokens += len(arr)
            except OSError as e:
                raise data_error("E0501", f"cannot read the data file {f}: {e.strerror or e}", f) from None
            if len(arr):
                segments.append(arr)
                sources.append(f"{f.as_posix()}:{size}")
    if not segments:
        more = f" (skipped: {', '.join(skipped[:5])})" if skipped else ""
        raise data_error("E0502", f"no tokens in --data {' '.join(map(str, paths))}{more}", None, "give text files or token arrays")
    bpt = text_bytes / text_tokens if text_tokens and not pretokenized else None
    return Corpus(segments, holdout, bpt, sources, tok.name, skipped), mapped


def _token_array(f: Path, bin_dtype: str, vocab: int) -> np.ndarray:
    if f.suffix == ".npy":
        try:
            arr = np.load(f, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise data_error("E0503", f"cannot read {f} as a .npy token array: {e}", f) from None
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise data_error("E0503", f"{f} holds a {arr.dtype} array of shape {arr.shape}, not a 1-D integer token array", f)
    else:
        dt = np.dtype(bin_dtype)
        if f.stat().st_size % dt.itemsize:
            raise data_error("E0503", f"{f} is {f.stat().st_size} bytes, not a whole number of {dt.name} tokens", f, "set --bin-dtype")
        arr = np.memmap(f, dtype=dt, mode="r") if f.stat().st_size else np.zeros(0, dt)
    if len(arr) == 0:
        raise data_error("E0502", f"the token array {f} is empty", f)
    top = max(int(arr[i : i + (1 << 24)].max()) for i in range(0, len(arr), 1 << 24))
    low = min(int(arr[i : i + (1 << 24)].min()) for i in range(0, len(arr), 1 << 24))
    if top >= vocab or low < 0:
        raise data_error("E0505", f"{f} holds token id {top if top >= vocab else low}, outside the feed's vocab of {vocab}", f,
                         "tokenize with a vocabulary that fits the spec's feed")
    return arr
