//! Step time of the Qwen-Image models at their real size, with random weights: the transformer
//! (forward, and LoRA forward + backward with or without per-block activation checkpointing)
//! and the text path of the text encoder (forward), at the resolutions and prompt batches the
//! recipe runs. Built for a GPU (`--features cuda -- --backend cuda`); `--size mid` runs the
//! same work on a small configuration on any backend, in seconds.
//!
//! ```text
//! cargo run --release --features cuda --example full_size -- --backend cuda \
//!     --part transformer --dtype bf16 --resolutions 384,1024
//! cargo run --release --features cuda --example full_size -- --backend cuda --part text-encoder
//! ```
//!
//! Every measurement is one JSON line on stdout: what ran, the first call's time (kernel
//! compilation and autotuning included), then the median, min and max of the timed calls, and
//! the wall-clock span (`start_ms`, `end_ms`, Unix milliseconds) of the whole measurement, so
//! that a device-memory log sampled beside the run (`nvidia-smi --query-gpu=timestamp,
//! memory.used -lms 100`) can be cut into each measurement's peak. Between measurements the
//! device's memory pools are released (`Backend::memory_cleanup`).
//!
//! `benches/reference/full_size_torch.py` is the same work in PyTorch (diffusers, peft,
//! transformers); docs/PERFORMANCE.md holds the figures.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Module, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, Int, Tensor, TensorData};
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, ValueEnum};
use flowrl::backend::BackendKind;
use flowrl::dit_models::{
    ActivationCheckpointing, Adapters, ImageShape, LoraConfig, QwenImageConfig, QwenImageInput,
    QwenImageTransformer2DModel,
};
use flowrl::model_weights::cast_float_params;
use flowrl::qwen_image::text_encoder::{
    Attention, DecoderLayer, Linear, Mlp, RmsNorm, TextEncoder,
};
use flowrl::qwen_image::tokenizer::TokenBatch;

