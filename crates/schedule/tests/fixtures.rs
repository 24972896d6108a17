//! Parity with the reference schedules: diffusers' `FlowMatchEulerDiscreteScheduler` driven by
//! the pipelines' own code (SD3.5, Qwen-Image, FLUX.1), `UniPCMultistepScheduler`'s flow grid,
//! and DanceGRPO's schedule function. Fixtures are written by
//! `fixtures/generate/schedule_fixtures.py`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use schedule::{
    BaseGrid, Compat, ComputeMu, EvalFallback, ExplicitSteps, MuInput, PerRolloutResample,
    PlanQuery, Schedule, SchedulePolicy, SchedulerConfig, SdeStepPlan, Shift, TimeShift,
    UNIPC_INERT_KEYS,
};
use serde_json::Value;

/// The tolerance of the issue's acceptance: sigmas and timesteps to 1e-6 absolute.
const TOL: f64 = 1e-6;

fn fixtures() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|d| d.join("fixtures").join("schedule"))
        .find(|d| d.is_dir())
        .expect("a fixtures/schedule directory above the crate")
}

fn load(name: &str) -> Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: bad JSON: {e}", path.display()));
    if let Some(t) = v["tolerance"]["sigma_abs"].as_f64() {
        assert_eq!(t, TOL, "{name}: recorded tolerance differs from the test's");
        assert_eq!(v["tolerance"]["timestep_abs"].as_f64(), Some(TOL));
    }
    v
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// Max abs difference of two equally long slices; NaN when any difference is NaN (a NaN in
/// either slice, or `inf - inf`), so that every `err <= TOL` after it fails. (`f64::max` drops a
/// NaN operand, so it must not be the fold.)
fn max_abs(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs())
        .fold(0.0, worse)
}

/// The larger of two errors, NaN if either is (`f64::max` would drop the NaN).
fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The comparison helper itself: a NaN in either slice, at any position, makes `err <= TOL`
/// (and so [`check`]) fail.
#[test]
fn max_abs_fails_on_nan_in_either_input() {
    let passes = |err: f64| err <= TOL;
    let clean = [1.0f32, 0.5, 0.0];
    assert!(passes(max_abs(&clean, &clean)));
    for i in 0..clean.len() {
        let mut nan = clean;
        nan[i] = f32::NAN;
        for err in [max_abs(&nan, &clean), max_abs(&clean, &nan)] {
            assert!(err.is_nan(), "NaN at {i} read as error {err}");
            assert!(!passes(err));
        }
    }
    let inf = [f32::INFINITY; 3];
    assert!(!passes(max_abs(&inf, &inf)), "inf - inf must not pass");
    assert!(worse(0.5, f64::NAN).is_nan() && worse(f64::NAN, 0.5).is_nan());
}

/// The one comparison of this file: a schedule against a fixture case's sigmas and timesteps.
/// Returns the largest sigma difference.
fn check(name: &str, got: &Schedule, case: &Value) -> f64 {
    let (sig, ts) = (f32s(&case["sigmas"]), f32s(&case["timesteps"]));
    let ds = max_abs(got.sigmas.as_slice(), &sig);
    let dt = max_abs(&got.timesteps, &ts);
    assert!(
        ds <= TOL,
        "{name}: sigmas differ by {ds:e}\n got {:?}\nwant {sig:?}",
        got.sigmas.as_slice()
    );
    assert!(
        dt <= TOL,
        "{name}: timesteps differ by {dt:e}\n got {:?}\nwant {ts:?}",
        got.timesteps
    );
    ds
}

fn preset(name: &str) -> SchedulePolicy {
    match name {
        "sd3_5" => SchedulePolicy::sd3_5(),
        "qwen_image" => SchedulePolicy::qwen_image(),
        "flux_1" => SchedulePolicy::flux_1(),
        "flux_2_klein" => SchedulePolicy::flux_2_klein(),
        other => panic!("unknown preset {other}"),
    }
}

fn geometry(case: &Value) -> (u32, u32, usize) {
    (
        case["height"].as_u64().unwrap() as u32,
        case["width"].as_u64().unwrap() as u32,
        case["steps"].as_u64().unwrap() as usize,
    )
}

