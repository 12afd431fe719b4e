# nvidia-h200 (one GPU), repository root, `.whlmin` carried (README here).
# Issue 8: the full-size H3 forward with selective FP8 on its fused path (fp8f) alone and stacked on block_sparse at
# 20 % (DEFAULT now with means_split) + fused_block_norms; the selective_fp8 / fp8_rowwise gpu tests first.
mkdir -p /tmp/logs/h
timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_fp8_rowwise.py tests/accelerations/test_selective_fp8.py -k gpu > /tmp/logs/gpu_tests.log 2>&1; echo "gpu tests rc=$?" >> /tmp/logs/gpu_tests.log
OUT=/tmp/logs/h timeout 420 python -m benchmarks.h3_full_forward --stacks --rounds 3 --budget-s 300 --profile \
  --arms block_sparse,fp8f,block_sparse+norms,block_sparse+norms+fp8f > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log
cp /tmp/logs/h/*.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs
tail -5 /tmp/logs/gpu_tests.log
grep -v "^W1130\|torchao\|^  \"\"\"" /tmp/logs/h3.log | tail -c 3000
