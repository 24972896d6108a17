//! The attributes every transformers `PretrainedConfig` carries, which the model crates'
//! config readers accept without effect.

/// Attributes every transformers `PretrainedConfig` carries (heads, generation defaults,
/// output flags, labels) that files saved by transformers 4.x before about 4.30 wrote out in
/// full into every (sub-)config: the keys of `PretrainedConfig().to_dict()` in transformers
/// 4.21, 4.25 and 4.57, less those a reader decides on itself (`_name_or_path`,
/// `architectures`, `model_type`, `transformers_version`, `torch_dtype` / `dtype`, the
/// `bos` / `eos` / `pad` token ids, `tie_word_embeddings` and `pruned_heads`). None of them
/// changes a forward; a reader accepts them without effect.
///
/// ```
/// assert!(model_weights::PRETRAINED_CONFIG_KEYS.contains(&"num_beams"));
/// assert!(!model_weights::PRETRAINED_CONFIG_KEYS.contains(&"pruned_heads"));
/// ```
pub const PRETRAINED_CONFIG_KEYS: &[&str] = &[
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "use_bfloat16",
    "tf_legacy_loss",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "is_decoder",
    "cross_attention_hidden_size",
    "add_cross_attention",
    "tie_encoder_decoder",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "finetuning_task",
    "id2label",
    "label2id",
    "tokenizer_class",
    "prefix",
    "sep_token_id",
    "decoder_start_token_id",
    "task_specific_params",
    "problem_type",
];
