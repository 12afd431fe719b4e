# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 7: the sparse benchmark with the launch sweep limited to DEFAULT and its means_split / lpt candidates.
mkdir -p /tmp/logs/s
OUT=/tmp/logs/s timeout 500 python -m benchmarks.sparse_attention_h200 \
  --launches g1_w4_s3_fused_means_tma,g1_w4_s3_fused_means_tma_split_means,g1_w4_s3_fused_means_tma_lpt,g1_w4_s3_fused_means_tma_split_means_lpt \
  > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
cp /tmp/logs/s/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
grep -i "target 0.2\|rc=\|forward:\|fastest\|0.20" /tmp/logs/sparse.log | cut -c1-300 | tail -40
