#!/bin/sh
# The in-process (gRPC) side-by-side cost with 16 rounds: A/A first, on against off, a known ~1 % load.
set -e
calm=${1:-target/release/calm}
out=${2:-.}
g="$calm bench mdtest --metrics-cost --side-by-side --files 60000 --clients 16 --check-pairs 16 --json"
$g --check-calibrate > $out/grpc16-aa.json 2> $out/grpc16-aa.txt
$g > $out/grpc16-ab.json 2> $out/grpc16-ab.txt
$g --check-calibrate --burn-ns 1000 > $out/grpc16-burn.json 2> $out/grpc16-burn.txt
