"""Open a real run's Ray dashboard in headless Chromium, the way a user would, token included.

Starts ``python -m walle_ray algo=impala env=cartpole topology=2a1m1l run.max_wall_s=90``
(with the preset's return and env-step stops lifted, so that it trains the full 90 s), waits
for the address it prints, and then, while the run trains:

- asks the dashboard over HTTP whether token auth is on, and checks that its actor list
  (``/api/v0/actors``) refuses a request without the token and one with a wrong token, and
  lists the run's ``walle/...`` roles with the token that ``ray get-auth-token`` prints;
- drives Chromium over the DevTools protocol (no extra packages: aiohttp, which Ray's
  dashboard needs anyway, speaks the websocket): opens the Actors page, pastes the token into
  the dashboard's "Authentication Token Required" dialog, and screenshots the Actors page
  (docs/images/dashboard_actors.png) and the Metrics page (docs/images/dashboard_metrics.png);
- reads the node's Prometheus endpoint for the ``ray_walle_*`` gauges and screenshots them
  (docs/images/dashboard_gauges.png), since the Metrics page's charts need Prometheus and
  Grafana, which a plain ``pip install ray`` does not bring.

Writes benchmarks/results/dashboard_check.json: each check, passed or not, with the machine.
Needs a Chromium (``apt-get install -y chromium``). A script, not a CI test: about 2 minutes.

    python benchmarks/dashboard_check.py [--chromium PATH] [--keep-run-dir]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, write_result  # noqa: E402

IMAGES = ROOT / "docs" / "images"
# CartPole's preset stops at return 475 or 500k env steps, within 30 s here: lift both so the
# dashboard stays up for the 90 s the checks need
RUN_ARGS = ["algo=impala", "env=cartpole", "topology=2a1m1l", "run.max_wall_s=90",
            "run.stop_at_return=null", "run.total_env_steps=1000000000"]
ROLES = ("sampler", "memory", "learner")  # roles a 2a1m1l IMPALA run must show
EXPECTED = ("walle/sampler-0", "walle/sampler-1", "walle/memory-0", "walle/learner-0")
LOGIN_TITLE = "Authentication Token Required"
T0 = time.time()


def step(text: str) -> None:
    print(f"[{time.time() - T0:5.1f} s] {text}", flush=True)


# ---------------------------------------------------------------- the run and its output

class Run:
    """``python -m walle_ray`` in a subprocess; its output is collected line by line."""

    def __init__(self, run_dir: Path):
        cmd = [sys.executable, "-m", "walle_ray", *RUN_ARGS, f"hydra.run.dir={run_dir}",
               "logger.progress=line"]
        self.command = " ".join(["python -m walle_ray", *RUN_ARGS])
        print("$", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     start_new_session=True)
        self.lines: list[str] = []
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self.queue.put(line)
            print("  run |", line, flush=True)

    def wait_for(self, pattern: str, timeout: float) -> re.Match | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                line = self.queue.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is not None:
                    return None
                continue
            match = re.search(pattern, line)
            if match:
                return match
        return None

    def finish(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
            return None


# ---------------------------------------------------------------- HTTP with and without the token

def http(url: str, token: str | None = None, timeout: float = 20) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get_token() -> tuple[str, str]:
    """The token the way docs/dashboard.md tells a user to get it: ``ray get-auth-token``."""
    ray_cli = Path(sys.executable).with_name("ray")
    cli = str(ray_cli) if ray_cli.exists() else (shutil.which("ray") or "ray")
    out = subprocess.run([cli, "get-auth-token"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"ray get-auth-token failed: {out.stderr.strip()}")
    return out.stdout.strip(), "ray get-auth-token"


def actor_rows(body: bytes) -> list[dict]:
    """The actor dicts in a ``/api/v0/actors`` answer."""
    def find(node):
        if isinstance(node, list) and node and all(isinstance(x, dict) for x in node) \
                and "actor_id" in node[0]:
            return node
        if isinstance(node, dict):
            for value in node.values():
                found = find(value)
                if found is not None:
                    return found
        return None
    return find(json.loads(body)) or []


def find_key(node, key: str):
    if isinstance(node, dict):
        if key in node:
            return node[key]
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            found = find_key(value, key)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------- Chromium over CDP

class Browser:
    """Headless Chromium driven over the DevTools protocol with aiohttp's websocket."""

    def __init__(self, chromium: str, width: int = 1600, height: int = 1000):
        self.profile = tempfile.mkdtemp(prefix="walle_chromium_")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
             f"--remote-debugging-port={self.port}", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.size = (width, height)
        self.next_id = 0

    async def connect(self):
        import aiohttp

        deadline = time.time() + 60
        while True:
            try:
                status, body = http(f"http://127.0.0.1:{self.port}/json/list", timeout=5)
                pages = [t for t in json.loads(body) if t.get("type") == "page"]
                if status == 200 and pages:
                    break
            except (OSError, ValueError):
                pass
            if time.time() > deadline:
                raise RuntimeError("Chromium's DevTools endpoint did not come up")
            await asyncio.sleep(0.5)
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"],
                                                max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Network.enable")
        width, height = self.size
        await self.send("Emulation.setDeviceMetricsOverride",
                        {"width": width, "height": height, "deviceScaleFactor": 1,
                         "mobile": False})

    async def send(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        call_id = self.next_id
        await self.ws.send_json({"id": call_id, "method": method, "params": params or {}})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), timeout=60)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def evaluate(self, expression: str):
        result = await self.send("Runtime.evaluate", {"expression": expression,
                                                      "awaitPromise": True,
                                                      "returnByValue": True})
        return result.get("result", {}).get("value")

    async def text(self) -> str:
        return await self.evaluate("document.body ? document.body.innerText : ''") or ""

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})

    async def wait_text(self, needles: tuple[str, ...], timeout: float) -> str:
        """Poll the page's text until it holds one of ``needles``; returns the text."""
        deadline = time.time() + timeout
        text = ""
        while time.time() < deadline:
            try:
                text = await self.text()
            except RuntimeError:  # navigating: no context for a moment
                text = ""
            if any(n in text for n in needles):
                return text
            await asyncio.sleep(1.0)
        return text

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        print(f"wrote {path}", flush=True)

    async def close(self) -> None:
        try:
            await self.ws.close()
            await self.session.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


