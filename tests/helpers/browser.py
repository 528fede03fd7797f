"""A small Chrome DevTools Protocol client over --remote-debugging-pipe, for the page tests.

Chromium started with --remote-debugging-pipe reads NUL-terminated JSON messages on its fd 3
and writes its own on fd 4: two os.pipe()s, handed over with pass_fds and moved to 3 and 4
by the shell that execs the browser. No new Python dependency, no port, no network: the
browser is started with a proxy that goes nowhere and a resolver that resolves nothing, and
every request it makes to anything but file: and data: is recorded, so a test can assert
there were none.

Every read waits with select and a deadline; the browser is always killed at the end (its
whole process group, with a bounded wait).
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

CHROMIUM = "/usr/bin/chromium"
TRAMPOLINE = """
import fcntl, os, sys
high = [fcntl.fcntl(int(fd), fcntl.F_DUPFD_CLOEXEC, 10) for fd in sys.argv[1:3]]
for fd in sys.argv[1:3]:
    os.close(int(fd))
os.dup2(high[0], 3)
os.dup2(high[1], 4)
os.execv(sys.argv[3], sys.argv[3:])
"""
LOCAL_SCHEMES = ("file:", "data:", "about:", "chrome:", "devtools:")


class BrowserError(Exception):
    pass


class Browser:
    """One headless Chromium and one page (target) in it."""

    def __init__(self, width: int = 1400, height: int = 900, path: str = CHROMIUM,
                 timeout: float = 30.0, loopback: bool = False):
        """`loopback`: the browser may reach servers on this machine by address (a live page
        served on 127.0.0.1); every other request still goes to the proxy that goes nowhere."""
        self.width, self.height, self.timeout = width, height, timeout
        self.profile = tempfile.mkdtemp(prefix="inferris-browser-")
        self.errors: list[str] = []           # console errors, exceptions, log entries of level error
        self.requests: list[str] = []         # every URL requested that is not file: or data:
        self.dialogs: list[str] = []          # alert/confirm/prompt opened by the page
        self.events: list[dict] = []          # events not yet looked at by a wait
        self._next_id = 0
        self._buf = b""
        self.session: str | None = None
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        args = [path, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--disable-default-apps", "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                "--proxy-server=127.0.0.1:9",
                f"--proxy-bypass-list={'127.0.0.1' if loopback else '<-loopback>'}",
                "--host-resolver-rules=MAP * ~NOTFOUND" + (", EXCLUDE 127.0.0.1" if loopback else ""),
                f"--window-size={width},{height}",
                f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]
        # a small trampoline puts our pipe ends at 3 (its input) and 4 (its output), then
        # becomes chromium (first moved above 9, so that they cannot collide with 3 and 4)
        self.stderr = open(os.path.join(self.profile, "stderr.txt"), "wb")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", TRAMPOLINE, str(to_child_r),
                                          str(from_child_w), *args], pass_fds=(to_child_r, from_child_w),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=self.stderr, start_new_session=True)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        try:
            self._open_page()
        except BaseException:
            self.close()
            raise

    # -- the protocol

    def _write(self, message: dict) -> None:
        data = json.dumps(message).encode() + b"\0"
        deadline = time.monotonic() + self.timeout
        while data:
            left = deadline - time.monotonic()
            _, ready, _ = select.select([], [self._to_child], [], max(0.0, left))
            if not ready:
                raise BrowserError("the browser does not read its pipe")
            n = os.write(self._to_child, data[:65536])
            data = data[n:]

    def _read(self, deadline: float) -> dict | None:
        """The next message, or None at the deadline."""
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._from_child], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserError(f"the browser closed its pipe (exit {self.proc.poll()}): "
                                   f"{self._stderr_tail()}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self._observe(message)
        return message

    def _observe(self, ev: dict) -> None:
        method, p = ev["method"], ev.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            said = d.get("exception", {}).get("description") or d.get("text", "")
            self.errors.append(f"exception: {said}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                      for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            self.errors.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith(LOCAL_SCHEMES):
                self.requests.append(url)
        elif method == "Page.javascriptDialogOpening":
            self.dialogs.append(p.get("message", ""))
            self._write({"id": self._take_id(), "method": "Page.handleJavaScriptDialog",
                         "params": {"accept": False}, "sessionId": ev.get("sessionId")})
        self.events.append(ev)
        del self.events[:-1000]

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def send(self, method: str, params: dict | None = None, session: bool = True,
             timeout: float | None = None) -> dict:
        """Run one command; its result (BrowserError with the browser's words if it failed)."""
        i = self._take_id()
        message: dict[str, Any] = {"id": i, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        self._write(message)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(deadline)
            if reply is None:
                raise BrowserError(f"no answer to {method} within {timeout or self.timeout} s")
            if reply.get("id") == i:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})

    def wait_event(self, method: str, timeout: float | None = None,
                   where: Callable[[dict], bool] = lambda p: True) -> dict:
        """The first event `method` (seen already or to come) whose params satisfy `where`."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for n, ev in enumerate(self.events):
                if ev["method"] == method and where(ev.get("params", {})):
                    del self.events[: n + 1]
                    return ev.get("params", {})
            self.events.clear()
            if self._read(deadline) is None and time.monotonic() >= deadline:
                raise BrowserError(f"no {method} within {timeout or self.timeout} s")

    def _open_page(self) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False})

    # -- what the tests do

    def open(self, path: str | Path, timeout: float | None = None, fragment: str = "") -> None:
        """Navigate to a local file (and a `fragment` in it: "step=3") and wait for its load event."""
        url = Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else "")
        self.events.clear()
        reply = self.send("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise BrowserError(f"navigating to {url}: {reply['errorText']}")
        self.wait_event("Page.loadEventFired", timeout)

    def open_url(self, url: str, timeout: float | None = None) -> None:
        """Navigate to a URL (a server on loopback: see `loopback`) and wait for its load event."""
        self.events.clear()
        reply = self.send("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise BrowserError(f"navigating to {url}: {reply['errorText']}")
        self.wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in reply:
            d = reply["exceptionDetails"]
            raise BrowserError(f"evaluating {expression[:80]!r}: "
                               f"{d.get('exception', {}).get('description') or d.get('text')}")
        return reply.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Evaluate `expression` until it is truthy (re-evaluated each time the browser says
        something, and at least every 50 ms), up to the deadline."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{expression!r} still false after {timeout or self.timeout} s")
            self._read(time.monotonic() + min(0.05, left))     # an event, or 50 ms of nothing

    def click(self, x: float, y: float) -> None:
        """A left click at page coordinates, as a user's mouse gives it."""
        base = {"x": x, "y": y, "button": "left", "clickCount": 1}
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        self.send("Input.dispatchMouseEvent", {"type": "mousePressed", **base})
        self.send("Input.dispatchMouseEvent", {"type": "mouseReleased", **base})

    def wheel(self, x: float, y: float, delta_y: float) -> None:
        self.send("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y, "deltaX": 0,
                                               "deltaY": delta_y})

    def screenshot(self, path: str | Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        Path(path).write_bytes(base64.b64decode(data))

    # -- the end

    def _stderr_tail(self) -> str:
        try:
            return Path(self.profile, "stderr.txt").read_bytes()[-600:].decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Ask the browser to close, then kill its process group whatever it said; bounded."""
        try:
            if self.proc.poll() is None:
                try:
                    self._write({"id": self._take_id(), "method": "Browser.close", "params": {}})
                except (BrowserError, OSError):
                    pass
                try:
                    self.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)     # the helpers it forked are in its group
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    self.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    continue
                if sig is signal.SIGTERM:
                    # the group may outlive its leader for a moment: make sure, then stop
                    try:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                break
        finally:
            for fd in (self._to_child, self._from_child):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.stderr.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
