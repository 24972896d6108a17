//! A learned value baseline, as DPOK's release trains one (`ValueMulti` in its
//! `reward_model.py`, `_train_value_func` in `train_online_pg.py`): `V(x_t, c, t)` predicts the
//! final reward of a trajectory from one of its states, so that a transition's advantage is
//! `r - V(x_t, c, t)` instead of the raw reward.
//!
//! * **The network** ([`ValueNet`]): three conditional linear layers and a linear head,
//!   `h <- relu((W h + b) ⊙ γ_t)`, where `γ_t` is a learned per-step scale (an embedding of
//!   the step index, initialised uniform in `[0, 1)`), over the input row `[flattened x_t,
//!   prompt features]`. The release's widths are 256; its weights are Xavier-normal, its
//!   biases PyTorch's default `U(±1/sqrt(fan_in))`. Here every draw comes from a stream keyed
//!   by the seed, so a run initialises the same network on every machine and backend.
//! * **The replay buffer** ([`ValueBuffer`]): the most recent `capacity` rows (features, step,
//!   reward) of past rollouts, oldest dropped first (the release's `buffer_size`, 1000).
//! * **The fit** ([`fit_value`]): before a rollout's policy updates, `steps` minibatches of
//!   `batch_size` rows drawn without replacement from the buffer (the release's 5 of 256),
//!   the MSE to the rewards, their gradients summed over the minibatches with weight
//!   `1 / steps`, one optimizer step (the release's AdamW at lr 1e-4).
//!
//! * **In a run** ([`ValueBaseline`]): the network, its optimizer and its buffer, kept by the
//!   run for DPOK's `algorithm.value_baseline` (see `docs/ALGORITHMS.md`). Each rollout pushes
//!   one row per (sample, trained step) — the state `x_k` before the step, flattened, then the
//!   prompt features of its group ([`prompt_features`]: the mean of the conditioning's real
//!   tokens, standing in for the release's CLIP text features) — fits once, and predicts the
//!   rollout's values with the fitted network, as the release does before its policy steps.
//!   Its state is checkpointed in three files ([`VALUE_FILES`]) so that a resumed run
//!   continues exactly.

use std::collections::VecDeque;

use burn::module::AutodiffModule;
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use keyed_rng::{PcgStream, fnv1a64};

use trajectory::Trajectory;

use crate::error::TrainerError;

/// The keyed stream of the network's initial weights.
const INIT_DOMAIN: u64 = fnv1a64(b"flowrl/trainer/value-baseline/init/v1");
/// The keyed stream of the fit's minibatches.
const BATCH_DOMAIN: u64 = fnv1a64(b"flowrl/trainer/value-baseline/minibatch/v1");

/// The shape of a [`ValueNet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueNetShape {
    /// Input features per row: the flattened state and the prompt features.
    pub features: usize,
    /// The hidden width (the release's 256).
    pub hidden: usize,
    /// Conditional linear layers before the head (the release's 3).
    pub layers: usize,
    /// Step indices the per-step scales cover (the sampler's steps).
    pub steps: usize,
}

