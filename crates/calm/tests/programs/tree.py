"""A tree of every kind of node, and a description of a tree to compare two by.

  make DIR SEED FILES   makes under DIR directories, FILES files of sizes from 0 to a few MiB
                        (random bytes from SEED), symlinks, hard links, xattrs, modes and owners;
                        prints "made N"
  describe DIR          prints one line per node below DIR, sorted: path, kind, mode, owner,
                        size, links, symlink target or the sha256 of the bytes, xattrs
"""

import hashlib
import os
import random
import sys


def make(top, seed, files):
    rng = random.Random(seed)
    dirs = [top]
    made = 0
    for d in range(max(1, files // 50)):
        path = os.path.join(rng.choice(dirs), f"d{d}")
        os.mkdir(path, 0o755)
        dirs.append(path)
        made += 1
    sizes = [0, 1, 100, 4096, 65536, 70000, 1 << 20, (4 << 20) + 3]
    for f in range(files):
        path = os.path.join(rng.choice(dirs), f"f{f}")
        size = sizes[f % len(sizes)] if f % 10 == 0 else rng.randrange(0, 3000)
        with open(path, "wb") as out:
            out.write(rng.randbytes(size))
        os.chmod(path, 0o600 + (f % 3) * 0o40)
        if f % 7 == 0:
            os.chown(path, 1000 + f % 5, 1000 + f % 3)
        if f % 11 == 0:
            os.setxattr(path, "user.seed", f"{seed}:{f}".encode())
        if f % 13 == 0:
            os.symlink(os.path.basename(path), path + ".link")
            made += 1
        if f % 17 == 0:
            os.link(path, path + ".hard")
            made += 1
        made += 1
    print(f"made {made}")


def describe(top):
    lines = []
    for root, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(root, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, top)
            kind = "l" if os.path.islink(path) else ("d" if os.path.isdir(path) else "f")
            if kind == "l":
                what = os.readlink(path)
            elif kind == "f":
                with open(path, "rb") as f:
                    what = hashlib.sha256(f.read()).hexdigest()
            else:
                what = ""
            xattrs = ""
            if kind != "l":
                names = sorted(n for n in os.listxattr(path) if n.startswith("user."))
                xattrs = ",".join(f"{n}={os.getxattr(path, n).hex()}" for n in names)
            size = st.st_size if kind != "d" else 0
            lines.append(
                f"{rel} {kind} {st.st_mode & 0o7777:o} {st.st_uid}:{st.st_gid} "
                f"{size} {st.st_nlink if kind == 'f' else 0} {what} {xattrs}"
            )
    lines.sort()
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "describe":
        describe(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
