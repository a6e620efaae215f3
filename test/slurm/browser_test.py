#!/usr/bin/env python3
"""The demo's two reports as a person sees them: headless Chromium (Debian chromium + chromium-driver,
driven by python3-selenium) loads each page, and the test reads what the browser laid out and painted.

usage: browser_test.py PAGES_DIR RANKS
  PAGES_DIR holds report.html (forge-train report of the demo run) and quota-report.html (forge-quota report
  --by job --format html); the screenshots are written next to them (run-report.png, cost-report.png).

Checks, per page: no console errors; every chart is an SVG the browser rendered with a non-empty box; each
series is drawn where it should be (inside its chart's frame, with the expected number of elements: one
loss point per step, five stacked step-time areas, one bar per rank with five parts each); the tables hold
the run's segments with its layout, and the cost report's MFU and ETTR; and the screenshot shows the
series' colours inside the charts' boxes (the pixels, not the markup). Exits 1 naming the first failure.
"""
import os
import sys

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


# What the page laid out: per chart (by its aria-label), the frame's box and each series' elements with
# their rendered boxes in page coordinates.
CHARTS_JS = """
const out = {};
for (const svg of document.querySelectorAll('svg[aria-label]')) {
  const box = svg.getBoundingClientRect();
  const frame = svg.querySelector('.frame');
  const f = frame ? frame.getBoundingClientRect() : box;
  const series = {};
  for (const el of svg.querySelectorAll('[data-series]')) {
    const r = el.getBoundingClientRect();
    const name = el.getAttribute('data-series');
    const pts = el.points ? el.points.numberOfItems : 0;
    const paint = getComputedStyle(el).fill !== 'none' ? getComputedStyle(el).fill : getComputedStyle(el).stroke;
    (series[name] = series[name] || []).push({x: r.x + scrollX, y: r.y + scrollY, w: r.width, h: r.height,
                                             points: pts, paint: paint,
                                             rank: el.parentNode.getAttribute('data-rank')});
  }
  out[svg.getAttribute('aria-label')] = {x: box.x + scrollX, y: box.y + scrollY, w: box.width, h: box.height,
    frame: {x: f.x + scrollX, y: f.y + scrollY, w: f.width, h: f.height}, series: series,
    visible: getComputedStyle(svg).visibility === 'visible' && box.width > 0 && box.height > 0};
}
return out;
"""


def load(driver, path, shot):
    driver.set_window_size(1000, 800)
    driver.get("file://" + os.path.abspath(path))
    if driver.execute_script("return document.readyState") != "complete":
        fail(f"{path} did not finish loading")
    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    if errors:
        fail(f"{path}: console errors: {errors}")
    # The whole page in one screenshot: the window as tall as the document.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1000, height + 100)
    charts = driver.execute_script(CHARTS_JS)
    driver.save_screenshot(shot)
    return charts, Image.open(shot).convert("RGB")


def rgb(css):
    """'rgb(0, 114, 178)' -> (0, 114, 178)."""
    if not css.startswith("rgb"):
        fail(f"a series is painted with '{css}', not a colour")
    return tuple(int(v) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])


def painted(img, box, colour, where):
    """At least a few pixels of `colour` inside `box` of the screenshot."""
    x0, y0 = max(0, int(box["x"])), max(0, int(box["y"]))
    x1, y1 = min(img.width, int(box["x"] + box["w"]) + 1), min(img.height, int(box["y"] + box["h"]) + 1)
    region = img.crop((x0, y0, x1, y1))
    near = sum(1 for p in region.getdata() if all(abs(a - b) <= 24 for a, b in zip(p, colour)))
    if near < 3:
        fail(f"{where}: the screenshot shows no {colour} pixels in {box}")
    return near


def inside(el, frame, where):
    if el["w"] <= 0 and el["h"] <= 0:
        fail(f"{where}: rendered with an empty box {el}")
    if el["x"] < frame["x"] - 2 or el["y"] < frame["y"] - 2 or \
            el["x"] + el["w"] > frame["x"] + frame["w"] + 2 or el["y"] + el["h"] > frame["y"] + frame["h"] + 2:
        fail(f"{where}: drawn outside its chart's frame: {el} not in {frame}")