# turns the Prometheus text page into a table of the ray_walle_* gauges: name, the run's tags,
# value (the raw lines are too long to read in a screenshot)
GAUGE_TABLE_JS = r"""(() => {
  const rows = document.body.innerText.split('\n').filter(l => l.startsWith('ray_walle_'))
    .map(l => { const m = l.match(/^(\w+)\{(.*)\}\s+(\S+)/); if (!m) return null;
      const tags = Object.fromEntries(
        [...m[2].matchAll(/(\w+)="([^"]*)"/g)].map(t => [t[1], t[2]]));
      return [m[1], tags.run || '', tags.algo || '', tags.env || '', tags.memory || '',
              Number(m[3]).toPrecision(4)]; }).filter(Boolean).sort();
  document.body.innerHTML = '';
  document.body.style.fontFamily = 'sans-serif';
  const h = document.createElement('h3');
  h.textContent = 'ray_walle_* gauges on the node\'s Prometheus endpoint ' + %s;
  const t = document.createElement('table'); t.style.borderCollapse = 'collapse';
  for (const [i, r] of [['gauge', 'run', 'algo', 'env', 'memory', 'value'], ...rows].entries()) {
    const tr = t.insertRow();
    for (const c of r) { const td = tr.insertCell(); td.textContent = c;
      td.style.padding = '4px 14px'; td.style.borderBottom = '1px solid #ddd';
      if (i === 0) td.style.fontWeight = 'bold'; }
  }
  document.body.append(h, t);
  return rows.length; })()"""


