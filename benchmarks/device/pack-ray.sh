#!/usr/bin/env bash
# Ray for the device (run from the project root): its wheel is ~79 MB, over one call's 64 MiB carry, so Ray and its
# pure dependencies travel in two parts (out/ray1, out/ray2: benchmarks/device/parts.sh), each small enough to go with
# the project and .whl/. Unpacking drops the executable bits of Ray's servers (gcs_server, raylet): they are set here.
set -eu
. "$(dirname "$0")/parts.sh"
version=${1:-2.60.0}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
unpack_wheels "$site" "ray==$version" click filelock jsonschema jsonschema-specifications referencing rpds-py attrs \
    msgpack protobuf pyyaml
chmod -R a+x "$site/ray/core"
find "$site/ray" -name '*.so' -exec chmod a+x {} +
split_in_two ray "$site"
