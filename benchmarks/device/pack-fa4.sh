#!/usr/bin/env bash
# FlashAttention-4 for the device (run from the project root): its eight wheels unpack to ~300 MB (the CUDA 13 DSL
# library alone is a 92 MB wheel), over one call's 64 MiB carry, so they travel in two parts of ~36 MB (out/fa1,
# out/fa2: benchmarks/device/parts.sh). With the tracked tree at ~65 MB (the shipped demo models), move
# workbench/models/demo-av* out of the tree for those two calls; FA4 stays in /tmp/fa while the machine is warm.
set -eu
. "$(dirname "$0")/parts.sh"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
unpack_wheels "$site" flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
    nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5 \
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
split_in_two fa "$site"
