"""Open the HTML report in headless Chromium, as a reader would, and report what it shows.

Talks the Chrome DevTools protocol over ``--remote-debugging-pipe`` (file descriptors 3 and 4, NUL-terminated JSON), so
it needs nothing beyond the standard library and Debian's ``chromium``. What it returns: every figure image and its
natural size, visible code, the answers present, and which fonts actually rendered the Korean text
(``CSS.getPlatformFontsForNode``: a glyph missing from the page's font shows up there as a fallback font).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..records import smoke_copy

REPORT = "reports/analysis.html"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--remote-debugging-pipe"]


def sandbox_flags(uid: int | None = None) -> list[str]:
    """Chromium keeps its sandbox (it renders our own report, but a sandbox costs nothing) except where it cannot have
    one: as root (a container's or CI's usual user) Chromium refuses to start without ``--no-sandbox`` ("Running as
    root without --no-sandbox is not supported"). As any other user the sandbox stays on."""
    return ["--no-sandbox"] if (os.geteuid() if uid is None else uid) == 0 else []

# Evaluated in the page after load: what a reader sees.
CHECK_JS = r"""
(async () => {
  await document.fonts.ready;
  const imgs = [...document.querySelectorAll('figure.blocklab img')];
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  const visible = e => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length)
                       && getComputedStyle(e).visibility !== 'hidden';
  const code = [...document.querySelectorAll('.jp-InputArea, .jp-CodeMirrorEditor, .jp-InputPrompt, div.input_area, .highlight')]
               .filter(visible).length;
  const faces = [...document.fonts].map(f => ({family: f.family.replace(/["']/g, ''), weight: f.weight, status: f.status}));
  return {
    title: document.title,
    figures: imgs.map(i => ({figure: i.closest('figure').dataset.figure, complete: i.complete,
                             width: i.naturalWidth, height: i.naturalHeight, shown: i.getBoundingClientRect().width})),
    missing_figures: document.querySelectorAll('p.missing').length,
    visible_code_elements: code,
    text_has_code: /display\(HTML|from blocklab|import /.test(document.body.innerText),
    answers: [...document.querySelectorAll('div.answer')].map(a => ({key: a.dataset.answer, verdict: a.dataset.verdict,
                                                                   text: a.innerText})),
    sections: [...document.querySelectorAll('section.blocklab')].map(s => s.dataset.section),
    toc_links: [...document.querySelectorAll('nav.toc a')].map(a => a.getAttribute('href')),
    toc_targets_missing: [...document.querySelectorAll('nav.toc a')]
        .filter(a => !document.getElementById(a.getAttribute('href').slice(1))).length,
    claims_rows: document.querySelectorAll('table.claims tbody tr').length,
    claims_coloured: document.querySelectorAll('table.claims tbody tr[class^="v-"]').length,
    sensitivity: document.querySelector('[data-sensitivity]')?.dataset.sensitivity ?? null,
    font_faces: faces,
    body_font: getComputedStyle(document.querySelector('div.answer') || document.body).fontFamily,
    height: document.documentElement.scrollHeight,
  };
})()
"""

# Elements whose Korean text must be drawn with the page's own font (no fallback, no replacement glyph).
FONT_SELECTORS = ("h1", "blockquote.question", "div.answer p", "table.claims td", "figcaption", "nav.toc a")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A Chromium process and its DevTools pipe."""

    def __init__(self, chromium: str, width: int = 1200, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="blocklab-chromium-")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        # move the child's ends well above 4, so that placing them at 3 and 4 cannot clobber one with the other
        high_r, high_w = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.close(to_child_r), os.close(from_child_w)

        def place():
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [chromium, *FLAGS, *sandbox_flags(), f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(3, 4),
            preexec_fn=place)
        os.close(high_r), os.close(high_w)
        self.next_id, self.buffer, self.events = 0, b"", []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60.0) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read(max(0.1, deadline - time.monotonic())))

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.poll() is not None else ""
                raise TimeoutError(f"no DevTools message from Chromium within {timeout:.0f} s {err}")
            ready, _, _ = select.select([self.from_child], [], [], left)
            if ready:
                chunk = os.read(self.from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            os.write(self.to_child, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_child), os.close(self.from_child)
        shutil.rmtree(self.profile, ignore_errors=True)


def inspect_report(html: str | Path, chromium: str | None = None, screenshot: str | Path | None = None,
                   width: int = 1200) -> dict:
    """Load ``html`` in headless Chromium; return what a reader sees (see CHECK_JS) plus ``fonts``: per element kind,
    the platform fonts that rendered its text. ``screenshot``: write a full-page PNG there."""
    chromium = chromium or find_chromium()
    if not chromium:
        raise FileNotFoundError("no Chromium found (Debian: apt-get install chromium)")
    tools = DevTools(chromium, width=width)
    try:
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "DOM", "CSS"):
            tools.send(f"{domain}.enable", session=session)
        tools.send("Page.navigate", {"url": Path(html).resolve().as_uri()}, session=session)
        tools.wait_event("Page.loadEventFired", timeout=120)
        result = tools.send("Runtime.evaluate", {"expression": CHECK_JS, "awaitPromise": True, "returnByValue": True},
                            session=session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page check failed: {result['exceptionDetails']}")
        seen = result["result"]["value"]
        root = tools.send("DOM.getDocument", {"depth": 0}, session=session)["root"]["nodeId"]
        fonts = {}
        for selector in FONT_SELECTORS:
            nodes = tools.send("DOM.querySelectorAll", {"nodeId": root, "selector": selector}, session=session)["nodeIds"]
            used = {}
            for node in nodes:
                for font in tools.send("CSS.getPlatformFontsForNode", {"nodeId": node}, session=session)["fonts"]:
                    name = font["familyName"] + (" (web font)" if font.get("isCustomFont") else "")
                    used[name] = used.get(name, 0) + font["glyphCount"]
            fonts[selector] = {"elements": len(nodes), "fonts": used}
        seen["fonts"] = fonts
        if screenshot:
            tools.send("Emulation.setDeviceMetricsOverride",
                       {"width": width, "height": int(seen["height"]), "deviceScaleFactor": 1, "mobile": False},
                       session=session)
            shot = tools.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                              session=session, timeout=120)
            Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        return seen
    finally:
        tools.close()


def register(subparsers) -> None:
    p = subparsers.add_parser("inspect", help="open the HTML report in headless Chromium and print what it shows")
    p.add_argument("html", nargs="?", default=REPORT)
    p.add_argument("--screenshot", default=None, help="also write a full-page PNG here")
    p.add_argument("--width", type=int, default=1200)
    p.add_argument("--json", action="store_true", help="print everything measured, as JSON (default: a summary of a "
                   "few lines)")
    p.set_defaults(func=_inspect_main)


def _inspect_main(args) -> None:
    smoke = smoke_copy(args.html) if args.html == REPORT else None
    if smoke is not None:  # a fresh checkout after `make smoke`: the smoke's report, said so first
        print(smoke[1] + ":", file=sys.stderr)
        args.html = str(smoke[0])
    if not Path(args.html).is_file():  # else Chromium opens an error page and the check reports it as an empty report
        raise FileNotFoundError(f"no report at {args.html}: the pipeline makes it (`snakemake --cores 2 "
                                "reports/analysis.html`, or `make run`; `make smoke` makes one in a scratch copy)")
    seen = inspect_report(args.html, screenshot=args.screenshot, width=args.width)
    if getattr(args, "json", False):
        print(json.dumps({k: v for k, v in seen.items() if k != "answers"}, indent=1, ensure_ascii=False))
    else:
        print("\n".join(summary_lines(seen, args.html, getattr(args, "width", None), args.screenshot)))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def summary_lines(seen: dict, html: str | Path = REPORT, width: int | None = None,
                  screenshot: str | Path | None = None) -> list[str]:
    """What ``inspect_report`` found, in a few lines a reader takes in at a glance: the figures, the sections and their
    links, the answers, the claims table, any code shown, the fonts that drew the text; the last line says whether
    anything is wrong (`--json` prints every value measured)."""
    problems = []
    lines = [f"{html}, as headless Chromium shows it{f' at {width} px wide' if width else ''}:",
             f"  title: {seen.get('title') or '(none)'}"]
    figures = seen.get("figures")
    if figures is not None:
        broken = [f.get("figure", "?") for f in figures if not f.get("complete") or not f.get("width")]
        missing = seen.get("missing_figures", 0)
        lines.append(f"  figures: {len(figures)} shown" + (f", {len(broken)} not loaded ({', '.join(broken)})" if broken
                     else ", every one loaded") + (f"; {missing} missing (their data or drawing absent)" if missing else ""))
        problems += [f"{_count(len(broken), 'figure')} not loaded"] * bool(broken)
        problems += [f"{_count(missing, 'figure')} missing"] * bool(missing)
    if "sections" in seen:
        links, dead = len(seen.get("toc_links", [])), seen.get("toc_targets_missing", 0)
        lines.append(f"  sections: {len(seen['sections'])} ({', '.join(seen['sections'])}); contents: "
                     f"{_count(links, 'link')}" + (f", {dead} leading nowhere" if dead else ", each reaching its heading"))
        problems += [f"{_count(dead, 'contents link')} leading nowhere"] * bool(dead)
    if seen.get("answers") is not None:
        tally = {}
        for answer in seen["answers"]:
            tally[answer.get("verdict")] = tally.get(answer.get("verdict"), 0) + 1
        lines.append(f"  answers: {len(seen['answers'])}" + (" (" + ", ".join(f"{v} {n}" for v, n in tally.items()) + ")"
                                                            if tally else ""))
    if "claims_rows" in seen:
        rows, coloured = seen["claims_rows"], seen.get("claims_coloured", 0)
        lines.append(f"  claims table: {_count(rows, 'row')}" + (", each coloured by its verdict" if rows == coloured
                                                                else f", {rows - coloured} without a verdict colour"))
        problems += [f"{rows - coloured} claim row(s) without a verdict colour"] * (rows != coloured)
    if "visible_code_elements" in seen:
        code = seen["visible_code_elements"] or seen.get("text_has_code")
        lines.append("  code: " + ("shown (the notebook's code should be hidden)" if code else "none shown"))
        problems += ["code shown"] * bool(code)
    fonts = seen.get("fonts")
    if fonts:
        fallback = {}
        for selector, found in fonts.items():
            for name, glyphs in found.get("fonts", {}).items():
                if glyphs and not name.endswith("(web font)"):
                    fallback.setdefault(name, []).append(selector)
        lines.append("  fonts: " + ("every text checked drawn with the page's own (web) font" if not fallback else
                     "; ".join(f"{name} drew some of {', '.join(where)}" for name, where in fallback.items())
                     + " (a font of this machine, not the page's: a glyph the page's font lacks)"))
    if seen.get("height"):
        lines.append(f"  page: {seen['height']:,} px tall" + (f"; screenshot: {screenshot}" if screenshot else ""))
    lines.append(("nothing wrong found" if not problems else "wrong: " + "; ".join(problems))
                 + " (`--json`: every value measured)")
    return lines
