"""Small utilities the rooms of traces/ share; none of them imports anything of traces/ but `errors`.

Owns: `cbuild` (compile a C fast path with the system compiler, at install time or first use), `gcpause`
(pause the cycle collector around a burst of small objects), `lru` (the LRU of built values the server
caches in), `progress` (the import's progress line), `sizes` (the one byte-size formatter, `fmt_bytes`), `verbose` (facts and stage times for -v),
`textsafe` (text from a trace made safe to print or show).
"""
