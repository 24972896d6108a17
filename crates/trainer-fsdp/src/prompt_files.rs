//! The `[data]` prompt files of the worlds that read them: one reader of text-to-image records
//! with each world's own check, the training pool without held-out prompts, and the draw of a
//! rollout's prompts.

use std::path::Path;

use prompt_data::PromptRecord;

use crate::error::TrainerError;
use crate::rng::TrainerRng;

/// The text-to-image (`t2i`) records of a `[data]` prompt file, each passed through `accept`
/// (the world's check: `Ok` with what the world keeps of it, or `Err` with what is wrong).
///
/// # Errors
/// [`TrainerError::PromptFile`] listing every record that is not a `t2i` record or that
/// `accept` refuses, by line (or the file's read error, or "no records").
pub fn read_t2i_records<T>(
    path: &Path,
    world: &str,
    accept: impl Fn(&PromptRecord) -> Result<T, String>,
) -> Result<Vec<(String, T)>, TrainerError> {
    let bad = |problems: Vec<String>| TrainerError::PromptFile {
        path: path.to_path_buf(),
        problems,
    };
    let records = prompt_data::read_jsonl(path).map_err(|e| bad(vec![e.to_string()]))?;
    let mut out = Vec::with_capacity(records.len());
    let mut problems = Vec::new();
    for (line, r) in records {
        if r.metadata.task != "t2i" {
            problems.push(format!(
                "line {line}: task {:?}; the {world} is text-to-image (t2i)",
                r.metadata.task
            ));
            continue;
        }
        match accept(&r) {
            Ok(kept) => out.push((r.prompt, kept)),
            Err(problem) => problems.push(format!("line {line}: {problem}")),
        }
    }
    if out.is_empty() && problems.is_empty() {
        problems.push("no records".into());
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(bad(problems))
    }
}

/// The distinct prompts of `prompts` (the training file `path`'s), in order.
///
/// # Errors
/// [`TrainerError::PromptFile`] naming every prompt that is also held out (leakage).
pub fn train_pool(
    path: &Path,
    prompts: impl IntoIterator<Item = String>,
    held_out: &[String],
) -> Result<Vec<String>, TrainerError> {
    let mut pool: Vec<String> = Vec::new();
    let mut problems = Vec::new();
    for p in prompts {
        if held_out.contains(&p) {
            problems.push(format!("{p:?} is also a held-out prompt (leakage)"));
        } else if !pool.contains(&p) {
            pool.push(p);
        }
    }
    if problems.is_empty() {
        Ok(pool)
    } else {
        Err(TrainerError::PromptFile {
            path: path.to_path_buf(),
            problems,
        })
    }
}

/// `n` distinct prompts of `pool`, drawn from `rng` (a partial Fisher-Yates shuffle).
///
/// # Errors
/// [`TrainerError::PromptPoolExhausted`] when `pool` has fewer than `n`.
pub(crate) fn draw_distinct(
    rng: &mut TrainerRng,
    n: usize,
    pool: &[String],
) -> Result<Vec<String>, TrainerError> {
    if n > pool.len() {
        return Err(TrainerError::PromptPoolExhausted {
            requested: n,
            available: pool.len(),
        });
    }
    let mut idx: Vec<usize> = (0..pool.len()).collect();
    for i in 0..n {
        let j = i + rng.below((pool.len() - i) as u64) as usize;
        idx.swap(i, j);
    }
    Ok(idx[..n].iter().map(|&i| pool[i].clone()).collect())
}
