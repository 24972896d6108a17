//! The text encoder, the tokenizer and the prompt encoding against transformers / diffusers
//! (`fixtures/qwen_image/text_encoder.json`, written by
//! `fixtures/generate/qwen_image_fixtures.py` from a tiny random Qwen-Image directory saved
//! with `save_pretrained`), and the errors of bad directories.

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn::backend::flex::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use qwen_image::text_encoder::{ConfigLayout, TextEncoderConfig};
use qwen_image::tokenizer::{PaddingSide, TokenizerForm};
use qwen_image::{PromptEncoder, QwenImageError, QwenTokenizer, TextEncoder, TokenBatch};
use serde_json::Value;

mod support;

use support::{BF16_VS_PYTORCH, TOL, fixtures, max_abs_err_where, rows, strings, values};

fn fixture() -> Value {
    support::fixture("text_encoder.json")
}

fn pipeline() -> PathBuf {
    fixtures().join("tiny_pipeline")
}

fn check<B: Backend, const D: usize>(
    what: &str,
    got: Tensor<B, D>,
    want: &Value,
    keep: impl Fn(usize) -> bool,
) {
    let (shape, data) = values(want);
    assert_eq!(got.dims().to_vec(), shape, "{what}: shape");
    let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
    let err = max_abs_err_where(&got, &data, keep);
    eprintln!("{what}: max abs error {err:.3e}");
    assert!(err <= TOL, "{what}: max abs error {err:e} > {TOL:e}");
}

#[test]
fn both_tokenizer_forms_give_transformers_ids() {
    let f = fixture();
    let json = QwenTokenizer::from_dir(pipeline().join("tokenizer")).unwrap();
    let vm = QwenTokenizer::from_dir(fixtures().join("tokenizer_vocab_merges")).unwrap();
    assert_eq!(json.form(), TokenizerForm::TokenizerJson);
    assert_eq!(vm.form(), TokenizerForm::VocabMerges);
    assert_eq!(json.vocab_size(), vm.vocab_size());
    assert_eq!(json.pad_id(), vm.pad_id());
    for case in f["tokenizer"]["strings"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            json.encode(text).unwrap(),
            want,
            "tokenizer.json on {text:?}"
        );
        assert_eq!(
            vm.encode(text).unwrap(),
            want,
            "vocab.json + merges.txt on {text:?}"
        );
    }
    for batch in f["tokenizer"]["batches"].as_array().unwrap() {
        let side = match batch["side"].as_str().unwrap() {
            "left" => PaddingSide::Left,
            _ => PaddingSide::Right,
        };
        let texts: Vec<&str> = strings(&batch["texts"]);
        let max = batch["max_length"].as_u64().unwrap() as usize;
        let want = TokenBatch {
            ids: rows(&batch["input_ids"]),
            mask: rows(&batch["attention_mask"]),
        };
        for tok in [&json, &vm] {
            let got = tok
                .clone()
                .with_padding_side(side)
                .encode_batch(&texts, Some(max))
                .unwrap();
            assert_eq!(got, want, "{side:?} padding, max_length {max}");
        }
    }
}

fn hidden_case<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> (Tensor<B, 3>, TextEncoderConfig, TokenBatch) {
    let f = fixture();
    let batch = TokenBatch {
        ids: rows(&f["hidden"]["input_ids"]),
        mask: rows(&f["hidden"]["attention_mask"]),
    };
    let (model, config) = TextEncoder::<B>::from_dir(dir, device).unwrap();
    (model.forward(&batch, device).unwrap(), config, batch)
}

fn last_hidden_state_matches<B: Backend>(device: &B::Device) {
    let f = fixture();
    // transformers 5's layout, every position (padding included: positions are 0..seq as in
    // transformers 5).
    let (got, config, _) = hidden_case::<B>(&pipeline().join("text_encoder"), device);
    assert_eq!(config.layout, ConfigLayout::Nested);
    check(
        "transformers-5 layout",
        got,
        &f["hidden"]["last_hidden_state"],
        |_| true,
    );
    // transformers 4's layout of the same weights, against transformers 4's output at the real
    // tokens (it places padding at position 1).
    let (got, config, batch) = hidden_case::<B>(&fixtures().join("text_encoder_tf4"), device);
    assert_eq!(config.layout, ConfigLayout::Flat);
    let d = config.hidden_size;
    let s = batch.ids[0].len();
    let mask = batch.mask.clone();
    let real = move |i: usize| mask[i / (s * d)][(i / d) % s] != 0;
    check(
        "transformers-4 layout",
        got,
        &f["hidden"]["transformers4_last_hidden_state"],
        real,
    );
}

