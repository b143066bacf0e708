"""Pre-flight sweeps of real programs: a ggml program run once per combination of flag values, each run
recorded, so that every point's compute buffer is the exact one ggml made, before any real run.

`vary` reads `--vary FLAG=V1,V2` and puts the values into the program's arguments, `printed` reads the
sizes a program prints itself (llama.cpp's weights, KV cache and compute buffers), `prestart` starts a
sweep's first programs from the entry point before the command imports itself, `points` runs and stores
the points (-j programs at a time, one trace each, tagged with the sweep), `summary` sums a point up from
its trace, `laws` fits how each family grows with the varied flags, and `budget` finds the largest value
that fits a memory budget (`forkpool`: the workers that read points where the compiled replay is missing).
"""
