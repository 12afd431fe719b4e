# Source this at the start of a device call (the H200 has torch and triton, no package index):
#   . benchmarks/device/setup.sh && python3 -m benchmarks run SCENARIO --out $OUT
# What it does, each step only when its input was carried:
# - `.whl/` (made here by ../shared/tools/device-wheels.sh diffusers==0.42.1 torchao==0.18.0 peft==0.21.2):
#   installed into /tmp/site, which outlives the call while the machine stays warm (about 30 s);
# - `out/ray1/` (first call): Ray's first part staged in /tmp/raystage; `out/ray2/` (the next call, machine still
#   warm): both parts joined and unpacked into /tmp/ray (benchmarks/device/pack-ray.sh makes the parts);
# - `out/fa1/`, then `out/fa2/` the same way: FlashAttention-4 into /tmp/fa (benchmarks/device/pack-fa4.sh), on the
#   path (with its DSL packages, as its .pth would add) in every later call while the machine stays warm;
# - always: the project installed in place, PYTHONPATH set, progress bars off, output unbuffered, and
#   BENCHMARKS_OUT=$OUT, so `python3 -m benchmarks run SCENARIO` writes its record where the call's files come back.
# Set WORKBENCH_COMMIT=<sha> before sourcing: the copy on the device has no git history for the envelope to read.
# The tracked tree is about 63 MiB, 59 of them the shipped demo models: a call that carries `.whl` or an FA4 part goes
# over the device's 64 MiB only with workbench/models/demo-av* moved aside; meanwhile commit with explicit paths
# (`git commit -a` records their deletion), and copy WORKBENCH_COMMIT from `git rev-parse HEAD`, never by hand.
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
# join_parts NAME: out/NAME1's part staged in /tmp/NAMEstage; with out/NAME2's (a later call), unpacked into /tmp/NAME
join_parts() {
    if [ -f "out/${1}1/$1.part.aa" ]; then
        mkdir -p "/tmp/${1}stage" && cp "out/${1}1/$1.part.aa" "/tmp/${1}stage/"
    fi
    if [ -f "out/${1}2/$1.part.ab" ]; then
        mkdir -p "/tmp/$1" && cat "/tmp/${1}stage/$1.part.aa" "out/${1}2/$1.part.ab" | xz -d | tar x -C "/tmp/$1"
    fi
}
join_parts ray
join_parts fa
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
# results go where the device call's files come back, unless a command names its own --out
export BENCHMARKS_OUT="${OUT:-}"
export PYTHONPATH=/tmp/site:/tmp/ray:/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