async def browse(chromium: str, dashboard: str, token: str, metrics_url: str | None,
                 checks: dict) -> None:
    browser = Browser(chromium)
    try:
        await browser.connect()
        # 1. the Actors page, as a new visitor: the dashboard asks for the token
        await browser.goto(f"{dashboard}/#/actors")
        text = await browser.wait_text((LOGIN_TITLE, "walle/"), timeout=60)
        asked = LOGIN_TITLE in text
        checks["browser_asks_for_token"] = {
            "passed": asked, "what": "a fresh browser on the Actors page sees the token dialog",
            "dialog_text": text[:400] if asked else None}
        if asked:
            await browser.screenshot(IMAGES / "dashboard_login.png")
            # 2. paste the token into the dialog and press its Submit button, as a user does
            focused = await browser.evaluate(
                "(() => { const i = document.querySelector('input[placeholder=\"Enter your "
                "authentication token\"]'); if (!i) return false; i.focus(); return true; })()")
            typed = False
            if focused:
                await browser.send("Input.insertText", {"text": token})
                typed = await browser.evaluate(
                    "document.activeElement && document.activeElement.value.length") == len(token)
                clicked = await browser.evaluate(
                    "(() => { const b = [...document.querySelectorAll('button')].find("
                    "x => x.innerText.trim().toLowerCase() === 'submit'); "
                    "if (b) b.click(); return !!b; })()")
                if not clicked:
                    for kind in ("keyDown", "keyUp"):
                        await browser.send("Input.dispatchKeyEvent", {
                            "type": kind, "key": "Enter", "code": "Enter",
                            "windowsVirtualKeyCode": 13})
            checks["browser_asks_for_token"]["token_typed_into_dialog"] = typed
            await asyncio.sleep(4.0)  # the dialog posts to /api/authenticate, then reloads
        cookies = (await browser.send("Network.getCookies", {"urls": [dashboard]})).get(
            "cookies", [])
        cookie = next((c for c in cookies if c["name"] == "ray-authentication-token"), None)
        checks["browser_login_sets_cookie"] = {
            "passed": cookie is not None and cookie.get("httpOnly", False),
            "what": "submitting the token sets the dashboard's HttpOnly cookie "
                    "ray-authentication-token",
            "cookie": None if cookie is None else {k: cookie.get(k) for k in
                                                   ("name", "httpOnly", "sameSite", "path")}}
        # 3. the Actors page with the cookie: the run's roles
        await browser.goto(f"{dashboard}/#/actors")
        text = await browser.wait_text(("walle/learner",), timeout=90)
        await asyncio.sleep(2.0)  # let the table finish drawing
        text = await browser.text()
        await browser.screenshot(IMAGES / "dashboard_actors.png")
        shown = sorted(set(re.findall(r"walle/[a-z]+(?:-\d+)?", text)))
        checks["actors_page_shows_roles"] = {
            "passed": LOGIN_TITLE not in text and all(any(n.startswith(f"walle/{r}")
                                                          for n in shown) for r in ROLES),
            "what": "the Actors page (not the login dialog) names the run's walle/... actors",
            "names_on_page": shown, "screenshot": "docs/images/dashboard_actors.png"}
        # 4. the Metrics page: charts only with Prometheus and Grafana set up
        await browser.goto(f"{dashboard}/#/metrics")
        await asyncio.sleep(8.0)
        text = await browser.text()
        await browser.screenshot(IMAGES / "dashboard_metrics.png")
        no_grafana = "grafana" in text.lower() and ("not" in text.lower()
                                                    or "set up" in text.lower())
        checks["metrics_page"] = {
            "passed": LOGIN_TITLE not in text,
            "what": "the Metrics page opens (past the login); its charts need Prometheus and "
                    "Grafana",
            "grafana_missing_notice": no_grafana, "page_text": text[:600],
            "screenshot": "docs/images/dashboard_metrics.png"}
        # 5. the walle gauges on the node's Prometheus endpoint, filtered to ray_walle_*
        if metrics_url:
            await browser.goto(metrics_url)
            await asyncio.sleep(2.0)
            rows = await browser.evaluate(GAUGE_TABLE_JS % json.dumps(metrics_url))
            checks.setdefault("prometheus_gauges", {})["rows_in_screenshot"] = rows
            await browser.screenshot(IMAGES / "dashboard_gauges.png")
    finally:
        await browser.close()