impl ValueNetShape {
    fn check(&self) -> Result<(), TrainerError> {
        for (what, v) in [
            ("features", self.features),
            ("hidden width", self.hidden),
            ("layers", self.layers),
            ("steps", self.steps),
        ] {
            if v == 0 {
                return Err(TrainerError::InvalidValueBaseline {
                    problem: format!(
                        "the value network's {what} is 0; every dimension must be >= 1"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// `(W x + b) ⊙ γ_t`: a linear layer whose output is scaled per step (the release's
/// `ConditionalLinear`).
#[derive(Module, Debug)]
pub struct ConditionalLinear<B: Backend> {
    /// The linear map.
    pub linear: Linear<B>,
    /// The per-step output scales, `[steps, out]`.
    pub scale: Param<Tensor<B, 2>>,
}

impl<B: Backend> ConditionalLinear<B> {
    /// `(W x + b) ⊙ γ_t` of rows `x` (`[n, in]`) at steps `t` (`[n]`).
    pub fn forward(&self, x: Tensor<B, 2>, t: Tensor<B, 1, Int>) -> Tensor<B, 2> {
        let gamma = self.scale.val().select(0, t);
        self.linear.forward(x).mul(gamma)
    }
}

/// The value network. See the module docs.
#[derive(Module, Debug)]
pub struct ValueNet<B: Backend> {
    /// The conditional layers, each followed by a ReLU.
    pub layers: Vec<ConditionalLinear<B>>,
    /// The head, to one value per row.
    pub head: Linear<B>,
}

/// `n` draws of `N(0, std^2)`: the workspace's platform-independent keyed normals
/// ([`noise_recipe::fill_normals`]), scaled.
fn normals(rng: &mut PcgStream, n: usize, std: f64) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    noise_recipe::fill_normals(rng, &mut out);
    let std = std as f32;
    out.iter_mut().for_each(|v| *v *= std);
    out
}

/// `n` draws of `U(lo, hi)`.
fn uniforms(rng: &mut PcgStream, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n)
        .map(|_| (lo + (hi - lo) * rng.unit_f64()) as f32)
        .collect()
}

/// A linear layer `d_in -> d_out` with Xavier-normal weights and `U(±1/sqrt(d_in))` biases.
fn linear<B: Backend>(
    rng: &mut PcgStream,
    d_in: usize,
    d_out: usize,
    device: &B::Device,
) -> Linear<B> {
    let mut layer = LinearConfig::new(d_in, d_out).init::<B>(device);
    let std = (2.0 / (d_in + d_out) as f64).sqrt();
    let w = normals(rng, d_in * d_out, std);
    layer.weight = Param::from_tensor(Tensor::from_data(TensorData::new(w, [d_in, d_out]), device));
    let bound = 1.0 / (d_in as f64).sqrt();
    let b = uniforms(rng, d_out, -bound, bound);
    layer.bias = Some(Param::from_tensor(Tensor::from_data(
        TensorData::new(b, [d_out]),
        device,
    )));
    layer
}

impl<B: Backend> ValueNet<B> {
    /// A network of `shape` initialised from the stream keyed by `seed`.
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] for a zero dimension.
    pub fn init(shape: ValueNetShape, seed: u64, device: &B::Device) -> Result<Self, TrainerError> {
        shape.check()?;
        let mut rng = PcgStream::keyed(INIT_DOMAIN, &[seed]);
        let mut layers = Vec::with_capacity(shape.layers);
        let mut d_in = shape.features;
        for _ in 0..shape.layers {
            let linear = linear(&mut rng, d_in, shape.hidden, device);
            let scale = uniforms(&mut rng, shape.steps * shape.hidden, 0.0, 1.0);
            layers.push(ConditionalLinear {
                linear,
                scale: Param::from_tensor(Tensor::from_data(
                    TensorData::new(scale, [shape.steps, shape.hidden]),
                    device,
                )),
            });
            d_in = shape.hidden;
        }
        let head = linear(&mut rng, d_in, 1, device);
        Ok(Self { layers, head })
    }

    /// The values of rows `x` (`[n, features]`) at steps `t` (`[n]`), `[n]`.
    pub fn forward(&self, x: Tensor<B, 2>, t: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let n = x.dims()[0];
        let mut h = x;
        for layer in &self.layers {
            h = burn::tensor::activation::relu(layer.forward(h, t.clone()));
        }
        self.head.forward(h).reshape([n])
    }

    /// The values of the host rows `rows` (row-major, `features` per row) at `steps`.
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] when the rows and steps disagree in length.
    pub fn predict(
        &self,
        rows: &[f32],
        steps: &[usize],
        device: &B::Device,
    ) -> Result<Vec<f32>, TrainerError> {
        let (x, t) = self.inputs(rows, steps, device)?;
        Ok(self
            .forward(x, t)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("converted to f32"))
    }

    fn features(&self) -> usize {
        self.layers
            .first()
            .map_or(self.head.weight.dims()[0], |l| l.linear.weight.dims()[0])
    }

    fn inputs(
        &self,
        rows: &[f32],
        steps: &[usize],
        device: &B::Device,
    ) -> Result<(Tensor<B, 2>, Tensor<B, 1, Int>), TrainerError> {
        let f = self.features();
        if rows.len() != steps.len() * f {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!(
                    "{} input values for {} rows of {f} features",
                    rows.len(),
                    steps.len()
                ),
            });
        }
        let n_steps = self
            .layers
            .first()
            .map_or(usize::MAX, |l| l.scale.dims()[0]);
        if let Some(bad) = steps.iter().find(|&&s| s >= n_steps) {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!("step {bad} is outside the network's {n_steps} steps"),
            });
        }
        let x = Tensor::from_data(TensorData::new(rows.to_vec(), [steps.len(), f]), device);
        let t = Tensor::from_data(
            TensorData::new(
                steps.iter().map(|&s| s as i64).collect::<Vec<_>>(),
                [steps.len()],
            ),
            device,
        );
        Ok((x, t))
    }
}

/// The replay buffer of the value fit. See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueBuffer {
    features: usize,
    capacity: usize,
    rows: VecDeque<(Vec<f32>, usize, f32)>,
}

