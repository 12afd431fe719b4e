# call 2: GPU0 resumes demo-av's denoiser unless call 1's model already passes; GPU1 sparse attention then H3
mkdir -p $OUT/t /tmp/logs2/s /tmp/logs2/h /tmp/logs2/r
RUN=../out/demo-av-run
PASS=$(python - <<'PY'
import json, pathlib
p = pathlib.Path("../out/demo-av-run/train.json")
try:
    rates = json.loads(p.read_text())["eval"]["all"]
    ok = rates["colour"] >= 0.75 and rates["direction"] >= 0.625 and rates["pitch"] >= 0.75
except Exception:
    ok = None
print({True: "pass", False: "fail", None: "none"}[ok])
PY
)
echo "demo-av after call 1: $PASS"
if [ "$PASS" = fail ]; then
  (CUDA_VISIBLE_DEVICES=0 python -m workbench.cli train-tiny --out $RUN --resume --stage denoiser --minutes 8.3 \
     --device cuda --denoise-batch 256 --pack $OUT/t > /tmp/logs2/train.log 2>&1; echo "train rc=$?" >> /tmp/logs2/train.log) & P1=$!
elif [ "$PASS" = none ]; then
  (CUDA_VISIBLE_DEVICES=0 python -m workbench.cli train-tiny --out ../out/demo-av-run2 --minutes 8.3 --device cuda \
     --denoise-batch 256 --pack $OUT/t > /tmp/logs2/train.log 2>&1; echo "train rc=$?" >> /tmp/logs2/train.log) & P1=$!
else
  (CUDA_VISIBLE_DEVICES=0 OUT=/tmp/logs2/r python -m benchmarks.exact_fast_forward --arms cudnn+compile,exact-fast \
     --phases request --request-arms exact-fast,cudnn+compile --request-rounds 3 --budget-s 520 \
     --name exact-fast-request > /tmp/logs2/request.log 2>&1; echo "request rc=$?" >> /tmp/logs2/request.log) & P1=$!
fi
(export CUDA_VISIBLE_DEVICES=1
 OUT=/tmp/logs2/s timeout 285 python -m benchmarks.sparse_attention_h200 > /tmp/logs2/sparse.log 2>&1; echo "sparse rc=$?" >> /tmp/logs2/sparse.log
 OUT=/tmp/logs2/h python -m benchmarks.h3_full_forward --budget-s 245 --rounds 4 > /tmp/logs2/h3.log 2>&1; echo "h3 rc=$?" >> /tmp/logs2/h3.log) & P2=$!
(sleep 572; tar czf $OUT/logs2.tgz -C /tmp logs2) & S=$!
wait $P1 $P2; kill $S 2>/dev/null
tar czf $OUT/logs2.tgz -C /tmp logs2
tail -c 2500 /tmp/logs2/train.log /tmp/logs2/request.log 2>/dev/null; echo ----; tail -c 3000 /tmp/logs2/sparse.log; echo ----; tail -c 3000 /tmp/logs2/h3.log
