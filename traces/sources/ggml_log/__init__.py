"""ggml AT_PRINTF logs of every generation: reader, splitter, recovery, and their fast paths.

Owns: `parse_log` (one line), `split` (graph walks; `split_fast`: repeated bodies once), `recover` (replay
through the model: offsets, consistency; `recover_fast`: identical walks recovered once), `detect` (which
generation wrote a log), `import_log` (GgmlLogSource, LogImport: the source), `fastlog.c` + `fastlog.py` (the
same pipeline compiled). Public names: SOURCE, GgmlLogSource, LogImport.
"""
from alloctrace.traces.sources.ggml_log.import_log import GgmlLogSource, LogImport

SOURCE = GgmlLogSource()

__all__ = ["GgmlLogSource", "LogImport", "SOURCE"]
