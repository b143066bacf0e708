#!/bin/sh
# A sweep point's program: with -c 1, a real ggml dry run ($PYTHON $SWEEP_PROGRAM) that ends at once; otherwise
# it runs until it is killed, with a child of its own, both noting their pids in $PIDS.
if [ "$2" = 1 ]; then exec "$PYTHON" "$SWEEP_PROGRAM" -c 128 -nh 2; fi
echo $$ >> "$PIDS"
sleep 300 &
echo $! >> "$PIDS"
wait
