//! Parity checks against the reference fixtures, generic over the burn backend.
//!
//! Shared by `cargo test -p sde-math` (CPU backends) and by the workspace's GPU-backend tests,
//! which include this file with `#[path]`. Each check loads one fixture file written by
//! `fixtures/generate/sde_math_fixtures.py` and compares every case with [`check`].

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::{Tensor, TensorData, backend::Backend};
use sde_math::analytic::GaussianFlow;
use sde_math::solvers::{DpmSecondOrder, DpmSolverPP, OdeSolver, SolverState, UniPc, UniPcVariant};
use sde_math::{Cps, Dance, FlowSde, Kernel, SigmaOnePolicy, Sigmas, StepSigmas, StorageDtype};
use serde_json::Value;

/// The tolerance every parity comparison uses: f32 max abs error.
pub const TOL: f64 = 1e-5;

/// Reads a fixture file of `fixtures/sde_math/`.
pub fn load(fixtures: &Path, name: &str) -> Value {
    let path = fixtures.join("sde_math").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: bad JSON: {e}", path.display()));
    let tol = v["tolerance"]["f32_max_abs"]
        .as_f64()
        .expect("tolerance recorded");
    assert_eq!(
        tol,
        TOL,
        "{}: tolerance recorded in the fixture differs from the test's",
        path.display()
    );
    v
}

/// The workspace's `fixtures/` directory, from a crate manifest directory.
pub fn fixtures_dir(manifest_dir: &str) -> PathBuf {
    let here = Path::new(manifest_dir);
    for dir in here.ancestors() {
        let candidate = dir.join("fixtures").join("sde_math");
        if candidate.is_dir() {
            return dir.join("fixtures");
        }
    }
    panic!("no fixtures/sde_math above {manifest_dir}");
}

/// A fixture tensor: (shape, f32 values).
pub fn tensor_of(v: &Value) -> (Vec<usize>, Vec<f32>) {
    let shape = v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(number)
        .collect();
    (shape, data)
}

/// A fixture number: JSON numbers are exact f32 values; non-finite ones are written as strings.
fn number(x: &Value) -> f32 {
    match x {
        Value::Number(n) => n.as_f64().expect("finite number") as f32,
        Value::String(s) if s == "nan" => f32::NAN,
        Value::String(s) if s == "inf" => f32::INFINITY,
        Value::String(s) if s == "-inf" => f32::NEG_INFINITY,
        other => panic!("not a fixture number: {other}"),
    }
}

pub fn f32s(v: &Value) -> Vec<f32> {
    tensor_of(v).1
}

pub fn tensor<B: Backend, const D: usize>(v: &Value, dev: &B::Device) -> Tensor<B, D> {
    let (shape, data) = tensor_of(v);
    let shape: [usize; D] = shape.try_into().expect("rank");
    Tensor::from_data(TensorData::new(data, shape), dev)
}

pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")
}

/// Compares `got` with `want` element-wise; returns the max abs error, panics above `tol`.
///
/// A NaN on either side (or `inf - inf`) makes the error NaN, which is kept as the worst (it is
/// never replaced by a later finite error) and fails `worst <= tol`: the panic names the first
/// such element.
pub fn check(label: &str, got: &[f32], want: &[f32], tol: f64) -> f64 {
    assert_eq!(
        got.len(),
        want.len(),
        "{label}: length {} vs {}",
        got.len(),
        want.len()
    );
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (f64::from(*g) - f64::from(*w)).abs();
        if !worst.is_nan() && (e.is_nan() || e > worst) {
            worst = e;
            at = i;
        }
    }
    assert!(
        worst <= tol,
        "{label}: max abs error {worst:e} > {tol:e} at element {at} (got {}, want {})",
        got[at],
        want[at]
    );
    worst
}

/// The larger of two errors, NaN if either is (`f64::max` would drop the NaN).
pub fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The comparison helpers themselves: a NaN in `got` or in `want`, at any position, makes
/// [`check`] panic, and [`worse`] keeps a NaN error.
#[test]
fn check_fails_on_nan_in_either_input() {
    let clean = [0.25f32, -1.0, 3.0];
    assert_eq!(check("clean", &clean, &clean, TOL), 0.0);
    for i in 0..clean.len() {
        let mut nan = clean;
        nan[i] = f32::NAN;
        for (what, got, want) in [("got", &nan, &clean), ("want", &clean, &nan)] {
            let r = std::panic::catch_unwind(|| check("nan", got, want, TOL));
            assert!(r.is_err(), "a NaN in {what} at {i} passed the check");
        }
    }
    let inf = [f32::INFINITY; 3];
    assert!(std::panic::catch_unwind(|| check("inf", &inf, &inf, TOL)).is_err());
    assert!(worse(0.5, f64::NAN).is_nan() && worse(f64::NAN, 0.5).is_nan());
    assert_eq!(worse(0.5, 0.25), 0.5);
}

