# next session, call 1 (nvidia-h200-x2), prologue as in README.md here: GPU 0 exact-fast (issue 6),
# GPU 1 the block-sparse sweep with the fused-routing candidates (issue 7), then the full-size H3 forward (issue 8)
mkdir -p /tmp/logs/e /tmp/logs/s /tmp/logs/h
(CUDA_VISIBLE_DEVICES=0 OUT=/tmp/logs/e python -m benchmarks.exact_fast_forward --phases forward,profile,request \
   --rounds 3 --request-rounds 3 --budget-s 525 > /tmp/logs/exact.log 2>&1; echo "exact rc=$?" >> /tmp/logs/exact.log) & P1=$!
(export CUDA_VISIBLE_DEVICES=1
 OUT=/tmp/logs/s timeout 285 python -m benchmarks.sparse_attention_h200 > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
 OUT=/tmp/logs/h python -m benchmarks.h3_full_forward --budget-s 245 --rounds 4 > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log) & P2=$!
(sleep 570; tar czf $OUT/logs1.tgz -C /tmp logs) & S=$!
wait $P1 $P2; kill $S 2>/dev/null
tar czf $OUT/logs1.tgz -C /tmp logs
tail -c 3000 /tmp/logs/exact.log; echo ----; tail -c 3000 /tmp/logs/sparse.log; echo ----; tail -c 3000 /tmp/logs/h3.log