# ---------------------------------------------------------------- the check

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default=shutil.which("chromium")
                        or shutil.which("chromium-browser") or shutil.which("google-chrome"))
    parser.add_argument("--keep-run-dir", action="store_true")
    args = parser.parse_args()
    if not args.chromium:
        sys.exit("no Chromium found: apt-get install -y chromium, or pass --chromium PATH")

    run_dir = ROOT / "runs" / "bench_dashboard_check"
    shutil.rmtree(run_dir, ignore_errors=True)
    checks: dict[str, dict] = {}
    result: dict = {"command": "python benchmarks/dashboard_check.py",
                    "run_command": None, "chromium": None, "checks": checks}
    result["chromium"] = subprocess.run([args.chromium, "--version"], capture_output=True,
                                        text=True).stdout.strip()
    run = Run(run_dir)
    result["run_command"] = run.command
    token = None
    try:
        match = run.wait_for(r"Ray dashboard at (\S+)", timeout=180)
        if match is None:
            checks["address_printed"] = {"passed": False, "what": "the run prints the address"}
            raise SystemExit(1)
        dashboard = match.group(1).rstrip("/")
        auth_line = next((l for l in run.lines if "ray get-auth-token" in l), None)
        if auth_line is None:  # the line after the address, if it has come yet
            auth_line = run.wait_for(r".*ray get-auth-token.*", timeout=5)
            auth_line = auth_line.group(0) if auth_line else None
        status, body = http(f"{dashboard}/api/authentication_mode")
        mode = json.loads(body).get("authentication_mode") if status == 200 else None
        token, token_from = get_token()
        checks["address_printed"] = {
            "passed": mode != "token" or auth_line is not None,
            "what": "the run prints the dashboard's address and, with token auth on, how to "
                    "get the token", "address": dashboard, "auth_mode": mode,
            "auth_line": auth_line}

        step("the actor list API, with and without the token")
        # the actor list API: refused without the token, listed with it
        api = f"{dashboard}/api/v0/actors?limit=200&detail=false"
        no_token = http(api)[0]
        wrong = http(api, token="not-the-token")[0]
        names: list[str] = []
        deadline = time.time() + 120
        while time.time() < deadline:
            status, body = http(api, token=token)
            if status == 200:
                names = sorted(r["name"] for r in actor_rows(body)
                               if r.get("name") and r.get("state") == "ALIVE")
                if set(EXPECTED) <= set(names):
                    break
            time.sleep(2.0)
        checks["actor_api_needs_token"] = {
            "passed": mode != "token" or (no_token == 401 and wrong == 403),
            "what": "GET /api/v0/actors without a token / with a wrong one",
            "status_without_token": no_token, "status_wrong_token": wrong}
        checks["actor_api_lists_roles"] = {
            "passed": set(EXPECTED) <= set(names),
            "what": f"GET /api/v0/actors with the token from `{token_from}` lists the alive "
                    f"actors {', '.join(EXPECTED)}",
            "status": status, "alive_named_actors": names}

        step("the node's Prometheus endpoint")
        # the node's Prometheus endpoint (no auth on it) and the walle gauges there
        status, body = http(f"{dashboard}/nodes?view=summary", token=token)
        port = find_key(json.loads(body), "metricsExportPort") if status == 200 else None
        host = find_key(json.loads(body), "nodeManagerAddress") if status == 200 else None
        metrics_url = f"http://{host}:{port}/metrics" if port and host else None
        gauges: list[str] = []
        deadline = time.time() + 60  # gauges are exported every few seconds
        while metrics_url and time.time() < deadline:
            try:
                status, body = http(metrics_url)
            except OSError:
                status, body = 0, b""
            gauges = sorted({line.split("{")[0].split(" ")[0]
                             for line in body.decode(errors="replace").splitlines()
                             if line.startswith("ray_walle_")})
            if "ray_walle_env_steps_per_s" in gauges:
                break
            time.sleep(3.0)
        checks["prometheus_gauges"] = {
            "passed": "ray_walle_env_steps_per_s" in gauges,
            "what": "the node's Prometheus endpoint serves the run's ray_walle_* gauges",
            "endpoint": metrics_url, "gauges": gauges,
            "screenshot": "docs/images/dashboard_gauges.png"}

        step("Chromium: login, Actors, Metrics, gauges")
        asyncio.run(browse(args.chromium, dashboard, token, metrics_url, checks))
    finally:
        step("waiting for the run to end")
        code = run.finish(timeout=240)
        checks["run_finished"] = {"passed": code == 0, "what": "the run exits 0",
                                  "exit_code": code}
        if token:
            checks["token_not_printed"] = {
                "passed": token not in "\n".join(run.lines),
                "what": "the token itself appears nowhere in the run's output"}
        result["passed"] = all(c.get("passed") for c in checks.values())
        result["notes"] = (
            "Ray >= 2.59 starts a local cluster with token auth on; the token is the one "
            "`ray get-auth-token` prints (~/.ray/auth_token unless RAY_AUTH_TOKEN or "
            "RAY_AUTH_TOKEN_PATH say otherwise). The browser gets in by pasting it into the "
            "dashboard's dialog, which sets an HttpOnly cookie. The Metrics page's charts are "
            "Grafana panels: without Prometheus and Grafana running it shows only a notice, so "
            "the gauges are read from the node's Prometheus endpoint instead.")
        write_result("dashboard_check", result)
        if not args.keep_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    print("passed" if result["passed"] else "FAILED: " + ", ".join(
        k for k, c in checks.items() if not c.get("passed")))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