fn step_sigmas(case: &Value) -> Sigmas {
    let sched = f32s(&case["schedule"]);
    let idx: Vec<usize> = case["step_index"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let pairs: Vec<StepSigmas> = idx
        .iter()
        .map(|&i| StepSigmas::from_schedule(&sched, i).unwrap())
        .collect();
    if pairs.iter().all(|p| *p == pairs[0]) {
        Sigmas::Shared(pairs[0])
    } else {
        Sigmas::PerSample(pairs)
    }
}

/// Summary of one parity run: cases checked and the worst error seen per quantity.
#[derive(Debug, Default)]
pub struct Report {
    pub cases: usize,
    pub worst_mean: f64,
    pub worst_sample: f64,
    pub worst_log_prob: f64,
}

impl Report {
    fn note(&mut self, mean: f64, sample: f64, log_prob: f64) {
        self.worst_mean = worse(self.worst_mean, mean);
        self.worst_sample = worse(self.worst_sample, sample);
        self.worst_log_prob = worse(self.worst_log_prob, log_prob);
    }
}

/// flow_grpo `sde_step_with_logprob`, `sde` and `cps`, sampling and replay.
pub fn flow_grpo_sde_step<B: Backend>(fixtures: &Path, dev: &B::Device) -> Report {
    let file = load(fixtures, "flow_grpo_sde_step.json");
    let mut report = Report::default();
    for case in file["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let a = case["noise_level"].as_f64().unwrap() as f32;
        let cps = case["sde_type"] == "cps";
        let kernel = if cps {
            Kernel::Cps(Cps { noise_level: a })
        } else {
            // flow_grpo substitutes sigmas[1] at sigma == 1; opt into that convention explicitly.
            Kernel::FlowSde(FlowSde {
                noise_level: a,
                at_sigma_one: SigmaOnePolicy::SubstituteNext,
            })
        };
        let at = step_sigmas(case);
        let x = tensor::<B, 3>(&case["sample"], dev);
        let v = tensor::<B, 3>(&case["model_output"], dev);
        let noise = tensor::<B, 3>(&case["noise"], dev);
        let out = kernel
            .sample(&at, v.clone(), x.clone(), noise, StorageDtype::Native)
            .unwrap();
        let m = check(
            &format!("{name}: mean"),
            &values(out.mean.clone()),
            &f32s(&case["mean"]),
            TOL,
        );
        let s = check(
            &format!("{name}: prev_sample"),
            &values(out.prev_sample.clone()),
            &f32s(&case["prev_sample"]),
            TOL,
        );
        let g: Vec<f32> = out.std_dev_t.iter().map(|v| *v as f32).collect();
        check(
            &format!("{name}: std_dev_t"),
            &g,
            &f32s(&case["std_dev_t"]),
            1e-6,
        );
        let lp_ref = if cps {
            out.cps_reference_score()
        } else {
            out.log_prob.clone()
        };
        let l = check(
            &format!("{name}: log_prob"),
            &values(lp_ref),
            &f32s(&case["log_prob"]),
            TOL,
        );

        let stored = tensor::<B, 3>(&case["stored_prev_sample"], dev);
        let replay = kernel
            .replay(&at, v, x, stored, StorageDtype::Bf16)
            .unwrap();
        let lp_replay = if cps {
            replay.cps_reference_score()
        } else {
            replay.log_prob
        };
        let l2 = check(
            &format!("{name}: replay log_prob"),
            &values(lp_replay),
            &f32s(&case["replay_log_prob"]),
            TOL,
        );
        if std::env::var_os("PARITY_VERBOSE").is_some() {
            println!("{name}: mean {m:.1e} sample {s:.1e} log_prob {l:.1e} replay {l2:.1e}");
        }
        report.note(m, s, worse(l, l2));
        report.cases += 1;
    }
    report
}

/// DanceGRPO `flux_step` (grpo, sde_solver), sampling and replay.
pub fn dance_flux_step<B: Backend>(fixtures: &Path, dev: &B::Device) -> Report {
    let file = load(fixtures, "dance_flux_step.json");
    let mut report = Report::default();
    for case in file["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let kernel = Kernel::Dance(Dance {
            eta: case["eta"].as_f64().unwrap() as f32,
        });
        let at = step_sigmas(case);
        let x = tensor::<B, 3>(&case["sample"], dev);
        let v = tensor::<B, 3>(&case["model_output"], dev);
        let noise = tensor::<B, 3>(&case["noise"], dev);
        let out = kernel
            .sample(&at, v.clone(), x.clone(), noise, StorageDtype::Native)
            .unwrap();
        let m = check(
            &format!("{name}: mean"),
            &values(out.mean.clone()),
            &f32s(&case["mean"]),
            TOL,
        );
        let s = check(
            &format!("{name}: prev_sample"),
            &values(out.prev_sample),
            &f32s(&case["prev_sample"]),
            TOL,
        );
        let l = check(
            &format!("{name}: log_prob"),
            &values(out.log_prob),
            &f32s(&case["log_prob"]),
            TOL,
        );
        let stored = tensor::<B, 3>(&case["stored_prev_sample"], dev);
        let replay = kernel
            .replay(&at, v, x, stored, StorageDtype::Bf16)
            .unwrap();
        let l2 = check(
            &format!("{name}: replay log_prob"),
            &values(replay.log_prob),
            &f32s(&case["replay_log_prob"]),
            TOL,
        );
        report.note(m, s, worse(l, l2));
        report.cases += 1;
    }
    report
}

