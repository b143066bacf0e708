"""How each built-in source knows its input from the first decompressed bytes, without importing the source.

Importing a source costs what reading with it needs (the PyTorch source alone pulls in numpy, the caching
allocator's state and the unpickler: about a tenth of a second), while telling inputs apart needs a few bytes
compared. So the registry asks these, and imports only the source that said yes (`LazySource`)."""
from __future__ import annotations

import re
from alloctrace.allocator.record_class import record_class
from importlib import import_module

JSONL_HEADER = re.compile(rb'\A\s*\{\s*"type"\s*:\s*"trace"')
TORCH_JSONL_HEADER = re.compile(rb'\A\s*\{\s*"type"\s*:\s*"trace"\s*,\s*"format"\s*:\s*"alloctrace-torch-jsonl"')
RECORDING_MAGIC = b"ATREC 1"  # the first bytes of a recording (record/stream.py writes them)


def jsonl(head: bytes) -> bool:
    """Our own JSON Lines export: its first object is the trace header."""
    return JSONL_HEADER.match(head) is not None


def torch_jsonl(head: bytes) -> bool:
    """A PyTorch trace's JSON Lines export (traces/export/torch_jsonl.py): its header names that format first."""
    return TORCH_JSONL_HEADER.match(head) is not None


def torch_snapshot(head: bytes) -> bool:
    """A pickle (protocol 2+) whose top-level dict starts with a snapshot's keys."""
    return head[:1] == b"\x80" and (b"segments" in head[:256] or b"device_traces" in head[:256])


def recording(head: bytes) -> bool:
    """A recording of `alloctrace record`."""
    return head.startswith(RECORDING_MAGIC)


@record_class(frozen=True)
class LazySource:
    """A built-in source known by its name and sniffer; `load()` imports the module that reads it."""
    name: str
    sniffer: object
    module: str

    def sniff(self, head: bytes) -> bool:
        return self.sniffer(head)

    def load(self):
        return import_module(self.module).SOURCE


BUILTINS = (LazySource("jsonl", jsonl, "alloctrace.traces.sources.jsonl"),  # asked after the torch one below
            LazySource("torch-jsonl", torch_jsonl, "alloctrace.traces.sources.torch.jsonl"),
            LazySource("torch", torch_snapshot, "alloctrace.traces.sources.torch.source"),
            LazySource("recording", recording, "alloctrace.traces.sources.record.source"))
