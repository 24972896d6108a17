//! The base-model hash is recorded in adapter contracts and training checkpoints: its value
//! for the fixture transformer is pinned (computed before the loader moved to `model-weights`).

mod support;

use burn::backend::Flex;
use dit_models::{Checkpoint, LoadOptions, QwenImageTransformer2DModel};
use support::*;

const FIXTURE_HASH: &str =
    "sha256:d81cbacb539e22317897e52822d3bb08bc5c13da46252a3de87f58cd85503176";

#[test]
fn the_fixture_base_model_hash_is_pinned() {
    for layout in ["tiny_single", "tiny_sharded"] {
        let dir = fixtures().join(layout);
        let mut model = QwenImageTransformer2DModel::<Flex>::from_pretrained(
            &dir,
            &Default::default(),
            LoadOptions::default(),
        )
        .unwrap();
        assert_eq!(
            model.base_model_hash(),
            Some(FIXTURE_HASH),
            "{layout}: on load"
        );
        assert_eq!(
            model.compute_base_model_hash().unwrap(),
            FIXTURE_HASH,
            "{layout}: in memory"
        );
        let ckpt = Checkpoint::open(&dir).unwrap();
        assert_eq!(
            ckpt.weights().content_hash().unwrap(),
            FIXTURE_HASH,
            "{layout}: the file"
        );
    }
    let unhashed = QwenImageTransformer2DModel::<Flex>::from_pretrained(
        fixtures().join("tiny_single"),
        &Default::default(),
        LoadOptions {
            hash: false,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!(unhashed.base_model_hash(), None);
}
