#!/usr/bin/env bash
# The Qwen-Image LoRA recipe (`--recipe qwen_image_t2i_lora`: bf16 frozen weights, f32 LoRA)
# on the tiny diffusers directory of the fixtures, at the sizes of the `qwen_image_loop` test:
# 3 rollouts of 2 prompts x 4 candidates at 32x48, 4 steps, a checkpoint every rollout, then
# a resume for a fourth. It checks a backend runs the whole loop (a GPU one in particular);
# the log and the metrics go to OUT.
#
#   benches/reference/tiny_recipe.sh OUT [backend] [binary] [more main-example arguments]
#
# backend: cpu (default), cuda or wgpu; binary: the main example built with that backend's
# feature (default target/release/examples/qwen_image_t2i_lora), e.g.
# `cargo build --release --features cuda --example qwen_image_t2i_lora`.
set -u
out=${1:?usage: tiny_recipe.sh OUT [backend] [binary] [arguments]}
backend=${2:-cpu}
bin=${3:-target/release/examples/qwen_image_t2i_lora}
shift $(($# < 3 ? $# : 3))
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/train.jsonl" <<'J'
{"prompt": "a red circle above a blue square", "metadata": {"task": "t2i", "sample_id": "s0", "category": "position"}}
{"prompt": "two green triangles", "metadata": {"task": "t2i", "sample_id": "s1", "category": "counting"}}
{"prompt": "a cat sitting on a wooden table", "metadata": {"task": "t2i", "sample_id": "s2", "category": "object"}}
{"prompt": "a yellow star on a white background", "metadata": {"task": "t2i", "sample_id": "s3", "category": "colors"}}
J
cat > "$work/eval.jsonl" <<'J'
{"prompt": "a photo of a red circle", "metadata": {"task": "t2i", "sample_id": "s0", "category": "single"}}
{"prompt": "two yellow stars", "metadata": {"task": "t2i", "sample_id": "s1", "category": "counting"}}
J
set -- --set run.num_rollouts=3 --set run.host_threads=2 --set sampling.height=32 --set sampling.width=48 \
  --set sampling.num_inference_steps=4 --set "sampling.sde_pool=[1, 2]" --set "sampling.sde_indices=[1, 2]" \
  --set sampling.num_sde_steps=2 --set rollout.prompts_per_rollout=2 --set rollout.group_size=4 \
  --set rollout.micro_batch_size=4 --set eval.interval=1 --set eval.samples_per_prompt=1 \
  --set checkpoint.save_interval=1 --set lora.rank=2 --set lora.alpha=4.0 \
  --set data.train="$work/train.jsonl" --set data.eval="$work/eval.jsonl" "$@"
common=(--recipe qwen_image_t2i_lora --model-path fixtures/qwen_image/tiny_pipeline
  --reward-model-path fixtures/reward/tiny_clip --backend "$backend")
t=$SECONDS
timeout 150 "$bin" "${common[@]}" --run-dir "$work/run" "$@" > "$out/tiny_log.txt" 2>&1
echo "tiny recipe on $backend: rc $? after $((SECONDS - t)) s"
t=$SECONDS
timeout 60 "$bin" "${common[@]}" --run-dir "$work/run" --resume "$@" --set run.num_rollouts=4 >> "$out/tiny_log.txt" 2>&1
echo "tiny recipe resumed on $backend: rc $? after $((SECONDS - t)) s"
cp "$work/run/metrics.jsonl" "$out/tiny_metrics.jsonl" 2>/dev/null
tail -15 "$out/tiny_log.txt"
