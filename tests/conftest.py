import json
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# tests sit in folders by room (docs/testing.md); a test may import another room's test module for its helpers
for _room in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_room) not in sys.path:
        sys.path.append(str(_room))
# real logs of ggml's allocator, generation by generation (README.md there lists their sizes)
FIXTURES = Path(__file__).resolve().parent / "data" / "ggml-real"


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


def allocator_lines(path: Path) -> list[str]:
    """A harness log without the harness program's own markers."""
    with open(path, newline="") as f:
        return [line.rstrip("\n") for line in f if not line.startswith("harness:")]


def load_harness(path: Path) -> dict:
    """A harness graph description (the JSON beside a harness log)."""
    with open(path) as f:
        return json.load(f)


def log_records(imp) -> list:
    """A LogImport's graphs recovered one by one, with no recovery cache: the plain reference the
    importer's cached path (`LogImport.encoded`) must match. Each event learns its graph index."""
    from alloctrace.traces.sources.ggml_log.parse_log import own

    replay, out = None, []
    for draft in imp._drafts():
        replay = replay or imp._replayer(imp.features, draft)
        draft.items = own(draft.items)
        rec = replay.graph(draft)
        for ev in rec.events:
            ev.graph = rec.index
        out.append(rec)
    if replay is None:
        raise AssertionError("no graphs")
    return out


# Markers (pyproject.toml lists them; `pytest -m "not browser and not slow"` is a quick local run). `browser` and
# `postgres` follow from the fixtures a test asks for; the others from the file, by this table.
FILE_MARKS = {
    "record": ["test_record.py", "test_record_cuda.py", "test_record_errors.py", "test_record_llama.py",
               "test_record_locks.py", "test_record_model.py", "test_record_moe.py", "test_prestart.py",
               "test_preflight_llama.py", "test_preflight_startup.py", "test_torch_record.py",
               "test_preflight_iswa.py"],
    "gpu_fixture": ["test_record_cuda.py", "test_record_moe.py", "test_torch_recorded.py", "test_torch_pairs.py",
                    "test_torch_ranks.py", "test_torch_import.py", "test_torch_plan_truth.py", "test_torch_hook_gpu.py"],
    "slow": ["test_install.py", "test_server_schema.py", "test_hostile_server.py", "test_memmap_saved.py",
             "test_import_fuzz.py", "test_torch_fuzz.py",
             "test_torch_plan_resnet.py", "test_torch_jsonl.py", "test_torch_jsonl_fuzz.py",
             "test_torch_plan_checkpoint.py", "test_torch_plan_addresses.py", "test_torch_plan_address_orders.py",
             "test_web_ux.py",
             "test_bench_run_all.py"],
}
BROWSER_FIXTURES = {"browser", "profile", "window", "page"}
POSTGRES_FIXTURES = {"pg_admin", "pg_url"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = Path(str(item.fspath)).name
        for mark, names in FILE_MARKS.items():
            if name in names:
                item.add_marker(mark)
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & BROWSER_FIXTURES:
            item.add_marker("browser")
        callspec = getattr(item, "callspec", None)
        if fixtures & POSTGRES_FIXTURES or (callspec and callspec.params.get("store_ref") == "postgresql"):
            item.add_marker("postgres")


def pytest_configure(config):
    """One folder of captured PyTorch steps for the whole run, shared by the workers (torchsnap.plan_cached)."""
    if not hasattr(config, "workerinput") and "ALLOCTRACE_TEST_CAPTURES" not in os.environ:
        import tempfile

        config._capture_dir = tempfile.mkdtemp(prefix="alloctrace-test-captures-")
        os.environ["ALLOCTRACE_TEST_CAPTURES"] = config._capture_dir


def pytest_unconfigure(config):
    folder = getattr(config, "_capture_dir", None)
    if folder:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("ALLOCTRACE_TEST_CAPTURES", None)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture(scope="session")
def _playwright():
    """Playwright's sync API, started once (it runs one instance per thread) for the browser fixtures."""
    from playwright import sync_api as playwright_api

    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):  # CI installs it (.ci/run): a missing browser there is a failure, not a skip
            pytest.fail(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium to run the browser tests)")
    with playwright_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def browser(_playwright):
    """A headless Chromium without a profile, for the tests that need a context of their own (a cookie, the
    network off)."""
    b = _playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield b
    b.close()


