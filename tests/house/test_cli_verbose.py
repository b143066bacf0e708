"""`-v/--verbose`, before or after any command: at the end, on stderr, the store, budgets, reader, generation
profile and each stage's time; without it nothing changes. The server logs the same at DEBUG."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.util.verbose import hide_password

LOG = Path(__file__).resolve().parents[1] / "data" / "ggml-real" / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"


def _run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_import_then_list_and_peak_say_what_ran(tmp_path, capsys):
    store = tmp_path / "s"
    rc, out, err = _run(capsys, ["-v", "import", str(LOG), "--store", str(store), "--json"])
    assert rc == 0
    assert f"alloctrace: store: sqlite {store}/alloctrace.db\n" in err
    assert re.search(r"^alloctrace: ggml logs: the (compiled|pure Python) path", err, re.M)  # the reader
    assert re.search(r"^alloctrace: budgets: max_decompressed=.*max_cpu_s=900\.0.*max_graphs=100000", err, re.M)
    assert re.search(r"^alloctrace: stage import: \d+\.\d ms$", err, re.M)
    tid = json.loads(out)["traces"][0]["id"]
    for cmd in (["list"], ["peak", f"{tid}:0"]):
        quiet = _run(capsys, [*cmd, "--store", str(store)])
        loud = _run(capsys, [*cmd, "--store", str(store), "-v"])
        assert quiet[0] == loud[0] == 0 and quiet[1] == loud[1]  # stdout is the same
        assert "alloctrace: store:" not in quiet[2] and "stage" not in quiet[2]
        assert f"alloctrace: store: sqlite {store}/alloctrace.db\n" in loud[2]
        assert re.search(rf"^alloctrace: stage {cmd[0]}: \d+\.\d ms$", loud[2], re.M)
        assert re.search(r"^alloctrace: stage open store: \d+\.\d ms$", loud[2], re.M)


def test_replay_names_the_generation_profile(tmp_path, capsys):
    rc, _, err = _run(capsys, ["replay", "-v", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-28",
                               "--store", str(tmp_path / "s")])
    assert rc == 0
    assert "alloctrace: generation profile: ggml-2023-08-28 (preset gpt2-tiny, layout linux)\n" in err


def test_a_failing_command_still_says_what_ran(tmp_path, capsys):
    rc, _, err = _run(capsys, ["-v", "list", "--store", str(tmp_path / "none")])
    assert rc == 2 and err.startswith("alloctrace: error: no store at")
    assert re.search(r"^alloctrace: stage list: \d+\.\d ms$", err, re.M)


def test_a_store_url_is_printed_without_its_password():
    assert hide_password("postgresql://bob:s3cret@db.example:5432/traces") == "postgresql://bob:***@db.example:5432/traces"
    assert hide_password("postgresql://db.example/traces") == "postgresql://db.example/traces"
    assert hide_password("host=db user=bob password=s3cret dbname=t") == "host=db user=bob password=*** dbname=t"


def test_the_server_logs_the_same_at_debug(tmp_path, caplog):
    with TestClient(create_app(store_dir=tmp_path / "s")) as c:
        with caplog.at_level(logging.DEBUG, logger="alloctrace.server"):
            assert c.get("/api/traces").status_code == 200
        lines = [r.getMessage() for r in caplog.records if r.name == "alloctrace.server"]
        assert f"store: sqlite {tmp_path}/s/alloctrace.db" in lines
        assert any(re.fullmatch(r"stage GET /api/traces: \d+\.\d ms", m) for m in lines)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="alloctrace.server"):
            assert c.get("/api/traces").status_code == 200
        assert not [r for r in caplog.records if r.name == "alloctrace.server"]
