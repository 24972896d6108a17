#!/usr/bin/env python3
"""The work of `examples/full_size.rs` in PyTorch on a CUDA GPU: diffusers'
`QwenImageTransformer2DModel` at its real size (20.4 B parameters, random weights) with a peft
LoRA on the eight attention projections, forward and LoRA forward + backward (with and without
diffusers' gradient checkpointing, which is per block as flowrl's), and the text path of
Qwen2.5-VL-7B (transformers' `Qwen2_5_VLTextModel`, random weights), forward. Same shapes,
same masks (the last sample's prompt a third shorter; every fourth text-encoder row padded to
half its length), same loss (`mean(v^2)` in f32).

    python benches/reference/full_size_torch.py --part transformer --dtype bf16
    python benches/reference/full_size_torch.py --part text-encoder --dtype bf16

Prints one JSON line per measurement, with the fields of the Rust example's lines (the first
call's time, then the median, min and max of `--iters` timed calls, CUDA-synchronised) plus
`torch_peak_allocated_mib` and `torch_peak_reserved_mib` (the caching allocator's peaks over
the measurement). Written against torch 2.11, diffusers 0.42.1, peft 0.18 and transformers 5.
"""

import argparse
import json
import sys
import time

import torch

# The eight attention projections, as in the CPU comparison.
from transformer_torch import TARGETS  # this directory is on sys.path

