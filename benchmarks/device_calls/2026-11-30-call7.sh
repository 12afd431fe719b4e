# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# The norm kernels' launches again: LayerNorm and the qk row tile with persistent (pipelined) launches, GELU-tanh
# after its exp2 path's fix, and a same-bytes device copy per kernel under the same clock.
mkdir -p /tmp/logs/n
OUT=/tmp/logs/n timeout 420 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
tar czf $OUT/logs.tgz -C /tmp logs
grep -v "^W1130\|Warning\|warn" /tmp/logs/norm.log | cut -c1-1500
