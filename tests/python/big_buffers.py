"""Builds many bytearrays of a few KiB (larger than pymalloc's 512 bytes: malloc's) and
keeps every tenth, then idles: glibc's heap is left with free space between the
survivors, not pymalloc's arenas."""
import sys
import time

n = int(sys.argv[1])
bufs = [bytearray(3000 + (i % 7) * 200) for i in range(n)]
keep = bufs[::10]
del bufs
print("kept", len(keep), flush=True)
time.sleep(float(sys.argv[2]))
