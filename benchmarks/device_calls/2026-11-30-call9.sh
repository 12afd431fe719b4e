# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# The norm kernels again: LayerNorm's chunked kernel (three passes over 512-channel pieces) beside the whole-row launches.
mkdir -p /tmp/logs/n
OUT=/tmp/logs/n timeout 420 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
tar czf $OUT/logs.tgz -C /tmp logs
grep -v "^W1130\|Warning\|warn" /tmp/logs/norm.log | cut -c1-1500
