"""A peak knows a tensor by the event that placed it and its bytes, never by its name.

Real graphs name several tensors alike (ggml's `node_N` of two graphs' nodes, `Qcur-0` reshaped under its own
name, a recording's repeated layer names): the peak numbers them (`node_7 #2`), never lends one's recorded
shape (or the difference to it as "padding") to another, and accounts for every byte below the mark: live
tensors, bytes earlier tensors held, and bytes no logged tensor held (unattributed, with the amount).
"""
from __future__ import annotations

from alloctrace.allocator.events import Event
from alloctrace.commands.peak import report_lines
from alloctrace.traces.explain.peak import ggml_peak
from alloctrace.traces.explain.peak_fast import ggml_peak_events
from alloctrace.traces.explain.peak_shapes import annotate


def two_alike() -> list[Event]:
    """node_7 (ADD, 128 B at 0) and node_7 (MUL, 256 B at 192) both live at the peak; leaf_1's bytes are free
    again there; nothing ever held [448, 1024)."""
    return [Event("alloc", tensor="node_7", op="ADD", size=128, offset=0),
            Event("alloc", tensor="leaf_1", op="NONE", size=64, offset=128),
            Event("alloc", tensor="node_7", op="MUL", size=256, offset=192),
            Event("free", tensor="leaf_1", size=64, offset=128),
            Event("alloc", tensor="big", op="MUL_MAT", size=512, offset=1024)]


SHAPES = {"node_7": ["f32", [32], "ADD", []], "big": ["f32", [128], "MUL_MAT", ["node_7", "node_7"]]}


def peak_out(events):
    fast = ggml_peak_events(events)
    plain = ggml_peak(events)
    assert fast is not None and fast.to_json() == plain.to_json()  # both ways of computing agree
    return plain.to_json("t", 0)


def test_tensors_named_alike_stay_two_tensors_numbered_in_placing_order():
    out = peak_out(two_alike())
    assert out["peak"]["bytes"] == 1536 and out["peak"]["event"] == 4
    alike = sorted((t["offset"], t["bytes"], t["op"], t["occurrence"]) for t in out["tensors"] if t["tensor"] == "node_7")
    assert alike == [(0, 128, "ADD", 1), (192, 256, "MUL", 2)]
    assert next(t for t in out["tensors"] if t["tensor"] == "big")["occurrence"] is None
    fam = {f["family"]: f for f in out["families"]}
    assert (fam["ADD"]["first_node"], fam["MUL"]["first_node"]) == ("node_7 #1", "node_7 #2")
    text = "\n".join(report_lines({**out, "role": "eval"}, tensors=True))
    assert "node_7 #1" in text and "node_7 #2" in text


def test_a_shape_recorded_under_a_shared_name_is_lent_to_neither_tensor():
    out = annotate(peak_out(two_alike()), SHAPES)
    fam = {f["family"]: f for f in out["families"]}
    # 256 B against node_7's recorded f32 [32] (128 B) would read as "+128 B padding": it is another tensor
    assert fam["MUL"]["shape"] is None and fam["ADD"]["shape"] is None
    assert fam["big"]["shape"]["formula"] == "f32 [128]: 4·128 = 512 B"
    labels = {t["offset"]: t["label"] for t in out["tensors"]}
    assert labels[0] == "node_7 #1" and labels[192] == "node_7 #2"
    acc = out["accounting"]
    assert (acc["padding_bytes"], acc["padding_known_for"]) == (0, 1)  # only big's own shape is known
    text = "\n".join(report_lines({**out, "role": "eval"}))
    assert "B padding)" not in text and "(0 B of it allocator padding, from the shapes of 1 tensors)" in text


def test_every_byte_below_the_mark_is_a_tensor_a_freed_hole_or_unattributed():
    out = peak_out(two_alike())
    acc = out["accounting"]
    assert acc == {"bytes": 1536, "tensors": 3, "tensor_bytes": 896, "freed_bytes": 64, "unattributed_bytes": 576}
    holes = {h["offset"]: h for h in out["fragmentation"]["holes"]}
    assert holes[128]["unattributed"] == 0 and [x["tensor"] for x in holes[128]["freed"]] == ["leaf_1"]
    assert holes[448]["unattributed"] == 576 and holes[448]["freed"] == []
    text = "\n".join(report_lines({**out, "role": "eval"}))
    assert "576 B unattributed" in text and "(padding)" not in text
    assert "accounted: 896 B in 3 live tensors + 64 B free after earlier tensors + 576 B unattributed = 1,536 B" in text


def test_a_hole_partly_held_before_says_how_much_nothing_held():
    events = [Event("alloc", tensor="a", op="ADD", size=64, offset=0),
              Event("alloc", tensor="b", op="ADD", size=64, offset=64),
              Event("free", tensor="b", size=64, offset=64),
              Event("alloc", tensor="c", op="ADD", size=64, offset=256)]
    out = peak_out(events)
    (hole,) = out["fragmentation"]["holes"]
    assert (hole["offset"], hole["bytes"], hole["unattributed"]) == (64, 192, 128)
    assert "; 128 B of it by no logged tensor (unattributed)" in "\n".join(report_lines({**out, "role": "eval"}))


def test_the_same_name_in_two_plans_is_one_tensor_replanned_not_two():
    events = [Event("alloc", tensor="x", op="ADD", size=64, offset=0),
              Event("realloc", reason="graph changed"),
              Event("alloc", tensor="x", op="ADD", size=128, offset=0),
              Event("alloc", tensor="y", op="ADD", size=64, offset=128)]
    out = peak_out(events)
    assert [(t["tensor"], t["occurrence"]) for t in out["tensors"]] == [("x", None), ("y", None)]
    assert out["families"][0]["first_node"] == "x"