@pytest.fixture(scope="session")
def profile(_playwright, tmp_path_factory):
    """One headless Chromium with a profile on disk for the run, as a user's browser has: a page of a server
    seen before starts from V8's cached compile of Plotly.js (about a second of a core on this machine each
    time without it; a context without a profile keeps no code cache). The dashboard keeps nothing in cookies
    or storage, and each test's server has a port, so an origin, of its own."""
    ctx = _playwright.chromium.launch_persistent_context(tmp_path_factory.mktemp("chromium-profile"),
                                                         executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield ctx
    ctx.close()


class Window:
    """Pages of the profile with one viewport (and colour scheme): what a new browser context gave a test."""

    def __init__(self, profile, viewport: dict, color_scheme: str | None = None):
        self.profile, self.viewport, self.color_scheme, self.pages = profile, viewport, color_scheme, []

    def new_page(self):
        pg = self.profile.new_page()
        pg.set_viewport_size(self.viewport)
        if self.color_scheme:
            pg.emulate_media(color_scheme=self.color_scheme)
        self.pages.append(pg)
        return pg

    def close(self):
        for pg in self.pages:
            if not pg.is_closed():
                pg.close()


@pytest.fixture
def window(profile):
    """window(width, height, color_scheme=None) -> a Window of the profile; its pages close after the test."""
    made = []

    def open_window(width: int = 1400, height: int = 1000, color_scheme: str | None = None) -> Window:
        made.append(Window(profile, {"width": width, "height": height}, color_scheme))
        return made[-1]

    yield open_window
    for w in made:
        w.close()


@pytest.fixture
def page(profile):
    """A fresh page of the profile; JavaScript errors fail the test, dialogs are recorded and dismissed."""
    pg = profile.new_page()
    pg.set_viewport_size({"width": 1400, "height": 1000})
    pg.errors = []
    pg.dialogs = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    yield pg
    pg.close()
    assert pg.errors == [], f"JavaScript errors: {pg.errors}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(store_dir, **app_options):
    """A real uvicorn on a free loopback port serving the store at `store_dir`; yields its base URL."""
    import uvicorn

    from alloctrace.server.app import create_app

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(store_dir=store_dir, **app_options), host="127.0.0.1", port=port,
                                        log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def upload_snapshots(base: str, paths) -> dict:
    """Each PyTorch snapshot at `paths` uploaded to the live server at `base`: {file stem (before .pickle): id}."""
    import httpx

    ids = {}
    for path in paths:
        with open(path, "rb") as f:
            r = httpx.post(f"{base}/api/torch/traces", files={"file": (path.name, f)}, timeout=60)
        assert r.status_code == 201, r.text
        ids[path.name.split(".pickle")[0]] = r.json()["traces"][0]["id"]
    return ids


@pytest.fixture(scope="session")
def pg_admin():
    """A PostgreSQL server for the store tests (tests/pgcluster.py); the tests of the PostgreSQL store
    fail, not skip, in CI, where .ci/run provides one."""
    import os

    from pgcluster import ENV, Cluster, pg_bin

    if os.environ.get(ENV):
        yield os.environ[ENV]
        return
    bindir = pg_bin()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail(f"no PostgreSQL: set {ENV} or install postgresql")
        pytest.skip("no PostgreSQL binaries (set ALLOCTRACE_TEST_PG to a server URL)")
    cluster = Cluster(bindir)
    url = cluster.start()
    try:
        yield url
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_admin):
    """A fresh PostgreSQL database of its own for one test."""
    from pgcluster import drop_database, new_database

    url = new_database(pg_admin)
    yield url
    drop_database(pg_admin, url)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_ref(request, tmp_path):
    """What `--store` takes for each backend: a directory, or a PostgreSQL URL (the same tests run on both)."""
    if request.param == "sqlite":
        return str(tmp_path / "store")
    return request.getfixturevalue("pg_url")
