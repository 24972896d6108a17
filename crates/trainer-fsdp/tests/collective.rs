//! Ranks on burn's collective runtime, as threads of this process on CPU devices: one
//! optimizer step over a batch split between two peers equals the single-device step over
//! the whole batch (LoRA and full fine-tuning of the shapes world's transformer, replicas
//! loaded separately so that their parameter ids differ); scalars gather bit for bit; a
//! mismatch of collectives is an error, not a hang; an aborted peer releases the others.
//!
//! The collective server is one per backend type in the process, so the tests take turns
//! (`SERIAL`).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use dit_models::{LoraConfig, QwenImageConditioning, QwenImageTransformer2DModel};
use flow_grpo::PlannedUpdate;
use trainer_fsdp::shapes_world::{TOKEN_CHANNELS, TOKEN_GRID, image_shapes};
use trainer_fsdp::transformer_policy::load_transformer_policy;
use trainer_fsdp::{
    AdamWSettings, CollectiveWorkers, LocalWorkers, LrSchedule, LrSchedulerKind, MasterDtype,
    MicroBatchLoss, PolicyOptimizer, ScalarReduce, Trainable, TrainerError, TrainerRng, Workers,
    train_step,
};
use velocity_model::{Conditioning, VelocityModel};

type AD = Autodiff<Flex>;
type Dit = QwenImageTransformer2DModel<AD>;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn transformer_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/shapes_world/transformer")
}

/// A batch of 4 velocity-regression samples: latents, noise levels, text states, targets.
struct Batch {
    x: Tensor<Flex, 3>,
    sigma: Tensor<Flex, 1>,
    cond: QwenImageConditioning<Flex>,
    target: Tensor<Flex, 3>,
}

const ROWS: usize = 4;

fn batch() -> Batch {
    let dev = Default::default();
    let mut rng = TrainerRng::seeded(7);
    let mut draw =
        |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect() };
    let tokens = TOKEN_GRID * TOKEN_GRID;
    let x = draw(ROWS * tokens * TOKEN_CHANNELS);
    let target = draw(ROWS * tokens * TOKEN_CHANNELS);
    let text = draw(ROWS * 6 * 64);
    Batch {
        x: Tensor::from_data(TensorData::new(x, [ROWS, tokens, TOKEN_CHANNELS]), &dev),
        sigma: Tensor::from_floats([0.9, 0.7, 0.5, 0.3], &dev),
        cond: QwenImageConditioning {
            encoder_hidden_states: Tensor::from_data(TensorData::new(text, [ROWS, 6, 64]), &dev),
            encoder_hidden_states_mask: None,
            img_shapes: image_shapes(),
        },
        target: Tensor::from_data(
            TensorData::new(target, [ROWS, tokens, TOKEN_CHANNELS]),
            &dev,
        ),
    }
}

/// The mean squared velocity error of `rows` of the batch.
fn loss(
    model: &Dit,
    b: &Batch,
    rows: Range<usize>,
) -> Result<MicroBatchLoss<AD, ()>, TrainerError> {
    let lift3 = |t: &Tensor<Flex, 3>| Tensor::<AD, 3>::from_inner(t.clone().slice([rows.clone()]));
    let cond = b.cond.slice_rows(rows.clone());
    let cond = QwenImageConditioning::<AD> {
        encoder_hidden_states: Tensor::from_inner(cond.encoder_hidden_states),
        encoder_hidden_states_mask: None,
        img_shapes: cond.img_shapes,
    };
    let sigma = Tensor::<AD, 1>::from_inner(b.sigma.clone().slice([rows.clone()]));
    let v = model.velocity(lift3(&b.x), sigma, &cond);
    let d = v - lift3(&b.target);
    Ok(MicroBatchLoss {
        loss: (d.clone() * d).mean().reshape([1]),
        elements: rows.len(),
        diagnostics: (),
    })
}

fn optimizer() -> PolicyOptimizer<AD, Dit, trainer_fsdp::AdamWOptimizer<AD, Dit>> {
    let settings = AdamWSettings {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let schedule = LrSchedule::new(1e-3, 0, LrSchedulerKind::Constant, 1e-3, None).unwrap();
    PolicyOptimizer::adamw(&settings, schedule, 1.0, Some(MasterDtype::Fp32)).unwrap()
}

fn load(trainable: &Trainable) -> Dit {
    load_transformer_policy::<AD>(&transformer_dir(), None, trainable, 3, &Default::default())
        .unwrap()
        .model
}

/// Every float parameter's values, in visit order.
fn values<M: Module<AD>>(m: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl ModuleVisitor<AD> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<AD, D>>) {
            self.0
                .push(p.val().into_data().convert::<f32>().to_vec().unwrap());
        }
    }
    let mut c = Collect(Vec::new());
    m.visit(&mut c);
    c.0
}

/// The largest absolute difference between two parameter lists (NaN fails).
fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len(), "parameter counts");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter()
                .zip(y)
                .map(|(p, q)| (f64::from(*p) - f64::from(*q)).abs())
        })
        .fold(0.0, |acc: f64, d| {
            assert!(!d.is_nan(), "a NaN parameter");
            acc.max(d)
        })
}

