//! Property tests: x_T does not depend on batch composition (or backend), per-step noise is
//! sample-unique inside a group, sample ids round-trip, and the native normals are normal.

use burn::backend::{Flex, NdArray};
use noise_recipe::{
    DenoiseSeeds, HostLatents, NoiseAlgorithm, NoiseError, NoiseRecipe, PromptMeta, SampleId,
    SampleIdMode, StepNoise, TorchCpuKernel, resolve_initial_noise,
};
use proptest::prelude::*;

fn algorithm(i: usize) -> NoiseAlgorithm {
    match i {
        0 => NoiseAlgorithm::Pcg64BoxMuller,
        1 => NoiseAlgorithm::Torch(TorchCpuKernel::Vectorized),
        _ => NoiseAlgorithm::Torch(TorchCpuKernel::Scalar),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A sample's x_T is the same bits whatever batch it is generated in: any sub-batch, in any
    /// order, gives each group id the bytes it has in the full batch.
    #[test]
    fn initial_noise_does_not_depend_on_batch_composition(
        alg in 0usize..3, seed in any::<u64>(),
        shape in proptest::collection::vec(1usize..6, 1..4),
        groups in proptest::collection::vec(any::<u64>(), 1..6),
        pick in proptest::collection::vec(any::<prop::sample::Index>(), 1..6),
    ) {
        let full = NoiseRecipe::new(seed, shape.clone(), groups.clone(), algorithm(alg)).unwrap().generate();
        let sub_ids: Vec<usize> = pick.iter().map(|i| i.index(groups.len())).collect();
        let sub_groups: Vec<u64> = sub_ids.iter().map(|&i| groups[i]).collect();
        let sub = NoiseRecipe::new(seed, shape.clone(), sub_groups, algorithm(alg)).unwrap().generate();
        for (j, &i) in sub_ids.iter().enumerate() {
            prop_assert_eq!(bits(sub.sample(j)), bits(full.sample(i)));
        }
        // and it is a pure function: generating again gives the same bits
        let again = NoiseRecipe::new(seed, shape, groups, algorithm(alg)).unwrap().generate();
        prop_assert_eq!(bits(again.data()), bits(full.data()));
    }

    /// Two candidates of one prompt group never share per-step noise, at any step.
    #[test]
    fn per_step_noise_is_sample_unique_within_a_group(
        base in any::<u64>(), prompt in "[a-z0-9 -]{1,24}", slots in 2usize..9, step in 0usize..60,
    ) {
        let meta = PromptMeta { prompt_id: Some(&prompt), sample_id: None };
        let ids: Vec<SampleId> = (0..slots).map(|s| SampleId::new(SampleIdMode::Metadata, 0, meta, s)).collect();
        let seeds = DenoiseSeeds::for_samples(base, &ids).unwrap();
        let noise: Vec<Vec<u32>> = (0..slots).map(|i| bits(&seeds.noise(i, step, &[4, 4]))).collect();
        for a in 0..slots {
            for b in a + 1..slots {
                prop_assert_ne!(&noise[a], &noise[b]);
            }
        }
        // and each sample's noise changes from step to step
        prop_assert_ne!(bits(&seeds.noise(0, step, &[4, 4])), bits(&seeds.noise(0, step + 1, &[4, 4])));
    }

    /// Sample ids format and parse back to themselves, in both modes.
    #[test]
    fn sample_ids_round_trip(key in "[^\\n]{1,30}", group in 0usize..10_000, slot in 0usize..10_000, positional in any::<bool>()) {
        let mode = if positional { SampleIdMode::Positional } else { SampleIdMode::Metadata };
        let meta = PromptMeta { prompt_id: None, sample_id: Some(&key) };
        let id = SampleId::new(mode, group, meta, slot);
        let parsed: SampleId = id.as_str().parse().unwrap();
        prop_assert_eq!(parsed.slot(), slot);
        let want = if positional { group.to_string() } else { key.clone() };
        prop_assert_eq!(parsed.prompt_key(), want.as_str());
        prop_assert_eq!(parsed.noise_key(), id.noise_key());
        prop_assert_eq!(&parsed, &id);
    }
}

#[test]
fn two_samples_of_one_group_get_different_step_noise() {
    // The named check of the issue: one prompt, two candidates, the same step.
    let meta = PromptMeta {
        prompt_id: Some("prompt-7"),
        sample_id: None,
    };
    let ids = [0, 1].map(|slot| SampleId::new(SampleIdMode::Metadata, 3, meta, slot));
    let policy = StepNoise::RequestLocal(DenoiseSeeds::for_samples(1234, &ids).unwrap());
    assert!(policy.is_reproducible());
    let StepNoise::RequestLocal(seeds) = &policy else {
        unreachable!()
    };
    let (a, b) = (
        seeds.noise(0, 5, &[16, 8, 8]),
        seeds.noise(1, 5, &[16, 8, 8]),
    );
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert_eq!(same, 0, "{same} identical values");
    // the frozen-exploration mistake, one seed reset for every sample, is refused
    let err = DenoiseSeeds::new(vec![77, 12, 77]).unwrap_err();
    assert_eq!(
        err,
        NoiseError::DuplicateDenoiseSeed {
            seed: 77,
            first: 0,
            second: 2
        }
    );
    assert!(!StepNoise::EngineLocal.is_reproducible());
    assert_eq!(StepNoise::default(), StepNoise::EngineLocal);
}

#[test]
fn candidates_of_one_prompt_start_from_different_noise() {
    let meta = PromptMeta {
        prompt_id: None,
        sample_id: Some("s-1"),
    };
    let ids: Vec<SampleId> = (0..8)
        .map(|s| SampleId::new(SampleIdMode::Metadata, 0, meta, s))
        .collect();
    let x = NoiseRecipe::for_samples(5, vec![16, 6, 6], &ids, NoiseAlgorithm::Pcg64BoxMuller)
        .unwrap()
        .generate();
    for a in 0..8 {
        for b in a + 1..8 {
            assert_ne!(x.sample(a), x.sample(b));
        }
    }
}

#[test]
fn x_t_is_the_same_bits_on_every_backend() {
    let recipe =
        NoiseRecipe::new(9, vec![4, 5, 3], vec![1, 2], NoiseAlgorithm::Pcg64BoxMuller).unwrap();
    let host = recipe.generate();
    let a = host
        .to_tensor::<Flex, 4>(&Default::default())
        .unwrap()
        .into_data();
    let b = host
        .to_tensor::<NdArray<f32>, 4>(&Default::default())
        .unwrap()
        .into_data();
    assert_eq!(a.shape.as_slice(), &[2, 4, 5, 3]);
    assert_eq!(bits(&a.to_vec::<f32>().unwrap()), bits(host.data()));
    assert_eq!(bits(&b.to_vec::<f32>().unwrap()), bits(host.data()));
    let err = host.to_tensor::<Flex, 3>(&Default::default()).unwrap_err();
    assert!(
        matches!(err, NoiseError::RankMismatch { asked: 3, .. }),
        "{err}"
    );
}

#[test]
fn shipped_initial_latents_win_over_the_recipe() {
    let recipe =
        NoiseRecipe::new(1, vec![2, 2], vec![4, 5], NoiseAlgorithm::Pcg64BoxMuller).unwrap();
    let shipped = HostLatents::new(vec![2, 2, 2], (0..8).map(|i| i as f32).collect()).unwrap();
    assert_eq!(
        resolve_initial_noise(&recipe, Some(shipped.clone())),
        shipped
    );
    assert_eq!(resolve_initial_noise(&recipe, None), recipe.generate());
    assert!(matches!(
        HostLatents::new(vec![2, 2], vec![0.0; 3]),
        Err(NoiseError::CountMismatch {
            got: 3,
            expected: 4,
            ..
        })
    ));
    assert!(matches!(
        NoiseRecipe::new(1, vec![4, 0], vec![1], NoiseAlgorithm::Pcg64BoxMuller),
        Err(NoiseError::InvalidShape { .. })
    ));
    assert!(matches!(
        NoiseRecipe::new(1, vec![4], vec![], NoiseAlgorithm::Pcg64BoxMuller),
        Err(NoiseError::CountMismatch { .. })
    ));
}

#[test]
fn invalid_sample_ids_are_refused() {
    for bad in [
        "prompt::sample:1",
        "prompt:x:sample:",
        "prompt:x:sample:01",
        "x:sample:1",
        "prompt:x:slot:1",
        "prompt:x:sample:-1",
    ] {
        let err = bad.parse::<SampleId>().unwrap_err();
        assert!(
            matches!(err, NoiseError::InvalidSampleId { .. }),
            "{bad}: {err}"
        );
    }
    // a prompt key may itself contain ":sample:"; the slot is the last field
    let id: SampleId = "prompt:a:sample:b:sample:3".parse().unwrap();
    assert_eq!((id.prompt_key(), id.slot()), ("a:sample:b", 3));
    // serde uses the text form
    let json = serde_json::to_string(&id).unwrap();
    assert_eq!(json, "\"prompt:a:sample:b:sample:3\"");
    assert_eq!(serde_json::from_str::<SampleId>(&json).unwrap(), id);
    assert!(serde_json::from_str::<SampleId>("\"nope\"").is_err());
    // an empty prompt id counts as absent, as Python's `prompt_id or sample_id`
    let meta = PromptMeta {
        prompt_id: Some(""),
        sample_id: Some("s-4"),
    };
    assert_eq!(
        SampleId::new(SampleIdMode::Metadata, 2, meta, 0).as_str(),
        "prompt:s-4:sample:0"
    );
    let mode: SampleIdMode = serde_json::from_str("\"group_index\"").unwrap();
    assert_eq!(mode, SampleIdMode::Positional);
}

#[test]
fn native_normals_are_standard_normal() {
    let recipe =
        NoiseRecipe::new(2024, vec![400_000], vec![0], NoiseAlgorithm::Pcg64BoxMuller).unwrap();
    let x = recipe.generate();
    let v = x.data();
    let n = v.len() as f64;
    let mean = v.iter().map(|&a| f64::from(a)).sum::<f64>() / n;
    let var = v
        .iter()
        .map(|&a| (f64::from(a) - mean).powi(2))
        .sum::<f64>()
        / n;
    let kurt = v
        .iter()
        .map(|&a| (f64::from(a) - mean).powi(4))
        .sum::<f64>()
        / n
        / (var * var);
    // standard errors: mean 1/sqrt(n) = 0.0016, var sqrt(2/n) = 0.0022, kurtosis sqrt(24/n) = 0.0077
    assert!(mean.abs() < 0.008, "mean {mean}");
    assert!((var - 1.0).abs() < 0.011, "var {var}");
    assert!((kurt - 3.0).abs() < 0.04, "kurtosis {kurt}");
    let within_1 = v.iter().filter(|a| a.abs() < 1.0).count() as f64 / n;
    assert!(
        (within_1 - 0.682_689).abs() < 0.004,
        "P(|x| < 1) = {within_1}"
    );
    assert!(v.iter().all(|a| a.is_finite() && a.abs() < 6.0));
}
