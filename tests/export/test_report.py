"""`alloctrace report`: one self-contained HTML file; it opens in Chromium with the network off and draws, its
numbers are the trace's, and its size stays bounded as the trace grows (level of detail)."""
from __future__ import annotations

import gzip
import json
import pickle
import re
import shutil
from html.parser import HTMLParser

import pytest

from alloctrace.cli import main
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.sources.ranks import import_ranks
from torchsnap import DATA, sidecar

MB = 1_000_000


class Refs(HTMLParser):
    """Everything a page would fetch: src/href attributes and the script and style tags."""

    def __init__(self):
        super().__init__()
        self.refs, self.scripts = [], 0

    def handle_starttag(self, tag, attrs):
        self.scripts += tag == "script"
        self.refs += [v for k, v in attrs if k in ("src", "href", "data") and v]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    store = open_store(str(root / "s"))
    ids = {n: import_paths(store, [DATA / f"{n}.pickle.gz"])[0] for n in ("oom", "gpt2_train_bs8")}
    job = root / "job"
    job.mkdir()
    for r, n in enumerate(("gpt2_train_bs8", "oom", "gpt2_train_bs16")):
        shutil.copy(DATA / f"{n}.pickle.gz", job / f"rank{r}.pickle.gz")
    ids["ranks"] = import_ranks(store, [job])[0]["id"]
    return root, store, ids


def report(stored, ref, name, *opts) -> str:
    root = stored[0]
    out = root / f"{name}.html"
    assert main(["report", ref, "--store", str(root / "s"), "-o", str(out), *opts]) == 0
    return out


def data_of(text: str) -> list:
    return json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)
                      .group(1).replace("<\\/", "</"))


def test_torch_report_is_self_contained_and_holds_the_numbers(stored):
    out = report(stored, stored[2]["oom"], "oom")
    text = out.read_text()
    refs = Refs()
    refs.feed(text)
    assert refs.refs == []  # nothing to fetch: no src, no href, no CDN
    truth = sidecar("oom")
    assert f"{truth['ground_truth']['max_memory_reserved']:,} B" in text
    assert f"{truth['memory_stats_subset']['requested_bytes.all.peak']:,} B" in text
    assert "Out of memory at entry" in text and text.count("<div class=\"flame\"><svg") == 2  # flamegraphs at the peak and the OOM
    [d] = data_of(text)
    assert max(d["timeline"]["allocated_max"]) == truth["memory_stats_subset"]["requested_bytes.all.peak"]


def test_torch_report_oom_card_keeps_cause_cap_and_blocks(stored):
    """The report's OOM card is the dashboard's: the cause, the inferred cap (the real 6 GiB inside it), the
    largest free blocks and the largest blocks held, each with exact bytes."""
    text = report(stored, stored[2]["oom"], "oom-card").read_text()
    card = text[text.index('<div class="oom">'):]
    card = card[:card.index("</div>", card.index("Who held the memory"))]
    limit = sidecar("oom")["scenario_details"]["limit_bytes"]
    assert "Cause:" in card and "set_per_process_memory_fraction" in card
    lo, hi = (int(x.replace(",", "")) for x in re.search(r"memory cap</dt><dd>([\d,]+) – ([\d,]+) B", card).groups())
    assert lo <= limit <= hi
    assert "largest free block (large pool)" in card and "Largest blocks held" in card
    assert "154,389,504" in card                      # the largest block held, exactly (as on the dashboard)


def test_report_opens_offline_in_chromium_and_draws(stored, browser):
    out = report(stored, stored[2]["ranks"], "ranks")
    ctx = browser.new_context(offline=True, viewport={"width": 1300, "height": 900})
    page = ctx.new_page()
    errors, asked = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: asked.append(r.url))
    ctx.route(re.compile(r"^(?!file:).*"), lambda route: route.abort())  # the network is off
    try:
        page.goto(out.as_uri())
        page.wait_for_selector("body[data-drawn='1']", timeout=60000)
        for d in (0, 1, 2):
            page.wait_for_selector(f"#timeline-{d}[data-ready='1']", timeout=60000)
            assert page.locator(f"#timeline-{d} .scatterlayer .trace").count() > 10  # bands drawn by Plotly
        assert page.locator("section .flame svg").count() == 4  # three peaks and rank 1's OOM
        assert "Ranks" in page.text_content("body")
    finally:
        ctx.close()
    assert errors == [] and asked == [out.as_uri()]


