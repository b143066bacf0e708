"""ggml AT_PRINTF logs of every generation: reader, splitter, memo, recovery."""