fn two_peers_equal_one_device(trainable: Trainable, what: &str) {
    let _serial = serial();
    let b = batch();
    let before = values(&load(&trainable));

    // one device: one update over the 4 rows in two micro-batches
    let whole = PlannedUpdate {
        index: 0,
        samples: 0..ROWS,
        micro_batches: vec![0..2, 2..ROWS],
    };
    // two steps: AdamW's first step is nearly sign(g) whatever the gradient's scale; the
    // second weighs the two gradients against each other
    let mut opt = optimizer();
    let mut single = load(&trainable);
    for _ in 0..2 {
        let (m, report) = train_step(
            single,
            &mut opt,
            &LocalWorkers::ONE,
            &whole,
            false,
            |m, rows| loss(m, &b, rows),
        )
        .unwrap();
        assert_eq!(report.step.skipped, None);
        single = m;
    }
    let single = values(&single);
    let moved = max_diff(&single, &before);
    assert!(moved > 1e-5, "{what}: the step moved the weights ({moved})");

    // two peers, two rows each; each loads its own replica (other parameter ids)
    let replicas = [load(&trainable), load(&trainable)];
    let b = &b;
    let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = replicas
            .into_iter()
            .enumerate()
            .map(|(rank, model)| {
                s.spawn(move || {
                    let workers =
                        CollectiveWorkers::register::<Flex>(rank, 2, Default::default(), 1, None)
                            .unwrap();
                    let share = PlannedUpdate {
                        index: 0,
                        samples: 0..2,
                        micro_batches: std::iter::once(0..2).collect(),
                    };
                    let mut opt = optimizer();
                    let mut m = model;
                    for _ in 0..2 {
                        let (next, report) =
                            train_step(m, &mut opt, &workers, &share, false, |m, rows| {
                                loss(m, b, rows.start + 2 * rank..rows.end + 2 * rank)
                            })
                            .unwrap();
                        assert_eq!(report.step.skipped, None);
                        m = next;
                    }
                    workers.finish().unwrap();
                    values(&m)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in results.iter().enumerate() {
        let d = max_diff(r, &single);
        println!(
            "{what}: rank {rank} against one device: max |diff| {d:.3e} (the step moved {moved:.3e})"
        );
        assert!(
            d <= 1e-6,
            "{what}: rank {rank} differs from one device by {d}"
        );
    }
}

#[test]
fn two_peers_take_the_single_device_step_with_lora() {
    two_peers_equal_one_device(Trainable::Lora(LoraConfig::new(4, 8.0)), "LoRA");
}

#[test]
fn two_peers_take_the_single_device_step_in_full_fine_tuning() {
    two_peers_equal_one_device(Trainable::Full, "full fine-tuning");
}

/// Every gradient `grads` holds for `m`'s float parameters, in visit order (`None` where a
/// parameter has none).
fn grad_values(m: &Dit, grads: &GradientsParams) -> Vec<Option<Vec<f32>>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Option<Vec<f32>>>);
    impl ModuleVisitor<AD> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<AD, D>>) {
            self.1.push(
                self.0
                    .get::<Flex, D>(p.id)
                    .map(|g| g.into_data().convert::<f32>().to_vec().unwrap()),
            );
        }
    }
    let mut c = Collect(grads, Vec::new());
    m.visit(&mut c);
    c.1
}

#[test]
fn the_all_reduced_gradient_is_the_whole_batch_gradient() {
    let _serial = serial();
    let b = batch();
    let trainable = Trainable::Lora(LoraConfig::new(4, 8.0));
    let model = load(&trainable);
    let whole = loss(&model, &b, 0..ROWS).unwrap().loss.backward();
    let whole = grad_values(&model, &GradientsParams::from_grads(whole, &model));
    let with_grad = whole.iter().filter(|g| g.is_some()).count();
    assert!(
        with_grad > 0 && with_grad < whole.len(),
        "the adapters have gradients, the base none"
    );
    for bucket in [trainer_fsdp::workers::BUCKET, 1000] {
        reduced_equals_whole(&trainable, &b, &whole, bucket);
    }
}

