# prepared 2026-11-30, not run yet (nvidia-h200-x2), repository root, `.whlmin` carried (README here).
# GPU 0: LayerNorm launches with one warp per row (and the others) against the copy roofline, then the Wan forward's
# `reduction` arm with the two most promising LayerNorm launches swapped in (speed and output against stock).
# GPU 1: the full-size H3 forward's block_sparse arm with the TMA default (issue 8: 1.60x with the old launch).
mkdir -p /tmp/logs/n /tmp/logs/e /tmp/logs/h
(export CUDA_VISIBLE_DEVICES=0
 OUT=/tmp/logs/n timeout 90 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
 OUT=/tmp/logs/e timeout 150 python -m benchmarks.exact_fast_forward --arms "reduction,reduction(ln r1_w1),reduction(ln r2_w4)" \
   --phases forward --rounds 3 --budget-s 140 > /tmp/logs/exact.log 2>&1; echo "exact rc=$?" >> /tmp/logs/exact.log) & P1=$!
(export CUDA_VISIBLE_DEVICES=1
 OUT=/tmp/logs/h timeout 260 python -m benchmarks.h3_full_forward --arms exact_fast,block_sparse --rounds 3 --budget-s 240 --profile \
   > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log) & P2=$!
wait $P1 $P2
tar czf $OUT/logs6.tgz -C /tmp logs
grep -A3 "^layernorm\|^add_layer" /tmp/logs/norm.log | grep -v "equal to"; echo ----; grep "check\|round\|rc=" /tmp/logs/exact.log; echo ----; tail -c 1500 /tmp/logs/h3.log