/// The FlowMatch cases of `file` under `compat`; every sigma is also required to be the
/// reference's bit for bit.
fn flowmatch_cases_match(file: &str, compat: Compat) {
    let fx = load(file);
    let cases = fx["cases"].as_array().unwrap();
    let mut worst = 0.0f64;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (h, w, n) = geometry(case);
        let cfg: SchedulerConfig = serde_json::from_value(case["config"].clone()).unwrap();
        let policy = SchedulePolicy::from_config(&cfg)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .with_compat(compat);
        let got = policy.sample_sigmas(h, w, n).unwrap();
        worst = worse(worst, check(name, &got, case));
        assert_eq!(
            got.sigmas.as_slice(),
            f32s(&case["sigmas"]),
            "{name}: not bit for bit"
        );

        // mu and the packed token count are the pipeline's
        if let Some(mu) = case["mu"].as_f64() {
            assert_eq!(got.mu, Some(mu), "{name}: mu");
            let seq = case["image_seq_len"].as_u64().unwrap();
            assert_eq!(
                MuInput {
                    height: h,
                    width: w,
                    steps: n
                }
                .packed_tokens(16),
                seq,
                "{name}: tokens"
            );
        } else {
            assert_eq!(got.mu, None);
        }
        // the named preset is the checkpoint config
        if let Some(p) = case["preset"].as_str() {
            assert_eq!(
                preset(p)
                    .with_compat(compat)
                    .sample_sigmas(h, w, n)
                    .unwrap(),
                got,
                "{name}: preset {p} differs from its config"
            );
        }
        // SD3.5: not diffusers' double-shifted default path (#13243)
        if let Some(default) = case.get("diffusers_default_path") {
            assert_eq!(
                default["equals_shift_of_linspace_to_shifted_sigma_min"],
                Value::Bool(true)
            );
            let d = max_abs(got.sigmas.as_slice(), &f32s(&default["sigmas"]));
            assert!(
                d > 1e-3,
                "{name}: matches the double-shifted default path (diff {d:e})"
            );
            // ... which the named compatibility grid reproduces bit for bit
            let compat = policy
                .clone()
                .with_grid(BaseGrid::FlowMatchSchedulerDefault)
                .unwrap()
                .sample_sigmas(h, w, n)
                .unwrap();
            assert_eq!(
                compat.sigmas.as_slice(),
                f32s(&default["sigmas"]),
                "{name}: diffusers' default set_timesteps path"
            );
        }
    }
    assert_eq!(cases.len(), 23);
    println!(
        "flowmatch {file}: {} cases, max sigma diff {worst:e}",
        cases.len()
    );
}

#[test]
fn flowmatch_schedules_match_diffusers_0_35_under_numpy_1() {
    flowmatch_cases_match("flowmatch_schedules.json", Compat::Diffusers035Numpy1);
}

/// The default arithmetic is current diffusers under numpy 2, whose terminal stretch keeps its
/// scale in `f32`: 4 of the 23 cases differ from numpy 1's by an ulp.
#[test]
fn flowmatch_schedules_match_current_diffusers_under_numpy_2() {
    assert_eq!(SchedulePolicy::qwen_image().compat(), Compat::Current);
    let fx = load("flowmatch_schedules_current.json");
    assert_eq!(fx["meta"]["versions"]["diffusers"], "0.42.1");
    assert!(
        fx["meta"]["versions"]["numpy"]
            .as_str()
            .unwrap()
            .starts_with("2.")
    );
    flowmatch_cases_match("flowmatch_schedules_current.json", Compat::Current);
    let old = load("flowmatch_schedules.json");
    let differ = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .zip(old["cases"].as_array().unwrap())
        .filter(|(a, b)| a["sigmas"] != b["sigmas"])
        .count();
    assert_eq!(differ, 4, "the numpy 1 / numpy 2 difference");
}

#[test]
fn the_sd3_5_double_shift_bug_is_recorded_as_present() {
    let fx = load("flowmatch_schedules.json");
    assert_eq!(fx["meta"]["versions"]["diffusers"], "0.35.2");
    assert_eq!(fx["meta"]["versions"]["numpy"], "1.26.4");
    assert_eq!(
        fx["meta"]["notes"]["diffusers_13243"]["present_in_installed_diffusers"],
        true
    );
    // our static shift at 10 steps / shift 3: last non-zero sigma 3 * 0.1 / (1 + 2 * 0.1) = 0.25
    let s = SchedulePolicy::sd3_5()
        .sample_sigmas(1024, 1024, 10)
        .unwrap();
    assert_eq!(s.sigmas.as_slice()[9], 0.25);
}

