# 2026-11-30 call 2 (nvidia-h200-x2), run from the repository root with `.whlmin` and `.fa2` carried; the call
# before it (`2026-11-30-stage-fa4.sh`) left the first part of the FlashAttention-4 bundle in ../fastage (README here).
# GPU 0: exact-fast candidates (issue 6). GPU 1: FA4 vs cuDNN at the Wan and H3 shapes, the sparse sweep with the
# new launch candidates (issue 7), then the full-size H3 forward with FA4 arms and a kernel-time profile (issue 8).
mkdir -p /tmp/logs/e /tmp/logs/s /tmp/logs/h /tmp/logs/f /tmp/fa
part=../fastage/fa.part.00; [ -f $part ] || part=/tmp/fastage/fa.part.00
(cat $part .fa2/fa.part.01 | sha256sum; cat $part .fa2/fa.part.01 | xz -d | tar x -C /tmp/fa) > /tmp/logs/fa-unpack.log 2>&1
export PYTHONPATH=/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
(CUDA_VISIBLE_DEVICES=0 OUT=/tmp/logs/e python -m benchmarks.exact_fast_forward \
   --arms "cudnn+compile,exact-fast,reduction,reduction without gelu_epilogue,reduction+compile,flash4,reduction+flash4" \
   --request-arms "reduction+flash4,reduction" \
   --phases forward,profile,request --rounds 3 --request-rounds 2 --budget-s 480 > /tmp/logs/exact.log 2>&1
 echo "exact rc=$?" >> /tmp/logs/exact.log) & P1=$!
(export CUDA_VISIBLE_DEVICES=1
 OUT=/tmp/logs/f timeout 120 python -m benchmarks.flash4_attention > /tmp/logs/flash4.log 2>&1; echo "flash4 rc=$?" >> /tmp/logs/flash4.log
 OUT=/tmp/logs/s timeout 170 python -m benchmarks.sparse_attention_h200 > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
 OUT=/tmp/logs/h python -m benchmarks.h3_full_forward --budget-s 200 --rounds 3 --flash4 --profile > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log) & P2=$!
(sleep 555; tar czf $OUT/logs2.tgz -C /tmp logs) & S=$!
wait $P1 $P2; kill $S 2>/dev/null
tar czf $OUT/logs2.tgz -C /tmp logs
cat /tmp/logs/fa-unpack.log; tail -c 1500 /tmp/logs/flash4.log; echo ----; tail -c 2500 /tmp/logs/exact.log; echo ----; tail -c 1200 /tmp/logs/sparse.log; echo ----; tail -c 2000 /tmp/logs/h3.log
