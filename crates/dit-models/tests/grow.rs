//! Growing a trained transformer by blocks whose gates start closed: the same outputs, the
//! gates trainable, the deeper model saved and loaded as any other.

mod support;

use burn::backend::{Autodiff, Flex};
use dit_models::{DitError, ExportOptions, LoadOptions, LoraConfig, QwenImageTransformer2DModel};
use support::*;

type B = Flex;

#[test]
fn grown_blocks_start_closed_and_their_gates_train() {
    type AD = Autodiff<Flex>;
    let dev = Default::default();
    let c = case("square");
    let base = base::<AD>();
    let layers = base.config().num_layers;
    let grown = base.clone().grow(3, &dev).unwrap();
    assert_eq!(grown.config().num_layers, layers + 3);
    assert_eq!(grown.transformer_blocks.len(), layers + 3);
    assert_eq!(grown.base_model_hash, None);
    // closed gates: the grown model is the base, exactly
    let out = grown.forward(input::<AD>(&c, &dev));
    assert_eq!(diff(out.clone(), base.forward(input::<AD>(&c, &dev))), 0.0);
    check("grown", out.clone(), &c["output"]);
    // the new modulations get gradients, and the new blocks' other weights are random
    let grads = out.powi_scalar(2).mean().backward();
    let last = grown.transformer_blocks.last().unwrap();
    let g = last
        .img_mod
        .weight
        .grad(&grads)
        .expect("a new gate has a gradient");
    assert!(
        g.abs().max().into_scalar() > 0.0,
        "the new gates cannot open"
    );
    assert!(last.attn.to_q.weight.val().abs().max().into_scalar() > 0.0);
    // an adapted model is refused by name
    let adapted = base.attach_lora(&LoraConfig::new(2, 2.0)).unwrap();
    let err = adapted.grow(1, &dev).unwrap_err();
    assert!(matches!(err, DitError::InvalidLora { .. }), "{err}");
    assert!(err.to_string().contains("adapter"), "{err}");
}

#[test]
fn a_grown_model_saves_and_loads_with_its_depth() {
    let dev = Default::default();
    let c = case("nonsquare");
    let dir = tempfile::tempdir().unwrap();
    let grown = base::<B>().grow(2, &dev).unwrap();
    // open one gate a little, so the round trip carries the new blocks' weights too
    let mut grown = grown;
    let last = grown.transformer_blocks.last_mut().unwrap();
    last.img_mod.weight =
        burn::module::Param::from_tensor(last.img_mod.weight.val().add_scalar(0.01));
    let want = grown.forward(input::<B>(&c, &dev));
    assert!(
        diff(want.clone(), base::<B>().forward(input::<B>(&c, &dev))) > 1e-4,
        "the opened gate changed nothing"
    );
    grown
        .save_merged_diffusers(dir.path().join("grown"), ExportOptions::default())
        .unwrap();
    let loaded = QwenImageTransformer2DModel::<B>::from_pretrained(
        dir.path().join("grown"),
        &dev,
        LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(loaded.config().num_layers, grown.config().num_layers);
    assert_eq!(diff(loaded.forward(input::<B>(&c, &dev)), want), 0.0);
}
