# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 8: head_norm_rope's launch candidates at H3's q shape, then the full-size H3 forward with selective FP8
# compiled per Linear (fp8c) alone and stacked on block_sparse at 20 % + fused_block_norms.
mkdir -p /tmp/logs/h /tmp/logs/n
OUT=/tmp/logs/n timeout 120 python -m benchmarks.head_norm_rope_gpu > /tmp/logs/hnr.log 2>&1; echo "hnr rc=$?" >> /tmp/logs/hnr.log
OUT=/tmp/logs/h timeout 450 python -m benchmarks.h3_full_forward --stacks --rounds 3 --budget-s 330 --profile \
  --arms block_sparse,fp8c,block_sparse+norms,block_sparse+norms+fp8c > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log
cp /tmp/logs/h/*.json /tmp/logs/n/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
grep -v "^W1130\|torchao\|^  \"\"\"" /tmp/logs/hnr.log | tail -c 1500
grep -v "^W1130\|torchao\|^  \"\"\"" /tmp/logs/h3.log | tail -c 3500
