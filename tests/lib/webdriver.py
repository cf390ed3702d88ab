"""webdriver.py — the few W3C WebDriver calls the browser tests make: to Chromium through chromedriver,
to Firefox through its own Marionette port.

WebDriver (https://www.w3.org/TR/webdriver2/) is JSON over plain HTTP, and chromedriver (Debian's
chromium-driver) speaks it: a session, a URL, elements, keys, a script. This is what Selenium sends,
without a package to install and pin for it (Python's standard library only). Firefox takes the
same commands by name over Marionette, a TCP socket of length-prefixed JSON messages (what
geckodriver, which Debian does not package, translates WebDriver into).
"""
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
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


def descendants(root):
    """The processes under `root` (children, theirs, ...), from /proc: what a browser started."""
    parent = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent[int(pid)] = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def stop_tree(proc):
    """Ends `proc` and every process under it, whatever state they are in: a check that fails, or a
    browser that did not start, leaves nothing running."""
    tree = [proc.pid] + descendants(proc.pid)
    for sig in (15, 9):  # SIGTERM, then SIGKILL for what did not end on it
        for pid in tree:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def machine_notes():
    """What this machine gives a browser, for the line that says why one did not start."""
    notes = []
    try:
        mem = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        notes.append(f"{int(mem['MemAvailable'].split()[0]) // 1024} MB of memory free")
    except (OSError, KeyError, ValueError):
        pass
    notes.append(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if not os.path.exists("/proc/self/stat"):
        notes.append("/proc is not mounted (a chroot without it: mount -t proc proc /proc)")
    if not os.path.isdir("/dev/shm"):
        notes.append("no /dev/shm")
    tmp = tempfile.gettempdir()
    if os.environ.get("TMPDIR") and os.path.realpath(os.environ["TMPDIR"]) != os.path.realpath(tmp):
        notes.append(f"TMPDIR={os.environ['TMPDIR']} is not a writable folder")
    return "; ".join(notes)


class Browser:
    """Headless Chromium through chromedriver, `width` x `height` pixels. A Chromium that does not start is
    one WebDriverError line saying why (chromedriver's message, Chromium's own last error, the machine's
    memory and load), with chromedriver and all it started already ended."""

    def __init__(self, width=1024, height=768):
        self.port = free_port()
        fd, self.log = tempfile.mkstemp(prefix="nz-chromedriver-", suffix=".log")
        os.close(fd)
        # --enable-chrome-logs: Chromium's own messages in the log too, for the line on a failed start
        self.proc = subprocess.Popen([shutil.which("chromedriver"), f"--port={self.port}", f"--log-path={self.log}",
                                      "--enable-chrome-logs"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        try:
            for _ in range(100):  # chromedriver answers /status once it listens
                try:
                    self._call("GET", "/status")
                    break
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.1)
            else:
                raise WebDriverError("chromedriver did not answer on its port in 10 s")
            # --no-sandbox: Chromium's sandbox refuses to run as root, and as a user it needs user namespaces,
            # which many containers do not allow; the tests load only the project's own pages.
            # --disable-dev-shm-usage: a container's /dev/shm is often 64 MB, too small for a renderer
            args = ["--headless=new", "--disable-gpu", "--no-first-run", "--no-sandbox", "--disable-dev-shm-usage",
                    f"--window-size={width},{height}", "--allow-file-access-from-files"]
            caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                     "goog:chromeOptions": {"args": args}}}}
            self.session = self._call("POST", "/session", caps)["sessionId"]
        except (WebDriverError, OSError) as e:
            why = self._why(e)
            self._end()
            raise WebDriverError(why) from None

    def _why(self, error):
        """One line: chromedriver's error, Chromium's last error line in its log, the machine's state."""
        said = str(error).split("\\n")[0].split("\n")[0]
        m = re.search(r'"message":"([^"]*)', str(error))
        if m:
            said = m.group(1).replace("\\n", ": ").split("  (Session info")[0]
        chrome = ""
        try:
            # Chromium's lines: [PID:TID:MMDD/HHMMSS.micro:ERROR:file.cc(N)] or a loader's "error while loading"
            lines = [ln.strip() for ln in open(self.log, errors="replace")
                     if re.search(r"^\[[\d:/.]+:(ERROR|FATAL):|error while loading", ln)]
            chrome = f"; Chromium's log: {lines[-1][:200]}" if lines else ""
        except OSError:
            pass
        return f"chromium did not start under chromedriver: {said[:200]}{chrome}; {machine_notes()}"

    def _end(self):
        stop_tree(self.proc)
        try:
            os.unlink(self.log)
        except OSError:
            pass

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

    def set_width(self, width, height=768):
        """The page's viewport `width` CSS pixels wide (a phone's 400, a tablet's 768, a projector's 1024):
        the window resized; returns the viewport's width as the page sees it."""
        self.cmd("POST", "/window/rect", {"width": width, "height": height})
        return self.run("return window.innerWidth")

    def refresh(self):
        self.cmd("POST", "/refresh", {})

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
        self._end()


