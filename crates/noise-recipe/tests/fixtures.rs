//! Bit parity with PyTorch's `torch.randn` (both CPU kernels) and with the independent
//! re-implementation of flowrl's own generators, from the fixtures written by
//! `fixtures/generate/schedule_fixtures.py`.

use std::path::{Path, PathBuf};

use noise_recipe::{
    DenoiseSeeds, NoiseAlgorithm, NoiseRecipe, SampleId, TorchCpuKernel, TorchGenerator,
};
use serde_json::Value;

fn load(name: &str) -> Value {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir: PathBuf = here
        .ancestors()
        .map(|d| d.join("fixtures").join("noise_recipe"))
        .find(|d| d.is_dir())
        .expect("a fixtures/noise_recipe directory above the crate");
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["tolerance"]["bitwise"],
        Value::Bool(true),
        "{name}: these fixtures are compared bit for bit"
    );
    v
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn u64_of(v: &Value) -> u64 {
    v.as_str().expect("u64 as a string").parse().unwrap()
}

fn shape(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

/// FNV-1a 64 of the little-endian f32 bytes, as the generator script prints it.
fn fingerprint(values: &[f32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in values.iter().flat_map(|v| v.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The one comparison of this file: bit equality, naming the first differing element.
fn check(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!(
            "{what}: element {i} is {} but torch gave {}",
            got[i], want[i]
        );
    }
}

fn kernel_cases(kernel: TorchCpuKernel) -> Value {
    let name = match kernel {
        TorchCpuKernel::Vectorized => "vectorized",
        TorchCpuKernel::Scalar => "scalar",
    };
    let fx = load("torch_randn.json");
    fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kernel"] == name)
        .expect("kernel present")
        .clone()
}

fn torch_parity(kernel: TorchCpuKernel) -> usize {
    let fx = kernel_cases(kernel);
    let mut compared = 0;
    for case in fx["cases"].as_array().unwrap() {
        let seed = u64_of(&case["seed"]);
        let shape = shape(&case["shape"]);
        let want = f32s(&case["values"]);
        let got = TorchGenerator::manual_seed(seed).randn(shape.iter().product(), kernel);
        check(
            &format!("{kernel:?} seed {seed} shape {shape:?}"),
            &got,
            &want,
        );
        compared += want.len();
    }
    // a realistic latent, 16 x 48 x 48
    let latent = &fx["latent"];
    let big = TorchGenerator::manual_seed(u64_of(&latent["seed"]))
        .randn(shape(&latent["shape"]).iter().product(), kernel);
    check("latent first", &big[..64], &f32s(&latent["first"]));
    check(
        "latent last",
        &big[big.len() - 64..],
        &f32s(&latent["last"]),
    );
    assert_eq!(
        fingerprint(&big),
        latent["fnv1a64"].as_str().unwrap(),
        "latent fingerprint"
    );
    // one generator reused across calls (the cached Box-Muller value carries over)
    let seq = &fx["sequential"];
    let mut g = TorchGenerator::manual_seed(u64_of(&seq["seed"]));
    for (call, want) in seq["calls"]
        .as_array()
        .unwrap()
        .iter()
        .zip(seq["values"].as_array().unwrap())
    {
        let got = g.randn(shape(call).iter().product(), kernel);
        check(&format!("sequential call {call}"), &got, &f32s(want));
    }
    // the recipe's torch convention
    let r = &fx["recipe"];
    let groups: Vec<u64> = r["group_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(u64_of)
        .collect();
    let recipe = NoiseRecipe::new(
        u64_of(&r["base_seed"]),
        shape(&r["latent_shape"]),
        groups,
        NoiseAlgorithm::Torch(kernel),
    )
    .unwrap();
    let x = recipe.generate();
    for (i, want) in r["samples"].as_array().unwrap().iter().enumerate() {
        check(&format!("recipe sample {i}"), x.sample(i), &f32s(want));
    }
    compared
}

#[test]
fn randn_matches_torch_vectorized_kernel_bitwise() {
    assert_eq!(
        kernel_cases(TorchCpuKernel::Vectorized)["capability"],
        "AVX2"
    );
    let n = torch_parity(TorchCpuKernel::Vectorized);
    assert_eq!(
        n,
        3 * (1 + 3 + 5 + 15 + 16 + 17 + 31 + 32 + 33 + 84 + 100 + 512) + 4 * (7 + 16 + 50)
    );
}

/// PyTorch's scalar kernel calls the C library's `logf`/`cosf`/`sinf`; so does Rust's `f32`
/// math on Linux. The fixture was made with glibc, so the bits are only promised there.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn randn_matches_torch_scalar_kernel_bitwise_with_glibc() {
    assert_eq!(kernel_cases(TorchCpuKernel::Scalar)["capability"], "NO AVX");
    torch_parity(TorchCpuKernel::Scalar);
}

#[test]
fn seeds_above_32_bits_keep_the_low_half_like_torch() {
    let fx = kernel_cases(TorchCpuKernel::Vectorized);
    let find = |seed: u64, n: usize| {
        fx["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| u64_of(&c["seed"]) == seed && shape(&c["shape"]) == [n])
            .map(|c| f32s(&c["values"]))
    };
    // manual_seed(2^32 + 5) is manual_seed(5) in torch: check against ours for seed 5
    let want = find((1 << 32) + 5, 17).expect("case");
    check(
        "seed 5",
        &TorchGenerator::manual_seed(5).randn(17, TorchCpuKernel::Vectorized),
        &want,
    );
}

#[test]
fn native_initial_noise_matches_the_golden_bits() {
    let fx = load("native_noise.json");
    let g = &fx["cases"][0];
    let mut samples = 0;
    for r in g["recipes"].as_array().unwrap() {
        let ids: Vec<u64> = r["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| u64_of(&s["group_id"]))
            .collect();
        let recipe = NoiseRecipe::new(
            u64_of(&r["base_seed"]),
            shape(&r["latent_shape"]),
            ids,
            NoiseAlgorithm::Pcg64BoxMuller,
        )
        .unwrap();
        let x = recipe.generate();
        for (i, s) in r["samples"].as_array().unwrap().iter().enumerate() {
            let first = f32s(&s["first"]);
            check(
                &format!("recipe sample {i} first values"),
                &x.sample(i)[..first.len()],
                &first,
            );
            assert_eq!(
                fingerprint(x.sample(i)),
                s["fnv1a64"].as_str().unwrap(),
                "sample {i} fingerprint"
            );
            samples += 1;
        }
    }
    assert_eq!(samples, 6);
    for k in g["noise_keys"].as_array().unwrap() {
        let id: SampleId = k["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            format!("{:016x}", id.noise_key()),
            k["noise_key"].as_str().unwrap(),
            "{id}"
        );
    }
}

#[test]
fn request_local_step_noise_matches_the_golden_bits() {
    let fx = load("native_noise.json");
    let cases = fx["cases"][0]["step_noise"].as_array().unwrap();
    for c in cases {
        let base = c["base_seed"].as_u64().unwrap();
        let id: SampleId = c["sample_id"].as_str().unwrap().parse().unwrap();
        let seeds = DenoiseSeeds::for_samples(base, std::slice::from_ref(&id)).unwrap();
        assert_eq!(seeds.seeds()[0], u64_of(&c["denoise_seed"]), "{id}");
        let step = c["step"].as_u64().unwrap() as usize;
        check(
            &format!("{id} step {step}"),
            &seeds.noise(0, step, &shape(&c["shape"])),
            &f32s(&c["values"]),
        );
    }
    assert_eq!(cases.len(), 12);
}
