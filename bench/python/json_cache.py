"""A service-like CPython load: parses JSON requests, keeps a bounded cache of parsed
documents (an LRU dict with churn), and builds small response dicts that die at once.
Usage: json_cache.py REQUESTS"""
import json
import random
import sys
from collections import OrderedDict

requests = int(sys.argv[1])
random.seed(7)
cache = OrderedDict()
CACHE_SIZE = 20000
served = 0
for i in range(requests):
    doc = json.dumps({
        "user": random.randrange(100000),
        "items": [{"id": j, "name": "item%d" % j, "price": j * 1.5} for j in range(random.randrange(1, 8))],
        "note": "x" * random.randrange(0, 200),
    })
    parsed = json.loads(doc)
    key = parsed["user"]
    cache[key] = parsed
    cache.move_to_end(key)
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    response = {"ok": True, "count": len(parsed["items"]), "total": sum(it["price"] for it in parsed["items"])}
    served += response["count"]
print("served", served, "cached", len(cache))