def test_ggml_report_draws_the_memory_map(stored, fixtures, browser):
    root, store, _ = stored
    log = fixtures / "head-gallocr" / "harness_gallocr.AT.log"
    tid = import_paths(store, [log])[0]
    out = report(stored, tid, "ggml")
    text = out.read_text()
    assert "Memory map" in text and "Peak by tensor family" in text
    assert len(text) < MB  # no Plotly.js: the map is drawn on a canvas
    peak = store.summary(tid)["graphs"]
    page = browser.new_page()
    try:
        page.goto(out.as_uri())
        page.wait_for_selector("body[data-drawn='1']", timeout=30000)
        boxes = page.eval_on_selector_all("canvas.map", "cs => cs.map(c => Number(c.dataset.boxes))")
        assert boxes and all(b > 0 for b in boxes) and len(boxes) == min(4, len(peak))
    finally:
        page.close()


def test_size_is_bounded_by_the_level_of_detail(stored, tmp_path):
    root, store, ids = stored
    small = report(stored, ids["gpt2_train_bs8"], "small").stat().st_size
    snap = pickle.loads(gzip.decompress((DATA / "gpt2_train_bs8.pickle.gz").read_bytes()))
    trace = snap["device_traces"][0]
    span = trace[-1]["time_us"] - trace[0]["time_us"] + 1
    snap["device_traces"][0] = [dict(e, time_us=e["time_us"] + r * span) for r in range(20) for e in trace]
    big_file = tmp_path / "big.pickle"
    big_file.write_bytes(pickle.dumps(snap, protocol=4))
    big_id = import_paths(store, [big_file])[0]
    assert store.summary(big_id)["graphs"][0]["n_events"] == 20 * len(trace)
    big = report(stored, big_id, "big").stat().st_size
    assert big < 1.2 * small and big < 10 * MB  # 20 times the entries, about the same file


def test_bad_requests_are_one_line(stored, capsys):
    root, _, ids = stored
    s = str(root / "s")
    assert main(["report", ids["oom"], "--store", s, "-o", str(root / "r.pdf")]) == 2
    assert main(["report", ids["oom"], "--store", s, "-o", str(root / "r.html"), "--device", "7"]) == 2
    assert main(["report", ids["oom"], "--store", s, "-o", str(root / "r.html"), "--device", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("alloctrace: error:") == 3 and "Traceback" not in err and not (root / "r.html").exists()


def test_the_ggml_map_in_a_report_names_its_axes_and_has_a_legend(stored, fixtures, browser):
    root, store, _ = stored
    tid = import_paths(store, [fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"])[0]
    out = report(stored, tid, "ggml")
    page = browser.new_page()
    try:
        page.goto(out.as_uri())
        page.wait_for_selector("body[data-drawn='1']", timeout=30000)
        for c in page.eval_on_selector_all("canvas.map", "cs => cs.map(c => ({id: c.id, axes: c.dataset.axes}))"):
            assert c["axes"] == "event|offset in the buffer (bytes)"
            entries = page.eval_on_selector_all(f"#{c['id']}-legend span", "ss => ss.map(s => s.textContent)")
            assert entries[0].startswith("buffer (") and len(entries) >= 3  # the buffer line, then tensors
            names = set(page.evaluate(f"""JSON.parse(document.getElementById('report-data').textContent)
                .find(d => d.id === '{c['id']}').shapes.tensor"""))
            assert set(entries[1:]) <= names
            # tick labels left of the plot area: ink in the margin beside several heights, not one corner label
            inked = page.evaluate(f"""(() => {{ const c = document.getElementById('{c['id']}'), g = c.getContext('2d');
                const rows = []; for (let y = 0; y < c.height - 42; y += 4) {{
                  const px = g.getImageData(30, y, 44, 1).data; let ink = 0;
                  for (let i = 0; i < px.length; i += 4) if (px[i] < 150) ink++; rows.push(ink > 0); }}
                return rows.filter(Boolean).length; }})()""")
            assert inked >= 6
    finally:
        page.close()
