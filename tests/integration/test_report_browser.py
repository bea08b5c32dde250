"""The run report in a real browser: the embedded run's `results/<dataset>/report.html` opened offline in
Debian's headless Chromium, driven over the DevTools protocol: it loads with no console error and no
request leaves the file, every plot rendered (SVG with drawn marks and a non-empty box), and the
screenshot is not blank."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
import zlib
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# the flags a closed network needs: no background traffic, no component updates (see .ci/system.sh)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1280,1600"]  # fmt: skip

PLOT_CHECK = """(() => {
  const figs = [...document.querySelectorAll('figure.plot')];
  return JSON.stringify({
    sections: [...document.querySelectorAll('main > section')].map(s => s.id),
    plots: figs.map(f => {
      const svg = f.querySelector('svg'); const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
      return {caption: f.dataset.plot, width: box.width, height: box.height,
              marks: svg ? svg.querySelectorAll('path, rect, use').length : 0};
    }),
    external: [...document.querySelectorAll('[src], link[href], script')].length,
    height: document.documentElement.scrollHeight,
  });
})()"""


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page target (commands and collected events)."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id, self.events = 0, []

    def send(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events:
                if ev.get("method") == method:
                    return ev
            self.events.append(json.loads(self.ws.recv()))
        raise AssertionError(f"no {method} within {timeout} s")


def png_distinct_colours(png: bytes, limit: int = 64) -> int:
    """How many distinct RGB(A) colours the first rows of a PNG hold (a blank page has one)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, channels = 8, b"", 0, 4
    while pos < len(png):
        length = int.from_bytes(png[pos : pos + 4], "big")
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, channels = int.from_bytes(data[:4], "big"), {2: 3, 6: 4}[data[9]]
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride, colours = 1 + width * channels, set()
    for row in range(0, min(len(raw) // stride, 900), 3):  # filtered bytes still differ where pixels do
        line = raw[row * stride + 1 : (row + 1) * stride]
        colours.update(line[i : i + channels] for i in range(0, len(line), channels * 7))
        if len(colours) >= limit:
            break
    return len(colours)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not CHROMIUM:
        pytest.skip("needs Debian's chromium (.ci/system.sh --test)")
    pytest.importorskip("websocket")
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        yield DevTools(page["webSocketDebuggerUrl"])
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_report_renders_offline_with_every_plot(embedded_local_run, browser, tmp_path):
    report = Path(embedded_local_run) / "results" / "sample" / "report.html"
    assert report.is_file(), "make run's pipeline ends by writing the report"
    page = tmp_path / "report.html"  # a copy alone in a folder: nothing beside it to load
    shutil.copy(report, page)

    dt = browser
    for domain in ("Page", "Runtime", "Log", "Network"):
        dt.send(f"{domain}.enable")
    dt.send("Page.navigate", url=page.as_uri())
    dt.wait_for("Page.loadEventFired")
    state = json.loads(
        dt.send("Runtime.evaluate", expression=PLOT_CHECK, returnByValue=True)["result"]["value"]
    )
    shot = base64.b64decode(
        dt.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
    )
    (tmp_path / "report.png").write_bytes(shot)

    errors = [e for e in dt.events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]  # fmt: skip
    assert errors == [], errors
    requests = [
        e["params"]["request"]["url"] for e in dt.events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert requests == [page.as_uri()], f"the page fetched more than itself: {requests}"
    assert state["external"] == 0

    # every stage of the embedded default has its section, and each plot drew something visible
    assert state["sections"] == ["data", "validation", "training", "smith", "sft", "evaluation", "provenance"]
    captions = [p["caption"] for p in state["plots"]]
    for expected in ("rows per split: in the parquet, converted", "validation verdicts per split",
                     "reward mean and resolved share per step", "share of zero-variance groups per step",
                     "policy loss, grad norm, entropy, response length per step",
                     "KL loss per step", "PPO clip and TIS-clip fractions per step",
                     "step time: rollout / train / weight sync", "validation outcome per strategy",
                     "F2P / P2P tests per synthesized task", "SFT training loss per step",
                     "resolve rate (mean over attempts) with its 95% interval over tasks"):  # fmt: skip
        assert expected in captions, f"plot {expected!r} missing: {captions}"
    for p in state["plots"]:
        assert p["width"] > 200 and p["height"] > 100, p
        assert p["marks"] >= 5, p
    assert len(shot) > 20_000 and png_distinct_colours(shot) >= 8, "the screenshot is blank"