/// The solver a fixture case names.
pub fn solver_of(case: &Value) -> OdeSolver {
    let order = case["order"].as_u64().unwrap() as usize;
    match (
        case["solver"].as_str().unwrap(),
        case["variant"].as_str().unwrap(),
    ) {
        ("unipc", "bh1") => OdeSolver::UniPc(UniPc::new(order, UniPcVariant::Bh1, true).unwrap()),
        ("unipc", "bh2") => OdeSolver::UniPc(UniPc::new(order, UniPcVariant::Bh2, true).unwrap()),
        ("dpm", "midpoint") => {
            OdeSolver::DpmSolverPP(DpmSolverPP::new(order, DpmSecondOrder::Midpoint).unwrap())
        }
        ("dpm", "heun") => {
            OdeSolver::DpmSolverPP(DpmSolverPP::new(order, DpmSecondOrder::Heun).unwrap())
        }
        other => panic!("unknown solver {other:?}"),
    }
}

/// diffusers UniPC / DPM-Solver++ and flow_grpo's dpm2, teacher-forced step by step: step `i`
/// gets the reference's sample and model output at `i` and must produce its sample at `i + 1`.
pub fn ode_solvers<B: Backend>(fixtures: &Path, dev: &B::Device) -> Report {
    let file = load(fixtures, "ode_solvers.json");
    let mut report = Report::default();
    for case in file["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let solver = solver_of(case);
        let sched = f32s(&case["schedule"]);
        let samples = case["samples"].as_array().unwrap();
        let outputs = case["model_outputs"].as_array().unwrap();
        let nonfinite: Vec<u64> = case["nonfinite_reference_samples"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect())
            .unwrap_or_default();
        let mut state = SolverState::<B, 3>::new();
        let mut worst = 0.0f64;
        for i in 0..outputs.len() {
            let x = tensor::<B, 3>(&samples[i], dev);
            let v = tensor::<B, 3>(&outputs[i], dev);
            let next = values(solver.step(&mut state, &sched, i, v, x).unwrap());
            if nonfinite.contains(&(i as u64 + 1)) {
                // The reference returns NaN here (see the generator); ours must stay finite.
                assert!(
                    next.iter().all(|v| v.is_finite()),
                    "{name}: step {i} is not finite"
                );
                continue;
            }
            let e = check(
                &format!("{name}: step {i}"),
                &next,
                &f32s(&samples[i + 1]),
                TOL,
            );
            worst = worse(worst, e);
        }
        // Free-running with our own analytic model: the same velocities, the same endpoint.
        let flow = GaussianFlow::<B, 3> {
            mu: tensor(&case["mu"], dev),
            s: tensor(&case["s"], dev),
        };
        let mut x = tensor::<B, 3>(&samples[0], dev);
        let mut state = SolverState::<B, 3>::new();
        for (i, v_ref) in outputs.iter().enumerate() {
            let v = flow.velocity(x.clone(), sched[i]);
            check(
                &format!("{name}: analytic velocity {i}"),
                &values(v.clone()),
                &f32s(v_ref),
                TOL,
            );
            x = solver.step(&mut state, &sched, i, v, x).unwrap();
        }
        if nonfinite.is_empty() {
            let end = &f32s(&samples[outputs.len()]);
            let e = check(
                &format!("{name}: free-running endpoint"),
                &values(x),
                end,
                TOL,
            );
            worst = worse(worst, e);
        }
        report.note(0.0, worst, 0.0);
        report.cases += 1;
    }
    report
}

/// The storage round trip rounds exactly as torch's casts do (bitwise, ties to even).
pub fn storage_rounding<B: Backend>(fixtures: &Path, dev: &B::Device) -> usize {
    let file = load(fixtures, "storage_rounding.json");
    let case = &file["cases"][0];
    let input = tensor::<B, 1>(&case["values"], dev);
    let mut checked = 0;
    for (dtype, key) in [(StorageDtype::Bf16, "bf16"), (StorageDtype::F16, "f16")] {
        let got = values(dtype.round_trip(input.clone()));
        let want = f32s(&case[key]);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{key} round trip of element {i}: got {g:e}, torch gives {w:e}"
            );
        }
        checked += got.len();
    }
    checked
}
