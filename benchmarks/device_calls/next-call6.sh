# 2026-11-30 call 6 (nvidia-h200), repository root, `.whlmin` carried: LayerNorm launches with one warp per row
# (and the others) against the copy roofline, then the Wan forward's `reduction` arm with the two most promising
# LayerNorm launches swapped in (speed and output against stock)
mkdir -p /tmp/logs/n /tmp/logs/e
OUT=/tmp/logs/n timeout 70 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
OUT=/tmp/logs/e timeout 100 python -m benchmarks.exact_fast_forward --arms "reduction,reduction(ln r1_w1),reduction(ln r2_w4)" --phases forward --rounds 3 --budget-s 90 > /tmp/logs/exact.log 2>&1; echo "exact rc=$?" >> /tmp/logs/exact.log
tar czf $OUT/logs6.tgz -C /tmp logs
grep -A3 "^layernorm\|^add_layer" /tmp/logs/norm.log | grep -v "equal to"; echo ----; grep "check\|round\|rc=" /tmp/logs/exact.log
