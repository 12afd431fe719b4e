# nvidia-h200 (one GPU), after `2026-11-30-stage-fa4.sh` (part 1 of the FA4 bundle); carries `.whlmin` and `.fa2`.
# Issue 7: the sparse sweep of DEFAULT against its threshold_rows candidate (the routing in two launches).
# Issue 8: H3 exact-fast as the profile gives it (fused_block_ops + FlashAttention-4) against fused_block_norms +
# FlashAttention-4, the candidate for the profile.
mkdir -p /tmp/logs/h /tmp/logs/s /tmp/fa
part=../fastage/fa.part.00; [ -f $part ] || part=/tmp/fastage/fa.part.00
(cat $part .fa2/fa.part.01 | sha256sum; cat $part .fa2/fa.part.01 | xz -d | tar x -C /tmp/fa
 python3 -m zipfile -e .fa2/nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl /tmp/fa) > /tmp/logs/fa-unpack.log 2>&1
export PYTHONPATH=/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
OUT=/tmp/logs/s timeout 170 python -m benchmarks.sparse_attention_h200 \
  --launches g1_w4_s3_fused_means_tma_split_means,g1_w4_s3_fused_means_tma_split_means_rows \
  > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
OUT=/tmp/logs/h timeout 330 python -m benchmarks.h3_full_forward --flash4 --stacks --rounds 3 --budget-s 250 \
  --arms exact_fast,norms+flash4 > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log
cp /tmp/logs/h/*.json /tmp/logs/s/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
cat /tmp/logs/fa-unpack.log
grep -i "sweep 0.2\|target 0.2\|rc=\|forward:" /tmp/logs/sparse.log | cut -c1-420
grep -v "^W1130\|torchao\|^  \"\"\"" /tmp/logs/h3.log | tail -c 2500