/// Two peers' all-reduced gradients against the whole batch's, with gradient buckets of
/// `bucket` elements.
fn reduced_equals_whole(
    trainable: &Trainable,
    b: &Batch,
    whole: &[Option<Vec<f32>>],
    bucket: usize,
) {
    let replicas = [load(trainable), load(trainable)];
    let reduced: Vec<Vec<Option<Vec<f32>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = replicas
            .into_iter()
            .enumerate()
            .map(|(rank, model)| {
                s.spawn(move || {
                    let w =
                        CollectiveWorkers::register::<Flex>(rank, 2, Default::default(), 1, None)
                            .unwrap()
                            .with_bucket_elements(bucket);
                    let g = loss(&model, b, 2 * rank..2 * rank + 2)
                        .unwrap()
                        .loss
                        .backward();
                    let g = GradientsParams::from_grads(g, &model);
                    let g = w.all_reduce_grads::<AD, Dit>(g, &model).unwrap();
                    w.finish().unwrap();
                    grad_values(&model, &g)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in reduced.iter().enumerate() {
        let mut worst = 0.0f64;
        for (i, (a, e)) in r.iter().zip(whole).enumerate() {
            match (a, e) {
                (None, None) => {}
                (Some(a), Some(e)) => {
                    let scale = e.iter().fold(0.0f64, |m, x| m.max(f64::from(x.abs())));
                    for (x, y) in a.iter().zip(e) {
                        let d = (f64::from(*x) - f64::from(*y)).abs() / scale.max(1e-12);
                        assert!(!d.is_nan(), "parameter {i}: NaN");
                        worst = worst.max(d);
                    }
                }
                _ => panic!("rank {rank}, parameter {i}: a gradient on one side only"),
            }
        }
        println!(
            "rank {rank}, buckets of {bucket} elements: all-reduced gradient against the whole batch's: max relative diff {worst:.3e}"
        );
        assert!(worst <= 1e-5, "rank {rank}: {worst}");
    }
}

/// Runs `f(workers)` on `n` peers (threads) and returns their results in rank order.
fn on_peers<T: Send>(n: usize, f: impl Fn(&CollectiveWorkers) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                s.spawn(move || {
                    let w =
                        CollectiveWorkers::register::<Flex>(rank, n, Default::default(), 1, None)
                            .unwrap();
                    let out = f(&w);
                    w.finish().unwrap();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn scalars_gather_bit_for_bit_and_reduce_alike_on_every_rank() {
    let _serial = serial();
    let out = on_peers(3, |w| {
        let r = w.rank() as f64;
        let mine = [
            0.1 + r,
            1.0 / 3.0 * (r + 1.0),
            if w.rank() == 1 { f64::NAN } else { -r },
            1e12 + r,
        ];
        let all = w.all_gather(&mine).unwrap();
        let mut sum = [0.25 * r, 1e-9 * r];
        w.reduce_scalars(&mut sum, ScalarReduce::Sum).unwrap();
        let mut max = [r, if w.rank() == 2 { f64::NAN } else { 0.0 }];
        w.reduce_scalars(&mut max, ScalarReduce::Max).unwrap();
        let mut min = [r + 0.5];
        w.reduce_scalars(&mut min, ScalarReduce::Min).unwrap();
        (all, sum, max, min)
    });
    for (rank, (all, sum, max, min)) in out.iter().enumerate() {
        assert_eq!(all.len(), 3, "rank {rank}");
        for (r, vals) in all.iter().enumerate() {
            let rf = r as f64;
            assert_eq!(vals[0], 0.1 + rf, "rank {rank} sees rank {r}'s first value");
            assert_eq!(vals[1], 1.0 / 3.0 * (rf + 1.0), "bit for bit");
            assert_eq!(vals[2].is_nan(), r == 1);
            assert_eq!(vals[3], 1e12 + rf);
        }
        assert_eq!(sum[0], 0.25 * 3.0);
        assert_eq!(sum[1], 0.0 + 1e-9 + 2e-9, "summed in rank order");
        assert_eq!(max[0], 2.0);
        assert!(max[1].is_nan(), "a NaN of one rank makes the max NaN");
        assert_eq!(min[0], 0.5);
    }
    // every rank reduced to the same bits
    let first = (&out[0].1, out[0].2[0], out[0].3[0]);
    for o in &out[1..] {
        assert_eq!((&o.1, o.2[0], o.3[0]), first);
    }
}

#[test]
fn ranks_that_gather_different_lengths_get_an_error_naming_them() {
    let _serial = serial();
    let out = on_peers(2, |w| {
        let n = 1 + w.rank();
        w.all_gather(&vec![1.0; n])
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    for (rank, r) in out.iter().enumerate() {
        let e = r.as_ref().unwrap_err();
        assert!(
            e.contains("rank 1 gathers 2 values where rank 0 gathers 1")
                || e.contains("rank 0 gathers 1 values where rank 1 gathers 2"),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn an_aborted_collective_releases_the_peer_waiting_in_it() {
    let _serial = serial();
    let out: Vec<Result<(), String>> = std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let w = CollectiveWorkers::register::<Flex>(0, 2, Default::default(), 1, None).unwrap();
            // rank 1 never joins this gather
            w.all_gather(&[1.0]).map(|_| ()).map_err(|e| e.to_string())
        });
        let failing = s.spawn(|| {
            let w = CollectiveWorkers::register::<Flex>(1, 2, Default::default(), 1, None).unwrap();
            // this rank fails before its gather; its launcher aborts the collective
            std::thread::sleep(std::time::Duration::from_millis(200));
            w.abort();
            Err("rank 1 failed".to_string())
        });
        vec![waiting.join().unwrap(), failing.join().unwrap()]
    });
    let e = out[0].as_ref().unwrap_err();
    assert!(e.contains("rank 0 of 2") && e.contains("all_gather"), "{e}");
}
