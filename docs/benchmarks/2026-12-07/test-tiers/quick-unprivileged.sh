#!/usr/bin/env bash
# The quick tier's tests run by an unprivileged user (nobody) on a machine where nothing of what
# the other tiers need is there: in a private mount namespace, etcd, etcdctl, fusermount3 and
# /dev/fuse are replaced by /dev/null, and no S3 server runs. The tests are built first by the
# caller (as root here), archived by nextest, and run from the archive; the architecture tests'
# `cargo tree` reads the toolchain and the crates' index through read-only binds of root's.
# Usage (from the repository, as root): docs/benchmarks/2026-12-07/test-tiers/quick-unprivileged.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
repo=$PWD
nextest=${CALM_CACHE_DIR:-$HOME/.cache/calm}/nextest/bin/cargo-nextest
export PATH="$(dirname "$nextest"):$PATH"
work=$(mktemp -d -t calm-quick-unpriv.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"
cargo nextest archive --workspace --locked --archive-file "$work/quick.tar.zst"
cargo nextest archive -p calm-lockfree --features loom --locked --archive-file "$work/loom.tar.zst"
cp "$nextest" "$work/cargo-nextest"
chmod 0644 "$work"/*.tar.zst
cargo_bin=$(dirname "$(rustup which cargo)")
unshare -m bash -s "$repo" "$work" "$cargo_bin" "$HOME" <<'INNER'
set -euo pipefail
repo=$1 work=$2 cargo_bin=$3 home=$4
mount --make-rprivate /
for hidden in /usr/bin/etcd /usr/bin/etcdctl /usr/bin/fusermount3 /dev/fuse; do
  [ -e "$hidden" ] && mount --bind /dev/null "$hidden"
done
# Root's home is closed to others: open a copy of its shape holding the toolchain and the
# crates' index read-only (cargo tree --offline reads them; its locks go to a writable upper).
mkdir -p "$work/root" "$work/upper" "$work/tmp"
chmod 1777 "$work/tmp"
mount --bind "$home" "$work/root"
mount -t tmpfs -o mode=0755 tmpfs "$home"
mkdir -p "$home/.rustup" "$home/.cargo"
mount --bind -o ro "$work/root/.rustup" "$home/.rustup"
mount -t tmpfs tmpfs "$work/upper"
mkdir -p "$work/upper/u" "$work/upper/w"
chmod 0777 "$work/upper/u"
mount -t overlay overlay -o "lowerdir=$work/root/.cargo,upperdir=$work/upper/u,workdir=$work/upper/w" "$home/.cargo"
echo "as $(setpriv --reuid=65534 --regid=65534 --clear-groups id -un): etcd, fusermount3 and /dev/fuse are $(stat -c %t:%T /usr/bin/etcd /usr/bin/fusermount3 /dev/fuse | tr '\n' ' ')(/dev/null)"
run() {
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    env -i PATH="$cargo_bin:/usr/bin:/bin" HOME="$work/tmp" CARGO_HOME="$home/.cargo" \
    RUSTUP_HOME="$home/.rustup" TMPDIR="$work/tmp" \
    "$work/cargo-nextest" nextest run --workspace-remap "$repo" --no-fail-fast "$@"
}
time run --archive-file "$work/quick.tar.zst" --profile quick
time run --archive-file "$work/loom.tar.zst" -E 'test(/::models::/)'
INNER
