# 2026-11-30 call 3 (nvidia-h200-x2), after `2026-11-30-stage-fa4.sh` (part 1 of the FA4 bundle); carries `.whlmin` and
# `.fa2` (part 2 + nvidia-cutlass-dsl-libs-core, which holds the `cutlass.cute` Python package call 2 lacked).
# GPU 0: FA4 vs cuDNN per kernel, then exact-fast candidates with FA4 (issue 6). GPU 1: the full-size H3 forward with
# FA4 arms and a profile (issue 8), then the sparse sweep of TMA + fused-means launches (issue 7).
mkdir -p /tmp/logs/e /tmp/logs/s /tmp/logs/h /tmp/logs/f /tmp/fa
part=../fastage/fa.part.00; [ -f $part ] || part=/tmp/fastage/fa.part.00
(cat $part .fa2/fa.part.01 | sha256sum; cat $part .fa2/fa.part.01 | xz -d | tar x -C /tmp/fa
 python3 -m zipfile -e .fa2/nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl /tmp/fa; ls /tmp/fa/nvidia_cutlass_dsl/dsl_packages/cutlass | head) > /tmp/logs/fa-unpack.log 2>&1
export PYTHONPATH=/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
(export CUDA_VISIBLE_DEVICES=0
 OUT=/tmp/logs/f timeout 150 python -m benchmarks.flash4_attention > /tmp/logs/flash4.log 2>&1; echo "flash4 rc=$?" >> /tmp/logs/flash4.log
 OUT=/tmp/logs/e python -m benchmarks.exact_fast_forward \
   --arms "cudnn+compile,reduction,reduction+compile,flash4,reduction+flash4" --request-arms "reduction+flash4,reduction" \
   --phases forward,profile,request --rounds 3 --request-rounds 2 --budget-s 370 > /tmp/logs/exact.log 2>&1
 echo "exact rc=$?" >> /tmp/logs/exact.log) & P1=$!
(export CUDA_VISIBLE_DEVICES=1
 OUT=/tmp/logs/h python -m benchmarks.h3_full_forward --budget-s 220 --rounds 3 --flash4 --arms exact_fast,flash4,exact_fast+flash4 --profile > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log
 OUT=/tmp/logs/s timeout 150 python -m benchmarks.sparse_attention_h200 --launches g1_w4_s3,g1_w4_s3_fused_means,g1_w4_s3_fused_routing_tma,g1_w4_s3_fused_means_tma,g1_w4_s3_fused_means_tma_dotacc > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log) & P2=$!
(sleep 550; tar czf $OUT/logs3.tgz -C /tmp logs) & S=$!
wait $P1 $P2; kill $S 2>/dev/null
tar czf $OUT/logs3.tgz -C /tmp logs
cat /tmp/logs/fa-unpack.log; tail -c 2500 /tmp/logs/flash4.log; echo ----; tail -c 2500 /tmp/logs/exact.log; echo ----; tail -c 1500 /tmp/logs/h3.log; echo ----; tail -c 1000 /tmp/logs/sparse.log