impl ValueBuffer {
    /// An empty buffer of rows of `features` values, keeping at most `capacity` rows.
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] for a zero `features` or `capacity`.
    pub fn new(features: usize, capacity: usize) -> Result<Self, TrainerError> {
        if features == 0 || capacity == 0 {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!(
                    "a buffer of {capacity} rows of {features} features; both must be >= 1"
                ),
            });
        }
        Ok(Self {
            features,
            capacity,
            rows: VecDeque::new(),
        })
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Appends rows (`features` values each, row-major) with their steps and rewards, then
    /// drops the oldest rows beyond the capacity.
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] when the lengths disagree or a value is not
    /// finite (nothing is appended then).
    pub fn push(
        &mut self,
        rows: &[f32],
        steps: &[usize],
        rewards: &[f32],
    ) -> Result<(), TrainerError> {
        let n = steps.len();
        if rows.len() != n * self.features || rewards.len() != n {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!(
                    "{} values, {n} steps and {} rewards pushed to a buffer of {} features per row",
                    rows.len(),
                    rewards.len(),
                    self.features
                ),
            });
        }
        if let Some(i) = rewards.iter().position(|r| !r.is_finite()) {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!("reward {} of row {i} is not finite", rewards[i]),
            });
        }
        if rows.iter().any(|v| !v.is_finite()) {
            return Err(TrainerError::InvalidValueBaseline {
                problem: "a pushed state or prompt feature is not finite".into(),
            });
        }
        for (i, (&s, &r)) in steps.iter().zip(rewards).enumerate() {
            self.rows.push_back((
                rows[i * self.features..(i + 1) * self.features].to_vec(),
                s,
                r,
            ));
        }
        while self.rows.len() > self.capacity {
            self.rows.pop_front();
        }
        Ok(())
    }

    /// `min(size, len)` distinct row indices drawn from the stream keyed by `keys` (a partial
    /// Fisher-Yates shuffle: sampling without replacement, as the release's
    /// `np.random.choice(..., replace=False)`).
    pub fn minibatch(&self, size: usize, keys: &[u64]) -> Vec<usize> {
        let mut rng = PcgStream::keyed(BATCH_DOMAIN, keys);
        let mut idx: Vec<usize> = (0..self.rows.len()).collect();
        let k = size.min(idx.len());
        for i in 0..k {
            let j = i + rng.below((idx.len() - i) as u64) as usize;
            idx.swap(i, j);
        }
        idx.truncate(k);
        idx
    }

    /// The rows `idx` as (row-major features, steps, rewards).
    fn gather(&self, idx: &[usize]) -> (Vec<f32>, Vec<usize>, Vec<f32>) {
        let mut rows = Vec::with_capacity(idx.len() * self.features);
        let mut steps = Vec::with_capacity(idx.len());
        let mut rewards = Vec::with_capacity(idx.len());
        for &i in idx {
            let (f, s, r) = &self.rows[i];
            rows.extend_from_slice(f);
            steps.push(*s);
            rewards.push(*r);
        }
        (rows, steps, rewards)
    }
}

/// How [`fit_value`] fits the network (the release's `v_step`, `v_batch_size`, `v_lr`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueFit {
    /// Minibatches per fit, whose gradients are summed into one optimizer step (5).
    pub minibatches: usize,
    /// Rows per minibatch (256).
    pub batch_size: usize,
    /// The optimizer's learning rate (1e-4).
    pub lr: f64,
}

/// One fit of `net` to the rewards of `buffer` (see the module docs), its minibatches drawn
/// from the stream keyed by `keys` (e.g. the run's seed and the rollout id). Returns the
/// network after the step and the fit's loss, the mean of its minibatches' MSEs (the
/// release's logged `value_loss`).
///
/// # Errors
/// [`TrainerError::InvalidValueBaseline`] for an empty buffer, zero minibatches or rows, a
/// learning rate not finite and `> 0`, or a non-finite loss. The network is consumed either
/// way: a caller that must survive an error keeps a clone (its parameters are shared, not
/// copied, until the step).
pub fn fit_value<B, O>(
    net: ValueNet<B>,
    optimizer: &mut O,
    buffer: &ValueBuffer,
    fit: ValueFit,
    keys: &[u64],
) -> Result<(ValueNet<B>, f64), TrainerError>
where
    B: AutodiffBackend,
    O: Optimizer<ValueNet<B>, B>,
{
    if buffer.is_empty() || fit.minibatches == 0 || fit.batch_size == 0 {
        return Err(TrainerError::InvalidValueBaseline {
            problem: format!(
                "a fit of {} minibatches of {} rows on a buffer of {} rows; all must be >= 1",
                fit.minibatches,
                fit.batch_size,
                buffer.len()
            ),
        });
    }
    if !(fit.lr.is_finite() && fit.lr > 0.0) {
        return Err(TrainerError::InvalidValueBaseline {
            problem: format!(
                "the value fit's learning rate {} is not finite and > 0",
                fit.lr
            ),
        });
    }
    let device = net.head.weight.val().device();
    let mut total: Option<Tensor<B, 1>> = None;
    for m in 0..fit.minibatches {
        let mut k = keys.to_vec();
        k.push(m as u64);
        let idx = buffer.minibatch(fit.batch_size, &k);
        let (rows, steps, rewards) = buffer.gather(&idx);
        let (x, t) = net.inputs(&rows, &steps, &device)?;
        let target = Tensor::<B, 1>::from_data(TensorData::new(rewards, [idx.len()]), &device);
        let err = net.forward(x, t).sub(target);
        let mse = err
            .clone()
            .mul(err)
            .mean()
            .div_scalar(fit.minibatches as f64);
        total = Some(match total {
            None => mse,
            Some(t) => t.add(mse),
        });
    }
    let loss = total.expect("at least one minibatch");
    let value = loss
        .clone()
        .into_data()
        .convert::<f64>()
        .into_vec::<f64>()
        .expect("converted to f64")[0];
    if !value.is_finite() {
        return Err(TrainerError::InvalidValueBaseline {
            problem: format!("the value fit's loss is {value}"),
        });
    }
    let grads = GradientsParams::from_grads(loss.backward(), &net);
    Ok((optimizer.step(fit.lr, net, grads), value))
}

