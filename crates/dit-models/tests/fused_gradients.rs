//! The CPU backend's fused kernels (`fused-ops`: GELU, RoPE, the heads relayouts, attention's
//! backward) against the generic compositions every other backend runs, through the whole
//! adapted transformer: every LoRA gradient of all eight attention projections of every block,
//! `Autodiff<Flex>` (fused) against `Autodiff<NdArray>` (generic), with a padded text mask.

mod support;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::AutodiffBackend;
use support::*;

fn lora_grads<A: AutodiffBackend>() -> Vec<(String, Vec<f32>)> {
    let model = adapted::<A>();
    let c = case("text_mask");
    let out = model.forward(input::<A>(&c, &Default::default()));
    let g = out.powi_scalar(2).mean().backward();
    let mut all = Vec::new();
    let last = model.transformer_blocks.len() - 1;
    for (i, b) in model.transformer_blocks.iter().enumerate() {
        let a = &b.attn;
        for (name, lin) in [
            ("to_q", &a.to_q),
            ("to_k", &a.to_k),
            ("to_v", &a.to_v),
            ("to_out", &a.to_out),
            ("add_q_proj", &a.add_q_proj),
            ("add_k_proj", &a.add_k_proj),
            ("add_v_proj", &a.add_v_proj),
            ("to_add_out", &a.to_add_out),
        ] {
            if i == last && (name == "to_add_out" || name == "add_q_proj") {
                // the last block's text stream feeds nothing, so neither its text queries nor
                // its text output get a gradient (none or zeros), on either backend
                continue;
            }
            let lora = lin
                .lora
                .as_ref()
                .expect("the fixture adapts all eight projections");
            for (ab, p) in [("a", &lora.lora_a), ("b", &lora.lora_b)] {
                let t = p
                    .grad(&g)
                    .unwrap_or_else(|| panic!("{i}.{name}.lora_{ab}: no grad"));
                all.push((
                    format!("blocks.{i}.{name}.lora_{ab}"),
                    t.into_data().convert::<f32>().to_vec().unwrap(),
                ));
            }
        }
    }
    all
}

#[test]
fn every_lora_gradient_matches_the_generic_compositions() {
    let generic = lora_grads::<Autodiff<NdArray>>();
    let fused = lora_grads::<Autodiff<Flex>>();
    assert_eq!(fused.len(), generic.len());
    let scale = generic
        .iter()
        .map(|(_, v)| max_magnitude(v))
        .fold(0.0, worse);
    assert!(scale > 0.0 && !scale.is_nan(), "gradient scale {scale}");
    let mut worst = (0.0f64, String::new());
    for ((n, f), (_, g)) in fused.iter().zip(&generic) {
        assert!(max_magnitude(g) > 0.0, "{n}: a zero gradient tests nothing");
        let err = max_abs_err(f, g) / scale;
        if worse(err, worst.0) != worst.0 {
            worst = (err, n.clone());
        }
    }
    println!(
        "{} LoRA gradients, worst relative error {:.3e} ({})",
        fused.len(),
        worst.0,
        worst.1
    );
    assert!(worst.0 < 1e-5, "{}: {:e}", worst.1, worst.0);
}
