"""Metal's execution order: the concurrency reorder llama.cpp handed to ggml-alloc as parse_seq."""
from .concurrency import MAX_CONCUR_2023, ConcurrencyReport, find_concurrency, report

__all__ = ["MAX_CONCUR_2023", "ConcurrencyReport", "find_concurrency", "report"]
