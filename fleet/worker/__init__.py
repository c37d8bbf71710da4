"""What runs in a worker process and in the fork server that makes them: the zygote, a
worker's run loop, its I/O lane, what it does before its first unit, the Executor's
call handler, and the codec both ends of a task or result go through. Nothing here
imports the supervisor's rooms (tests/test_rooms.py pins it)."""
