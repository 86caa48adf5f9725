"""A minimal LSP client for the tests: real JSON-RPC over the server's stdin/stdout."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Client:
    def __init__(self):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "cyclelang.cli", "lsp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=ROOT)
        self.next_id = 0
        self.messages: queue.Queue = queue.Queue()
        self.notifications: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.stderr: list[bytes] = []
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self):
        out = self.proc.stdout
        while True:
            headers = {}
            while True:
                line = out.readline()
                if not line:
                    self.messages.put(None)
                    return
                line = line.strip()
                if not line:
                    break
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            body = out.read(int(headers["content-length"]))
            self.messages.put(json.loads(body))

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, msg: dict) -> None:
        body = json.dumps(msg).encode()
        self.send_raw(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def notify(self, method: str, params: dict) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: dict, timeout: float = 30):
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return self.wait(lambda m: m.get("id") == rid and "method" not in m, timeout)

    def wait(self, pred, timeout: float = 30) -> dict:
        import time

        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the language server; stderr:\n" + b"".join(self.stderr).decode(errors="replace"))
            m = self.messages.get(timeout=left)
            if m is None:
                raise EOFError("the language server closed its output; stderr:\n" + b"".join(self.stderr).decode(errors="replace"))
            if "method" in m and "id" not in m:
                self.notifications.append(m)
            if pred(m):
                return m

    def notification(self, method: str, timeout: float = 30) -> dict:
        """The next notification of `method` (one already read counts)."""
        for m in self.notifications:
            if m.get("method") == method:
                self.notifications.remove(m)
                return m
        m = self.wait(lambda m: m.get("method") == method, timeout)
        self.notifications.remove(m)
        return m

    def diagnostics(self, uri: str, version: int | None = None, timeout: float = 30) -> list[dict]:
        def match(m):
            return m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri and (
                version is None or m["params"].get("version") == version)

        for m in self.notifications:
            if match(m):
                self.notifications.remove(m)
                return m["params"]["diagnostics"]
        m = self.wait(match, timeout)
        self.notifications.remove(m)
        return m["params"]["diagnostics"]

    def initialize(self) -> dict:
        r = self.request("initialize", {"processId": os.getpid(), "rootUri": ROOT.as_uri(), "capabilities": {}})
        self.notify("initialized", {})
        return r

    def close(self) -> int:
        try:
            self.request("shutdown", {}, timeout=10)
            self.notify("exit", {})
        except (OSError, EOFError, TimeoutError):
            pass
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