DEVICE = "cuda"
MID_TRANSFORMER = dict(
    num_layers=4,
    attention_head_dim=64,
    num_attention_heads=4,
    joint_attention_dim=256,
    axes_dims_rope=(16, 24, 24),
)
FULL_TEXT = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
)
MID_TEXT = dict(
    vocab_size=4096,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def measure(what, iters, step):
    sync()
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start_ms = int(time.time() * 1000)
    t = time.perf_counter()
    step()
    sync()
    first_ms = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    line = dict(what)
    line.update(
        first_ms=first_ms,
        median_ms=times[len(times) // 2],
        min_ms=times[0],
        max_ms=times[-1],
        iters=iters,
        start_ms=start_ms,
        end_ms=int(time.time() * 1000),
        impl="torch",
    )
    if DEVICE == "cuda":
        line["torch_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        line["torch_peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    print(json.dumps(line), flush=True)
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def transformer(args, dtype):
    from diffusers import QwenImageTransformer2DModel
    from peft import LoraConfig, inject_adapter_in_model

    t = time.perf_counter()
    torch.set_default_dtype(dtype)
    with torch.device(DEVICE):
        model = QwenImageTransformer2DModel(**(MID_TRANSFORMER if args.size == "mid" else {}))
    torch.set_default_dtype(torch.float32)
    model.requires_grad_(False)
    config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        target_modules=TARGETS,
        lora_dropout=0.0,
    )
    model = inject_adapter_in_model(config, model)
    model.to(device=DEVICE, dtype=dtype)
    # The adapters in f32 on the base's dtype, as flowrl keeps them (and diffusers' training
    # scripts' `cast_training_params`); peft casts the input to the adapter's dtype.
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    params = sum(p.numel() for p in model.parameters())
    sync()
    print(
        f"transformer: {params / 1e9:.2f} B parameters ({dtype}), built in "
        f"{time.perf_counter() - t:.1f} s",
        file=sys.stderr,
    )
    b, s = args.batch, args.text_tokens
    lengths = [s - s // 3 if (r + 1 == b and b > 1) else s for r in range(b)]
    mask = torch.tensor([[i < n for i in range(s)] for n in lengths], device=DEVICE)
    for px in args.resolutions:
        side = px // 16
        tokens = side * side
        inputs = dict(
            hidden_states=torch.randn(b, tokens, 64, device=DEVICE, dtype=dtype),
            encoder_hidden_states=torch.randn(b, s, model.config.joint_attention_dim, device=DEVICE, dtype=dtype),
            encoder_hidden_states_mask=mask,
            timestep=(torch.rand(b, device=DEVICE) * 0.7 + 0.2).to(dtype),
            img_shapes=[[(1, side, side)]] * b,
            return_dict=False,
        )

        def what(phase, ckpt=None):
            w = dict(
                part="transformer",
                phase=phase,
                size=args.size.capitalize(),
                dtype="Bf16" if dtype == torch.bfloat16 else "F32",
                resolution=px,
                image_tokens=tokens,
                text_tokens=s,
                batch=b,
                lora_rank=args.lora_rank,
                params=params,
            )
            if ckpt is not None:
                w["checkpointing"] = ckpt
            return w

        def forward():
            with torch.inference_mode():
                model(**inputs)

        measure(what("forward"), args.iters, forward)

        def train():
            (v,) = model(**inputs)
            loss = v.float().pow(2).mean()
            loss.backward()
            model.zero_grad(set_to_none=True)

        for ckpt in args.checkpointing:
            if ckpt == "per-block":
                model.enable_gradient_checkpointing()
            else:
                model.disable_gradient_checkpointing()
            model.train()
            name = "PerBlock" if ckpt == "per-block" else "None"
            try:
                measure(what("lora_forward_backward", name), args.iters, train)
            except torch.OutOfMemoryError as e:
                print(json.dumps(dict(what("lora_forward_backward", name), error=str(e)[:200])))
                model.zero_grad(set_to_none=True)
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
            model.eval()


def text_encoder(args, dtype):
    from transformers import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLTextModel

    shape = MID_TEXT if args.size == "mid" else FULL_TEXT
    config = Qwen2_5_VLTextConfig(
        **shape,
        rms_norm_eps=1e-6,
        max_position_embeddings=128000,
    )
    config._attn_implementation = "sdpa"
    t = time.perf_counter()
    torch.set_default_dtype(dtype)
    with torch.device(DEVICE):
        model = Qwen2_5_VLTextModel(config).eval()
    torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    sync()
    print(
        f"text encoder: {params / 1e9:.2f} B parameters ({dtype}), built in "
        f"{time.perf_counter() - t:.1f} s",
        file=sys.stderr,
    )
    s = args.prompt_tokens
    for b in args.prompt_batches:
        ids = torch.tensor(
            [[(r * 7919 + i * 104729) % shape["vocab_size"] for i in range(s)] for r in range(b)],
            device=DEVICE,
        )
        mask = torch.tensor(
            [[int(i < (s // 2 if r % 4 == 3 else s)) for i in range(s)] for r in range(b)],
            device=DEVICE,
        )

        def forward():
            with torch.inference_mode():
                model(input_ids=ids, attention_mask=mask)

        what = dict(
            part="text_encoder",
            phase="forward",
            size=args.size.capitalize(),
            dtype="Bf16" if dtype == torch.bfloat16 else "F32",
            prompts=b,
            prompt_tokens=s,
            params=params,
        )
        measure(what, args.iters, forward)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["transformer", "text-encoder"], default="transformer")
    p.add_argument("--size", choices=["full", "mid"], default="full")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    p.add_argument("--resolutions", default="384,1024")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--text-tokens", type=int, default=64)
    p.add_argument("--lora-rank", type=int, default=64)
    p.add_argument("--checkpointing", default="per-block,none")
    p.add_argument("--prompt-batches", default="8,32")
    p.add_argument("--prompt-tokens", type=int, default=160)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args()
    global DEVICE
    DEVICE = args.device
    args.resolutions = [int(x) for x in args.resolutions.split(",")]
    args.checkpointing = args.checkpointing.split(",")
    args.prompt_batches = [int(x) for x in args.prompt_batches.split(",")]
    # As PyTorch users run on Ampere and later; flowrl's CUDA matmuls take TF32 stages too.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.part == "transformer":
        transformer(args, dtype)
    else:
        text_encoder(args, dtype)


if __name__ == "__main__":
    main()
