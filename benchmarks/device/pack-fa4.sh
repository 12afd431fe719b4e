#!/usr/bin/env bash
# FlashAttention-4 for the device (run from the project root): its eight wheels unpack to ~300 MB (the CUDA 13 DSL
# library alone is a 92 MB wheel), over one call's 64 MiB carry, so they travel unpacked, xz-compressed and split in
# two parts (out/fa1, out/fa2, both ignored). benchmarks/device/setup.sh joins them on the device.
# A call carries about 37 MB with out/fa1 and 35 MB with out/fa2: with the tracked tree at ~65 MB (the shipped demo
# models), move workbench/models/demo-av* out of the tree for those two calls; FA4 stays in /tmp/fa on the device
# while the machine is warm.
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=""
for n in 17 24 27 28 34; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 $plat --platform any -d "$work/wheels" \
    flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
    nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5 \
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
mkdir "$work/site"
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site/"; done
tar cf - -C "$work/site" . | xz -T0 -6 > "$work/fa.tar.xz"
size=$(stat -c %s "$work/fa.tar.xz")
rm -rf out/fa1 out/fa2 && mkdir -p out/fa1 out/fa2
split -b $(( (size + 1) / 2 )) "$work/fa.tar.xz" "$work/part."
mv "$work/part.aa" out/fa1/fa.part.aa && mv "$work/part.ab" out/fa2/fa.part.ab
ls -l out/fa1 out/fa2
