#!/usr/bin/env python3
"""The work of `benches/transformer.rs` in PyTorch on the CPU: diffusers'
`QwenImageTransformer2DModel` with a peft LoRA (rank 8, alpha 16, the eight attention
projections), at the same three configurations, the same shapes and the same key masks.

* `shapes_transformer/flex/forward/32`, `.../forward_backward/16`: the shapes world's
  generator (`fixtures/shapes_world/transformer`), 64 image tokens, 12 text tokens of which
  3, 8, 3, 7 are real (the bench's four prompts), batch 32 and 16;
* `mid_transformer/flex/{forward,forward_backward}/{256,1024}`: random weights at 4 blocks
  of 4 heads of 64, 32 text tokens (32, 20, 32, 9 real), batch 4.

The forward runs under `torch.inference_mode()`; forward + backward takes the gradient of
`mean(v^2)` for the adapter's weights (the base is frozen, as in flowrl). Pinned versions:
`benches/reference/requirements-transformer.txt`.

    python benches/reference/transformer_torch.py --threads 2 [--only forward/32]

Prints one JSON object per benchmark: its id (the criterion id of the Rust bench), the median
time in milliseconds over `--repeats` timed runs after `--warmup` untimed ones, and the peak
resident memory of the process so far.
"""

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import torch
from diffusers import QwenImageTransformer2DModel
from peft import LoraConfig, inject_adapter_in_model

ROOT = Path(__file__).resolve().parents[2]
TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
]
MID = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=4,
    attention_head_dim=64,
    num_attention_heads=4,
    joint_attention_dim=256,
    axes_dims_rope=(16, 24, 24),
)


def with_lora(model):
    model.requires_grad_(False)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.0)
    return inject_adapter_in_model(config, model)


def mask(lengths, tokens):
    return torch.tensor([[i < n for i in range(tokens)] for n in lengths], dtype=torch.bool)


def shapes_inputs(batch):
    lengths = [[3, 8, 3, 7][i % 4] for i in range(batch)]
    return dict(
        hidden_states=torch.randn(batch, 64, 48),
        encoder_hidden_states=torch.randn(batch, 12, 64),
        encoder_hidden_states_mask=mask(lengths, 12),
        timestep=torch.rand(batch) * 0.7 + 0.2,
        img_shapes=[[(1, 8, 8)]] * batch,
    )


def mid_inputs(side):
    batch = 4
    return dict(
        hidden_states=torch.randn(batch, side * side, 64),
        encoder_hidden_states=torch.randn(batch, 32, 256),
        encoder_hidden_states_mask=mask([32, 20, 32, 9], 32),
        timestep=torch.rand(batch) * 0.7 + 0.2,
        img_shapes=[[(1, side, side)]] * batch,
    )


def forward(model, inputs):
    def run():
        with torch.inference_mode():
            return model(**inputs, return_dict=False)[0]

    return run


def forward_backward(model, inputs):
    params = [p for p in model.parameters() if p.requires_grad]

    def run():
        for p in params:
            p.grad = None
        v = model(**inputs, return_dict=False)[0]
        (v * v).mean().backward()

    return run


def median_ms(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--only", default="", help="run the benchmarks whose id contains this")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    shapes = with_lora(
        QwenImageTransformer2DModel.from_pretrained(ROOT / "fixtures/shapes_world/transformer")
    )
    mid = with_lora(QwenImageTransformer2DModel(**MID))
    benches = [
        ("shapes_transformer/flex/forward/32", lambda: forward(shapes, shapes_inputs(32))),
        (
            "shapes_transformer/flex/forward_backward/16",
            lambda: forward_backward(shapes, shapes_inputs(16)),
        ),
    ]
    for side in (16, 32):
        tokens = side * side
        benches += [
            (f"mid_transformer/flex/forward/{tokens}", lambda s=side: forward(mid, mid_inputs(s))),
            (
                f"mid_transformer/flex/forward_backward/{tokens}",
                lambda s=side: forward_backward(mid, mid_inputs(s)),
            ),
        ]
    for name, make in benches:
        if args.only not in name:
            continue
        ms = median_ms(make(), args.warmup, args.repeats)
        print(
            json.dumps(
                {
                    "id": name,
                    "median_ms": round(ms, 2),
                    "peak_rss_mib": round(peak_rss_mib()),
                    "threads": args.threads,
                    "torch": torch.__version__,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
