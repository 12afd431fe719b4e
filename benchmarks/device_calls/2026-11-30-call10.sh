# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# The norm kernels again: after a 3 s warm-up of the GPU (the kernel timed first was slow in runs 3-5).
mkdir -p /tmp/logs/n
OUT=/tmp/logs/n timeout 420 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
tar czf $OUT/logs.tgz -C /tmp logs
grep -v "^W1130\|Warning\|warn" /tmp/logs/norm.log | cut -c1-1500
