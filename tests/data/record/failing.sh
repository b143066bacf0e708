#!/bin/sh
# A program that fails before building any ggml graph, as llama.cpp does on a model it cannot load: a few lines
# of output, then exit status 3.
echo "loading model (args: $*)" >&2
echo "error: failed to open missing.gguf" >&2
echo "exiting"
exit 3
