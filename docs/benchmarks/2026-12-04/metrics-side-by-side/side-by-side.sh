#!/bin/sh
# What metrics cost, both arms at once: A/A first, then on against off, then a known ~1 % load.
set -e
calm=${1:-target/release/calm}
out=${2:-.}
m="$calm bench mount --metrics-cost --side-by-side --files 60000 --threads 16 --check-pairs 8 --json"
$m --check-calibrate > $out/mount-aa.json 2> $out/mount-aa.txt
$m > $out/mount-ab.json 2> $out/mount-ab.txt
$m --check-calibrate --burn-ns 1700 > $out/mount-burn.json 2> $out/mount-burn.txt
g="$calm bench mdtest --metrics-cost --side-by-side --files 60000 --clients 16 --check-pairs 8 --json"
$g --check-calibrate > $out/grpc-aa.json 2> $out/grpc-aa.txt
$g > $out/grpc-ab.json 2> $out/grpc-ab.txt
$g --check-calibrate --burn-ns 1000 > $out/grpc-burn.json 2> $out/grpc-burn.txt
