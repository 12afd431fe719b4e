# 2026-11-30 call 5 (nvidia-h200), repository root, `.whlmin` carried: the LayerNorm kernel with its scale/shift
# loaded once per program (row vectors) against the per-element loads, then the Wan forward's `reduction` arm
# (no FlashAttention-4 here) to see the change at forward level and that its output is unchanged
mkdir -p /tmp/logs/n /tmp/logs/e
OUT=/tmp/logs/n timeout 120 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
OUT=/tmp/logs/e timeout 150 python -m benchmarks.exact_fast_forward --arms reduction --phases forward --rounds 3 --budget-s 140 > /tmp/logs/exact.log 2>&1; echo "exact rc=$?" >> /tmp/logs/exact.log
tar czf $OUT/logs5.tgz -C /tmp logs
tail -c 3000 /tmp/logs/norm.log; echo ----; tail -c 1500 /tmp/logs/exact.log
