# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 8: the full-size H3 forward with the stacks: fused_block_norms (q/k norm + rotary kernel), selective FP8,
# block_sparse at 20 % alone and stacked (no FA4 arms: no staging call).
mkdir -p /tmp/logs/h
OUT=/tmp/logs/h timeout 560 python -m benchmarks.h3_full_forward --stacks --rounds 3 --budget-s 470 --profile \
  --arms block_sparse,norms,fp8,block_sparse+norms,block_sparse+norms+fp8 > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log
cp /tmp/logs/h/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
grep -v "^W1130\|torchao\|^  \"\"\"" /tmp/logs/h3.log | tail -c 4000
