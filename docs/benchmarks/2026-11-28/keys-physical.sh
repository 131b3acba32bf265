# usage: keys-physical.sh BIN N  -> as keys.sh, but the compaction waits until etcd has removed the old revisions (--physical) before the defragmentation, both with a long timeout and their answers shown
PHYSICAL=1 exec bash "$(dirname "$0")/keys.sh" "$@"
