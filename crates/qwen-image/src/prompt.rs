//! Qwen-Image's prompt encoding (`QwenImagePipeline._get_qwen_prompt_embeds` and
//! `encode_prompt`): each prompt in the chat template, the text encoder's last hidden state,
//! the template's leading tokens dropped, the rows re-padded with zeros.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::error::QwenImageError;
use crate::text_encoder::TextEncoder;
use crate::tokenizer::QwenTokenizer;

/// The chat template every prompt is put in (`{}` is the prompt).
pub const PROMPT_TEMPLATE: &str = "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";

/// How many leading tokens of each templated prompt are dropped: the system turn and
/// `<|im_start|>user\n` under the real Qwen vocabulary. diffusers drops this many whatever the
/// tokenizer, and so does this crate.
pub const PROMPT_TEMPLATE_START_IDX: usize = 34;

/// The longest prompt in tokens (the templated text is truncated to this plus
/// [`PROMPT_TEMPLATE_START_IDX`]).
pub const TOKENIZER_MAX_LENGTH: usize = 1024;

/// `encode_prompt`'s default `max_sequence_length`, also its largest accepted value.
pub const MAX_SEQUENCE_LENGTH: usize = 1024;

/// A prompt in the template.
pub fn templated(prompt: &str) -> String {
    let (head, tail) = PROMPT_TEMPLATE
        .split_once("{}")
        .expect("the template has one placeholder");
    format!("{head}{prompt}{tail}")
}

/// Prompt embeddings `[batch, seq, hidden]` and their mask `[batch][seq]` (1 = a token, 0 =
/// zero padding after it), as `encode_prompt` returns them.
#[derive(Clone, Debug)]
pub struct PromptEmbeds<B: Backend> {
    /// `[batch, seq, hidden]`, zero after each row's length.
    pub embeds: Tensor<B, 3>,
    /// `[batch][seq]`.
    pub mask: Vec<Vec<u8>>,
}

impl<B: Backend> PromptEmbeds<B> {
    /// The number of real tokens in each row.
    pub fn lengths(&self) -> Vec<usize> {
        self.mask
            .iter()
            .map(|r| r.iter().filter(|&&m| m != 0).count())
            .collect()
    }

    /// Whether no position is padding (diffusers then returns no mask at all).
    pub fn is_unmasked(&self) -> bool {
        self.mask.iter().flatten().all(|&m| m != 0)
    }
}

/// The tokenizer and the text encoder, encoding prompts as Qwen-Image conditions on them.
#[derive(Debug)]
pub struct PromptEncoder<B: Backend> {
    /// The tokenizer.
    pub tokenizer: QwenTokenizer,
    /// The text encoder.
    pub text_encoder: TextEncoder<B>,
}

impl<B: Backend> PromptEncoder<B> {
    /// The two components together.
    pub fn new(tokenizer: QwenTokenizer, text_encoder: TextEncoder<B>) -> Self {
        Self {
            tokenizer,
            text_encoder,
        }
    }

    /// `encode_prompt(prompts, max_sequence_length)` for one image per prompt: the templated
    /// prompts tokenized as one padded batch (truncated to [`TOKENIZER_MAX_LENGTH`] +
    /// [`PROMPT_TEMPLATE_START_IDX`] tokens), the last hidden state of each row's real tokens
    /// after the first [`PROMPT_TEMPLATE_START_IDX`], zero-padded to the longest row, then cut
    /// to `max_sequence_length` positions.
    ///
    /// # Errors
    /// [`QwenImageError::Input`] for an empty batch, `max_sequence_length` of 0 or above
    /// [`MAX_SEQUENCE_LENGTH`] (diffusers refuses it too), or prompts that leave no token once
    /// the template's leading tokens are dropped; the tokenizer's and the text encoder's
    /// errors.
    pub fn encode<S: AsRef<str>>(
        &self,
        prompts: &[S],
        max_sequence_length: usize,
        device: &B::Device,
    ) -> Result<PromptEmbeds<B>, QwenImageError> {
        if max_sequence_length == 0 || max_sequence_length > MAX_SEQUENCE_LENGTH {
            return Err(QwenImageError::input(
                "max_sequence_length",
                format!("{max_sequence_length}: expected 1 to {MAX_SEQUENCE_LENGTH}"),
            ));
        }
        let texts: Vec<String> = prompts.iter().map(|p| templated(p.as_ref())).collect();
        let batch = self.tokenizer.encode_batch(
            &texts,
            Some(TOKENIZER_MAX_LENGTH + PROMPT_TEMPLATE_START_IDX),
        )?;
        let hidden = self.text_encoder.forward(&batch, device)?;
        let [b, s, d] = hidden.dims();
        let kept: Vec<Vec<i64>> = batch
            .mask
            .iter()
            .map(|m| {
                (0..s)
                    .filter(|&j| m[j] != 0)
                    .skip(PROMPT_TEMPLATE_START_IDX)
                    .map(|j| j as i64)
                    .collect()
            })
            .collect();
        let longest = kept.iter().map(Vec::len).max().unwrap_or(0);
        if longest == 0 {
            return Err(QwenImageError::input(
                "prompts",
                format!(
                    "no templated prompt has more than {PROMPT_TEMPLATE_START_IDX} tokens (lengths {:?}): nothing is left once the template's leading tokens are dropped",
                    batch.lengths()
                ),
            ));
        }
        let rows: Vec<Tensor<B, 2>> = kept
            .iter()
            .enumerate()
            .map(|(i, idx)| {
                let row = hidden.clone().narrow(0, i, 1).reshape([s, d]);
                let mut parts = Vec::with_capacity(2);
                if !idx.is_empty() {
                    let index = Tensor::<B, 1, Int>::from_data(
                        TensorData::new(idx.clone(), [idx.len()]),
                        device,
                    );
                    parts.push(row.select(0, index));
                }
                if idx.len() < longest {
                    parts.push(Tensor::zeros(
                        [longest - idx.len(), d],
                        (device, hidden.dtype()),
                    ));
                }
                Tensor::cat(parts, 0)
            })
            .collect();
        let keep = longest.min(max_sequence_length);
        let embeds = Tensor::stack::<3>(rows, 0).narrow(1, 0, keep);
        debug_assert_eq!(embeds.dims()[0], b);
        let mask = kept
            .iter()
            .map(|idx| (0..keep).map(|j| u8::from(j < idx.len())).collect())
            .collect();
        Ok(PromptEmbeds { embeds, mask })
    }
}
