"""Bad input through the CLI: one clear error line, a non-zero exit, no traceback, store untouched."""
import gzip
import json
import os
import subprocess
import sys

import pytest
import zstandard


def cli(*args, cwd=None):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "alloctrace", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def snapshot(store):
    """Everything a user can see in the store, events included."""
    r = cli("list", "--store", store, "--json")
    assert r.returncode == 0, r.stderr
    out = []
    for t in json.loads(r.stdout)["traces"]:
        e = cli("export", t["id"], "--format", "jsonl", "--store", store)
        out.append((t, e.stdout))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory, fixtures):
    d = tmp_path_factory.mktemp("store")
    r = cli("import", fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log", "--store", d)
    assert r.returncode == 0, r.stderr
    return d


def _bad_files(tmp, fixtures):
    real = (fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log").read_bytes()
    files = {
        "random bytes": os.urandom(200_000),
        "empty": b"",
        "no allocator lines": b"hello world\nthis is a program\n" * 1000,
        "5 MB line": b"x" * (5 << 20) + b"\nmore text\n",
        "5 MB of allocator-like text": b"ggml_x: allocating (" * (5 << 18) + b"\n",
        "truncated gzip": gzip.compress(real)[:-40],
        "truncated zstd": zstandard.ZstdCompressor().compress(real)[:-40],
        "absurd numbers": real.replace(b"allocating norm (2048 bytes)",
                                       b"allocating norm (99999999999999999999999999 bytes)"),
        "absurd block": real.replace(b"- block -1", b"- block -123456789012345678901234567890", 1),
        "empty gzip": gzip.compress(b""),
        "JSON Lines nested 100,000 deep": b'{"type": "trace", "version": 1, "name": "x", "source": "jsonl"}\n'
                                          + b"[" * 100_000 + b"\n",
    }
    paths = {}
    for label, data in files.items():
        p = tmp / (label.replace(" ", "_") + ".log")
        p.write_bytes(data)
        paths[label] = p
    (tmp / "a_directory").mkdir()
    paths["directory"] = tmp / "a_directory"
    paths["missing path"] = tmp / "does-not-exist.log"
    return paths


def test_bad_inputs(store, tmp_path, fixtures):
    before = snapshot(store)
    for label, path in _bad_files(tmp_path, fixtures).items():
        r = cli("import", path, "--store", store)
        assert r.returncode != 0, label
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("alloctrace: error: "), (label, r.stderr[-500:])
        assert "Traceback" not in r.stderr, label
        assert r.stdout == "", label
    assert snapshot(store) == before


def test_one_bad_file_among_good_ones_stores_nothing(store, tmp_path, fixtures):
    before = snapshot(store)
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"\x00\x01" * 1000)
    r = cli("import", fixtures / "head-gallocr" / "harness_gallocr.AT.log", bad, "--store", store)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert snapshot(store) == before


def test_bad_references_and_options(store):
    for args in (["show", "zzzz"], ["show", "ffffffff"], ["rm", "12345678"], ["export", "nope", "--format", "csv"],
                 ["import", "x.log", "--generation", "ggml-1999"]):
        r = cli(*args, "--store", store)
        assert r.returncode != 0, args
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, args
