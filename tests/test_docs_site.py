"""The documentation site, built and opened in a real browser.

The site is built once per test session into a temporary folder, warnings as errors (the
README's command), then: every link inside it resolves (the file, and the anchor in it), and
headless Chromium (Debian's ``chromium``), served over localhost by ``http.server``, opens the
index and two chapters and reports that each figure loaded (``naturalWidth > 0``). Skipped, with
the reason, where Sphinx or Chromium is missing; CI installs both (.ci/run).
"""

import functools
import html
import http.server
import json
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from html.parser import HTMLParser

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES_IN_BROWSER = ["index.html", "path/vertex.html", "path/explain.html"]


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install -e '.[docs]')")
    pytest.importorskip("myst_parser", reason="myst-parser is not installed "
                                              "(pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html",
                             str(ROOT / "docs"), str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"the site does not build:\n{result.stderr[-5000:]}"
    print(f"site built in {time.perf_counter() - started:.1f} s")
    return out


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key) and not (tag == "a" and key == "src"):
                self.links.append(attrs[key])


def _parse(path):
    parser = _Links()
    parser.feed(path.read_text(errors="replace"))
    return parser


def test_every_link_inside_the_site_resolves(site):
    pages = sorted(site.rglob("*.html"))
    parsed = {p: _parse(p) for p in pages}
    checked, broken = 0, []
    for page, parser in parsed.items():
        for link in parser.links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or link.startswith("//") or link.startswith("mailto:"):
                continue  # outside the site
            target = page if not url.path else (page.parent / urllib.parse.unquote(url.path))
            target = target.resolve()
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {link} (no such file)")
            elif url.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if urllib.parse.unquote(url.fragment) not in ids:
                    broken.append(f"{page.relative_to(site)}: {link} (no anchor)")
    assert checked > 500, f"only {checked} links checked: is the site complete?"
    assert not broken, f"{len(broken)} broken links of {checked}:\n" + "\n".join(broken[:40])


def test_executed_blocks_show_their_output_and_code_wraps(site):
    """What a python block prints appears under it (docs/_ext/minicavs_outputs.py), and the
    stylesheet wraps long code lines instead of scrolling them."""
    page = (site / "path" / "tensors.html").read_text()
    output = re.search(r'<div class="mc-output[^"]*"><div class="highlight"><pre>(.*?)</pre>',
                       page, re.S)
    assert output, "no output block on path/tensors.html"
    assert "(1, 2) float32" in html.unescape(re.sub(r"<[^>]+>", "", output.group(1)))
    css = (site / "_static" / "minicavs.css").read_text()
    assert "white-space: pre-wrap" in css


def test_the_chapters_have_figures_made_at_build_time(site):
    images = sorted(p.name for p in (site / "_images").iterdir())
    assert any(name.endswith(".svg") for name in images) or shutil.which("dot") is None
    assert len(images) >= 6 or shutil.which("dot") is None, images


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed (apt-get install chromium); the browser check is "
                "skipped")


CHECK_PAGE = """<!doctype html><html><body><pre id="result">pending</pre>
<iframe id="page" src="/{page}" width="1200" height="900"></iframe>
<script>
document.getElementById("page").onload = function () {{
  var d = this.contentDocument, images = Array.from(d.images);
  Promise.all(images.map(function (i) {{
    return i.complete ? 0 : new Promise(function (r) {{ i.onload = i.onerror = r; }});
  }})).then(function () {{
    document.getElementById("result").textContent = JSON.stringify({{
      title: d.title, h1: d.querySelectorAll("h1").length,
      images: images.map(function (i) {{ return [i.getAttribute("src"), i.naturalWidth]; }})}});
  }});
}};
</script></body></html>"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The built site, plus /__check/<page>: the page in a same-origin frame and a script that
    writes what loaded into the DOM Chromium dumps."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.startswith("/__check/"):
            body = CHECK_PAGE.format(page=self.path[len("/__check/"):]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def served(site):
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _headless(browser, *args):
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", "--no-first-run", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("page", PAGES_IN_BROWSER)
def test_chromium_opens_the_page_and_its_figures_load(page, served, tmp_path):
    browser = _chromium()
    result = _headless(browser, "--virtual-time-budget=15000", "--dump-dom",
                       f"{served}/__check/{page}")
    match = re.search(r'<pre id="result">(.*?)</pre>', result.stdout, re.S)
    assert match, f"no result from Chromium for {page}:\n{result.stderr[-3000:]}"
    report = json.loads(html.unescape(match.group(1)))
    assert report["h1"] >= 1 and "minicavs" in report["title"], report
    if page != "index.html":
        assert report["images"], f"{page} shows no figure: {report}"
    unloaded = [src for src, width in report["images"] if width <= 0]
    assert not unloaded, f"{page}: these images did not load: {unloaded}"
    shot = tmp_path / "page.png"
    _headless(browser, f"--screenshot={shot}", "--window-size=1280,1400",
              f"{served}/{page}")
    assert shot.exists() and shot.stat().st_size > 10_000, "Chromium made no screenshot"
