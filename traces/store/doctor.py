"""Read every stored trace back, as the commands and the server would, and say what is damaged: what
`alloctrace doctor` lists and, asked to, deletes. A damaged trace is deleted whole; a graph's damaged
derived rows (state checkpoints, memory-map lifetimes) are only dropped, as they are made again from its
columns. Damage is only what the stored bytes positively show (a checksum or a decoding that fails); a read
that runs out of memory (or of anything else) says nothing about the bytes: that trace is "could not check",
never deleted."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .damage import Damaged, DerivedDamaged, OutOfMemory
from .store import NotFound


@dataclass
class Damage:
    trace: str
    name: str
    graph: int | None
    problem: str  # the Damaged message
    derived: bool  # only derived rows: dropped, not the trace

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Unchecked:
    trace: str
    name: str
    graph: int | None
    reason: str  # "out of memory", ...

    def to_dict(self) -> dict:
        return asdict(self)


def examine(store) -> tuple[int, list[Damage], list[Unchecked]]:
    """(traces examined, what is damaged, what could not be checked), trace by trace."""
    found: list[Damage] = []
    unchecked: list[Unchecked] = []
    listed = {s["id"]: s for s in store.list()}  # a listing never fails on one trace's damage
    for tid, summary in listed.items():
        name = summary["name"]

        def note(e: Damaged, g=None):
            found.append(Damage(tid, name, e.graph if e.graph is not None else g, str(e),
                                isinstance(e, DerivedDamaged)))

        def could_not(g=None):
            unchecked.append(Unchecked(tid, name, g, "out of memory"))
        try:
            meta = store.meta(tid)
            store.summary(tid)
            extras = store.graph_extras(tid)
        except Damaged as e:
            note(e)
            continue
        except (OutOfMemory, MemoryError):
            could_not()
            continue
        except NotFound:
            continue  # deleted meanwhile
        for g in sorted(extras):
            try:
                if meta.source == "torch":
                    store._raw(tid, g)
                else:
                    store.graph(tid, g)
            except Damaged as e:
                note(e, g)
                continue
            except (OutOfMemory, MemoryError):
                could_not(g)
                continue
            for check in (_checkpoints, _lifetimes):
                try:
                    check(store, tid, g)
                except DerivedDamaged as e:
                    note(e, g)
                except (OutOfMemory, MemoryError):
                    could_not(g)
    return len(listed), found, unchecked


def _checkpoints(store, tid: str, g: int):
    saved = store.saved_states(tid, g)
    for event in (saved.marks if saved else []):
        saved.load(event)


def _lifetimes(store, tid: str, g: int):
    store.saved_lifetimes(tid, g)


def repair(store, damage: list[Damage]) -> tuple[list[str], int]:
    """Delete each damaged trace, drop each damaged derived row set; (traces deleted, row sets dropped).
    Only `Damage` (bytes positively damaged) is passed here, never what could not be checked."""
    whole = sorted({d.trace for d in damage if not d.derived})
    for tid in whole:
        store.delete(tid)
    dropped = 0
    for d in damage:
        if d.derived and d.trace not in whole:
            table = "memmap_lod" if "memory-map" in d.problem else "state_checkpoints"
            store.drop_derived(d.trace, d.graph, table)
            dropped += 1
    return whole, dropped