#[test]
fn last_hidden_state_matches_transformers_on_flex() {
    last_hidden_state_matches::<Flex>(&Default::default());
}

#[test]
fn last_hidden_state_matches_transformers_on_ndarray() {
    last_hidden_state_matches::<NdArray<f32>>(&Default::default());
}

#[test]
fn encode_prompt_matches_diffusers() {
    let f = fixture();
    let device = Default::default();
    let tokenizer = QwenTokenizer::from_dir(pipeline().join("tokenizer")).unwrap();
    let (text_encoder, _) =
        TextEncoder::<Flex>::from_dir(pipeline().join("text_encoder"), &device).unwrap();
    assert_eq!(
        f["template"].as_str().unwrap(),
        qwen_image::prompt::PROMPT_TEMPLATE
    );
    assert_eq!(
        f["template_start_idx"].as_u64().unwrap() as usize,
        qwen_image::prompt::PROMPT_TEMPLATE_START_IDX
    );
    assert_eq!(
        f["tokenizer_max_length"].as_u64().unwrap() as usize,
        qwen_image::prompt::TOKENIZER_MAX_LENGTH
    );
    let encoder = PromptEncoder::new(tokenizer, text_encoder);
    for case in f["encode_prompt"].as_array().unwrap() {
        let prompts: Vec<&str> = strings(&case["prompts"]);
        let max = case["max_sequence_length"].as_u64().unwrap() as usize;
        let templated: Vec<Vec<u32>> = rows(&case["templated_ids"]);
        for (p, want) in prompts.iter().zip(&templated) {
            let ids = encoder
                .tokenizer
                .encode(&qwen_image::prompt::templated(p))
                .unwrap();
            assert_eq!(&ids, want, "templated {p:?}");
        }
        let got = encoder.encode(&prompts, max, &device).unwrap();
        match &case["mask"] {
            Value::Null => assert!(
                got.is_unmasked(),
                "diffusers returned no mask: every position is a token"
            ),
            m => assert_eq!(got.mask, rows::<u8>(m), "mask at max_sequence_length {max}"),
        }
        check(
            &format!("encode_prompt, max_sequence_length {max}"),
            got.embeds,
            &case["prompt_embeds"],
            |_| true,
        );
    }
}

#[test]
fn bad_prompt_requests_are_refused() {
    let device = Default::default();
    let tokenizer = QwenTokenizer::from_dir(pipeline().join("tokenizer")).unwrap();
    let (text_encoder, _) =
        TextEncoder::<Flex>::from_dir(pipeline().join("text_encoder"), &device).unwrap();
    let vocab = text_encoder.vocab_size() as u32;
    let encoder = PromptEncoder::new(tokenizer, text_encoder);
    for max in [0, 1025] {
        let err = encoder
            .encode(&["a"], max, &device)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_sequence_length") && err.contains(&max.to_string()),
            "{err}"
        );
    }
    let err = encoder
        .encode::<&str>(&[], 16, &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty batch"), "{err}");
    let batch = TokenBatch {
        ids: vec![vec![1, vocab]],
        mask: vec![vec![1, 1]],
    };
    let err = encoder
        .text_encoder
        .forward(&batch, &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("token id {vocab}")), "{err}");
    let ragged = TokenBatch {
        ids: vec![vec![1, 2], vec![1]],
        mask: vec![vec![1, 1], vec![1]],
    };
    assert!(matches!(
        encoder.text_encoder.forward(&ragged, &device),
        Err(QwenImageError::Input { .. })
    ));
}

/// A copy of the tiny text encoder whose `config.json` is `edit`ed.
fn edited_config(
    edit: impl FnOnce(&mut Value),
) -> (tempfile::TempDir, Result<TextEncoderConfig, QwenImageError>) {
    let dir = tempfile::tempdir().unwrap();
    let src = pipeline().join("text_encoder").join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    edit(&mut v);
    let path = dir.path().join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let parsed = TextEncoderConfig::from_json_file(&path);
    (dir, parsed)
}

