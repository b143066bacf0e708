#!/bin/sh
# A sweep point's program that runs until it is killed, with a child of its own; both note their pids in $PIDS.
echo $$ >> "$PIDS"
sleep 300 &
echo $! >> "$PIDS"
wait
