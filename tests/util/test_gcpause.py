"""traces/util/gcpause.py's pause of a command's start: the collector off from `start_paused` to `start_done`,
then on again with what existed frozen out of its passes; left as it was where it was off to begin with, and
off for the bulk work paused after it as before."""
from __future__ import annotations

import subprocess
import sys

# each case in a fresh interpreter: freezing is for the whole process, not for a test runner's
CASE = """import gc, sys
from alloctrace.traces.util import gcpause
if sys.argv[1] == "off":
    gc.disable()
gcpause.start_paused()
during = gc.isenabled()
gcpause.start_done()
after, frozen = gc.isenabled(), gc.get_freeze_count() > 0
with gcpause.gc_paused():
    inside = gc.isenabled()
print(during, after, frozen, inside, gc.isenabled())
"""


def case(how: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", CASE, how], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_the_start_is_paused_then_the_collector_runs_again_past_what_it_made():
    assert case("on") == ["False", "True", "True", "False", "True"]


def test_a_collector_that_was_off_stays_off():
    assert case("off") == ["False", "False", "False", "False", "False"]
