# 2026-11-30 call 4 (nvidia-h200, one GPU), repository root, `.whlmin` carried (README here): the LayerNorm and
# q/k-norm kernels' launch sweep against the copy roofline (issue 6), then the sparse sweep of the TMA launch's
# pipelining and the one-forward speed-up with the new DEFAULT (issue 7)
mkdir -p /tmp/logs/n /tmp/logs/s
OUT=/tmp/logs/n timeout 150 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
OUT=/tmp/logs/s timeout 200 python -m benchmarks.sparse_attention_h200 --launches g1_w4_s3_fused_means_tma,g1_w4_s2_fused_means_tma,g1_w4_s4_fused_means_tma,g1_w4_s3_fused_means_tma_xs4,g1_w4_s3_fused_means_tma_lu2 > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log
tar czf $OUT/logs4.tgz -C /tmp logs
tail -c 4000 /tmp/logs/norm.log; echo ----; tail -c 2500 /tmp/logs/sparse.log
