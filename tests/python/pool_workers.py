"""A multiprocessing pool whose forked workers each build small dicts, keep a tenth and
idle a moment: every worker is a CPython process of its own, with its own arenas."""
import multiprocessing
import time


def work(n):
    objs = [{"i": i} for i in range(n)]
    keep = objs[::10]
    del objs
    time.sleep(1.0)
    return len(keep)


if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(pool.map(work, [200000, 200000]))
