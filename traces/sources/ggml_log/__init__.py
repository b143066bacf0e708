"""ggml AT_PRINTF logs of every generation: reader, splitter, memo, recovery."""
from alloctrace.traces.sources.ggml_log.import_log import GgmlLogSource, LogImport

SOURCE = GgmlLogSource()

__all__ = ["GgmlLogSource", "LogImport", "SOURCE"]