/// The integer timesteps diffusers hands UniPC's model, as a case records them.
fn diffusers_int_timesteps(case: &Value) -> Vec<i64> {
    case["diffusers_int_timesteps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

/// The UniPC flow-grid cases of `file` under `compat`.
fn unipc_cases_match(file: &str, compat: Compat) {
    let fx = load(file);
    let cases = fx["cases"].as_array().unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (h, w, n) = geometry(case);
        let cfg: SchedulerConfig = serde_json::from_value(case["config"].clone()).unwrap();
        let policy = SchedulePolicy::from_config(&cfg)
            .unwrap()
            .with_compat(compat);
        assert_eq!(policy.grid(), BaseGrid::UniPcFlow);
        let got = policy.sample_sigmas(h, w, n).unwrap();
        check(name, &got, case);
        assert!(
            got.sigmas.as_slice()[0] < 1.0,
            "{name}: UniPC's flow grid starts below 1"
        );
        // diffusers' integer timesteps are the truncation of ours
        let ints = diffusers_int_timesteps(case);
        for (k, (t, i)) in got.timesteps.iter().zip(&ints).enumerate() {
            assert!(
                (f64::from(*t) - *i as f64).abs() < 1.0,
                "{name}: step {k}: {t} vs {i}"
            );
        }
    }
    assert_eq!(cases.len(), 3);
}

#[test]
fn unipc_flow_schedules_match_diffusers_0_35() {
    unipc_cases_match("unipc_flow_schedules.json", Compat::Diffusers035Numpy1);
}

/// diffusers 0.37+ builds another grid (`linspace(1, 1/T, N + 1)[:-1]`, its first value
/// nudged below 1): the default.
#[test]
fn unipc_flow_schedules_match_current_diffusers() {
    unipc_cases_match("unipc_flow_schedules_current.json", Compat::Current);
    let (old, new) = (
        load("unipc_flow_schedules.json"),
        load("unipc_flow_schedules_current.json"),
    );
    assert_ne!(
        old["cases"][0]["sigmas"], new["cases"][0]["sigmas"],
        "the grids differ"
    );
}

/// A `mu` as the pipeline hands it to UniPC's `set_timesteps`.
#[derive(Debug)]
struct GivenMu(f64);

impl ComputeMu for GivenMu {
    fn mu(&self, _: MuInput) -> f64 {
        self.0
    }
}

/// diffusers 0.37+ stretches UniPC's flow grid to `shift_terminal` and shifts it with the
/// linear time shift too: both reproduced bit for bit under the current compat, and refused
/// by name under 0.35's, whose UniPC had neither.
#[test]
fn unipc_flow_options_match_current_diffusers() {
    let fx = load("unipc_flow_options_current.json");
    let cases = fx["cases"].as_array().unwrap();
    let (mut stretched, mut linear) = (0, 0);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (h, w, n) = geometry(case);
        let cfg: SchedulerConfig = serde_json::from_value(case["config"].clone()).unwrap();
        let kind = match cfg.time_shift_type.as_str() {
            "linear" => TimeShift::Linear,
            _ => TimeShift::Exponential,
        };
        let policy = match case["mu"].as_f64() {
            None => SchedulePolicy::from_config(&cfg).unwrap_or_else(|e| panic!("{name}: {e}")),
            Some(mu) => {
                // UniPC's config carries no mu rule: the pipeline gives it one
                let err = SchedulePolicy::from_config(&cfg).unwrap_err().to_string();
                assert!(err.contains("use_dynamic_shifting"), "{name}: {err}");
                let shift = Shift::Dynamic {
                    compute_mu: Arc::new(GivenMu(mu)),
                    kind,
                };
                SchedulePolicy::new(
                    BaseGrid::UniPcFlow,
                    shift,
                    cfg.shift_terminal,
                    cfg.num_train_timesteps,
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"))
            }
        };
        let got = policy.sample_sigmas(h, w, n).unwrap();
        check(name, &got, case);
        assert_eq!(
            got.sigmas.as_slice(),
            f32s(&case["sigmas"]),
            "{name}: not bit for bit"
        );
        if let Some(term) = cfg.shift_terminal {
            stretched += 1;
            let last = f64::from(got.sigmas.as_slice()[n - 1]);
            assert!((last - term).abs() < 1e-6, "{name}: ends at {last}");
        }
        linear += usize::from(kind == TimeShift::Linear);
        let old = policy.clone().with_compat(Compat::Diffusers035Numpy1);
        let old = old.sample_sigmas(h, w, n);
        if cfg.shift_terminal.is_some() || kind == TimeShift::Linear {
            let err = old.unwrap_err().to_string();
            assert!(err.contains("diffusers 0.35 compat"), "{name}: {err}");
        } else {
            assert!(old.is_ok(), "{name}");
        }
        let ints = diffusers_int_timesteps(case);
        // diffusers truncates its f64 `T * sigma`; ours is the f32 product, which can round up
        // to the next integer (a stretched last sigma of 0.1 is a hair below it in f64)
        for (k, (t, i)) in got.timesteps.iter().zip(&ints).enumerate() {
            let d = f64::from(*t) - *i as f64;
            assert!((0.0..=1.0).contains(&d), "{name}: step {k}: {t} vs {i}");
        }
    }
    assert_eq!((cases.len(), stretched, linear), (8, 5, 3));
}

/// A UniPC flow scheduler as diffusers' `save_config` writes it (every constructor key) loads;
/// a key that describes another sampler, or no key UniPC has (FlowMatch's `shift` among
/// them), is refused by name, all at once; and UniPC's keys in a FlowMatch config too.
#[test]
fn a_saved_unipc_config_loads_and_its_other_samplers_are_refused() {
    let dir = fixtures().join("configs").join("unipc_flow_saved");
    let saved = SchedulePolicy::load(&dir).unwrap();
    let published = SchedulePolicy::load(fixtures().join("configs").join("unipc_flow")).unwrap();
    for n in [10, 20] {
        assert_eq!(
            saved.sample_sigmas(1024, 1024, n).unwrap().sigmas,
            published.sample_sigmas(1024, 1024, n).unwrap().sigmas
        );
    }
    let text = std::fs::read_to_string(dir.join("scheduler_config.json")).unwrap();
    let mut json: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
    for (key, _) in UNIPC_INERT_KEYS {
        if !key.starts_with('_') {
            assert!(json.contains_key(*key), "save_config writes {key}");
        }
    }
    for (key, value) in [
        ("solver_order", serde_json::json!(3)),
        ("solver_type", serde_json::json!("bh1")),
        ("predict_x0", serde_json::json!(false)),
        ("thresholding", serde_json::json!(true)),
        ("disable_corrector", serde_json::json!([0])),
        ("prediction_type", serde_json::json!("epsilon")),
        ("variance_type", serde_json::json!("fixed_small")),
        ("shift", serde_json::json!(3.0)),
    ] {
        json.insert(key.to_owned(), value);
    }
    // diffusers registers "midpoint" as bh2: not a problem
    let mut ok = json.clone();
    for key in [
        "solver_order",
        "solver_type",
        "predict_x0",
        "thresholding",
        "disable_corrector",
        "prediction_type",
        "variance_type",
        "shift",
    ] {
        ok.remove(key);
    }
    ok.insert("solver_type".into(), serde_json::json!("midpoint"));
    let cfg: SchedulerConfig = serde_json::from_value(Value::Object(ok)).unwrap();
    SchedulePolicy::from_config(&cfg).unwrap();

    let cfg = SchedulerConfig::from_json_str(&Value::Object(json).to_string()).unwrap();
    let err = SchedulePolicy::from_config(&cfg).unwrap_err().to_string();
    assert!(err.contains("8 problem(s)"), "{err}");
    for key in [
        "solver_order = 3",
        "solver_type = \"bh1\"",
        "predict_x0 = false",
        "thresholding = true",
        "disable_corrector = [0]",
        "prediction_type = \"epsilon\"",
        "variance_type",
        "shift = 3.0: a FlowMatchEulerDiscreteScheduler key",
    ] {
        assert!(err.contains(key), "{key} not named in: {err}");
    }
    // and the other way round: UniPC's keys in a FlowMatch config
    let cfg = SchedulerConfig::from_json_str(
        r#"{"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0, "flow_shift": 3.0,
            "use_flow_sigmas": false}"#,
    )
    .unwrap();
    let err = SchedulePolicy::from_config(&cfg).unwrap_err().to_string();
    assert!(err.contains("2 problem(s)"), "{err}");
    assert!(
        err.contains("flow_shift = 3.0: a UniPCMultistepScheduler key"),
        "{err}"
    );
    assert!(err.contains("use_flow_sigmas = false"), "{err}");
}

