# Sourced by pack-ray.sh and pack-fa4.sh (run from the project root): a package set too large for one device call's
# 64 MiB carry travels as its wheels unpacked into one folder, xz-compressed and split in two parts,
# out/<name>1/<name>.part.aa and out/<name>2/<name>.part.ab (out/ is ignored); benchmarks/device/setup.sh joins them
# into /tmp/<name> on the device, over two calls while the machine stays warm.

# unpack_wheels SITE REQUIREMENT...: CPython 3.12 x86-64 wheels of exactly these requirements (no dependencies),
# unpacked into SITE (zipfile drops executable bits: set them after, where a package needs them)
unpack_wheels() {
    local site=$1 wheels
    shift
    wheels=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
        --platform any -d "$wheels" "$@"
    mkdir -p "$site"
    for wheel in "$wheels"/*.whl; do python3 -m zipfile -e "$wheel" "$site/"; done
    rm -rf "$wheels"
}

# split_in_two NAME SITE: SITE as the two parts of NAME under out/
split_in_two() {
    local name=$1 site=$2 work size
    work=$(mktemp -d)
    tar cf - -C "$site" . | xz -T0 -6 > "$work/$name.tar.xz"
    size=$(stat -c %s "$work/$name.tar.xz")
    split -b $(( (size + 1) / 2 )) "$work/$name.tar.xz" "$work/part."
    rm -rf "out/${name}1" "out/${name}2" && mkdir -p "out/${name}1" "out/${name}2"
    mv "$work/part.aa" "out/${name}1/$name.part.aa" && mv "$work/part.ab" "out/${name}2/$name.part.ab"
    rm -rf "$work"
    ls -l "out/${name}1" "out/${name}2"
}
