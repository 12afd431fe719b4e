# Source this at the start of a device call (the H200 has torch and triton, no package index):
#   . benchmarks/device/setup.sh && python3 -m benchmarks run SCENARIO --out $OUT
# What it does, each step only when its input was carried:
# - `.whl/` (made here by ../shared/tools/device-wheels.sh diffusers==0.42.1 torchao==0.18.0 peft==0.21.2):
#   installed into /tmp/site, which outlives the call while the machine stays warm (about 30 s);
# - `out/ray1/` (first call): Ray's first part staged in /tmp/raystage; `out/ray2/` (the next call, machine still
#   warm): both parts joined and unpacked into /tmp/ray (benchmarks/device/pack-ray.sh makes the parts);
# - `out/fa1/`, then `out/fa2/` the same way: FlashAttention-4 into /tmp/fa (benchmarks/device/pack-fa4.sh), on the
#   path (with its DSL packages, as its .pth would add) in every later call while the machine stays warm;
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
if [ -f out/fa1/fa.part.aa ]; then
    mkdir -p /tmp/fastage && cp out/fa1/fa.part.aa /tmp/fastage/
fi
if [ -f out/fa2/fa.part.ab ]; then
    mkdir -p /tmp/fa && cat /tmp/fastage/fa.part.aa out/fa2/fa.part.ab | xz -d | tar x -C /tmp/fa
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:/tmp/ray:/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1 RAY_USAGE_STATS_ENABLED=0