#[test]
fn dance_grpo_schedules_match_its_schedule_function() {
    let fx = load("dance_grpo_schedules.json");
    assert_eq!(
        fx["meta"]["sources"]["dance_grpo"]["commit"],
        "15cc71d53cc2e6e18a68ee607d5fb6ba9a99e344"
    );
    let cases = fx["cases"].as_array().unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let n = case["steps"].as_u64().unwrap() as usize;
        let shift = case["shift"].as_f64().unwrap();
        let got = SchedulePolicy::dance_grpo(shift)
            .unwrap()
            .sample_sigmas(512, 512, n)
            .unwrap();
        check(name, &got, case);
    }
    assert_eq!(cases.len(), 18);
}

#[test]
fn checkpoint_config_files_load_to_the_presets() {
    let dir = fixtures().join("configs");
    for (name, p) in [
        ("sd3_5", SchedulePolicy::sd3_5()),
        ("qwen_image", SchedulePolicy::qwen_image()),
        ("flux_1", SchedulePolicy::flux_1()),
    ] {
        // a checkpoint's scheduler/ directory, or the file itself
        let from_dir = SchedulePolicy::load(dir.join(name)).unwrap();
        let from_file = SchedulePolicy::load(dir.join(name).join("scheduler_config.json")).unwrap();
        for (h, w, n) in [(384, 384, 12), (480, 832, 50), (1328, 1328, 28)] {
            let want = p.sample_sigmas(h, w, n).unwrap();
            assert_eq!(from_dir.sample_sigmas(h, w, n).unwrap(), want, "{name}");
            assert_eq!(from_file.sample_sigmas(h, w, n).unwrap(), want, "{name}");
        }
    }
    // a FlowMatch config's keys are implemented or refused by name
    let cfg = |extra: &str| {
        schedule::SchedulerConfig::from_json_str(&format!(
            r#"{{"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.42.1", {extra}}}"#
        ))
        .unwrap()
    };
    SchedulePolicy::from_config(&cfg(r#""stochastic_sampling": false"#)).unwrap();
    let err = SchedulePolicy::from_config(&cfg(
        r#""stochastic_sampling": true, "some_future_flag": 1"#,
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("stochastic_sampling = true") && err.contains("some_future_flag = 1"),
        "{err}"
    );
    let missing = SchedulePolicy::load(dir.join("no-such-model")).unwrap_err();
    assert!(
        matches!(missing, schedule::ScheduleError::Io { .. }),
        "{missing}"
    );
}

#[test]
fn flux_2_klein_schedules_match_its_pipeline() {
    let fx = load("flux2_klein_schedules.json");
    assert_eq!(
        fx["meta"]["sources"]["diffusers_git"]["commit"],
        "58eb52c0803ea9af3abec60841c2a093bdf1f951"
    );
    let cases = fx["cases"].as_array().unwrap();
    let mut step_dependent = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (h, w, n) = geometry(case);
        let got = SchedulePolicy::flux_2_klein()
            .sample_sigmas(h, w, n)
            .unwrap();
        check(name, &got, case);
        assert_eq!(got.mu, case["mu"].as_f64(), "{name}: mu");
        let seq = case["image_seq_len"].as_u64().unwrap();
        assert_eq!(
            MuInput {
                height: h,
                width: w,
                steps: n
            }
            .packed_tokens(16),
            seq,
            "{name}: tokens"
        );
        if seq <= 4300 {
            step_dependent += 1;
        }
    }
    assert_eq!(cases.len(), 15);
    assert!(
        step_dependent >= 6,
        "the fixture must cover the step-dependent branch"
    );
}

#[test]
fn flux_2_klein_override_changes_only_mu() {
    // Same grid and shift type as FLUX.1; only compute_mu differs.
    let klein = SchedulePolicy::flux_1()
        .with_compute_mu(Arc::new(schedule::Flux2KleinMu))
        .unwrap();
    for (h, w, n) in [(512, 512, 4), (1024, 1024, 28), (1600, 1600, 50)] {
        let a = klein.sample_sigmas(h, w, n).unwrap();
        let b = SchedulePolicy::flux_2_klein()
            .sample_sigmas(h, w, n)
            .unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn per_rollout_resample_matches_the_independent_reimplementation() {
    let fx = load("per_rollout_resample.json");
    let cases = fx["cases"].as_array().unwrap();
    let mut draws = 0;
    for case in cases {
        let n = case["num_steps"].as_u64().unwrap() as usize;
        let pool: Vec<usize> = case["pool"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let k = case["num_sde_steps"].as_u64().unwrap() as usize;
        let fallback = EvalFallback::Explicit(ExplicitSteps::new(n, [pool[0]]).unwrap());
        let plan = PerRolloutResample::new(n, pool, k, fallback).unwrap();
        for d in case["draws"].as_array().unwrap() {
            let id: u64 = d["rollout_id"].as_str().unwrap().parse().unwrap();
            let want: Vec<usize> = d["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(
                plan.steps(PlanQuery::rollout(id)).unwrap().as_slice(),
                want.as_slice(),
                "rollout {id}"
            );
            draws += 1;
        }
    }
    assert_eq!(draws, 18);
}