#[test]
fn every_config_key_is_implemented_or_refused_by_name() {
    let (_d, ok) = edited_config(|_| {});
    let ok = ok.unwrap();
    assert_eq!(
        (
            ok.hidden_size,
            ok.num_key_value_heads,
            ok.mrope_section.clone()
        ),
        (32, 2, vec![1, 1, 2])
    );
    // Several problems at once, each naming its key.
    let (_d, err) = edited_config(|v| {
        let t = &mut v["text_config"];
        t["use_sliding_window"] = true.into();
        t["rope_parameters"]["rope_type"] = "yarn".into();
        t["hidden_act"] = "gelu".into();
        t["some_future_flag"] = 1.into();
        v["another_root_flag"] = true.into();
    });
    let err = err.unwrap_err();
    let QwenImageError::Config { problems, .. } = &err else {
        panic!("{err}")
    };
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "text_config.use_sliding_window",
        "text_config.rope_parameters.rope_type",
        "text_config.hidden_act",
        "text_config.some_future_flag",
        "another_root_flag",
    ] {
        assert!(keys.contains(&key), "{key} not named in {err}");
    }
    assert!(err.to_string().contains("config.json"), "{err}");
    // Shapes that cannot work.
    let (_d, err) = edited_config(|v| {
        v["text_config"]["num_key_value_heads"] = 3.into();
        v["text_config"]["rope_parameters"]["mrope_section"] = serde_json::json!([1, 1, 1]);
    });
    let msg = err.unwrap_err().to_string();
    assert!(
        msg.contains("num_key_value_heads = 3") && msg.contains("mrope_section"),
        "{msg}"
    );
    // A layer of sliding-window attention.
    let (_d, err) = edited_config(|v| {
        v["text_config"]["layer_types"] =
            serde_json::json!(["full_attention", "sliding_attention"]);
    });
    assert!(
        err.unwrap_err()
            .to_string()
            .contains("text_config.layer_types")
    );
}

#[test]
fn checkpoint_problems_are_named_with_the_file() {
    use std::collections::HashMap;

    let src = pipeline().join("text_encoder");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: HashMap<String, safetensors::tensor::TensorView<'_>> = HashMap::new();
    for (name, view) in st.tensors() {
        match name.as_str() {
            "model.norm.weight" => {}
            "model.layers.0.self_attn.q_proj.bias" => {
                kept.insert("model.layers.0.self_attn.q_proj.extra".into(), view);
            }
            _ => {
                kept.insert(name, view);
            }
        }
    }
    safetensors::serialize_to_file(&kept, None, &dir.path().join("model.safetensors")).unwrap();
    let err = TextEncoder::<Flex>::from_dir(dir.path(), &Default::default())
        .unwrap_err()
        .to_string();
    let dir_name = dir.path().display().to_string();
    for needle in [
        dir_name.as_str(),
        "model.norm.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.q_proj.extra",
    ] {
        assert!(err.contains(needle), "{needle} not named in {err}");
    }
    assert!(
        !err.contains("visual."),
        "the vision tower is skipped, not reported: {err}"
    );
}

#[test]
fn a_tokenizer_directory_without_its_files_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = QwenTokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("merges.txt"),
        "{err}"
    );
    // vocab + merges without tokenizer_config.json: the added tokens would be lost.
    for f in ["vocab.json", "merges.txt"] {
        std::fs::copy(
            fixtures().join("tokenizer_vocab_merges").join(f),
            dir.path().join(f),
        )
        .unwrap();
    }
    let err = QwenTokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json"), "{err}");
}

/// The text encoder with its weights cast to f64 (`model_weights::cast_float_params`; f64 is
/// the other float the CPU backend has, and bf16 on a GPU takes the same path): its RoPE
/// tables and mask follow the weights' dtype, the states come out in it, and they are the f32
/// states.
#[test]
fn the_text_encoder_runs_in_its_weights_dtype() {
    let device = Default::default();
    let (want, _, batch) = hidden_case::<Flex>(&pipeline().join("text_encoder"), &device);
    let (model, _) =
        TextEncoder::<Flex>::from_dir(pipeline().join("text_encoder"), &device).unwrap();
    let wide = model_weights::cast_float_params(model, DType::F64);
    let got = wide.forward(&batch, &device).unwrap();
    assert_eq!(got.dtype(), DType::F64);
    let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
    let want: Vec<f32> = want.into_data().convert::<f32>().to_vec().unwrap();
    let err = max_abs_err_where(&got, &want, |_| true);
    eprintln!("f64 against f32: max abs difference {err:.3e}");
    assert!(err <= TOL, "f64 against f32: {err:e} > {TOL:e}");
}

