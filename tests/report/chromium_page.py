"""Headless Chromium driven over the DevTools protocol, for the report tests.

:class:`Browser` starts ``chromium --headless`` with a private profile, connects to its
page target with ``websocket-client`` and offers what the tests need: open a file,
evaluate JavaScript, click, collect console errors and uncaught exceptions, take a
screenshot. :func:`browser_or_skip` gives one or skips the test with the reason (no
Chromium binary, no websocket-client).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
START_TIMEOUT_S = 60
CALL_TIMEOUT_S = 60


def chromium_binary() -> Optional[str]:
    """Path of a Chromium/Chrome binary on PATH (``$MSPROBE_CHROMIUM`` first), or None."""
    for name in (os.environ.get("MSPROBE_CHROMIUM"),) + CANDIDATES:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    """One headless Chromium with one page. ``errors`` lists console errors, uncaught
    exceptions and error log entries (as text) since the last :meth:`open`."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000) -> None:
        import websocket

        self._profile = tempfile.mkdtemp(prefix="msprobe-chromium-")
        self._proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-allow-origins=*",
             f"--user-data-dir={self._profile}", "--remote-debugging-port=0", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._port()
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            page = next(t for t in targets if t.get("type") == "page")
            self._ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=CALL_TIMEOUT_S,
                                                   suppress_origin=True)
        except BaseException:
            self.close()
            raise
        self._id = 0
        self.events: list[dict] = []
        self.errors: list[str] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _port(self) -> int:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self._proc.returncode}")
            if marker.is_file():
                lines = marker.read_text().split()
                if lines:
                    return int(lines[0])
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port")

    def _event(self, message: dict) -> None:
        self.events.append(message)
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(params["entry"].get("text", ""))

    def call(self, method: str, **params) -> dict:
        """Send one DevTools command; returns its result (RuntimeError on a protocol error)."""
        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._event(message)

    def wait_for(self, method: str, timeout: float = CALL_TIMEOUT_S) -> dict:
        """Wait for the next event ``method`` (events already received count)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for k, message in enumerate(self.events):
                if message.get("method") == method:
                    del self.events[: k + 1]
                    return message
            message = json.loads(self._ws.recv())
            if "id" not in message:
                self._event(message)
        raise TimeoutError(method)

    def open(self, path: Path) -> None:
        """Load the file ``path`` and wait for its load event; clears ``errors``."""
        self.events.clear()
        self.errors.clear()
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (by value; RuntimeError when
        it throws)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {}).get("description", str(result)))
        return result["result"].get("value")

    def screenshot(self, path: Path, selector: Optional[str] = None, height: Optional[int] = None) -> Path:
        """Write a PNG of the page (or of the element ``selector``, clipped to ``height``
        CSS pixels when given)."""
        params: dict = {"format": "png"}
        if selector:
            box = self.js(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                          f" return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()")
            x, y, w, h = box
            params["clip"] = {"x": x, "y": y, "width": w, "height": min(h, height or h), "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        """Stop Chromium and remove its profile (idempotent)."""
        ws = getattr(self, "_ws", None)
        if ws is not None:
            try:
                ws.close()
            except OSError:
                pass
            self._ws = None
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)


def browser_or_skip() -> Browser:
    """A started :class:`Browser`, or ``pytest.skip`` naming what is missing."""
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no Chromium on PATH (Debian package 'chromium'; .ci/run installs it where apt-get works)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        pytest.skip("websocket-client is not installed (requirements-test.txt)")
    return Browser(binary)
