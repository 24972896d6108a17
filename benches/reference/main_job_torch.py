#!/usr/bin/env python3
"""The main job's work per rollout (`cargo run --release --example qwen_image_t2i_lora`, the
`shapes_world_lora` recipe) as a PyTorch loop on the CPU, timed by phase as the job's
`perf/rollout_time` and `perf/train_time` time it.

What one rollout does, on both sides:

* **rollout**: 8 prompts x 8 samples = 64 samples of 64 packed tokens x 48 channels (32x32
  RGB, the shapes world's latent) and 12 text tokens, encoded by a text encoder of the shapes
  world's size (2 layers, width 64, 4 heads; random weights here, its cost is what matters);
  12 steps of the shapes generator (`fixtures/shapes_world/transformer`, diffusers'
  `QwenImageTransformer2DModel` with a peft LoRA of rank 8, alpha 16 on the eight attention
  projections), Flow-SDE (flow_grpo's `sde_step_with_logprob` arithmetic, eta 1.2) on 3 steps
  drawn from 1..5 and Euler on the others; every trained step's sample rounded to bf16;
  the trajectory written to disk and fsynced (torch.save), the 64 images written as PNGs;
* **train**: the pi_old anchor (the stored transitions replayed under the policy before the
  updates: 64 samples x 3 steps, no gradient), then 2 updates of 32 samples, each two
  micro-batches of 16 samples x 3 steps (one forward of 48 rows), the clipped GRPO loss
  (eps 1e-4) with group-normalised advantages, backward, gradient clipping at 1.0 and AdamW
  (lr 2e-3) on the adapter.

Scoring and evaluation are not timed (the job times them apart). Pinned versions:
`benches/reference/requirements-transformer.txt`.

    python benches/reference/main_job_torch.py --threads 2 --rollouts 8

Prints one JSON object per rollout and a summary: the median of each phase over the rollouts
after the first, and the process's peak resident memory.
"""

import argparse
import json
import math
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from diffusers import QwenImageTransformer2DModel
from peft import LoraConfig, inject_adapter_in_model
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
PROMPTS, GROUP, STEPS, TRAINED, TEXT = 8, 8, 12, 3, 12
ETA, EPS_CLIP, LR, MICRO = 1.2, 1e-4, 2e-3, 16


def sigmas(steps):
    # the schedule's values do not change the cost; a shifted linear grid to 0
    t = torch.linspace(1.0, 1.0 / steps, steps)
    shift = 1.6
    s = shift * t / (1 + (shift - 1) * t)
    return torch.cat([s, torch.zeros(1)])


def sde_step(v, x, sigma, sigma_next, noise=None, prev=None):
    """Flow-SDE as flow_grpo's `sde_step_with_logprob` computes it: the mean, the drawn (or
    given) next sample and the mean log-density over each sample's elements."""
    sigma = sigma.view(-1, 1, 1)
    sigma_next = sigma_next.view(-1, 1, 1)
    dt = sigma_next - sigma
    std_dev_t = torch.sqrt(sigma / (1 - sigma)) * ETA
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    std = std_dev_t * torch.sqrt(-dt)
    if prev is None:
        prev = (mean + std * noise).bfloat16().float()
    log_prob = -((prev.detach() - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))
    return prev, log_prob.mean(dim=(1, 2))


class Conditioning:
    """Per-prompt text states and masks, repeated over each group."""

    def __init__(self, encoder, embed, generator):
        lengths = torch.randint(3, TEXT + 1, (PROMPTS,), generator=generator)
        tokens = torch.randint(0, 64, (PROMPTS, TEXT), generator=generator)
        keep = torch.arange(TEXT)[None, :] < lengths[:, None]
        with torch.inference_mode():
            states = encoder(embed(tokens), src_key_padding_mask=~keep)
        self.states = states.repeat_interleave(GROUP, 0).clone()
        self.mask = keep.repeat_interleave(GROUP, 0)


def forward(model, x, sigma, cond, rows):
    return model(
        hidden_states=x,
        encoder_hidden_states=cond.states[rows],
        encoder_hidden_states_mask=cond.mask[rows],
        timestep=sigma,
        img_shapes=[[(1, 8, 8)]] * x.shape[0],
        return_dict=False,
    )[0]


