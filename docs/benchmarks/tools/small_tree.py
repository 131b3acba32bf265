#!/usr/bin/env python3
"""The small-file tree of the tar benchmarks: 3 000 files of 1-16 KiB of random bytes in 50
directories (seed 1, so every run writes the same sizes), under DIR/t.
    small_tree.py DIR"""
import os
import random
import sys

random.seed(1)
root = sys.argv[1]
for d in range(50):
    os.makedirs(f"{root}/t/d{d}", exist_ok=True)
    for f in range(60):
        with open(f"{root}/t/d{d}/f{f}", "wb") as out:
            out.write(os.urandom(random.randint(1024, 16384)))
