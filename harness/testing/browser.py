"""A headless Chromium driven over the DevTools protocol, for the report.html
test (tests/test_report_browser.py): the page loaded as a user's browser loads
it, its console and uncaught exceptions recorded, JavaScript evaluated in it.

No browser-automation package: Chromium's ``--remote-debugging-pipe`` speaks the
protocol as NUL-terminated JSON on file descriptors 3 (commands in) and 4
(replies and events out), so the standard library is the whole client. The
browser is Debian's ``chromium`` (scripts/setup.sh installs it where missing);
``find()`` says why there is none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
import base64

NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find() -> tuple[str | None, str]:
    """``(path, "")`` of a Chromium, or ``(None, why there is none)``."""
    env = os.environ.get("CONFORMANCE_CHROMIUM")
    for name in ([env] if env else []) + list(NAMES):
        path = shutil.which(name)
        if path:
            return path, ""
    return None, ("no Chromium on PATH (looked for " + ", ".join(NAMES) + "; scripts/setup.sh installs Debian's "
                  "chromium where apt-get can, or set CONFORMANCE_CHROMIUM)")


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page: ``open(path)``, ``js(expr)``, and what
    the page said on its console (``errors``)."""

    def __init__(self, exe: str, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="conformance-chromium-")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        # the child's fds 3 and 4, whatever numbers the pipes got here
        hi_r, hi_w = os.dup(to_chrome_r), os.dup(from_chrome_w)

        def fds():
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-extensions", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        for fd in (to_chrome_r, from_chrome_w, hi_r, hi_w):
            os.close(fd)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    # ------------------------------------------------------------ the protocol
    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise BrowserError(f"no reply from Chromium in {self.timeout:.0f} s")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise BrowserError(f"Chromium exited (status {self.proc.poll()})")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: bool = False) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._id:
                if "error" in m:
                    raise BrowserError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, method: str) -> dict:
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read()
            if m.get("method") == method:
                return m
            self.events.append(m)

    # ------------------------------------------------------------ a page
    def open(self, path: Path) -> None:
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=True)
        self.wait_for("Page.loadEventFired")

    def js(self, expr: str):
        """The value of ``expr`` in the page (an exception in it is a BrowserError)."""
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True},
                      session=True)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expr[:80]}...: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    def screenshot(self, path: Path, width: int = 1400, height: int = 900, full: bool = False) -> Path:
        """The page as a PNG at ``width`` x ``height`` CSS pixels (a laptop's window), or
        its whole length with ``full``."""

        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=True)
        r = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": full}, session=True)
        Path(path).write_bytes(base64.b64decode(r["data"]))
        return Path(path)

    def wait_js(self, expr: str, timeout: float = 10.0):
        """``expr``'s value once it is truthy (a detail file loading), or the last value."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.js(expr)
            if v or time.monotonic() > deadline:
                return v
            time.sleep(0.05)

    @property
    def errors(self) -> list[str]:
        """What the page put on its console as an error, and its uncaught exceptions."""
        out = []
        for m in self.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def close(self) -> None:
        try:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
