"""`alloctrace record`: watch ggml's real graph allocator in an unmodified program.

`recorder.c` is preloaded into the program (built at install time; `build` finds it),
`run` starts the program under it, `stream` reads what it wrote, `plans`
puts every recorded plan through the `ggml-head` model and compares each real
placement with the model's, and `source` makes a recording one more trace source.
"""
