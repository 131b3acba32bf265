# Creates+unlinks per second through a mount of one server on its local store at THREADS threads
# (one directory each), and the CPU each process spent per pair: ../2026-11-28/pairs-cpu.sh with
# URL "-". usage (in a private mount namespace): pairs-cpu-local.sh BIN - THREADS SECONDS
exec bash "$(dirname "$0")/../2026-11-28/pairs-cpu.sh" "$1" - "$3" "$4"
