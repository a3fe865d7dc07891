"""Builds many small dicts, keeps a tenth of them (scattered at random, or the first
tenth with "first" as third argument), prints pymalloc's own statistics
(sys._debugmallocstats, on stderr) and then idles, allocating nothing, so that censuses
taken meanwhile can be checked against those statistics."""
import random
import sys
import time

n = int(sys.argv[1])
random.seed(1)
objs = [{"id": i, "name": "x" * (i % 40)} for i in range(n)]
if sys.argv[3:] == ["first"]:
    keep = objs[: n // 10]
else:
    keep = [o for o in objs if random.random() < 0.1]
del objs
sys._debugmallocstats()
sys.stderr.flush()
print("kept", len(keep), flush=True)
time.sleep(float(sys.argv[2]))