/// The value baseline's settings (DPOK's `algorithm.value_baseline`): the network's width and
/// depth, the fit, and the buffer's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValueBaselineSettings {
    /// The hidden width (the release's 256).
    pub hidden: usize,
    /// Conditional layers before the head (the release's 3).
    pub layers: usize,
    /// The fit of each rollout.
    pub fit: ValueFit,
    /// Rows the replay buffer keeps (the release's 1000).
    pub buffer_size: usize,
}

/// The checkpoint files of a [`ValueBaseline`]: the network (burn's named MessagePack record,
/// parameter ids included), its optimizer's state (likewise), and the replay buffer
/// ([`ValueBuffer::to_bytes`]).
pub const VALUE_FILES: [&str; 3] = ["value_net.mpk", "value_optimizer.mpk", "value_buffer.bin"];

/// The value network's optimizer: AdamW at PyTorch's defaults (the release's
/// `torch.optim.AdamW(lr=v_lr)`: betas 0.9 / 0.999, eps 1e-8, weight decay 0.01).
pub type ValueOptimizer<B> = OptimizerAdaptor<AdamW, ValueNet<B>, B>;

fn value_optimizer<B: AutodiffBackend>() -> ValueOptimizer<B> {
    AdamWConfig::new()
        .with_beta_1(0.9)
        .with_beta_2(0.999)
        .with_epsilon(1e-8)
        .with_weight_decay(0.01)
        .init::<B, ValueNet<B>>()
}

/// What one rollout's [`ValueBaseline::observe`] gives.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueStep {
    /// The fitted network's value of every row pushed (row order), NaN for a row whose reward
    /// was not finite.
    pub values: Vec<f32>,
    /// The fit's loss (the mean of its minibatches' MSEs, before the step).
    pub loss: f64,
    /// Rows the buffer holds after the push.
    pub buffer_rows: usize,
}

/// A learned value baseline in a run: the network, its optimizer and its replay buffer. See
/// the module docs.
#[derive(Clone)]
pub struct ValueBaseline<B: AutodiffBackend> {
    settings: ValueBaselineSettings,
    shape: ValueNetShape,
    seed: u64,
    net: ValueNet<B>,
    optimizer: ValueOptimizer<B>,
    buffer: ValueBuffer,
}

