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
//! The pieces are not yet wired into the trainer's DPOK: see `docs/ALGORITHMS.md`.

use std::collections::VecDeque;

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use keyed_rng::{PcgStream, fnv1a64};

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
}