def rollout(model, encoder, embed, grid, generator, out_dir, index):
    n = PROMPTS * GROUP
    cond = Conditioning(encoder, embed, generator)
    trained = sorted(torch.randperm(5, generator=generator)[:TRAINED].add(1).tolist())
    x = torch.randn(n, 64, 48, generator=generator)
    stored = {"x": [], "next": [], "log_prob": [], "steps": trained}
    rows = torch.arange(n)
    with torch.inference_mode():
        for k in range(STEPS):
            sigma = grid[k].expand(n)
            v = forward(model, x, sigma, cond, rows)
            if k in trained:
                noise = torch.randn(x.shape, generator=generator)
                nxt, lp = sde_step(v, x, sigma, grid[k + 1].expand(n), noise=noise)
                stored["x"].append(x.bfloat16())
                stored["next"].append(nxt.bfloat16())
                stored["log_prob"].append(lp)
                x = nxt
            else:
                x = x + (grid[k + 1] - grid[k]) * v
    path = out_dir / f"rollout_{index:04d}.pt"
    with open(path, "wb") as f:
        torch.save(stored, f)
        f.flush()
        os.fsync(f.fileno())
    # unpack 2x2 patches of 4x4 pixels x 3 channels into 32x32 images
    images = x.clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
    images = images.view(n, 8, 8, 4, 4, 3).permute(0, 1, 3, 2, 4, 5).reshape(n, 32, 32, 3).numpy()
    for i, im in enumerate(images):
        Image.fromarray(np.ascontiguousarray(im)).save(out_dir / f"rollout_{index:04d}_{i:02d}.png")
    rewards = torch.rand(n, generator=generator)
    return stored, cond, rewards


def replay(model, stored, cond, grid, rows):
    """Log-probs of the stored transitions of `rows` under the model: one forward of
    rows x trained steps."""
    steps = stored["steps"]
    x = torch.cat([stored["x"][j][rows].float() for j in range(len(steps))])
    nxt = torch.cat([stored["next"][j][rows].float() for j in range(len(steps))])
    sigma = torch.cat([grid[s].expand(len(rows)) for s in steps])
    sigma_next = torch.cat([grid[s + 1].expand(len(rows)) for s in steps])
    all_rows = rows.repeat(len(steps))
    v = forward(model, x, sigma, cond, all_rows)
    _, lp = sde_step(v, x, sigma, sigma_next, prev=nxt)
    return lp.view(len(steps), len(rows))


def train(model, params, opt, stored, cond, rewards, grid):
    n = PROMPTS * GROUP
    r = rewards.view(PROMPTS, GROUP)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).reshape(n)
    with torch.inference_mode():
        old = torch.cat([replay(model, stored, cond, grid, torch.arange(s, s + MICRO)) for s in range(0, n, MICRO)], 1)
    half = n // 2
    for u in range(2):
        opt.zero_grad(set_to_none=True)
        for s in range(u * half, (u + 1) * half, MICRO):
            rows = torch.arange(s, s + MICRO)
            lp = replay(model, stored, cond, grid, rows)
            ratio = torch.exp(lp - old[:, rows])
            a = adv[rows][None, :]
            loss = torch.maximum(-a * ratio, -a * ratio.clamp(1 - EPS_CLIP, 1 + EPS_CLIP)).mean()
            (loss * MICRO / half).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)

    model = QwenImageTransformer2DModel.from_pretrained(ROOT / "fixtures/shapes_world/transformer")
    model.requires_grad_(False)
    model = inject_adapter_in_model(LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.0), model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    embed = torch.nn.Embedding(64, 64)
    grid = sigmas(STEPS)

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        for i in range(args.rollouts):
            t0 = time.perf_counter()
            stored, cond, rewards = rollout(model, encoder, embed, grid, generator, out_dir, i)
            t1 = time.perf_counter()
            train(model, params, opt, stored, cond, rewards, grid)
            t2 = time.perf_counter()
            times.append((t1 - t0, t2 - t1))
            print(json.dumps({"rollout": i, "rollout_s": round(t1 - t0, 3), "train_s": round(t2 - t1, 3)}), flush=True)
    later = times[1:] or times
    print(
        json.dumps(
            {
                "summary": "median over the rollouts after the first",
                "rollout_s": round(statistics.median(t for t, _ in later), 3),
                "train_s": round(statistics.median(t for _, t in later), 3),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "threads": args.threads,
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
