"""The API's byte budget per answer (server/graphs.py): a snapshot built to blow up an answer (one 20,000-frame
stack named by every entry) is a 413 naming the limit, not gigabytes; a small page still answers, and so does
the next request."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from hostile_inputs import shared_long_stack_snapshot

PROG = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from fastapi.testclient import TestClient
    from alloctrace.server.app import create_app
    with TestClient(create_app(store_dir=Path(sys.argv[2]))) as c:
        r = c.post("/api/torch/traces", files={"file": ("stack.pickle", Path(sys.argv[1]).read_bytes())})
        assert r.status_code == 201, r.text[:500]
        tid = r.json()["traces"][0]["id"]
        out = []
        for params in ({"frames": "true", "limit": 300}, {"frames": "true", "limit": 1}, {"limit": 300}):
            r = c.get(f"/api/torch/traces/{tid}/devices/0/entries", params=params)
            out.append([r.status_code, len(r.content), r.json().get("detail")])
        r = c.get("/api/traces")
        out.append([r.status_code, len(r.content), None])
        print(json.dumps(out))
""")


def test_an_answer_past_the_byte_budget_is_a_413_and_the_server_keeps_answering(tmp_path):
    path = shared_long_stack_snapshot(tmp_path / "stack.pickle")
    assert path.stat().st_size < 1 << 20
    p = subprocess.run([sys.executable, "-c", PROG, str(path), str(tmp_path / "s")], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, ALLOCTRACE_MAX_ANSWER_BYTES="64M"))
    assert p.returncode == 0, p.stderr[-3000:]
    big, small, plain, listing = json.loads(p.stdout.strip().splitlines()[-1])
    assert big[0] == 413 and big[1] < 1000, big  # 300 x 20,000 frames x 2 KB: 12 GB before
    assert big[2].startswith("the answer would carry more than 67,108,864 bytes (stack frames: "), big[2]
    assert big[2].endswith("ask for less (a smaller page, no frames) or raise ALLOCTRACE_MAX_ANSWER_BYTES"), big[2]
    assert small[0] == 200 and 20_000 * 2000 < small[1] < 64 << 20, small  # one stack: 41 MB
    assert plain[0] == 200 and listing[0] == 200, (plain, listing)
