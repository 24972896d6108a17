//! DDPO's JPEG reward: our encoder against Pillow's (`fixtures/reward/jpeg.json`).

mod support;

use reward::jpeg::{self, COMPRESSIBILITY, INCOMPRESSIBILITY};
use reward::{Batch, JpegReward, JpegScorer, RgbImage, Scorer};
use serde_json::Value;
use support::*;

fn cases() -> Vec<(String, RgbImage, usize, String)> {
    let text = std::fs::read_to_string(fixtures().join("jpeg.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["quality"], 95);
    v["cases"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, c)| {
            let n = |k: &str| c[k].as_u64().unwrap() as usize;
            let (w, h) = (n("width"), n("height"));
            let image = match name.as_str() {
                "flat_32" => RgbImage::filled(32, 32, [235, 235, 235]),
                "half_48x40" => {
                    RgbImage::from_fn(
                        w,
                        h,
                        |x, _| {
                            if x < 24 { [220, 40, 40] } else { [40, 80, 220] }
                        },
                    )
                }
                _ => synthetic(w, h, n("k")),
            };
            (
                name.clone(),
                image,
                n("bytes"),
                c["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn encoded_files_equal_pillows_byte_for_byte() {
    use sha2::Digest;
    let mut rows = Vec::new();
    for (name, image, want, sha) in cases() {
        let bytes = jpeg::encode(&image, 95).unwrap();
        let got = bytes.len();
        let hex: String = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        rows.push(format!(
            "{name}: ours {got} bytes, Pillow {want} bytes, same sha256: {}",
            hex == sha
        ));
        assert_eq!(got, want, "{name}");
        assert_eq!(hex, sha, "{name}: same size, different bytes");
    }
    eprintln!("{}", rows.join("\n"));
}

#[test]
fn scorer_reports_kilobytes_with_ddpo_signs() {
    let images: Vec<RgbImage> = cases().into_iter().map(|(_, im, _, _)| im).collect();
    let want: Vec<f64> = cases()
        .into_iter()
        .map(|(_, _, b, _)| b as f64 / 1000.0)
        .collect();
    let batch = Batch::new(Some(&images), None, None).unwrap();
    let inc = JpegScorer::ddpo(JpegReward::Incompressibility)
        .score(batch)
        .unwrap();
    let com = JpegScorer::ddpo(JpegReward::Compressibility)
        .score(batch)
        .unwrap();
    for i in 0..images.len() {
        assert_eq!(inc[i].get(INCOMPRESSIBILITY), Some(want[i]));
        assert_eq!(com[i].get(COMPRESSIBILITY), Some(-want[i]));
    }
}

#[test]
fn detail_costs_bytes() {
    let flat = RgbImage::filled(64, 64, [128, 128, 128]);
    let busy = synthetic(64, 64, 3);
    assert!(jpeg::size_kb(&busy, 95).unwrap() > 3.0 * jpeg::size_kb(&flat, 95).unwrap());
    // lower quality, smaller file
    assert!(jpeg::size_kb(&busy, 50).unwrap() < jpeg::size_kb(&busy, 95).unwrap());
}
