//! Exports a trained policy out of flowrl, read-only on the run: a committed checkpoint of a
//! run directory (the newest, or `--iteration N`) or a checkpoint's own `iter_<N>` directory,
//! as a PEFT adapter, a diffusers LoRA file or merged diffusers weights.
//!
//! ```sh
//! cargo run --release --example export -- runs/shapes-world-lora --form peft --out exports/peft
//! cargo run --release --example export -- runs/shapes-world-lora --form diffusers-lora --out exports/lora
//! cargo run --release --example export -- runs/shapes-world-lora --form merged --dtype bf16 \
//!     --max-shard-bytes 5000000000 --out exports/merged
//! ```
//!
//! In Python, with the base transformer the run trained on:
//!
//! ```python
//! PeftModel.from_pretrained(QwenImageTransformer2DModel.from_pretrained(base), "exports/peft")
//! pipe.load_lora_weights("exports/lora")                      # QwenImagePipeline
//! QwenImageTransformer2DModel.from_pretrained("exports/merged")
//! ```
//!
//! Every export is reloaded and its forward compared with the checkpoint's before it is put in
//! place (`--no-verify` skips that); an existing non-empty output directory is refused unless
//! `--overwrite`. An output directory that is, holds or lies inside the run (its directory, its
//! checkpoints, its artifacts) or anything the export reads (the base model, reward models,
//! prompt files) is refused before anything is written, `--overwrite` or not.

use std::path::PathBuf;

use anyhow::{Result, bail};
use burn::backend::Autodiff;
use clap::Parser;
use dit_models::ExportDtype;
use trainer_fsdp::export::{ExportForm, ExportRequest, dtype_name, export};

/// Export a committed checkpoint's policy (PEFT adapter, diffusers LoRA, merged diffusers).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// A run directory (holding config.resolved.toml) or a committed iter_<N> checkpoint
    /// directory inside one.
    source: PathBuf,
    /// peft, diffusers-lora or merged.
    #[arg(long)]
    form: String,
    /// The output directory (created; refused if it exists and is not empty, unless
    /// --overwrite). It must lie apart from the run, its checkpoints and the base model: one
    /// that is, holds or lies inside any of them is refused.
    #[arg(long)]
    out: PathBuf,
    /// The committed iteration to export (default: the newest).
    #[arg(long)]
    iteration: Option<u64>,
    /// The run's config, when it is not in or above the source directory.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The merged form's dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// The merged form's largest shard in bytes (diffusers' index layout); default one file.
    #[arg(long)]
    max_shard_bytes: Option<u64>,
    /// Replace an existing output directory (only once the new export is complete).
    #[arg(long)]
    overwrite: bool,
    /// Skip reloading the export and comparing its forward with the checkpoint's.
    #[arg(long)]
    no_verify: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let form = ExportForm::parse(&args.form)?;
    let dtype = match args.dtype.as_str() {
        "f32" => ExportDtype::F32,
        "bf16" => ExportDtype::Bf16,
        other => bail!("--dtype {other:?}: expected f32 or bf16"),
    };
    let request = ExportRequest {
        form,
        dtype,
        max_shard_bytes: args.max_shard_bytes,
        verify: !args.no_verify,
    };
    let report = export::<Autodiff<flowrl::backend::Cpu>>(
        &args.source,
        args.iteration,
        args.config.as_deref(),
        &args.out,
        &request,
        args.overwrite,
        &Default::default(),
    )?;
    println!(
        "exported checkpoint {} ({}) as {}{} into {}{}",
        report.checkpoint.iteration,
        report.checkpoint.dir.display(),
        form.as_str(),
        if form.is_adapter() {
            String::new()
        } else {
            format!(" ({})", dtype_name(dtype))
        },
        report.out.display(),
        if report.replaced {
            " (replacing the earlier export)"
        } else {
            ""
        },
    );
    println!("  base model: {}", report.exported.base_model.display());
    for f in &report.exported.files {
        println!("  {}", f.display());
    }
    match &report.exported.verification {
        Some(v) => println!(
            "  verified: {} matches the checkpoint's policy to {:.2e} over {} velocity values (tolerance {:.1e})",
            v.reloaded_as, v.max_abs, v.values, v.tolerance
        ),
        None => println!("  not verified (--no-verify)"),
    }
    Ok(())
}
