//! Parity of CLIP / PickScore with transformers 5.24 and Pillow 13 on the fixtures of
//! `fixtures/generate/reward_fixtures.py`: tokenisation, image preprocessing, embeddings and
//! scores, on two CPU backends.

mod support;

use burn::backend::Flex;
use burn::backend::ndarray::NdArray;
use burn::tensor::backend::Backend;
use reward::clip::{ClipImageProcessor, ClipModel, ClipTokenizer, Padding};
use reward::{Batch, PickScore, PickScoreOptions, PickScoreScale, RgbImage, Scorer};
use support::*;

fn fixture_images(v: &serde_json::Value) -> Vec<RgbImage> {
    v["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let n = |k: &str| i[k].as_u64().unwrap() as usize;
            synthetic(n("width"), n("height"), n("k"))
        })
        .collect()
}

fn prompts(v: &serde_json::Value) -> Vec<String> {
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

fn ids(v: &serde_json::Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

#[test]
fn tokenizer_json_matches_transformers() {
    let v = clip_json();
    let tok = ClipTokenizer::from_dir(tiny_clip(), 77).unwrap();
    assert_eq!(
        tok.pad_id(),
        v["meta"]["special_ids"]["pad"].as_u64().unwrap() as u32
    );
    let p = prompts(&v);
    let want = ids(&v["ids"]);
    for (prompt, want) in p.iter().zip(&want) {
        assert_eq!(&tok.encode(prompt).unwrap(), want, "{prompt:?}");
    }
    assert_eq!(
        want.iter().map(Vec::len).max(),
        Some(77),
        "the long prompt is truncated to 77"
    );
    assert_eq!(
        tok.encode_batch(&p, Padding::Longest).unwrap(),
        ids(&v["ids_padded"])
    );
    let full = tok.encode_batch(&p, Padding::MaxLength).unwrap();
    assert!(full.iter().all(|r| r.len() == 77));
}

#[test]
fn small_processor_matches_transformers_pixel_values() {
    let v = clip_json();
    let p = ClipImageProcessor::from_json(tiny_clip().join("preprocessor_config.json")).unwrap();
    assert_eq!((p.shortest_edge, p.crop_height, p.crop_width), (40, 32, 32));
    let tol = v["tolerance"]["pixel_values_max_abs_normalised"]
        .as_f64()
        .unwrap();
    let mut worst: f64 = 0.0;
    for (i, im) in fixture_images(&v).iter().enumerate() {
        let name = v["images"][i]["name"].as_str().unwrap();
        let (shape, want) = stored_f32(&format!("small.{name}"));
        assert_eq!(shape, vec![3, 32, 32]);
        let err = max_abs(&p.pixel_values(im), &want);
        worst = worse(worst, err);
        assert!(err <= tol, "{name}: {err}");
    }
    eprintln!("small processor: worst max abs error {worst:.3e} (tolerance {tol:.3e})");
}

#[test]
fn default_processor_matches_pillow_crops_at_224() {
    let p = ClipImageProcessor::default();
    let cases = [
        ("landscape_300x200", 300, 200, 6),
        ("portrait_150x333", 150, 333, 7),
        ("upscale_97x61", 97, 61, 8),
    ];
    for (name, w, h, k) in cases {
        let im = synthetic(w, h, k);
        let crop = p.resize_and_crop(&im);
        let (shape, want, dtype) = stored(&format!("crop224.{name}"));
        assert_eq!((shape, dtype.as_str()), (vec![3, 224, 224], "U8"));
        let got = crop.as_bytes();
        let mut worst = 0i32;
        for c in 0..3 {
            for i in 0..224 * 224 {
                worst = worst.max((got[i * 3 + c] as i32 - want[c * 224 * 224 + i] as i32).abs());
            }
        }
        eprintln!("{name}: worst 8-bit difference {worst}");
        assert!(worst <= 1, "{name}: {worst} levels");
        // the final (normalised) values on a strided grid
        let values = p.pixel_values(&im);
        let (vs, want) = stored_f32(&format!("values224.{name}"));
        assert_eq!(vs, vec![3, 14, 14]);
        let mut got = Vec::new();
        for c in 0..3 {
            for y in (0..224).step_by(16) {
                for x in (0..224).step_by(16) {
                    got.push(values[c * 224 * 224 + y * 224 + x]);
                }
            }
        }
        let err = max_abs(&got, &want);
        assert!(
            err <= (1.0 / 255.0) / 0.26,
            "{name}: normalised values off by {err}"
        );
    }
}

#[test]
fn float_images_enter_as_rounded_bytes() {
    let (shape, values) = stored_f32("float.values");
    let (_, want, _) = stored("float.bytes");
    let (h, w) = (shape[1], shape[2]);
    let im = RgbImage::from_unit_chw(w, h, &values).unwrap();
    for c in 0..3 {
        for i in 0..w * h {
            assert_eq!(
                im.as_bytes()[i * 3 + c],
                want[c * w * h + i],
                "channel {c}, pixel {i}"
            );
        }
    }
    // the same through a decoded-image tensor [batch, 3, H, W]
    let t = burn::tensor::Tensor::<Flex, 1>::from_floats(values.as_slice(), &Default::default())
        .reshape([1, 3, h, w]);
    let two = burn::tensor::Tensor::cat(vec![t.clone(), t], 0);
    let batch = RgbImage::batch_from_tensor(two).unwrap();
    assert_eq!(batch, vec![im.clone(), im]);
    let mut bad = values.clone();
    bad[5] = f32::NAN;
    assert!(matches!(
        RgbImage::from_unit_chw(w, h, &bad),
        Err(reward::RewardError::NonFiniteImage { element: 5, .. })
    ));
}

fn embeddings_match<B: Backend>() {
    let v = clip_json();
    let dev = Default::default();
    let model = ClipModel::<B>::from_pretrained(tiny_clip(), &dev).unwrap();
    let p = ClipImageProcessor::from_json(tiny_clip().join("preprocessor_config.json")).unwrap();
    let images = fixture_images(&v);
    let img = model.image_embeds(p.batch::<B>(&images, &dev));
    check("image_embeds", img.clone(), &v["image_embeds"], TOL);
    let padded = ids(&v["ids_padded"]);
    let txt = model.text_embeds(&padded).unwrap();
    check("text_embeds", txt.clone(), &v["text_embeds"], TOL);
    let n = images.len().min(padded.len());
    let scores = model.pair_scores(img.narrow(0, 0, n), txt.narrow(0, 0, n));
    check("scores", scores, &v["scores"], TOL);
    let ls = v["logit_scale"].as_f64().unwrap();
    assert!((model.logit_scale_exp() as f64 - ls.exp()).abs() < 1e-5);
}

#[test]
fn embeddings_and_scores_match_transformers_flex() {
    embeddings_match::<Flex>();
}

#[test]
fn embeddings_and_scores_match_transformers_ndarray() {
    embeddings_match::<NdArray<f32>>();
}

#[test]
fn legacy_eos_2_pools_at_the_largest_id() {
    let v = clip_json();
    let dev = Default::default();
    let mut model = ClipModel::<Flex>::from_pretrained(tiny_clip(), &dev).unwrap();
    model.eos_token_id = 2;
    let txt = model.text_embeds(&ids(&v["ids_padded"])).unwrap();
    check(
        "legacy text_embeds",
        txt,
        &v["text_embeds_legacy_eos2"],
        TOL,
    );
}

#[test]
fn padding_to_77_changes_nothing() {
    let v = clip_json();
    let dev = Default::default();
    let model = ClipModel::<Flex>::from_pretrained(tiny_clip(), &dev).unwrap();
    let tok = ClipTokenizer::from_dir(tiny_clip(), 77).unwrap();
    let full = tok.encode_batch(&prompts(&v), Padding::MaxLength).unwrap();
    check(
        "text_embeds (padded to 77)",
        model.text_embeds(&full).unwrap(),
        &v["text_embeds"],
        TOL,
    );
}

#[test]
fn pickscore_scorer_end_to_end_in_chunks() {
    let v = clip_json();
    let dev = Default::default();
    let images = fixture_images(&v);
    let p = prompts(&v);
    let n = images.len().min(p.len());
    let (images, p) = (&images[..n], &p[..n]);
    let (_, want) = values(&v["scores"]);
    let (_, want26) = values(&v["scores_over_26"]);
    for (scale, want) in [
        (PickScoreScale::Logits, &want),
        (PickScoreScale::LogitsOver26, &want26),
    ] {
        let options = PickScoreOptions {
            scale,
            chunk_size: 2, // 5 samples: chunks of 2, 2, 1
            processor_dir: None,
        };
        let scorer = PickScore::<Flex>::from_dir(tiny_clip(), &dev, options).unwrap();
        let out = scorer
            .score(Batch::images_and_prompts(images, p).unwrap())
            .unwrap();
        let got: Vec<f32> = out
            .iter()
            .map(|c| c.get("pickscore").unwrap() as f32)
            .collect();
        let err = max_abs(&got, want);
        eprintln!("pickscore {scale:?}: max abs error {err:.3e}");
        assert!(err <= TOL, "{scale:?}: {err}");
    }
}

#[test]
fn pickscore_refuses_a_batch_without_prompts() {
    let dev = Default::default();
    let scorer =
        PickScore::<Flex>::from_dir(tiny_clip(), &dev, PickScoreOptions::default()).unwrap();
    let images = vec![synthetic(20, 20, 1)];
    let err = scorer
        .score(Batch::new(Some(&images), None, None).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            reward::RewardError::MissingInput {
                input: reward::Input::Prompt,
                ..
            }
        ),
        "{err}"
    );
}
