"""Property-based requests from the server's own OpenAPI schema never get a 5xx."""
from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from test_server import LEGACY_HARNESS, LiveServer, upload

MAX_EXAMPLES = 20


@pytest.fixture(scope="module")
def live(tmp_path_factory, fixtures):
    with LiveServer(tmp_path_factory.mktemp("schema"), max_upload_bytes=256 * 1024) as srv:
        with srv.client() as c:
            assert upload(c, fixtures / LEGACY_HARNESS).status_code == 201
        yield srv


def operations(schema):
    out = []
    for result in schema.get_all_operations():
        out.append(result.ok())
    return out


def test_schema_documents_every_api_route(live):
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    labels = {op.label for op in operations(schema)}
    assert {"POST /api/traces", "GET /api/traces", "GET /api/traces/{trace_id}", "DELETE /api/traces/{trace_id}",
            "GET /api/traces/{trace_id}/graphs/{g}/events", "GET /api/traces/{trace_id}/graphs/{g}/memory-map",
            "GET /api/traces/{trace_id}/graphs/{g}/state", "GET /api/diff", "POST /api/replay",
            "GET /api/presets"} <= labels


def variants(op, trace_id):
    """Random valid requests, invalid ones, and valid ones aimed at a stored trace's graphs."""
    yield "positive", op.as_strategy(GenerationMode.POSITIVE)
    yield "negative", op.as_strategy(GenerationMode.NEGATIVE)
    if "{trace_id}" in op.path and op.method.upper() != "DELETE":
        params = {"trace_id": trace_id, "g": 1} if "{g}" in op.path else {"trace_id": trace_id}
        yield "stored", op.as_strategy(GenerationMode.POSITIVE, path_parameters=params)
    if op.path == "/api/diff":
        yield "stored", op.as_strategy(GenerationMode.POSITIVE, query={"a": f"{trace_id}:0", "b": f"{trace_id}:1"})


def test_no_request_from_the_schema_gets_a_server_error(live):
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    with live.client() as c:
        [trace] = c.get("/api/traces").json()["traces"][:1]
    failures, statuses = [], Counter()
    for op in operations(schema):
        for mode, strategy in variants(op, trace["id"]):
            @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=strategy)
            def probe(case):
                response = case.call(base_url=live.url, timeout=60)
                statuses[(op.label, mode, response.status_code // 100)] += 1
                if response.status_code >= 500:
                    failures.append((op.label, mode, case.path_parameters, case.query, response.status_code,
                                     response.text[:300]))

            try:
                probe()
            except Unsatisfiable:
                assert mode == "negative"  # nothing about this operation can be made invalid
    assert not failures, failures[:5]
    # the run reached real answers, not only validation errors
    for label in ("GET /api/traces/{trace_id}/graphs/{g}/memory-map", "GET /api/traces/{trace_id}/graphs/{g}/events",
                  "GET /api/traces/{trace_id}/graphs/{g}/state", "GET /api/diff", "GET /api/traces/{trace_id}"):
        assert statuses[(label, "stored", 2)] > 0, label
    assert sum(v for (_, mode, _), v in statuses.items() if mode == "negative") > 0
