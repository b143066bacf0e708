"""A PyTorch trace as JSON Lines that holds everything its stored rows hold, so `alloctrace import` stores it back
with every view equal (traces/sources/torch/jsonl.py reads it; docs/torch.md lists the lines).

One line per thing, readable with jq or pandas: a `trace` header (format and version, id, name, tags, extra),
then per device a `device` line (counts, settings, the facts the import computed), its string table in
`strings` lines, `frame` and `stack` lines (the stack table: stack ids are what entries, segments and blocks
name), one `entry` line per trace entry, `segment` lines each followed by its `block` lines (the snapshot's
state at its end: where a wrapped or late trace starts from) and `annotation` lines. Texts are written as
text; the string table keeps their codes, so the stored bytes come back identical (the same checksums).
"""
from __future__ import annotations

import json
from typing import IO

from alloctrace.traces.errors import UserError
from alloctrace.traces.store.torch_stored import (ACTIONS, BLOCK_STATES, JSONL_FORMAT, JSONL_VERSION, LAYOUT, OOM,
                                                   device_tables)

STRINGS_PER_LINE = 1000  # a string-table line holds this many texts (and under 256 KiB of them)
STRING_LINE_BYTES = 256 << 10


def write_jsonl(store, tid: str, out: IO[str]) -> None:
    """Trace `tid` (a PyTorch one) as JSON Lines; a UserError for a device stored in a layout this format lacks."""
    meta = store.meta(tid)
    out.write(json.dumps({"type": "trace", "format": JSONL_FORMAT, "version": JSONL_VERSION, "id": tid,
                          "name": meta.name, "source": meta.source, "generation": meta.generation,
                          "profile": meta.profile, "created": meta.created, "tags": meta.tags,
                          "extra": meta.extra}) + "\n")
    for g in store.summary(tid)["graphs"]:
        cols, strings, extra = device_tables(store, tid, g["index"])
        _check_layout(tid, g["index"], cols)
        for line in device_lines(g, cols, strings, extra):
            out.write(line)


def _check_layout(tid: str, index: int, cols: dict) -> None:
    want = [(k, t) for k, t in LAYOUT if k != "device_free" or k in cols]
    have = [(k, v.dtype.str) for k, v in cols.items()]
    if have != want:
        raise UserError(f"trace {tid} device {index}: stored with columns this export does not know "
                        f"({', '.join(sorted({k for k, _ in have} ^ {k for k, _ in want})) or 'their order'}); "
                        "import its snapshot again")


def device_lines(g: dict, cols: dict, strings: list[str], extra: dict):
    """The lines of one stored device row (`g`: its summary row), each ending in a newline."""
    d = g["index"]
    dumps = json.dumps
    text = lambda code: None if code < 0 else strings[code]  # noqa: E731
    seg_block0 = cols["seg_block0"].tolist()
    yield dumps({"type": "device", "device": d, "role": g["role"], "n_entries": len(cols["action"]),
                 "n_strings": len(strings), "n_frames": len(cols["frame_name"]),
                 "n_stacks": len(cols["stack_offsets"]) - 1, "n_segments": len(cols["seg_address"]),
                 "n_blocks": len(cols["blk_address"]), "n_annotations": len(cols["ann_stage"]),
                 "peak_requested": g["max_size"], "peak_reserved": g["buffer_size"], "oom": g["oom"],
                 "consistent": g["consistent"], "extra": extra}) + "\n"
    chunk: list[str] = []
    size = 0
    for s in strings:
        if chunk and (len(chunk) == STRINGS_PER_LINE or size + len(s) > STRING_LINE_BYTES):
            yield dumps({"type": "strings", "device": d, "values": chunk}) + "\n"
            chunk, size = [], 0
        chunk.append(s)
        size += len(s)
    if chunk:
        yield dumps({"type": "strings", "device": d, "values": chunk}) + "\n"
    for k, (name, file, line) in enumerate(zip(cols["frame_name"].tolist(), cols["frame_file"].tolist(),
                                               cols["frame_line"].tolist())):
        yield dumps({"type": "frame", "device": d, "id": k, "name": strings[name], "filename": strings[file],
                     "line": line}) + "\n"
    offsets, frames = cols["stack_offsets"].tolist(), cols["stack_frames"]
    for s in range(len(offsets) - 1):
        yield dumps({"type": "stack", "device": d, "id": s, "frames": frames[offsets[s]:offsets[s + 1]].tolist()}) + "\n"
    free = cols["device_free"].tolist() if "device_free" in cols else None
    names = ("action", "addr", "size", "stream", "time_us", "stack", "meta", "compile")
    quoted = [dumps(x) for x in strings]  # each text as JSON once: entries repeat a few of them many times
    head = f'{{"type": "entry", "device": {d}, "i": '
    for k, (a, addr, size_, stream, t, stack, m, c) in enumerate(zip(*(cols[n].tolist() for n in names))):
        line = (f'{head}{k}, "action": "{ACTIONS[a]}", "addr": {addr}, "size": {size_}, "stream": {stream}, '
                f'"time_us": {t}, "stack": {stack}')  # what json.dumps writes for the dict, at a fraction of its cost
        if m >= 0:
            line += f', "user_metadata": {quoted[m]}'
        if c >= 0:
            line += f', "compile_context": {quoted[c]}'
        if free is not None and (a == OOM or free[k] != -1):
            line += f', "device_free": {free[k]}'
        yield line + "}\n"
    seg = {k: cols[f"seg_{k}"].tolist() for k in ("address", "total", "allocated", "active", "requested", "stream",
                                                   "small", "pool_a", "pool_b", "expandable", "stack")}
    blk = {k: cols[f"blk_{k}"].tolist() for k in ("address", "size", "requested", "state", "stack")}
    for k in range(len(seg["address"])):
        yield dumps({"type": "segment", "device": d, "id": k, "address": seg["address"][k],
                     "total_size": seg["total"][k], "allocated_size": seg["allocated"][k],
                     "active_size": seg["active"][k], "requested_size": seg["requested"][k],
                     "stream": seg["stream"][k], "segment_type": "small" if seg["small"][k] else "large",
                     "segment_pool_id": [seg["pool_a"][k], seg["pool_b"][k]],
                     "is_expandable": bool(seg["expandable"][k]), "stack": seg["stack"][k],
                     "n_blocks": seg_block0[k + 1] - seg_block0[k]}) + "\n"
        for j in range(seg_block0[k], seg_block0[k + 1]):
            state = blk["state"][j]
            yield dumps({"type": "block", "device": d, "segment": k, "address": blk["address"][j],
                         "size": blk["size"][j], "requested_size": blk["requested"][j],
                         "state": BLOCK_STATES[state] if 0 <= state < len(BLOCK_STATES) else text(state - 100),
                         "stack": blk["stack"][j]}) + "\n"
    for stage, name, t in zip(cols["ann_stage"].tolist(), cols["ann_name"].tolist(), cols["ann_time"].tolist()):
        yield dumps({"type": "annotation", "device": d, "stage": "END" if stage else "START", "name": strings[name],
                     "time_us": t}) + "\n"
