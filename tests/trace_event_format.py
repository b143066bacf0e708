"""The Trace Event Format's rules (the JSON Object Format Chrome's about:tracing and Perfetto read), as a
checker for exported files: every violation is listed, so a test can assert there are none."""
from __future__ import annotations

from numbers import Real

PHASES = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "M", "R", "c", "(", ")"}
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
UNITS = {"ms", "ns"}


def violations(doc) -> list[str]:
    bad: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["the top level is not an object with a traceEvents array"]
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in UNITS:
        bad.append(f"displayTimeUnit {doc['displayTimeUnit']!r} is not ms or ns")
    open_async: dict = {}
    stacks: dict = {}
    for i, ev in enumerate(doc["traceEvents"]):
        where = f"event {i}"
        if not isinstance(ev, dict):
            bad.append(f"{where}: not an object")
            continue
        ph = ev.get("ph")
        if ph not in PHASES:
            bad.append(f"{where}: unknown phase {ph!r}")
            continue
        if not isinstance(ev.get("pid"), int):
            bad.append(f"{where}: pid is not an integer")
        if "tid" in ev and not isinstance(ev["tid"], int):
            bad.append(f"{where}: tid is not an integer")
        if "args" in ev and not isinstance(ev["args"], dict):
            bad.append(f"{where}: args is not an object")
        if ph == "M":
            if ev.get("name") not in METADATA or not isinstance(ev.get("args"), dict):
                bad.append(f"{where}: metadata event {ev.get('name')!r} without a known name and args")
            elif ev["name"].endswith("_name") and not isinstance(ev["args"].get("name"), str):
                bad.append(f"{where}: {ev['name']} without args.name")
            if ev["name"].startswith("thread_") and "tid" not in ev:
                bad.append(f"{where}: {ev['name']} without tid")
            continue
        ts = ev.get("ts")
        if not isinstance(ts, Real) or isinstance(ts, bool) or ts < 0:
            bad.append(f"{where}: ts is not a non-negative number")
            continue
        if not isinstance(ev.get("name"), str):
            bad.append(f"{where}: no name")
        if ph == "X" and (not isinstance(ev.get("dur"), Real) or ev["dur"] < 0):
            bad.append(f"{where}: complete event without a non-negative dur")
        if ph in ("i", "I") and ev.get("s", "t") not in ("g", "p", "t"):
            bad.append(f"{where}: instant event scope {ev.get('s')!r}")
        if ph == "C" and (not ev.get("args") or not all(isinstance(v, Real) for v in ev["args"].values())):
            bad.append(f"{where}: counter without numeric args")
        if ph in ("b", "n", "e"):
            if "id" not in ev and "id2" not in ev or not isinstance(ev.get("cat"), str):
                bad.append(f"{where}: async event without id and cat")
                continue
            key = (ev["pid"], ev["cat"], str(ev.get("id", ev.get("id2"))))
            if ph == "b":
                if key in open_async:
                    bad.append(f"{where}: async {key} begins twice")
                open_async[key] = ts
            elif ph == "e":
                start = open_async.pop(key, None)
                if start is None:
                    bad.append(f"{where}: async {key} ends without a begin")
                elif ts < start:
                    bad.append(f"{where}: async {key} ends before it begins")
        if ph in ("B", "E"):
            st = stacks.setdefault((ev["pid"], ev.get("tid")), [])
            if ph == "B":
                st.append(ts)
            elif not st:
                bad.append(f"{where}: E without B on its thread")
            else:
                st.pop()
    bad += [f"async {k} never ends" for k in open_async]
    bad += [f"thread {k}: {len(v)} B without E" for k, v in stacks.items() if v]
    return bad
