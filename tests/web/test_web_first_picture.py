"""The trace view's first picture: the memory map drawn from its real data on a canvas before Plotly.js runs,
then replaced in place by Plotly's interactive chart (same plot area, same colours)."""
import base64

import pytest

from alloctrace.allocator.events import Event
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import open_store
from conftest import live_server

pytest.importorskip("playwright.sync_api")

OPS = ["MUL_MAT", "ADD", "SOFT_MAX"]
N_TENSORS = 36
PLOTLY = "**/plotly.min.js"


def stacked_trace():
    """36 tensors in three ops, each live for 6 steps in one of 6 slots of 64 KiB (every one is its own
    rectangle: far fewer than any view's budget)."""
    events, live = [Event("graph")], {}
    for k in range(N_TENSORS):
        slot = k % 6
        if slot in live:
            name, size = live.pop(slot)
            events.append(Event("free", tensor=name, size=size, offset=slot << 16))
        live[slot] = (f"t{k}", (1 + k % 4) << 14)
        events.append(Event("alloc", tensor=f"t{k}", op=OPS[k % 3], size=live[slot][1], offset=slot << 16, block=0))
    return TraceMeta(name="first picture", source="test", generation="ggml-2023-08-16"), \
        [GraphRecord(0, "eval", events, max_size=6 << 16)]


@pytest.fixture(scope="module")
def trace_url(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("store")
    store = open_store(store_dir)
    tid = store.add_trace(*stacked_trace())
    store.close()
    with live_server(store_dir) as base:
        yield f"{base}/traces/{tid}"


# Pixels of each op's fill (its colour at the map's opacity over the plot background) left of the key (the
# map's right margin is 230 px), counted in an image: a canvas on the page or a PNG screenshot.
COUNT_OP_PIXELS = """async ([src, ops]) => {
  const common = await import(document.querySelector('script[type=module]').src.replace('trace.js', 'common.js'));
  const hex = (c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16));
  const bg = hex(getComputedStyle(document.documentElement).getPropertyValue('--plot-bg').trim());
  const alpha = 0xb3 / 255;
  const want = ops.map((op) => hex(common.opColor(op)).map((c, i) => c * alpha + bg[i] * (1 - alpha)));
  let img;
  if (src.startsWith('data:')) {
    const bmp = await createImageBitmap(await (await fetch(src)).blob());
    const c = new OffscreenCanvas(bmp.width, bmp.height);
    c.getContext('2d').drawImage(bmp, 0, 0);
    img = c.getContext('2d').getImageData(0, 0, bmp.width, bmp.height);
  } else {
    const c = document.querySelector(src);
    img = c.getContext('2d').getImageData(0, 0, c.width, c.height);
  }
  const out = ops.map(() => ({ n: 0, x: 0, y: 0 }));
  const plotRight = img.width * (1 - 230 / document.getElementById('map').clientWidth);  // not the key
  for (let p = 0; p < img.data.length; p += 4) {
    if ((p / 4) % img.width > plotRight) continue;
    want.forEach((w, k) => {
      if ([0, 1, 2].every((c) => Math.abs(img.data[p + c] - w[c]) <= 3)) {
        const i = p / 4; out[k].n++; out[k].x += i % img.width; out[k].y += Math.floor(i / img.width);
      }
    });
  }
  return out.map((o) => ({ n: o.n, x: o.n ? o.x / o.n : null, y: o.n ? o.y / o.n : null }));
}"""


def test_the_map_is_drawn_from_its_data_without_plotly(trace_url, page):
    page.route(PLOTLY, lambda route: route.abort())  # Plotly.js never arrives
    page.goto(trace_url)
    page.wait_for_selector("#map[data-overview='1'] canvas.figure-sketch")
    assert page.evaluate("typeof window.Plotly") == "undefined"
    assert page.get_attribute("#map canvas", "data-shapes") == str(N_TENSORS)  # one rectangle per tensor
    counts = page.evaluate(COUNT_OP_PIXELS, ["#map canvas", OPS])
    # every op's rectangles are on the canvas in its colour: 12 tensors each, >= 16 KiB x 6 steps
    assert all(c["n"] > 500 for c in counts), counts
    # the page says the chart stays a still picture, and keeps it
    page.wait_for_function("document.getElementById('map-note').textContent.includes('still picture')")
    assert page.locator("#map canvas.figure-sketch").count() == 1
    assert page.get_attribute("#map", "data-ready") is None


def test_the_interactive_chart_takes_the_pictures_place(trace_url, page):
    held = []
    page.route(PLOTLY, lambda route: held.append(route))
    page.goto(trace_url)
    page.wait_for_selector("#map[data-overview='1']")
    picture = page.locator("#map").screenshot()
    while not held:
        page.wait_for_timeout(20)
    for r in held:
        r.continue_()
    page.unroute(PLOTLY)
    page.wait_for_selector("#map[data-ready='1']", timeout=30000)
    assert page.locator("#map canvas.figure-sketch").count() == 0
    assert page.evaluate("""document.getElementById('map').data.filter(t => t.fill === 'toself')
        .reduce((n, t) => n + t.x.filter(v => v === null).length, 0)""") == N_TENSORS
    chart = page.locator("#map").screenshot()
    before, after = (page.evaluate(COUNT_OP_PIXELS, ["data:image/png;base64," + base64.b64encode(png).decode(), OPS])
                     for png in (picture, chart))
    for op, b, a in zip(OPS, before, after):  # same colours, same area, same place (anti-aliasing aside)
        assert 0.9 < b["n"] / a["n"] < 1.1, (op, b, a)
        assert abs(b["x"] - a["x"]) < 3 and abs(b["y"] - a["y"]) < 3, (op, b, a)