impl<B: AutodiffBackend> std::fmt::Debug for ValueBaseline<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueBaseline")
            .field("settings", &self.settings)
            .field("shape", &self.shape)
            .field("buffer_rows", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

impl<B: AutodiffBackend> ValueBaseline<B> {
    /// A fresh baseline over rows of `features` values at `steps` sampler steps, its network
    /// initialised from the stream keyed by `seed`, its buffer empty.
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] for a zero dimension, capacity or fit size, or a
    /// learning rate not finite and `> 0`.
    pub fn new(
        settings: ValueBaselineSettings,
        features: usize,
        steps: usize,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, TrainerError> {
        let fit = settings.fit;
        if fit.minibatches == 0 || fit.batch_size == 0 || !(fit.lr.is_finite() && fit.lr > 0.0) {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!(
                    "a fit of {} minibatches of {} rows at lr {}; the sizes must be >= 1 and \
                     the learning rate finite and > 0",
                    fit.minibatches, fit.batch_size, fit.lr
                ),
            });
        }
        let shape = ValueNetShape {
            features,
            hidden: settings.hidden,
            layers: settings.layers,
            steps,
        };
        Ok(Self {
            settings,
            shape,
            seed,
            net: ValueNet::init(shape, seed, device)?,
            optimizer: value_optimizer(),
            buffer: ValueBuffer::new(features, settings.buffer_size)?,
        })
    }

    /// The network's shape.
    pub fn shape(&self) -> ValueNetShape {
        self.shape
    }

    /// The network.
    pub fn net(&self) -> &ValueNet<B> {
        &self.net
    }

    /// The replay buffer.
    pub fn buffer(&self) -> &ValueBuffer {
        &self.buffer
    }

    /// One rollout: pushes the rows whose reward is finite (`rows` row-major, `features` per
    /// row; `steps` and `rewards` one per row), fits the network once (minibatches keyed by
    /// the baseline's seed and `rollout_id`), and predicts every row's value with the fitted
    /// network. `None` when no row has a finite reward (nothing pushed, nothing fitted).
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] for rows of the wrong width, a step outside the
    /// network's, non-finite features or a non-finite fit loss. The baseline is left as it
    /// was on an error.
    pub fn observe(
        &mut self,
        rows: &[f32],
        steps: &[usize],
        rewards: &[f64],
        rollout_id: u64,
    ) -> Result<Option<ValueStep>, TrainerError> {
        let f = self.shape.features;
        if rows.len() != steps.len() * f || rewards.len() != steps.len() {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!(
                    "{} values, {} steps and {} rewards observed for rows of {f} features",
                    rows.len(),
                    steps.len(),
                    rewards.len()
                ),
            });
        }
        let kept: Vec<usize> = (0..steps.len())
            .filter(|&i| rewards[i].is_finite())
            .collect();
        if kept.is_empty() {
            return Ok(None);
        }
        let mut buffer = self.buffer.clone();
        let mut kept_rows = Vec::with_capacity(kept.len() * f);
        for &i in &kept {
            kept_rows.extend_from_slice(&rows[i * f..(i + 1) * f]);
        }
        let kept_steps: Vec<usize> = kept.iter().map(|&i| steps[i]).collect();
        let kept_rewards: Vec<f32> = kept.iter().map(|&i| rewards[i] as f32).collect();
        buffer.push(&kept_rows, &kept_steps, &kept_rewards)?;
        let mut optimizer = self.optimizer.clone();
        let (net, loss) = fit_value(
            self.net.clone(),
            &mut optimizer,
            &buffer,
            self.settings.fit,
            &[self.seed, rollout_id],
        )?;
        let predicted = net
            .valid()
            .predict(&kept_rows, &kept_steps, &net_device(&net))?;
        let mut values = vec![f32::NAN; steps.len()];
        for (&i, v) in kept.iter().zip(predicted) {
            values[i] = v;
        }
        self.net = net;
        self.optimizer = optimizer;
        self.buffer = buffer;
        Ok(Some(ValueStep {
            values,
            loss,
            buffer_rows: self.buffer.len(),
        }))
    }

    /// The baseline's checkpoint files, named [`VALUE_FILES`].
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] when burn's recorder fails.
    pub fn files(&self) -> Result<Vec<(&'static str, Vec<u8>)>, TrainerError> {
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::default();
        let record_err =
            |what: &str, e: burn::record::RecorderError| TrainerError::InvalidValueBaseline {
                problem: format!("recording the {what}: {e}"),
            };
        let net = recorder
            .record(self.net.clone().into_record(), ())
            .map_err(|e| record_err("network", e))?;
        let optimizer = recorder
            .record(self.optimizer.to_record(), ())
            .map_err(|e| record_err("optimizer state", e))?;
        Ok(vec![
            (VALUE_FILES[0], net),
            (VALUE_FILES[1], optimizer),
            (VALUE_FILES[2], self.buffer.to_bytes()),
        ])
    }

    /// This baseline with the state of `files` (what [`ValueBaseline::files`] wrote, read
    /// back by name): the network, its optimizer and its buffer.
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] for a missing file, a record burn cannot decode,
    /// or a buffer of another width or capacity than this baseline's.
    pub fn restored(
        mut self,
        file: impl Fn(&str) -> Option<Vec<u8>>,
        device: &B::Device,
    ) -> Result<Self, TrainerError> {
        let get = |name: &str| {
            file(name).ok_or_else(|| TrainerError::InvalidValueBaseline {
                problem: format!(
                    "the checkpoint has no {name} (it was written by a run without \
                     algorithm.value_baseline)"
                ),
            })
        };
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::default();
        let load_err =
            |name: &str, e: burn::record::RecorderError| TrainerError::InvalidValueBaseline {
                problem: format!("{name}: {e}"),
            };
        let net_record = recorder
            .load(get(VALUE_FILES[0])?, device)
            .map_err(|e| load_err(VALUE_FILES[0], e))?;
        self.net = self.net.load_record(net_record);
        let opt_record = recorder
            .load(get(VALUE_FILES[1])?, device)
            .map_err(|e| load_err(VALUE_FILES[1], e))?;
        self.optimizer = value_optimizer::<B>().load_record(opt_record);
        let buffer = ValueBuffer::from_bytes(&get(VALUE_FILES[2])?)?;
        if (buffer.features, buffer.capacity) != (self.buffer.features, self.buffer.capacity) {
            return Err(TrainerError::InvalidValueBaseline {
                problem: format!(
                    "{} holds rows of {} features up to {}; this run's baseline takes {} up to {}",
                    VALUE_FILES[2],
                    buffer.features,
                    buffer.capacity,
                    self.buffer.features,
                    self.buffer.capacity
                ),
            });
        }
        self.buffer = buffer;
        Ok(self)
    }
}

fn net_device<B: AutodiffBackend>(net: &ValueNet<B>) -> B::Device {
    net.head.weight.val().device()
}

/// The prompt features of a stored conditioning: the mean of its real tokens' embeddings
/// (`[dim]`; zeros when no token is real).
pub fn prompt_features(conditions: &trajectory::Conditions) -> Vec<f32> {
    let shape = conditions.text_embeddings.shape();
    let dim = shape.last().copied().unwrap_or(0);
    let values = conditions.text_embeddings.to_f32();
    let mut sum = vec![0.0f64; dim];
    let mut n = 0usize;
    for (t, row) in values.chunks(dim.max(1)).enumerate() {
        if conditions.text_mask.get(t).copied().unwrap_or(true) {
            n += 1;
            for (s, v) in sum.iter_mut().zip(row) {
                *s += f64::from(*v);
            }
        }
    }
    sum.into_iter()
        .map(|s| if n == 0 { 0.0 } else { (s / n as f64) as f32 })
        .collect()
}

