"""webdriver.py — the few W3C WebDriver calls the browser tests make, over HTTP to chromedriver.

WebDriver (https://www.w3.org/TR/webdriver2/) is JSON over plain HTTP, and chromedriver (Debian's
chromium-driver) speaks it: a session, a URL, elements, keys, a script. This is what Selenium sends,
without a package to install and pin for it (Python's standard library only).
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

KEY_TAB = "\ue004"
KEY_ENTER = "\ue007"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriverError(RuntimeError):
    pass


class Browser:
    """Headless Chromium through chromedriver, `width` x `height` pixels."""

    def __init__(self, width=1024, height=768):
        self.port = free_port()
        self.proc = subprocess.Popen([shutil.which("chromedriver"), f"--port={self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(100):  # chromedriver answers /status once it listens
            try:
                self._call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        args = ["--headless=new", "--disable-gpu", "--no-first-run", f"--window-size={width},{height}",
                "--allow-file-access-from-files"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium's sandbox refuses to run as root
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": {"args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read() or b"{}").get("value")
        except urllib.error.HTTPError as e:
            raise WebDriverError(f"{method} {path}: {e.read().decode(errors='replace')[:500]}") from None

    def cmd(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        self.cmd("POST", "/url", {"url": url})

    def run(self, script, *args):
        """Runs `script` (a function body) in the page; returns what it returns."""
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        v = self.cmd("POST", "/element", {"using": "css selector", "value": css})
        return next(iter(v.values()))

    def click(self, element):
        self.cmd("POST", f"/element/{element}/click", {})

    def clear(self, element):
        self.cmd("POST", f"/element/{element}/clear", {})

    def type(self, element, text):
        self.cmd("POST", f"/element/{element}/value", {"text": text})

    def keys(self, text):
        """Key presses sent to whatever has the focus (the Actions API), as a person typing."""
        actions = []
        for ch in text:
            actions += [{"type": "keyDown", "value": ch}, {"type": "keyUp", "value": ch}]
        self.cmd("POST", "/actions", {"actions": [{"type": "key", "id": "keyboard", "actions": actions}]})

    def wait_for(self, script, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            if self.run(script):
                return True
            time.sleep(0.05)
        return False

    def cpu_seconds(self):
        """User + system CPU seconds of chromedriver and every process under it (the browser's), so far."""
        tick = os.sysconf("SC_CLK_TCK")
        parent, cpu = {}, {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(pid)] = int(fields[1])
            cpu[int(pid)] = (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick

        def under(pid):
            while pid > 1:
                if pid == self.proc.pid:
                    return True
                pid = parent.get(pid, 0)
            return False
        return sum(c for pid, c in cpu.items() if under(pid))

    def close(self):
        try:
            self.cmd("DELETE", "")
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
