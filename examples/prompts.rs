//! Prompt datasets in the unified JSONL schema (seed 002, "Data preparation"): convert a source,
//! curate it into train / eval files, inspect the result before a run.
//!
//! ```sh
//! cargo run --release --example prompts -- convert --input prompts.txt --task t2i \
//!     --id-prefix mine_ --output data/raw/t2i/mine.jsonl
//! cargo run --release --example prompts -- curate --input data/raw/t2i/mine.jsonl \
//!     --out-dir data/processed/t2i --prefix mine_ --min-prompt-words 6 \
//!     --eval-size 2048 --eval-subset-sizes 64 256 --no-check-media
//! cargo run --release --example prompts -- inspect --train data/processed/t2i/mine_train.jsonl \
//!     --eval data/processed/t2i/mine_eval256.jsonl
//! ```
//!
//! Every step is deterministic: dedup by a content hash, the split by a hash of each sample id,
//! so a rerun writes the identical files. `convert` and `curate` refuse to replace a file that
//! exists unless given `--overwrite` (every output checked before any is written), and refuse
//! an output that is their input even then.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use prompt_data::{CurateOptions, SourceFormat, Split, convert, curate, inspect};

/// Convert, curate and inspect prompt datasets (unified JSONL schema).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A prompt source (.jsonl with a prompt field, .txt with one prompt per line, .parquet
    /// with a prompt column) into the schema.
    Convert {
        /// The source file.
        #[arg(long)]
        input: PathBuf,
        /// The JSONL field or parquet column holding the prompt (default: the first of prompt,
        /// caption, text); refused for a .txt input, which has no fields.
        #[arg(long)]
        field: Option<String>,
        /// The task of every record (t2i, i2i, t2v, i2v).
        #[arg(long, default_value = "t2i")]
        task: String,
        /// Sample ids are `<prefix><line number>`.
        #[arg(long, default_value = "")]
        id_prefix: String,
        /// The JSONL to write (not the input).
        #[arg(long)]
        output: PathBuf,
        /// Replace --output if it exists.
        #[arg(long)]
        overwrite: bool,
    },
    /// Dedup, filter and split a schema JSONL into `<prefix>train.jsonl`, `<prefix>eval.jsonl`
    /// and `<prefix>eval<k>.jsonl`.
    Curate {
        /// The schema JSONL.
        #[arg(long)]
        input: PathBuf,
        /// Where the files go.
        #[arg(long)]
        out_dir: PathBuf,
        /// Output file prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Drop prompts with fewer words.
        #[arg(long, default_value_t = 0)]
        min_prompt_words: usize,
        /// A fixed eval size (the records of smallest sample-id hash).
        #[arg(long, conflicts_with = "eval_fraction")]
        eval_size: Option<usize>,
        /// Nested eval subsets (with --eval-size).
        #[arg(long, num_args = 1.., requires = "eval_size")]
        eval_subset_sizes: Vec<usize>,
        /// The eval share of the sample-id hash space (default 0.01 without --eval-size).
        #[arg(long)]
        eval_fraction: Option<f64>,
        /// Keep records whose media files are missing.
        #[arg(long)]
        no_check_media: bool,
        /// Replace output files that exist (never the input).
        #[arg(long)]
        overwrite: bool,
    },
    /// Check a train file and eval files: keys, task, placeholders against media, leakage.
    Inspect {
        /// The train file.
        #[arg(long)]
        train: PathBuf,
        /// Eval files (repeatable).
        #[arg(long)]
        eval: Vec<PathBuf>,
        /// Also open and decode every media file (PNG and JPEG images).
        #[arg(long)]
        decode_media: bool,
    },
}

fn main() -> Result<()> {
    match Args::parse().command {
        Command::Convert {
            input,
            field,
            task,
            id_prefix,
            output,
            overwrite,
        } => {
            let format = SourceFormat::from_path(&input, field)?;
            let r = convert(&input, &format, &task, &id_prefix, &output, overwrite)?;
            println!(
                "wrote {} records to {} ({} blank lines skipped)",
                r.written,
                output.display(),
                r.blank
            );
        }
        Command::Curate {
            input,
            out_dir,
            prefix,
            min_prompt_words,
            eval_size,
            eval_subset_sizes,
            eval_fraction,
            no_check_media,
            overwrite,
        } => {
            let split = match eval_size {
                Some(size) => Split::EvalSize {
                    size,
                    subsets: eval_subset_sizes,
                },
                None => Split::EvalFraction(eval_fraction.unwrap_or(0.01)),
            };
            let r = curate(
                &input,
                &out_dir,
                &CurateOptions {
                    min_prompt_words,
                    check_media: !no_check_media,
                    split,
                    prefix,
                    overwrite,
                },
            )?;
            println!(
                "read {}: {} duplicates, {} under {min_prompt_words} words, {} with missing media dropped; \
                 {} train, {} eval",
                r.read, r.duplicates, r.too_short, r.missing_media, r.train, r.eval
            );
            for f in &r.files {
                println!("  {}", f.display());
            }
        }
        Command::Inspect {
            train,
            eval,
            decode_media,
        } => {
            let r = inspect(&train, &eval, decode_media)?;
            for (f, n) in &r.records {
                println!("{}: {n} records", f.display());
            }
            if !r.is_clean() {
                for p in &r.problems {
                    println!("{p}");
                }
                bail!("{} problem(s)", r.problems.len());
            }
            println!("no problems");
        }
    }
    Ok(())
}
