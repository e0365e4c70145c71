"""A page as headless Chromium lays it out: its height, what sticks out of the main column,
and whether the worker lanes' labels fit the room left of the lanes.

The page itself runs no script (the tests check it); a copy of it gets one that measures
after load and writes what it found into the DOM, which Chromium dumps."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: The window the pages are measured in: a laptop's width.
WINDOW = (1280, 1000)

MEASURE = """<script>
addEventListener("load", () => {
  const style = getComputedStyle(document.body), body = document.body.getBoundingClientRect();
  const left = body.left + parseFloat(style.paddingLeft);
  const right = body.right - parseFloat(style.paddingRight);
  const height = document.documentElement.scrollHeight;
  const folded = document.querySelectorAll("details:not([open])").length;
  // Widths are measured with every fold open: a closed one lays nothing out.
  document.querySelectorAll("details").forEach(d => { d.open = true; });
  const wider = [];
  for (const element of document.body.querySelectorAll("*")) {
    const box = element.getBoundingClientRect();
    if (box.width === 0 || wider.some(outer => outer.contains(element))) continue;
    if (box.left < left - 1 || box.right > right + 1) wider.push(element);
  }
  const labels = [];
  for (const svg of document.querySelectorAll("svg.lanes")) {
    const edge = svg.getBoundingClientRect().left;
    const lanes = [...svg.querySelectorAll(".lane")].map(r => r.getBoundingClientRect().left);
    const start = Math.min(...lanes);
    for (const text of svg.querySelectorAll("text.lane-label")) {
      const box = text.getBoundingClientRect();
      labels.push({text: text.textContent, left: box.left - edge, right: box.right - edge,
                   room: start - edge});
    }
  }
  const found = {
    height, folded, column: right - left, labels,
    lanes: [...document.querySelectorAll("svg.lanes")].map(s => s.querySelectorAll("*").length),
    wider: wider.map(e => `${e.tagName.toLowerCase()}.${e.getAttribute("class") || ""}`
      + ` ${Math.round(e.getBoundingClientRect().width)} px: ${e.textContent.slice(0, 80)}`),
  };
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>"""


def layout(page: Path, scratch: Path) -> dict[str, Any]:
    """``page`` measured in Chromium: ``height`` (px, folds as the page leaves them),
    ``folded`` (closed ``<details>``), ``column`` (the main column's width), ``wider`` (each
    element sticking out of the column, with every fold open), ``labels`` (each lane label's
    left and right edge and the room left of its lanes) and ``lanes`` (elements per lane
    chart)."""
    assert CHROMIUM is not None
    copy = scratch / f"measured-{page.parent.name}.html"
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", f"{MEASURE}</body>"))
    width, height = WINDOW
    dom = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
         f"--window-size={width},{height}", "--virtual-time-budget=5000", "--dump-dom",
         copy.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom.stdout, re.DOTALL)
    assert found is not None, dom.stderr[-2000:]
    measured: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return measured
