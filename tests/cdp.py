"""Headless Chromium driven over the DevTools protocol on a pipe, for the `-m browser` tests.

Why a pipe and not a driver library: ``--remote-debugging-pipe`` speaks CDP as NUL-separated JSON on file
descriptors 3 and 4, so the standard library is enough; no WebDriver, Playwright or websocket package has to be
installed for a handful of UI checks. MLflow 3's UI renders late (lazy chunks, then data), so everything waits on
a condition instead of sleeping a fixed time.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def chromium_binary() -> str | None:
    """The Chromium (Debian: ``apt-get install chromium``) or Chrome on PATH, if any."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


class Browser:
    """One headless browser with a fresh profile and one page; ``close()`` ends its whole process group."""

    def __init__(self, binary: str, width: int = 1440, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="cdp-profile-")
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()

        def wire_fds() -> None:  # in the child: its fd 3 reads our commands, its fd 4 carries the replies
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
            for fd in {a, b, to_browser_r, to_browser_w, from_browser_r, from_browser_w} - {3, 4}:
                os.close(fd)

        self.process = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "--remote-debugging-pipe", "about:blank"],
            close_fds=False, preexec_fn=wire_fds, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._out = os.fdopen(to_browser_w, "wb", buffering=0)
        self._in = os.fdopen(from_browser_r, "rb", buffering=0)
        self._buffer = b""
        self._id = 0
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip

    def call(self, method: str, session: bool | str = False, **params) -> dict:
        """Send one CDP command (to the page when ``session`` is True, or to that session id) and return its result."""
        self._id += 1
        message: dict = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session if session is True else session
        self._out.write(json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = self._in.read(1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def goto(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def js(self, expression: str, session: bool | str = True):
        """The JSON value of ``expression`` (awaited if a promise) in the page, or in another attached session."""
        result = self.call("Runtime.evaluate", session=session, expression=expression, returnByValue=True,
                           awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {}).get("description", expression))
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 90, what: str | None = None, session: bool | str = True):
        """Poll ``expression`` until it is truthy (return it); fail with ``what`` after ``timeout`` seconds.

        A DOM node comes back as ``{}``, which is falsy here: test elements with ``!!``.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(expression, session=session)
            except RuntimeError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(what or expression)
            time.sleep(0.5)

    def click(self, expression: str) -> None:
        """A real mouse click in the middle of the element ``expression`` evaluates to (React ignores some
        synthetic ``el.click()`` calls, e.g. on the runs table's Compare button)."""
        box = self.js(f"(() => {{ const e = {expression}; if (!e) return null; e.scrollIntoView({{block: 'center'}});"
                      " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")  # fmt: skip
        if box is None:
            raise LookupError(expression)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1], button="left",
                      clickCount=1)  # fmt: skip

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", session=True, text=text)

    def escape(self) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", session=True, type=kind, key="Escape", code="Escape",
                      windowsVirtualKeyCode=27)  # fmt: skip

    def attach_iframe(self, url_prefix: str) -> str:
        """A session inside the out-of-process iframe whose URL starts with ``url_prefix`` (sandboxed artifact views)."""
        targets = self.call("Target.getTargets")["targetInfos"]
        frame = next(t for t in targets if t["type"] == "iframe" and t["url"].startswith(url_prefix))
        return self.call("Target.attachToTarget", targetId=frame["targetId"], flatten=True)["sessionId"]

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.process.wait(timeout=10)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            pass
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)
