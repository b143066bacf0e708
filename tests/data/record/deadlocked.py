"""A sweep point's program that deadlocks: the main thread and two others each wait on a lock nobody will
release, so all three threads sit blocked in the futex system call until the program is killed."""
import threading

held = threading.Lock()
held.acquire()
for _ in range(2):
    threading.Thread(target=held.acquire, daemon=True).start()
held.acquire()
