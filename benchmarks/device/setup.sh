# Source this at the start of a device call (the H200 has torch and triton, no package index):
#   . benchmarks/device/setup.sh && python3 -m benchmarks run SCENARIO --out $OUT
# What it does, each step only when its input was carried:
# - `.whl/` (made here by ../shared/tools/device-wheels.sh diffusers==0.42.1 torchao==0.18.0 peft==0.21.2):
#   installed into /tmp/site, which outlives the call while the machine stays warm (about 30 s);
# - `out/ray1/` (first call): Ray's first part staged in /tmp/raystage; `out/ray2/` (the next call, machine still
#   warm): both parts joined and unpacked into /tmp/ray (benchmarks/device/pack-ray.sh makes the parts);
# - always: the project installed in place, PYTHONPATH set, progress bars off, output unbuffered.
# Set WORKBENCH_COMMIT=<sha> before sourcing: the copy on the device has no git history for the envelope to read.
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
if [ -f out/ray1/ray.part.aa ]; then
    mkdir -p /tmp/raystage && cp out/ray1/ray.part.aa /tmp/raystage/
fi
if [ -f out/ray2/ray.part.ab ]; then
    mkdir -p /tmp/ray && cat /tmp/raystage/ray.part.aa out/ray2/ray.part.ab | xz -d | tar x -C /tmp/ray
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:/tmp/ray:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