/// The value rows of a rollout: for every sample (group-major, `group_size` per trajectory)
/// and every trained step of `trained` in order, the state `x_k` before the step, flattened,
/// then its group's [`prompt_features`]. Returns the rows (row-major) and each row's step.
///
/// # Errors
/// [`TrainerError::Artifact`] for a step whose latent the trajectory does not hold.
pub fn value_rows(
    trajectories: &[Trajectory],
    trained: &[usize],
    group_size: usize,
) -> Result<(Vec<f32>, Vec<usize>), TrainerError> {
    let mut rows = Vec::new();
    let mut steps = Vec::new();
    for traj in trajectories {
        let features = prompt_features(&traj.conditions);
        for slot in 0..group_size {
            for &k in trained {
                rows.extend(traj.latent(slot, k)?);
                rows.extend_from_slice(&features);
                steps.push(k);
            }
        }
    }
    Ok((rows, steps))
}

impl ValueBuffer {
    const MAGIC: &'static [u8; 16] = b"flowrl-valuebuf1";

    /// The buffer as bytes: a 16-byte magic, then little-endian `features`, `capacity`, rows
    /// (`u64` each), then per row its step (`u64`), its reward and its features (`f32`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.rows.len() * (12 + 4 * self.features));
        out.extend_from_slice(Self::MAGIC);
        for v in [self.features, self.capacity, self.rows.len()] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for (f, s, r) in &self.rows {
            out.extend_from_slice(&(*s as u64).to_le_bytes());
            out.extend_from_slice(&r.to_le_bytes());
            for v in f {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// The buffer [`ValueBuffer::to_bytes`] wrote.
    ///
    /// # Errors
    /// [`TrainerError::InvalidValueBaseline`] for bytes of another layout or length.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TrainerError> {
        let bad = |why: String| TrainerError::InvalidValueBaseline {
            problem: format!("{} is not a value buffer: {why}", VALUE_FILES[2]),
        };
        if bytes.len() < 40 || &bytes[..16] != Self::MAGIC {
            return Err(bad("no flowrl-valuebuf1 header".into()));
        }
        let word =
            |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize;
        let (features, capacity, n) = (word(16), word(24), word(32));
        let per = 12usize
            .checked_add(
                features
                    .checked_mul(4)
                    .ok_or_else(|| bad("too wide".into()))?,
            )
            .ok_or_else(|| bad("too wide".into()))?;
        let want = n
            .checked_mul(per)
            .and_then(|b| b.checked_add(40))
            .ok_or_else(|| bad("too long".into()))?;
        if bytes.len() != want {
            return Err(bad(format!(
                "{} bytes for {n} rows of {features} features (expected {want})",
                bytes.len()
            )));
        }
        let mut buf = Self::new(features, capacity)?;
        if n > capacity {
            return Err(bad(format!("{n} rows in a buffer of capacity {capacity}")));
        }
        let f32_at = |at: usize| f32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        for i in 0..n {
            let at = 40 + i * per;
            let step = word(at);
            let reward = f32_at(at + 8);
            let row: Vec<f32> = (0..features).map(|j| f32_at(at + 12 + 4 * j)).collect();
            buf.push(&row, &[step], &[reward])?;
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::optim::AdamWConfig;

    use super::*;

    type B = Flex;
    type AD = Autodiff<Flex>;

    fn shape() -> ValueNetShape {
        ValueNetShape {
            features: 3,
            hidden: 8,
            layers: 3,
            steps: 4,
        }
    }

    #[test]
    fn a_conditional_layer_scales_each_row_by_its_steps_gamma() {
        let dev = Default::default();
        let mut rng = PcgStream::keyed(1, &[]);
        let layer = ConditionalLinear::<B> {
            linear: linear(&mut rng, 2, 2, &dev),
            scale: Param::from_tensor(Tensor::from_data(
                TensorData::new(vec![1.0f32, 2.0, 0.5, -1.0], [2, 2]),
                &dev,
            )),
        };
        let x =
            Tensor::<B, 2>::from_data(TensorData::new(vec![1.0f32, 2.0, 1.0, 2.0], [2, 2]), &dev);
        let plain: Vec<f32> = layer
            .linear
            .forward(x.clone())
            .into_data()
            .to_vec()
            .unwrap();
        let t = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![0i64, 1], [2]), &dev);
        let out: Vec<f32> = layer.forward(x, t).into_data().to_vec().unwrap();
        // row 0 at step 0 scaled by [1, 2], row 1 at step 1 by [0.5, -1]
        let want = [plain[0], 2.0 * plain[1], 0.5 * plain[2], -plain[3]];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{out:?} vs {want:?}");
        }
    }

    #[test]
    fn the_network_is_a_pure_function_of_its_seed() {
        let dev = Default::default();
        let rows = [0.1f32, -0.2, 0.3, 1.0, 0.0, -1.0];
        let a = ValueNet::<B>::init(shape(), 7, &dev)
            .unwrap()
            .predict(&rows, &[0, 3], &dev)
            .unwrap();
        let b = ValueNet::<B>::init(shape(), 7, &dev)
            .unwrap()
            .predict(&rows, &[0, 3], &dev)
            .unwrap();
        let c = ValueNet::<B>::init(shape(), 8, &dev)
            .unwrap()
            .predict(&rows, &[0, 3], &dev)
            .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let net = ValueNet::<B>::init(shape(), 7, &dev).unwrap();
        // the scales start in [0, 1)
        for l in &net.layers {
            let s: Vec<f32> = l.scale.val().into_data().to_vec().unwrap();
            assert!(s.iter().all(|v| (0.0..1.0).contains(v)));
        }
        let err = net.predict(&rows, &[0, 4], &dev).unwrap_err();
        assert!(err.to_string().contains("step 4"), "{err}");
        let err = net.predict(&rows[..5], &[0, 1], &dev).unwrap_err();
        assert!(err.to_string().contains("5 input values"), "{err}");
        let bad = ValueNetShape {
            hidden: 0,
            ..shape()
        };
        assert!(
            ValueNet::<B>::init(bad, 7, &dev)
                .unwrap_err()
                .to_string()
                .contains("hidden width")
        );
    }

