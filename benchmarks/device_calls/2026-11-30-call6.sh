# nvidia-h200-x2, repository root, `.whlmin` carried (README here).
# GPU 0: the norm kernels' launches against the copy roofline (LayerNorm moments=2 and native bf16 stores, the
#        qk_norm_rope and GELU-tanh candidates), then sparse attention with the stream clock (no launch sweeps).
# GPU 1: the full-size H3 forward's block_sparse arm with the TMA default (issue 8), profiled.
mkdir -p /tmp/logs/n /tmp/logs/s /tmp/logs/h
(export CUDA_VISIBLE_DEVICES=0
 OUT=/tmp/logs/n timeout 290 python -m benchmarks.norm_kernels_gpu > /tmp/logs/norm.log 2>&1; echo "norm rc=$?" >> /tmp/logs/norm.log
 OUT=/tmp/logs/s timeout 260 python -m benchmarks.sparse_attention_h200 --no-sweeps > /tmp/logs/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs/sparse.log) & P1=$!
(export CUDA_VISIBLE_DEVICES=1
 OUT=/tmp/logs/h timeout 480 python -m benchmarks.h3_full_forward --arms block_sparse --rounds 3 --budget-s 330 --profile \
   > /tmp/logs/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs/h3.log) & P2=$!
wait $P1 $P2
tar czf $OUT/logs.tgz -C /tmp logs
grep -A2 "^[a-z_]*: equal" /tmp/logs/norm.log; tail -2 /tmp/logs/norm.log; echo ----; grep -i "target\|error\|rc=\|forward" /tmp/logs/sparse.log | cut -c1-600; echo ----; tail -c 1500 /tmp/logs/h3.log
