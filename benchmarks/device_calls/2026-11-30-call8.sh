# nvidia-h200-x2, after `2026-11-30-stage-fa4.sh` (part 1 of the FA4 bundle); carries `.whlmin` and `.fa2`.
# Issue 6 with the measured kernel defaults (layernorm 2 rows x 2 warps, qk_norm_rope's row tile):
# GPU 0: one forward, A/B/A (stock, cudnn+compile, exact-fast, exact-fast+compile), then a profile of each.
# GPU 1: the full 16-step request, stock / exact-fast / cudnn+compile, 3 rounds.
mkdir -p /tmp/logs/e /tmp/logs/r /tmp/fa
part=../fastage/fa.part.00; [ -f $part ] || part=/tmp/fastage/fa.part.00
(cat $part .fa2/fa.part.01 | sha256sum; cat $part .fa2/fa.part.01 | xz -d | tar x -C /tmp/fa
 python3 -m zipfile -e .fa2/nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl /tmp/fa) > /tmp/logs/fa-unpack.log 2>&1
export PYTHONPATH=/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
(export CUDA_VISIBLE_DEVICES=0
 OUT=/tmp/logs/e timeout 540 python -m benchmarks.exact_fast_forward --arms "cudnn+compile,exact-fast,exact-fast+compile" \
   --phases forward,profile --rounds 4 --budget-s 420 > /tmp/logs/exact.log 2>&1; echo "exact rc=$?" >> /tmp/logs/exact.log) & P1=$!
(export CUDA_VISIBLE_DEVICES=1
 OUT=/tmp/logs/r timeout 540 python -m benchmarks.exact_fast_forward --arms "cudnn+compile,exact-fast" --phases request \
   --request-arms "exact-fast,cudnn+compile" --request-rounds 3 --budget-s 500 --name exact-fast-request > /tmp/logs/request.log 2>&1
 echo "request rc=$?" >> /tmp/logs/request.log) & P2=$!
(sleep 555; tar czf $OUT/logs8.tgz -C /tmp logs) & S=$!
wait $P1 $P2; kill $S 2>/dev/null
tar czf $OUT/logs8.tgz -C /tmp logs
cat /tmp/logs/fa-unpack.log; grep -v "^W1130" /tmp/logs/exact.log | tail -c 3000; echo ----; grep -v "^W1130" /tmp/logs/request.log | tail -c 2500