/// The text encoder in bf16 (which Flex computes, as a GPU does): its last hidden state strays
/// from transformers' f32 one no further than transformers' own bf16 forward does (times
/// [`BF16_VS_PYTORCH`]), and the prompt embeddings come out in bf16, padding rows included.
#[test]
fn the_text_encoder_in_bf16_is_as_accurate_as_pytorchs() {
    let device = Default::default();
    let f = fixture();
    let bf16 = support::bf16_fixture();
    let index = qwen_image::PipelineIndex::open(pipeline()).unwrap();
    let c =
        qwen_image::FrozenComponents::<Flex>::load_in(index, None, DType::BF16, &device).unwrap();
    let batch = TokenBatch {
        ids: rows(&f["hidden"]["input_ids"]),
        mask: rows(&f["hidden"]["attention_mask"]),
    };
    let got = c
        .prompt_encoder
        .text_encoder
        .forward(&batch, &device)
        .unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    let got: Vec<f32> = got.into_data().convert::<f32>().to_vec().unwrap();
    let (_, want) = values(&f["hidden"]["last_hidden_state"]);
    let (_, torch) = values(&bf16["text_encoder"]["last_hidden_state_bf16"]);
    let ours = max_abs_err_where(&got, &want, |_| true);
    let theirs = max_abs_err_where(&torch, &want, |_| true);
    eprintln!("bf16 last hidden state: flowrl strays {ours:.3e}, transformers {theirs:.3e}");
    assert!(
        ours <= BF16_VS_PYTORCH * theirs,
        "bf16: {ours:e} against transformers' {theirs:e}"
    );

    let case = &f["encode_prompt"][0];
    let prompts: Vec<&str> = strings(&case["prompts"]);
    let max = case["max_sequence_length"].as_u64().unwrap() as usize;
    let got = c.prompt_encoder.encode(&prompts, max, &device).unwrap();
    assert_eq!(got.embeds.dtype(), DType::BF16);
    let (_, want) = values(&case["prompt_embeds"]);
    let got: Vec<f32> = got.embeds.into_data().convert::<f32>().to_vec().unwrap();
    let err = max_abs_err_where(&got, &want, |_| true);
    eprintln!("bf16 prompt embeddings: flowrl strays {err:.3e}");
    assert!(
        err <= BF16_VS_PYTORCH * theirs,
        "bf16 prompt embeddings: {err:e}"
    );
}

/// Weights made in bf16 as they are read are each f32 weight rounded to the nearest bf16 (ties
/// to even), on the host. (burn-flex 0.21's own f32 -> bf16 cast is not always: it turns
/// 0.067627005 into 0.06738281 where the nearest bf16 is 0.06787109; so the world converts its
/// big weights as it reads them.)
#[test]
fn reading_in_bf16_rounds_each_weight_to_nearest() {
    use burn::module::{Module, ModuleVisitor, Param};
    struct All(Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for All {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.0
                .push(p.val().into_data().convert::<f32>().to_vec().unwrap());
        }
    }
    let device = Default::default();
    let dir = pipeline().join("text_encoder");
    let (read, _) =
        TextEncoder::<Flex>::from_dir_variant_in(&dir, None, DType::BF16, &device).unwrap();
    assert_eq!(read.embed_tokens.val().dtype(), DType::BF16);
    let (f32_model, _) = TextEncoder::<Flex>::from_dir(&dir, &device).unwrap();
    let (mut got, mut want) = (All(Vec::new()), All(Vec::new()));
    read.visit(&mut got);
    f32_model.visit(&mut want);
    assert_eq!(got.0.len(), want.0.len());
    for (g, w) in got.0.iter().zip(&want.0) {
        let rounded: Vec<f32> = w
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(g, &rounded);
    }
}