def run_report(driver, pages, ranks):
    charts, img = load(driver, os.path.join(pages, "report.html"), os.path.join(pages, "run-report.png"))
    steps = driver.execute_script(
        "return parseInt([...document.querySelectorAll('table.summary tr')].find(r => "
        "r.cells[0].textContent === 'steps').cells[1].textContent)")
    want = {"training loss": ["loss"], "throughput (tokens/s)": ["tokens/s"], "model FLOPs utilisation": ["MFU"],
            "peak resident memory, largest rank (MiB)": ["peak RSS"]}
    split = next((k for k in charts if k.startswith("step time split")), None)
    bars = next((k for k in charts if k.startswith("mean step time by rank")), None)
    if split is None or bars is None:
        fail(f"run report: charts {sorted(charts)} lack the step-time split or the per-rank view")
    parts = ["compute", "communication", "bubble", "data wait", "checkpoint stall"]
    want[split] = parts
    want[bars] = parts
    for title, names in want.items():
        c = charts.get(title)
        if c is None or not c["visible"]:
            fail(f"run report: no visible chart '{title}' (have {sorted(charts)})")
        if sorted(c["series"]) != sorted(names):
            fail(f"run report: '{title}' draws series {sorted(c['series'])}, want {sorted(names)}")
        for name in names:
            for el in c["series"][name]:
                if el["w"] > 0 or el["h"] > 0:
                    inside(el, c["frame"], f"run report: '{title}' series '{name}'")
    # One point per step on the line charts (the loss may skip a non-finite step; the demo has none).
    for title in ("training loss", "throughput (tokens/s)", "model FLOPs utilisation"):
        n = charts[title]["series"][next(iter(want[title]))][0]["points"]
        if n != steps:
            fail(f"run report: '{title}' has {n} points for {steps} steps")
        line = charts[title]["series"][want[title][0]][0]
        if line["w"] < 0.8 * charts[title]["frame"]["w"]:
            fail(f"run report: '{title}' spans {line['w']:.0f} of {charts[title]['frame']['w']:.0f} px")
    # The stacked areas: each one polygon over every step (its outline closes along the baseline).
    for name in parts:
        area = charts[split]["series"][name]
        if len(area) != 1 or area[0]["points"] != steps + 2:
            fail(f"run report: the '{name}' area has {[a['points'] for a in area]} points, want {steps + 2}")
    # The straggler view: one bar of five parts per rank.
    got = sorted({int(el["rank"]) for el in charts[bars]["series"]["compute"]})
    if got != list(range(ranks)):
        fail(f"run report: the per-rank view shows ranks {got}, want 0..{ranks - 1}")
    for name in parts:
        if len(charts[bars]["series"][name]) != ranks:
            fail(f"run report: '{name}' has {len(charts[bars]['series'][name])} bars, want {ranks}")
    # What a person sees: the series' colours inside each chart's frame.
    for title in (split, bars):
        for name in ("communication", "bubble"):
            painted(img, charts[title]["frame"], rgb(charts[title]["series"][name][0]["paint"]),
                    f"run report: '{title}' {name}")
    painted(img, charts["training loss"]["frame"], rgb(charts["training loss"]["series"]["loss"][0]["paint"]),
            "run report: the loss line")
    segments = driver.execute_script(
        "const h = [...document.querySelectorAll('h2')].find(x => x.textContent === 'Segments');"
        "if (!h) return null; const t = h.nextElementSibling.nextElementSibling;"
        "return [...t.rows].slice(1).map(r => [...r.cells].map(c => c.textContent));")
    if not segments or len(segments) < 2 or any(s[3] != str(ranks) for s in segments) or segments[-1][8] != "ok":
        fail(f"run report: segments table {segments}: want the preempted and the resumed process, {ranks} ranks")
    if segments[0][8] != "preempted":
        fail(f"run report: the first segment ended '{segments[0][8]}', want preempted")
    print(f"run report: {len(charts)} charts rendered, {steps} steps, {ranks} ranks, {len(segments)} segments; "
          f"screenshot {img.width}x{img.height}")


def cost_report(driver, pages):
    charts, img = load(driver, os.path.join(pages, "quota-report.html"), os.path.join(pages, "cost-report.png"))
    gpu = next((c for k, c in charts.items() if k.startswith("GPU-hours")), None)
    ettr = charts.get("Effective training time ratio (ETTR)")
    if gpu is None or ettr is None or not gpu["visible"] or not ettr["visible"]:
        fail(f"cost report: charts {sorted(charts)}: want GPU-hours and ETTR")
    jobs = driver.execute_script(
        "const t = document.querySelector('table'); const head = [...t.rows[0].cells].map(c => c.textContent);"
        "return [...t.rows].slice(1, -1).map(r => Object.fromEntries([...r.cells].map((c, i) => [head[i], "
        "c.textContent])));")
    dash = ("", "\u2013")
    trained = [j for j in jobs if j["MFU"] not in dash and j["ETTR"] not in dash]
    if not trained or any(not (0 < float(j["ETTR"]) <= 1) for j in trained):
        fail(f"cost report: no job with MFU and an ETTR in (0, 1]: {jobs}")
    keyed = ettr["series"].get("Effective training time ratio (ETTR)", [])
    if len(keyed) < len(trained) or any(el["w"] <= 0 for el in keyed):
        fail(f"cost report: the ETTR chart draws {len(keyed)} bars for {len(trained)} training jobs")
    painted(img, {"x": keyed[0]["x"], "y": keyed[0]["y"], "w": keyed[0]["w"], "h": keyed[0]["h"]},
            rgb(keyed[0]["paint"]), "cost report: an ETTR bar")
    wasted = gpu["series"].get("wasted", [])
    for el in wasted:
        if el["w"] >= 3:  # narrower bars are anti-aliased into their neighbours' colours
            painted(img, el, rgb(el["paint"]), "cost report: a wasted GPU-hours bar")
    print(f"cost report: {len(jobs)} jobs, {len(trained)} with MFU and ETTR, {len(wasted)} with waste drawn; "
          f"screenshot {img.width}x{img.height}")


def main():
    pages, ranks = sys.argv[1], int(sys.argv[2])
    driver = browser()
    try:
        run_report(driver, pages, ranks)
        cost_report(driver, pages)
    finally:
        driver.quit()
    print("PASS: both reports load without console errors and draw every series")


main()
