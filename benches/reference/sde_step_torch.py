#!/usr/bin/env python3
"""Times the reference implementations of the per-step kernels in PyTorch on the CPU, on the
shapes of `benches/sde_kernels.rs` (Qwen-Image 384x384 latents: batch 8 x 576 tokens x 64
channels), so the two can be compared in docs/PERFORMANCE.md.

Reference code, as for the fixtures (see fixtures/generate/sde_math_fixtures.py):
flow_grpo's `sde_step_with_logprob` ("sde", "cps"), DanceGRPO's `flux_step`, diffusers'
UniPC and DPM-Solver++ `step` in flow mode.

    python benches/reference/sde_step_torch.py --flow-grpo /path/to/flow_grpo \
        [--dance-grpo /path/to/DanceGRPO] --threads 2

Prints one line per kernel: median time per step and elements/s.
"""

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "generate"))
from sde_math_fixtures import load_functions_from_file  # noqa: E402

SHAPE = (8, 576, 64)


def bench(fn, repeats=60, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flow-grpo", required=True, type=Path)
    ap.add_argument("--dance-grpo", type=Path, help="DanceGRPO's source (its rows are skipped without it)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(args.flow_grpo))
    from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    sde = importlib.import_module("flow_grpo.diffusers_patch.sd3_sde_with_logprob").sde_step_with_logprob

    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    n = x.numel()
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(12)
    ts = sched.timesteps[[3] * SHAPE[0]]
    rows = []
    for sde_type in ["sde", "cps"]:
        gen = torch.Generator().manual_seed(1)
        prev = sde(sched, v, ts, x, noise_level=0.7, sde_type=sde_type, generator=gen)[0]
        rows.append((f"{sde_type}/sample", bench(lambda: sde(sched, v, ts, x, noise_level=0.7, sde_type=sde_type, generator=gen))))
        rows.append((f"{sde_type}/replay", bench(lambda: sde(sched, v, ts, x, noise_level=0.7, sde_type=sde_type, prev_sample=prev))))
        # the same work as flowrl's replay of a bf16-stored trajectory: the stored sample
        # rounded to bf16 and back, then scored
        rows.append(
            (
                f"{sde_type}/replay_bf16",
                bench(lambda: sde(sched, v, ts, x, noise_level=0.7, sde_type=sde_type, prev_sample=prev.bfloat16().float())),
            )
        )
    sigmas = sched.sigmas
    if args.dance_grpo is not None:
        flux_step = load_functions_from_file(args.dance_grpo / "fastvideo" / "train_grpo_flux.py", ["flux_step"])["flux_step"]
        rows.append(("dance/sample", bench(lambda: flux_step(v, x, 0.3, sigmas, 3, None, grpo=True, sde_solver=True))))
        prev = flux_step(v, x, 0.3, sigmas, 3, None, grpo=True, sde_solver=True)[0]
        rows.append(("dance/replay", bench(lambda: flux_step(v, x, 0.3, sigmas, 3, prev, grpo=True, sde_solver=True))))
    # diffusers' FlowMatchEulerDiscreteScheduler.step is `sample + dt * model_output`; timed
    # as that expression, without the scheduler's Python bookkeeping
    dt = float(sigmas[4] - sigmas[3])
    rows.append(("ode/euler", bench(lambda: x + dt * v)))
    for name, cls, kw in [
        ("ode/dpm++2m", DPMSolverMultistepScheduler, dict(algorithm_type="dpmsolver++", solver_order=2)),
        ("ode/unipc_bh2", UniPCMultistepScheduler, dict(solver_order=2, solver_type="bh2")),
    ]:
        def step(cls=cls, kw=kw):
            s = cls(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0, **kw)
            s.set_timesteps(12)
            for t in s.timesteps[:3]:
                s.step(v, t, x)
            return s

        warm = step()

        def one(warm=warm):
            # one steady-state step from a warmed copy of the scheduler state
            s = warm
            s._step_index = 3
            s.lower_order_nums = 2
            return s.step(v, s.timesteps[3], x)

        rows.append((name, bench(one)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, shape {SHAPE}")
    for name, t in rows:
        print(f"{name:20s} {t * 1e6:9.1f} us/step  {n / t / 1e6:9.1f} Melem/s")


if __name__ == "__main__":
    main()
