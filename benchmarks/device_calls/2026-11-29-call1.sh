# call 1 (nvidia-h200-x2): GPU0 trains demo-av (fresh), GPU1 measures exact-fast (forward, profile, request)
mkdir -p $OUT/t /tmp/logs/e
(CUDA_VISIBLE_DEVICES=0 python -m workbench.cli train-tiny --out ../out/demo-av-run --minutes 8.2 --device cuda \
   --denoise-batch 256 --pack $OUT/t > /tmp/logs/train.log 2>&1; echo "train rc=$?" >> /tmp/logs/train.log) & P1=$!
(CUDA_VISIBLE_DEVICES=1 OUT=/tmp/logs/e python -m benchmarks.exact_fast_forward --phases forward,profile,request \
   --rounds 3 --request-rounds 3 --budget-s 525 > /tmp/logs/exact.log 2>&1; echo "exact rc=$?" >> /tmp/logs/exact.log) & P2=$!
(sleep 570; tar czf $OUT/logs1.tgz -C /tmp logs) & S=$!
wait $P1 $P2; kill $S 2>/dev/null
tar czf $OUT/logs1.tgz -C /tmp logs
nvidia-smi --query-gpu=index,name,power.limit,clocks.max.sm --format=csv
tail -c 3500 /tmp/logs/train.log; echo ----; tail -c 6000 /tmp/logs/exact.log