class Firefox(Browser):
    """Headless Firefox (Debian's firefox-esr) through Marionette: the same calls as Browser."""

    COMMANDS = {("POST", "/url"): "WebDriver:Navigate", ("POST", "/execute/sync"): "WebDriver:ExecuteScript",
                ("POST", "/element"): "WebDriver:FindElement", ("POST", "/actions"): "WebDriver:PerformActions",
                ("GET", "/screenshot"): "WebDriver:TakeScreenshot", ("DELETE", ""): "Marionette:Quit",
                ("POST", "/click"): "WebDriver:ElementClick", ("POST", "/clear"): "WebDriver:ElementClear",
                ("POST", "/value"): "WebDriver:ElementSendKeys", ("POST", "/window/rect"): "WebDriver:SetWindowRect",
                ("POST", "/refresh"): "WebDriver:Refresh", ("POST", "/context"): "Marionette:SetContext"}
    MIN_WIDTH = 500  # Firefox keeps its window at least this wide, headless too

    def __init__(self, width=1024, height=768):
        self.port = free_port()
        self.profile = tempfile.mkdtemp()
        with open(os.path.join(self.profile, "user.js"), "w") as f:
            f.write(f'user_pref("marionette.port", {self.port});\n')
        exe = shutil.which("firefox-esr") or shutil.which("firefox")
        # -remote-allow-system-access: set_width zooms the page, which is the browser's own (chrome) script
        self.proc = subprocess.Popen([exe, "--headless", "--marionette", "-remote-allow-system-access", "--profile", self.profile,
                                      "--window-size", f"{width},{height}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=dict(os.environ, HOME=self.profile))
        try:
            for _ in range(600):
                if self.proc.poll() is not None:
                    raise WebDriverError(f"firefox exited with {self.proc.returncode} before opening its Marionette port")
                try:
                    self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=120)
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                raise WebDriverError("firefox: no Marionette port after 60 s")
            self.buf, self.msg_id = b"", 0
            self._read()  # the server's hello
            self.cmd("POST", "/session", {"capabilities": {}})
            self.cmd("POST", "/window/rect", {"width": width, "height": height})
        except (WebDriverError, OSError, ValueError) as e:
            self._end()
            raise WebDriverError(f"firefox did not start: {str(e)[:200]}; {machine_notes()}") from None

    def _end(self):
        stop_tree(self.proc)
        shutil.rmtree(self.profile, ignore_errors=True)

    def set_width(self, width, height=768):
        """As Browser.set_width; below MIN_WIDTH the window stays MIN_WIDTH wide and the page is zoomed in
        (Ctrl-+), which gives it a viewport `width` CSS pixels wide, as a phone's screen does. The zoom
        lasts until the tab leaves the page: call it after loading."""
        self.cmd("POST", "/window/rect", {"width": max(width, self.MIN_WIDTH), "height": height})
        zoom = max(width, self.MIN_WIDTH) / width
        self.cmd("POST", "/context", {"value": "chrome"})
        try:
            self.cmd("POST", "/execute/sync", {"script": "Services.prefs.setBoolPref('browser.zoom.siteSpecific', false);"
                                                         "ZoomManager.setZoomForBrowser(gBrowser.selectedBrowser, arguments[0])",
                                               "args": [zoom]})
        finally:
            self.cmd("POST", "/context", {"value": "content"})
        return self.run("return window.innerWidth")

    def _read(self):
        while b":" not in self.buf:
            self.buf += self.sock.recv(65536)
        n, rest = self.buf.split(b":", 1)
        while len(rest) < int(n):
            rest += self.sock.recv(65536)
        self.buf = rest[int(n):]
        return json.loads(rest[:int(n)])

    def cmd(self, method, path, body=None):
        body = dict(body or {})
        if path == "/session":
            name = "WebDriver:NewSession"
        elif path.startswith("/element/"):  # /element/ID/click, /clear, /value
            _, _, element, action = path.split("/")
            name, body["id"] = self.COMMANDS[(method, "/" + action)], element
        else:
            name = self.COMMANDS[(method, path)]
        self.msg_id += 1
        message = json.dumps([0, self.msg_id, name, body]).encode()
        self.sock.sendall(str(len(message)).encode() + b":" + message)
        _, _, error, result = self._read()
        if error:
            raise WebDriverError(f"{name}: {error}")
        return result.get("value", result) if isinstance(result, dict) else result

    def cpu_seconds(self):
        return Browser.cpu_seconds(self)

    def close(self):
        try:
            self.cmd("DELETE", "")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=20)  # Firefox quits on its own after Marionette:Quit
        except subprocess.TimeoutExpired:
            pass
        self._end()
