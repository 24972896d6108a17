//! Throughput of the PickScore architecture (CLIP: ViT image tower, causal text tower,
//! projections, `exp(logit_scale) * cos`) at a mid-size configuration on the CPU, in images per
//! second, device-synced (results read back to the host):
//!
//! * vision tower 384 wide, 6 layers, 6 heads, MLP 1536, 224 px in 14 px patches (257 tokens,
//!   CLIP-H/14's sequence length);
//! * text tower 256 wide, 6 layers, 4 heads, MLP 1024; joint space 256.
//!
//! Groups: `clip_mid/image_tower` (preprocessed pixels -> image embeddings),
//! `clip_mid/score` (what `PickScore::score_pairs` does per chunk: 256x256 RGB images through
//! the CLIP image processor, prompts through the tokenizer, both towers, the score), and
//! `clip_preprocess` (the processor alone). Batch of 4. Random weights (cost does not depend on
//! the values).
//!
//! `cargo bench -p reward --bench pickscore` (burn's Flex backend with its SIMD and rayon
//! kernels).

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;

use burn::backend::Flex;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use reward::RgbImage;
use reward::clip::{
    ClipConfig, ClipImageProcessor, ClipTextConfig, ClipTokenizer, ClipVisionConfig, HiddenAct,
    Padding,
};

const BATCH: usize = 4;

fn mid() -> ClipConfig {
    let text = ClipTextConfig::new()
        .with_vocab_size(640)
        .with_eos_token_id(587) // the fixture tokenizer's <|endoftext|>
        .with_hidden_size(256)
        .with_intermediate_size(1024)
        .with_num_hidden_layers(6)
        .with_num_attention_heads(4)
        .with_hidden_act(HiddenAct::Gelu);
    let vision = ClipVisionConfig::new()
        .with_hidden_size(384)
        .with_intermediate_size(1536)
        .with_num_hidden_layers(6)
        .with_num_attention_heads(6)
        .with_patch_size(14)
        .with_hidden_act(HiddenAct::Gelu);
    ClipConfig::new(text, vision).with_projection_dim(256)
}

fn images() -> Vec<RgbImage> {
    (0..BATCH)
        .map(|k| {
            RgbImage::from_fn(256, 256, |x, y| {
                [(x * 3 + k * 40) as u8, (y * 5) as u8, ((x * y) % 251) as u8]
            })
        })
        .collect()
}

fn tokenizer() -> ClipTokenizer {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = here
        .ancestors()
        .map(|d| d.join("fixtures/reward/tiny_clip"))
        .find(|d| d.is_dir())
        .expect("fixtures/reward/tiny_clip above the crate");
    ClipTokenizer::from_dir(dir, 77).expect("fixture tokenizer")
}

fn bench(c: &mut Criterion) {
    type B = Flex;
    let dev = Default::default();
    let config = mid();
    config.validate().expect("valid mid config");
    let model = config.init::<B>(&dev);
    let processor = ClipImageProcessor::default();
    let tok = tokenizer();
    let images = images();
    let prompts: Vec<String> = (0..BATCH)
        .map(|i| format!("a photo of {} red circles left of a blue square", i + 1))
        .collect();
    let pixels = processor.batch::<B>(&images, &dev);

    let mut group = c.benchmark_group("clip_mid");
    group.sample_size(10);
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("image_tower", |b| {
        b.iter(|| {
            let e = model.image_embeds(pixels.clone());
            e.into_data() // device sync
        })
    });
    group.bench_function("score", |b| {
        b.iter(|| {
            let px = processor.batch::<B>(&images, &dev);
            let ids = tok.encode_batch(&prompts, Padding::Longest).unwrap();
            let s = model.pair_scores(model.image_embeds(px), model.text_embeds(&ids).unwrap());
            s.into_data()
        })
    });
    group.finish();

    let mut group = c.benchmark_group("clip_preprocess");
    group.sample_size(10);
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("256px_to_224", |b| {
        b.iter(|| {
            images
                .iter()
                .map(|im| processor.pixel_values(im))
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
