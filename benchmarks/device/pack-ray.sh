#!/usr/bin/env bash
# Ray for the device (run from the project root): its wheel is ~79 MB, over one call's 64 MiB carry, so Ray and its
# pure dependencies travel unpacked, xz-compressed and split in two parts (out/ray1, out/ray2, both ignored), each
# small enough to go with the project and .whl/. benchmarks/device/setup.sh joins them on the device.
# Unpacking a wheel with zipfile drops the executable bits of Ray's servers (gcs_server, raylet): they are set here.
set -eu
version=${1:-2.60.0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$work/wheels" "ray==$version" click filelock jsonschema jsonschema-specifications referencing \
    rpds-py attrs msgpack protobuf pyyaml
mkdir "$work/site"
for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site/"; done
chmod -R a+x "$work/site/ray/core"
find "$work/site/ray" -name '*.so' -exec chmod a+x {} +
tar cf - -C "$work/site" . | xz -T0 -6 > "$work/ray.tar.xz"
size=$(stat -c %s "$work/ray.tar.xz")
rm -rf out/ray1 out/ray2 && mkdir -p out/ray1 out/ray2
split -b $(( (size + 1) / 2 )) "$work/ray.tar.xz" "$work/part."
mv "$work/part.aa" out/ray1/ray.part.aa && mv "$work/part.ab" out/ray2/ray.part.ab
ls -l out/ray1 out/ray2
