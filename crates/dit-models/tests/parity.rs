//! Parity of the burn model with diffusers 0.35.2 on the fixture model, on two CPU backends.

mod support;

use burn::backend::Flex;
use burn::backend::ndarray::NdArray;
use burn::tensor::backend::Backend;
use dit_models::{Checkpoint, LoadOptions, QwenImageTransformer2DModel};
use support::*;

fn load<B: Backend>(layout: &str) -> QwenImageTransformer2DModel<B> {
    QwenImageTransformer2DModel::<B>::from_pretrained(
        fixtures().join(layout),
        &Default::default(),
        LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{layout}: {e}"))
}

fn all_cases_match<B: Backend>(layout: &str) {
    let model = load::<B>(layout);
    let dev = Default::default();
    let mut worst: f64 = 0.0;
    for c in forward_cases() {
        let name = c["name"].as_str().unwrap();
        let out = model.forward(input::<B>(&c, &dev));
        worst = worse(worst, check(&format!("{layout}/{name}"), out, &c["output"]));
    }
    eprintln!("{layout}: worst max abs error {worst:.3e} (tolerance {TOL:e})");
}

#[test]
fn forward_matches_diffusers_single_file_flex() {
    all_cases_match::<Flex>("tiny_single");
}

#[test]
fn forward_matches_diffusers_single_file_ndarray() {
    all_cases_match::<NdArray<f32>>("tiny_single");
}

#[test]
fn forward_matches_diffusers_sharded_bf16_checkpoint() {
    all_cases_match::<Flex>("tiny_sharded");
}

#[test]
fn both_layouts_hold_the_same_weights_and_hash() {
    let single = Checkpoint::open(fixtures().join("tiny_single")).unwrap();
    let sharded = Checkpoint::open(fixtures().join("tiny_sharded")).unwrap();
    assert_eq!(single.num_shards(), 1);
    assert!(
        sharded.num_shards() > 1,
        "the sharded fixture has {} shards",
        sharded.num_shards()
    );
    assert_eq!(
        single.keys().collect::<Vec<_>>(),
        sharded.keys().collect::<Vec<_>>()
    );
    assert_eq!(single.stored("img_in.weight").unwrap().dtype, "F32");
    assert_eq!(sharded.stored("img_in.weight").unwrap().dtype, "BF16");
    for k in single.keys() {
        assert_eq!(single.read_f32(k), sharded.read_f32(k), "{k}");
    }
    let a = load::<Flex>("tiny_single");
    let mut b = load::<Flex>("tiny_sharded");
    let h = a
        .base_model_hash()
        .expect("hash computed on load")
        .to_string();
    assert!(h.starts_with("sha256:") && h.len() == 7 + 64, "{h}");
    assert_eq!(Some(h.as_str()), b.base_model_hash());
    // the hash of the weights in memory is the hash of the file
    assert_eq!(b.compute_base_model_hash().unwrap(), h);
}

#[test]
fn every_parameter_is_a_checkpoint_key() {
    let model = load::<Flex>("tiny_single");
    let ckpt = Checkpoint::open(fixtures().join("tiny_single")).unwrap();
    assert_eq!(model.param_requires_grad().len(), ckpt.keys().count());
}

#[test]
fn text_mask_changes_the_output_and_none_is_diffusers_default() {
    let model = load::<Flex>("tiny_single");
    let dev = Default::default();
    let c = case("text_mask");
    check(
        "masked",
        model.forward(input::<Flex>(&c, &dev)),
        &c["output"],
    );
    let mut unmasked = input::<Flex>(&c, &dev);
    unmasked.encoder_hidden_states_mask = None;
    check(
        "unmasked",
        model.forward(unmasked),
        &c["output_without_mask"],
    );
}

#[test]
fn masked_padding_equals_truncated_text() {
    // Sample 1 of the mask case has 2 padding tokens at the end: its image output must equal
    // a run on the 4 real tokens alone (text RoPE positions do not depend on the length).
    let model = load::<Flex>("tiny_single");
    let dev = Default::default();
    let c = case("text_mask");
    let full = model.forward(input::<Flex>(&c, &dev));
    let mut one = input::<Flex>(&c, &dev);
    one.hidden_states = one.hidden_states.narrow(0, 1, 1);
    one.encoder_hidden_states = one.encoder_hidden_states.narrow(0, 1, 1).narrow(1, 0, 4);
    one.timestep = one.timestep.narrow(0, 1, 1);
    one.encoder_hidden_states_mask = None;
    let truncated = model.forward(one);
    let err = diff(full.narrow(0, 1, 1), truncated);
    assert!(err < 1e-5, "masked vs truncated: {err}");
}