    #[test]
    fn the_buffer_keeps_the_newest_rows_and_draws_without_replacement() {
        let mut buf = ValueBuffer::new(2, 3).unwrap();
        buf.push(&[0.0, 0.0, 1.0, 1.0], &[0, 1], &[0.0, 1.0])
            .unwrap();
        buf.push(&[2.0, 2.0, 3.0, 3.0], &[2, 3], &[2.0, 3.0])
            .unwrap();
        assert_eq!(buf.len(), 3);
        // the oldest row went first
        let (rows, steps, rewards) = buf.gather(&[0, 1, 2]);
        assert_eq!(rows, [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        assert_eq!(steps, [1, 2, 3]);
        assert_eq!(rewards, [1.0, 2.0, 3.0]);
        let a = buf.minibatch(2, &[5, 1]);
        assert_eq!(a, buf.minibatch(2, &[5, 1]), "keyed");
        assert_eq!(a.len(), 2);
        assert_ne!(a[0], a[1]);
        let mut all = buf.minibatch(10, &[5, 1]);
        all.sort_unstable();
        assert_eq!(
            all,
            [0, 1, 2],
            "a minibatch larger than the buffer is the buffer"
        );
        let err = buf.push(&[0.0], &[0], &[1.0]).unwrap_err();
        assert!(err.to_string().contains("1 values"), "{err}");
        let err = buf.push(&[0.0, 0.0], &[0], &[f32::NAN]).unwrap_err();
        assert!(err.to_string().contains("not finite"), "{err}");
        assert_eq!(buf.len(), 3, "nothing was appended by the bad pushes");
        assert!(ValueBuffer::new(2, 0).is_err());
    }

    #[test]
    fn fitting_lowers_the_error_to_rewards_that_depend_on_state_and_step() {
        let dev = Default::default();
        // reward = x0 - x1 + 0.5 * step, over 64 rows
        let mut rng = PcgStream::keyed(3, &[]);
        let n = 64;
        let rows = uniforms(&mut rng, n * 3, -1.0, 1.0);
        let steps: Vec<usize> = (0..n).map(|i| i % 4).collect();
        let rewards: Vec<f32> = (0..n)
            .map(|i| rows[3 * i] - rows[3 * i + 1] + 0.5 * steps[i] as f32)
            .collect();
        let mut buf = ValueBuffer::new(3, 1000).unwrap();
        buf.push(&rows, &steps, &rewards).unwrap();
        let mse = |net: &ValueNet<AD>| {
            let p = net.predict(&rows, &steps, &dev).unwrap();
            p.iter()
                .zip(&rewards)
                .map(|(a, b)| f64::from((a - b).powi(2)))
                .sum::<f64>()
                / n as f64
        };
        let mut net = ValueNet::<AD>::init(shape(), 1, &dev).unwrap();
        let mut opt = AdamWConfig::new().init::<AD, ValueNet<AD>>();
        let fit = ValueFit {
            minibatches: 5,
            batch_size: 32,
            lr: 1e-2,
        };
        let before = mse(&net);
        let mut losses = Vec::new();
        for r in 0..150u64 {
            let (n2, loss) = fit_value(net, &mut opt, &buf, fit, &[9, r]).unwrap();
            net = n2;
            losses.push(loss);
        }
        let after = mse(&net);
        assert!(after < 0.1 * before, "MSE {before} -> {after}");
        assert!(losses.last().unwrap() < &losses[0], "{losses:?}");

        let empty = ValueBuffer::new(3, 10).unwrap();
        let err = fit_value(net, &mut opt, &empty, fit, &[0]).unwrap_err();
        assert!(err.to_string().contains("buffer of 0 rows"), "{err}");
    }

    fn settings() -> ValueBaselineSettings {
        ValueBaselineSettings {
            hidden: 8,
            layers: 2,
            fit: ValueFit {
                minibatches: 2,
                batch_size: 4,
                lr: 1e-2,
            },
            buffer_size: 6,
        }
    }

    /// A rollout of 4 rows of 3 features at steps 0..4, rewards `r`.
    fn rollout(r: [f64; 4], shift: f32) -> (Vec<f32>, Vec<usize>, Vec<f64>) {
        let rows = (0..12).map(|i| i as f32 * 0.1 + shift).collect();
        (rows, vec![0, 1, 2, 3], r.to_vec())
    }

    /// Rows whose reward is not finite are neither pushed nor valued; the buffer keeps its
    /// capacity; a rollout without a finite reward fits nothing.
    #[test]
    fn a_baseline_fits_on_finite_rewards_and_predicts_after_its_fit() {
        let dev = Default::default();
        let mut v = ValueBaseline::<AD>::new(settings(), 3, 4, 5, &dev).unwrap();
        let (rows, steps, rewards) = rollout([1.0, f64::NAN, 0.5, 0.0], 0.0);
        let before = v.net().valid().predict(&rows, &steps, &dev).unwrap();
        let out = v.observe(&rows, &steps, &rewards, 0).unwrap().unwrap();
        assert_eq!(out.buffer_rows, 3);
        assert!(out.values[1].is_nan());
        assert!(out.loss.is_finite());
        let after = v.net().valid().predict(&rows, &steps, &dev).unwrap();
        assert_ne!(before, after, "the fit stepped the network");
        for i in [0, 2, 3] {
            assert_eq!(
                out.values[i], after[i],
                "row {i} valued by the fitted network"
            );
        }
        let (rows2, _, _) = rollout([0.0; 4], 1.0);
        v.observe(&rows2, &steps, &[0.0; 4], 1).unwrap().unwrap();
        assert_eq!(v.buffer().len(), 6, "capacity 6");
        let kept = v.clone();
        assert_eq!(v.observe(&rows, &steps, &[f64::NAN; 4], 2).unwrap(), None);
        assert_eq!(v.buffer(), kept.buffer());
        let err = v.observe(&rows[..11], &steps, &rewards, 3).unwrap_err();
        assert!(err.to_string().contains("11 values"), "{err}");
        assert!(
            ValueBaseline::<AD>::new(
                ValueBaselineSettings {
                    fit: ValueFit {
                        lr: 0.0,
                        ..settings().fit
                    },
                    ..settings()
                },
                3,
                4,
                5,
                &dev
            )
            .is_err()
        );
    }

    /// The checkpoint files restore the network, its optimizer's moments and the buffer:
    /// the next rollout of a restored baseline matches the original's bit for bit.
    #[test]
    fn a_restored_baseline_continues_bit_for_bit() {
        let dev = Default::default();
        let mut v = ValueBaseline::<AD>::new(settings(), 3, 4, 5, &dev).unwrap();
        for (id, shift) in [(0u64, 0.0f32), (1, 0.3)] {
            let (rows, steps, _) = rollout([0.0; 4], shift);
            v.observe(&rows, &steps, &[1.0, 0.2, -0.5, 0.7], id)
                .unwrap();
        }
        let files = v.files().unwrap();
        assert_eq!(
            files.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            VALUE_FILES
        );
        let get = |name: &str| {
            files
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| b.clone())
        };
        // a fresh baseline of the run's seed, restored (unrestored, it would still be at its
        // initial weights with an empty buffer)
        let mut fresh = ValueBaseline::<AD>::new(settings(), 3, 4, 5, &dev).unwrap();
        let mut restored = fresh.clone().restored(get, &dev).unwrap();
        assert_eq!(restored.buffer(), v.buffer());
        let (rows, steps, _) = rollout([0.0; 4], 0.6);
        let r = [0.3, 0.1, 0.9, -0.2];
        let a = v.observe(&rows, &steps, &r, 2).unwrap().unwrap();
        let b = restored.observe(&rows, &steps, &r, 2).unwrap().unwrap();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.values), bits(&b.values));
        assert_eq!(a.loss.to_bits(), b.loss.to_bits());
        let c = fresh.observe(&rows, &steps, &r, 2).unwrap().unwrap();
        assert_ne!(bits(&a.values), bits(&c.values));

