"""A sweep point's program that deadlocks on its first run only. Its first run (no file $MARKER-ARGS yet, one
per point's arguments) makes that file and deadlocks as deadlocked.py does: three threads each waiting on a
lock nobody releases. A later run finds the file and becomes a real ggml dry run ($SWEEP_PROGRAM with the
same arguments). Every run adds a line to the file, so a test can count them."""
import os
import sys
import threading

marker = os.environ["MARKER"] + "-" + "_".join(a.strip("-") for a in sys.argv[1:])
first = not os.path.exists(marker)
with open(marker, "a") as f:
    f.write("run\n")
if first:
    held = threading.Lock()
    held.acquire()
    for _ in range(2):
        threading.Thread(target=held.acquire, daemon=True).start()
    held.acquire()
os.execv(sys.executable, [sys.executable, os.environ["SWEEP_PROGRAM"], *sys.argv[1:]])
