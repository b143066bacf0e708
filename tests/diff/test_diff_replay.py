"""The 70B Metal failure of Aug 2023, replayed on the model: measure and eval part before the OOM."""
from alloctrace.traces.replay.run import replay
from alloctrace.traces.diff.graphs import diff_graphs


def test_llama2_70b_metal_diverges_before_the_oom():
    r = replay("llama2-70b", "ggml-2023-08-16", n_ctx=512, n_batch=512, metal_concurrency=True)
    oom = r.eval.alloc.failed
    assert oom is not None and oom.kind == "oom"
    d = diff_graphs(r.measure.events, r.eval.events, {"role": "measure", "max_size": r.measure.max_size},
                    {"role": "eval", "buffer_size": r.eval.buffer_size, "max_size": r.eval.max_size})
    fd = d.first_divergence
    assert fd is not None
    explained = d.b["oom"]
    assert (explained["tensor"], explained["needed"], explained["largest_free"]) == (oom.tensor, oom.needed,
                                                                                    oom.largest)
    assert explained["total_free"] >= oom.needed > explained["largest_free"]
    # the divergence is an earlier decision: several placements before the one that failed
    placed_before_oom = [e for e in r.eval.events[fd["event_b"]:explained["event"]] if e.kind in ("alloc", "reuse")]
    assert fd["event_b"] < explained["event"] and len(placed_before_oom) >= 3
    assert fd["tensor"] != oom.tensor and fd["a"]["block"] != fd["b"]["block"]
    # a tensor that is live at the failure and keeps free blocks apart was placed after the divergence
    stranders = [t["tensor"] for g in explained["stranded_by"] for t in g["live"]]
    placed_after = {e.tensor for e in r.eval.events[fd["event_b"]:explained["event"]] if e.kind == "alloc"}
    assert placed_after & set(stranders)
    # measure, at the same aligned point, placed the tensor that eval could not
    assert explained["other"]["tensor"] == oom.tensor and explained["other"]["offset"] is not None
