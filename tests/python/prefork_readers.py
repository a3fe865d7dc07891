"""A pre-fork parent builds many small objects, then forks workers that share them.

usage: prefork_readers.py [--wait] N
A "reader" worker only reads every object (which writes their reference counts and so
copies their pages); an "idle" worker touches none of them. Each prints "reader PID" or
"idle PID" once it has done its part, then holds still for a moment (or, with --wait,
until its stdin closes) so that its memory can be looked at.
"""

import gc
import os
import sys
import time

wait = "--wait" in sys.argv
n = int([a for a in sys.argv[1:] if not a.startswith("--")][0])

# Small dicts and tuples: pymalloc's objects, in its arenas.
table = [{"k": i, "v": (i, i + 1)} for i in range(n)]
gc.collect()


def hold():
    if wait:
        sys.stdin.read()
    else:
        time.sleep(1.2)


def reader():
    total = 0
    for d in table:
        total += d["k"] + d["v"][1]
    print(f"reader {os.getpid()} {total}", flush=True)
    hold()


def idle():
    print(f"idle {os.getpid()}", flush=True)
    hold()


children = []
for role in (reader, idle):
    pid = os.fork()
    if pid == 0:
        role()
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