#[derive(Parser, Debug)]
#[command(about = "Step time of the Qwen-Image transformer and text encoder at their real size")]
struct Args {
    /// Backend: cpu, cuda or wgpu (GPU backends need their cargo feature).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// What to measure.
    #[arg(long, value_enum, default_value = "transformer")]
    part: Part,
    /// `full`: the real models (20.4 B transformer, 7.1 B text path); `mid`: a small
    /// configuration of the same code for a quick check on any backend.
    #[arg(long, value_enum, default_value = "full")]
    size: Size,
    /// Dtype of the base weights and the activations (the LoRA adapters stay f32).
    #[arg(long, value_enum, default_value = "f32")]
    dtype: WeightDtype,
    /// Image sides in pixels (the VAE's 8x and the 2x2 patch make `(side / 16)^2` tokens).
    #[arg(long, value_delimiter = ',', default_value = "384,1024")]
    resolutions: Vec<usize>,
    /// Samples per transformer call.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Text tokens per sample (the prompt after the template's drop).
    #[arg(long, default_value_t = 64)]
    text_tokens: usize,
    /// LoRA rank on the eight attention projections (alpha = 2 x rank, as the recipe).
    #[arg(long, default_value_t = 64)]
    lora_rank: usize,
    /// Activation checkpointing modes of the LoRA forward + backward, in order. `none` keeps
    /// every activation (at the real size and 1024x1024 it may not fit: it runs last).
    #[arg(long, value_delimiter = ',', default_value = "per-block,none")]
    checkpointing: Vec<Ckpt>,
    /// Prompt batches of the text encoder.
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    prompt_batches: Vec<usize>,
    /// Tokens per prompt row of the text encoder (template included; a quarter of the rows
    /// are padded to half their length).
    #[arg(long, default_value_t = 160)]
    prompt_tokens: usize,
    /// Timed calls per measurement, after one untimed first call.
    #[arg(long, default_value_t = 3)]
    iters: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Part {
    Transformer,
    TextEncoder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Size {
    Full,
    Mid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WeightDtype {
    F32,
    Bf16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Ckpt {
    None,
    PerBlock,
}

impl WeightDtype {
    fn burn(self) -> DType {
        match self {
            WeightDtype::F32 => DType::F32,
            WeightDtype::Bf16 => DType::BF16,
        }
    }
}

fn main() -> Result<()> {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches)?;
    check(&args, &matches)?;
    let kind: BackendKind = args.backend.parse()?;
    let kind = kind.ensure_available()?;
    match kind {
        BackendKind::Cpu => run::<flowrl::backend::Cpu>(&args),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => run::<flowrl::backend::Cuda>(&args),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => run::<flowrl::backend::Wgpu>(&args),
        #[allow(unreachable_patterns)]
        other => bail!("backend {other:?} is not compiled into this build"),
    }
}

/// Every flag, before any model is built: the values the measurements need, and no flag of
/// the part not measured (it would be accepted and then ignored).
fn check(args: &Args, matches: &ArgMatches) -> Result<()> {
    let mut problems = Vec::new();
    if args.iters == 0 {
        problems.push("--iters 0: expected at least 1 timed call".to_string());
    }
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    let (other, flags): (&str, &[(&str, &str)]) = match args.part {
        Part::Transformer => (
            "text-encoder",
            &[
                ("prompt_batches", "--prompt-batches"),
                ("prompt_tokens", "--prompt-tokens"),
            ],
        ),
        Part::TextEncoder => (
            "transformer",
            &[
                ("resolutions", "--resolutions"),
                ("batch", "--batch"),
                ("text_tokens", "--text-tokens"),
                ("lora_rank", "--lora-rank"),
                ("checkpointing", "--checkpointing"),
            ],
        ),
    };
    for (id, flag) in flags {
        if given(id) {
            problems.push(format!(
                "{flag} is a flag of --part {other}, which this run does not measure"
            ));
        }
    }
    match args.part {
        Part::Transformer => {
            for &side in &args.resolutions {
                if side == 0 || !side.is_multiple_of(16) {
                    problems.push(format!(
                        "--resolutions: {side} is not a positive multiple of 16 (VAE 8x, patch 2)"
                    ));
                }
            }
            for (flag, value) in [
                ("--batch", args.batch),
                ("--text-tokens", args.text_tokens),
                ("--lora-rank", args.lora_rank),
            ] {
                if value == 0 {
                    problems.push(format!("{flag} 0: expected at least 1"));
                }
            }
        }
        Part::TextEncoder => {
            if args.prompt_tokens < 2 {
                problems.push(format!(
                    "--prompt-tokens {}: expected at least 2",
                    args.prompt_tokens
                ));
            }
            if args.prompt_batches.contains(&0) {
                problems.push("--prompt-batches: a batch of 0 prompts measures nothing".into());
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("{}", problems.join("; "))
    }
}

fn run<B: Backend>(args: &Args) -> Result<()>
where
    B::Device: Default,
{
    let device = B::Device::default();
    match args.part {
        Part::Transformer => transformer::<Autodiff<B>>(args, &device),
        Part::TextEncoder => text_encoder::<B>(args, &device),
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Runs `step` once untimed and `iters` times timed (each ending in a device sync), and
/// prints the measurement's JSON line.
fn measure<B: Backend>(
    what: serde_json::Value,
    iters: usize,
    device: &B::Device,
    mut step: impl FnMut() -> Result<()>,
) -> Result<()> {
    let start_ms = now_ms();
    let t = Instant::now();
    step()?;
    B::sync(device)?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        step()?;
        B::sync(device)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let mut line = what;
    line["first_ms"] = first_ms.into();
    line["median_ms"] = times[times.len() / 2].into();
    line["min_ms"] = times[0].into();
    line["max_ms"] = times[times.len() - 1].into();
    line["iters"] = iters.into();
    line["impl"] = "flowrl".into();
    line["start_ms"] = (start_ms as u64).into();
    line["end_ms"] = (now_ms() as u64).into();
    println!("{line}");
    B::memory_cleanup(device);
    Ok(())
}

fn transformer_config(size: Size) -> QwenImageConfig {
    match size {
        Size::Full => QwenImageConfig::qwen_image(),
        Size::Mid => QwenImageConfig::new()
            .with_num_layers(4)
            .with_attention_head_dim(64)
            .with_num_attention_heads(4)
            .with_joint_attention_dim(256)
            .with_axes_dims_rope([16, 24, 24]),
    }
}

fn transformer_input<B: Backend>(
    config: &QwenImageConfig,
    args: &Args,
    side_px: usize,
    device: &B::Device,
) -> Result<QwenImageInput<B>> {
    if side_px == 0 || !side_px.is_multiple_of(16) {
        bail!("--resolutions: {side_px} is not a positive multiple of 16 (VAE 8x, patch 2)");
    }
    let side = side_px / 16;
    let (b, s) = (args.batch, args.text_tokens);
    let dtype = args.dtype.burn();
    let random = |shape: [usize; 3]| {
        Tensor::<B, 3>::random(shape, Distribution::Normal(0.0, 1.0), device).cast(dtype)
    };
    // The last row's prompt is a third shorter: padded keys are masked, as in a real batch.
    let mask: Vec<i32> = (0..b)
        .flat_map(|r| {
            let n = if r + 1 == b && b > 1 { s - s / 3 } else { s };
            (0..s).map(move |i| i32::from(i < n))
        })
        .collect();
    Ok(QwenImageInput {
        hidden_states: random([b, side * side, config.in_channels]),
        encoder_hidden_states: random([b, s, config.joint_attention_dim]),
        encoder_hidden_states_mask: Some(
            Tensor::<B, 2, Int>::from_data(TensorData::new(mask, [b, s]), device).equal_elem(1),
        ),
        timestep: Tensor::<B, 1>::random([b], Distribution::Uniform(0.2, 0.9), device).cast(dtype),
        img_shapes: vec![ImageShape::new(1, side, side)],
    })
}

fn transformer<A: AutodiffBackend>(args: &Args, device: &A::Device) -> Result<()> {
    let config = transformer_config(args.size);
    config.validate()?;
    let dtype = args.dtype.burn();
    let t = Instant::now();
    // The base cast before the adapters are attached: attaching freezes (and so materialises)
    // every base weight, which would hold the whole model in f32 at once. The adapters stay
    // f32, as a training run keeps them.
    let model: QwenImageTransformer2DModel<A> = cast_float_params(config.init::<A>(device), dtype);
    let lora = LoraConfig::new(args.lora_rank, 2.0 * args.lora_rank as f64);
    let model = model.attach_lora(&lora)?;
    A::sync(device)?;
    let params: usize = model.num_params();
    eprintln!(
        "transformer: {} blocks, width {}, {:.2} B parameters ({:?} base, f32 LoRA r{} on the \
         attention projections), built in {:.1} s",
        config.num_layers,
        config.inner_dim(),
        params as f64 / 1e9,
        args.dtype,
        args.lora_rank,
        t.elapsed().as_secs_f64()
    );
    for &px in &args.resolutions {
        let tokens = (px / 16) * (px / 16);
        let what = |phase: &str, ckpt: Option<Ckpt>| {
            let mut v = serde_json::json!({
                "part": "transformer", "phase": phase, "size": format!("{:?}", args.size),
                "dtype": format!("{:?}", args.dtype), "resolution": px, "image_tokens": tokens,
                "text_tokens": args.text_tokens, "batch": args.batch, "lora_rank": args.lora_rank,
                "params": params,
            });
            if let Some(c) = ckpt {
                v["checkpointing"] = format!("{c:?}").into();
            }
            v
        };
        let inner = model.valid();
        let input = transformer_input::<A::InnerBackend>(&config, args, px, device)?;
        measure::<A::InnerBackend>(what("forward", None), args.iters, device, || {
            let _ = inner.forward_with(input.clone(), Adapters::Enabled);
            Ok(())
        })?;
        drop(inner);
        let input = transformer_input::<A>(&config, args, px, device)?;
        for &ckpt in &args.checkpointing {
            let mode = match ckpt {
                Ckpt::None => ActivationCheckpointing::None,
                Ckpt::PerBlock => ActivationCheckpointing::PerBlock,
            };
            measure::<A>(
                what("lora_forward_backward", Some(ckpt)),
                args.iters,
                device,
                || {
                    let out = model.forward_backward(input.clone(), Adapters::Enabled, mode, |v| {
                        v.cast(DType::F32).powi_scalar(2).mean()
                    });
                    let _ = out.loss.into_data();
                    Ok(())
                },
            )?;
        }
    }
    Ok(())
}

/// The text path of Qwen2.5-VL-7B-Instruct (Qwen-Image's `text_encoder/config.json`), or a
/// small one of the same shape rules.
struct TextShape {
    vocab: usize,
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    eps: f64,
    rope_theta: f64,
}

impl TextShape {
    fn new(size: Size) -> Self {
        match size {
            Size::Full => Self {
                vocab: 152_064,
                hidden: 3584,
                intermediate: 18_944,
                layers: 28,
                heads: 28,
                kv_heads: 4,
                eps: 1e-6,
                rope_theta: 1_000_000.0,
            },
            Size::Mid => Self {
                vocab: 4096,
                hidden: 512,
                intermediate: 1024,
                layers: 4,
                heads: 4,
                kv_heads: 2,
                eps: 1e-6,
                rope_theta: 1_000_000.0,
            },
        }
    }
}

fn random_linear<B: Backend>(d_in: usize, d_out: usize, bias: bool, dev: &B::Device) -> Linear<B> {
    let k = 1.0 / (d_in as f64).sqrt();
    Linear {
        weight: Param::from_tensor(Tensor::random(
            [d_in, d_out],
            Distribution::Uniform(-k, k),
            dev,
        )),
        bias: bias.then(|| {
            Param::from_tensor(Tensor::random([d_out], Distribution::Uniform(-k, k), dev))
        }),
    }
}

fn ones_norm<B: Backend>(d: usize, eps: f64, dev: &B::Device) -> RmsNorm<B> {
    RmsNorm {
        weight: Param::from_tensor(Tensor::ones([d], dev)),
        eps,
    }
}

/// The text path with random weights in `dtype`, each layer cast as it is made, so that the
/// device never holds more than one layer in f32 (as the pipeline's loader, which converts
/// on the host, never holds any).
fn random_text_encoder<B: Backend>(s: &TextShape, dtype: DType, dev: &B::Device) -> TextEncoder<B> {
    let hd = s.hidden / s.heads;
    let (q, kv) = (s.heads * hd, s.kv_heads * hd);
    let layers = (0..s.layers)
        .map(|_| DecoderLayer {
            input_layernorm: ones_norm(s.hidden, s.eps, dev),
            self_attn: Attention {
                q_proj: random_linear(s.hidden, q, true, dev),
                k_proj: random_linear(s.hidden, kv, true, dev),
                v_proj: random_linear(s.hidden, kv, true, dev),
                o_proj: random_linear(q, s.hidden, false, dev),
                num_heads: s.heads,
                num_kv_heads: s.kv_heads,
                head_dim: hd,
            },
            post_attention_layernorm: ones_norm(s.hidden, s.eps, dev),
            mlp: Mlp {
                gate_proj: random_linear(s.hidden, s.intermediate, false, dev),
                up_proj: random_linear(s.hidden, s.intermediate, false, dev),
                down_proj: random_linear(s.intermediate, s.hidden, false, dev),
            },
        })
        .map(|layer| cast_float_params(layer, dtype))
        .collect();
    let embed: Tensor<B, 2> =
        Tensor::random([s.vocab, s.hidden], Distribution::Normal(0.0, 0.02), dev);
    let embed_tokens = Param::from_tensor(embed.cast(dtype));
    TextEncoder {
        embed_tokens,
        layers,
        norm: cast_float_params(ones_norm(s.hidden, s.eps, dev), dtype),
        rope_theta: s.rope_theta,
    }
}

fn text_encoder<B: Backend>(args: &Args, device: &B::Device) -> Result<()> {
    let shape = TextShape::new(args.size);
    let t = Instant::now();
    let encoder = random_text_encoder::<B>(&shape, args.dtype.burn(), device);
    B::sync(device)?;
    let params = encoder.num_params();
    eprintln!(
        "text encoder: {} layers, width {}, {:.2} B parameters ({:?}), built in {:.1} s",
        shape.layers,
        shape.hidden,
        params as f64 / 1e9,
        args.dtype,
        t.elapsed().as_secs_f64()
    );
    let s = args.prompt_tokens;
    if s < 2 {
        bail!("--prompt-tokens must be at least 2");
    }
    for &b in &args.prompt_batches {
        // Every fourth row is padded to half its length.
        let batch = TokenBatch {
            ids: (0..b)
                .map(|r| {
                    (0..s)
                        .map(|i| ((r * 7919 + i * 104_729) % shape.vocab) as u32)
                        .collect()
                })
                .collect(),
            mask: (0..b)
                .map(|r| {
                    let n = if r % 4 == 3 { s / 2 } else { s };
                    (0..s).map(|i| u8::from(i < n)).collect()
                })
                .collect(),
        };
        let what = serde_json::json!({
            "part": "text_encoder", "phase": "forward", "size": format!("{:?}", args.size),
            "dtype": format!("{:?}", args.dtype), "prompts": b, "prompt_tokens": s, "params": params,
        });
        measure::<B>(what, args.iters, device, || {
            let h = encoder
                .forward(&batch, device)
                .context("text encoder forward")?;
            let _ = h;
            Ok(())
        })?;
    }
    Ok(())
}