        // a missing file, a damaged buffer, a buffer of another width: refused by name
        let missing = ValueBaseline::<AD>::new(settings(), 3, 4, 5, &dev)
            .unwrap()
            .restored(|n| if n == VALUE_FILES[1] { None } else { get(n) }, &dev)
            .unwrap_err();
        assert!(missing.to_string().contains(VALUE_FILES[1]), "{missing}");
        let mut damaged = get(VALUE_FILES[2]).unwrap();
        damaged.pop();
        let err = ValueBuffer::from_bytes(&damaged).unwrap_err();
        assert!(err.to_string().contains("bytes for"), "{err}");
        let wide = ValueBaseline::<AD>::new(settings(), 4, 4, 5, &dev).unwrap();
        let err = ValueBaseline::<AD>::new(settings(), 3, 4, 5, &dev)
            .unwrap()
            .restored(
                |n| {
                    if n == VALUE_FILES[2] {
                        Some(wide.buffer().to_bytes())
                    } else {
                        get(n)
                    }
                },
                &dev,
            )
            .unwrap_err();
        assert!(err.to_string().contains("rows of 4 features"), "{err}");
    }

    /// The prompt features are the mean of the real tokens.
    #[test]
    fn prompt_features_average_the_real_tokens() {
        let c = trajectory::Conditions {
            text_embeddings: trajectory::StoredTensor::from_f32(
                "emb",
                &[1.0, 2.0, 3.0, 4.0, 100.0, 100.0],
                vec![3, 2],
                sde_math::StorageDtype::F32,
            )
            .unwrap(),
            text_mask: vec![true, true, false],
            extra: Default::default(),
        };
        assert_eq!(prompt_features(&c), [2.0, 3.0]);
    }
}
