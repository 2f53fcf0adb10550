# Call 41 as run (after call 39 on the same machine: /root/head holds its features, /root/gen the generated answers)
export MINITORCH_SPEC_CACHE=/root/cache PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
mkdir -p /root/head2 && ln -sfn /root/head/features /root/head2/features && python3 project/train_draft_head.py \
  --backend cuda --limit 3000 --generated /root/gen/train_gen.jsonl --epochs 3.5 --tokens-per-step 8192 --lr 2e-3 \
  --eval-every 100 --save-every 100 --time-limit 320 --output /root/head2 --quiet 2>&1 | tail -8
cd /root/head2 && split -b 15000000 -d -a 1 head.safetensors $OUT/head.safetensors.part && cp head.json report.json loss.png $OUT/ \
  && sha256sum head.safetensors; cd -
timeout 90 python3 project/benchmark_gsm8k.py --backend cuda --dtype float32 --drafter head --head /root/head2 --gamma 4 \
  --limit 5 --max-new-tokens 256 --modes spec --no-plots --no-progress -o /tmp/h2.jsonl 2>&1 | tail -5
# output: docs/GPU_RESULTS.md round 12, call 41
