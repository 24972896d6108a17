//! An exponential moving average (EMA) of the policy's trainable weights: the copy evaluations
//! sample with and checkpoints hand to readers outside flowrl, while the rollouts keep sampling
//! with the live weights (flow_grpo's `ema.copy_ema_to` for evaluation and saving, swapped back
//! before the next rollout; here the two copies simply coexist).
//!
//! After each optimizer step `s` (1-based, counted over the run) whose `s` is a multiple of
//! the update interval, every trainable parameter moves as
//! `ema <- d_s · ema + (1 - d_s) · θ`, with the decay `d_s` capped by `decay` and, during the
//! warm-up, smaller:
//!
//! * [`EmaWarmup::FlowGrpo`]: `d_s = min(decay, (1 + s) / (10 + s))` (flow_grpo's
//!   `EMAModuleWrapper`, which its SD3 recipe runs at decay 0.9 every 8 steps);
//! * [`EmaWarmup::Linear`]: `d_s = min(decay, ramp · s)` (the AWM release's
//!   `min(0.3, 0.001 · step)`);
//! * [`EmaWarmup::None`]: `d_s = decay`.
//!
//! The copy is a clone of the policy module: the frozen base weights are shared with the
//! policy (burn tensors are reference-counted), so it costs one more set of trainable
//! parameters. Its parameters keep the policy's [`ParamId`]s, which is how [`Ema::update`]
//! pairs them.
//!
//! Trainable parameters held below f32 (a full fine-tune in bf16) are averaged in f32 by
//! default ([`EmaPrecision::Fp32`]): `(1 - d) · (θ - ema)` is then usually below half a bf16
//! step of `ema`, so an average kept in bf16 rounds every move away and stays where it
//! started (with `d` = 0.99, a weight 1.0 whose live value sits at 1.0078, one bf16 step
//! up, never moves). The f32 average costs one f32 copy of those parameters; the copy that
//! evaluations and checkpoints' readable files use is that average rounded to the
//! parameters' own dtype. [`EmaPrecision::Param`] averages in the parameters' dtype, as
//! diffusers' `EMAModel` and flow_grpo's `EMAModuleWrapper` do (their shadow parameters are
//! clones of the trained ones).

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Tensor};

/// How the decay grows over the first optimizer steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EmaWarmup {
    /// The decay from the first step.
    None,
    /// `min(decay, (1 + s) / (10 + s))` (flow_grpo).
    FlowGrpo,
    /// `min(decay, ramp · s)` (the AWM release, `ramp = 0.001`).
    Linear {
        /// The decay gained per optimizer step.
        ramp: f64,
    },
}

/// The dtype the average of trainable parameters held below f32 is kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmaPrecision {
    /// In f32, rounded to the parameters' dtype for the copy evaluations use.
    #[default]
    Fp32,
    /// In the parameters' own dtype (diffusers' `EMAModel`, flow_grpo's `EMAModuleWrapper`).
    Param,
}

/// The EMA's schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmaSettings {
    /// The largest decay, in `[0, 1)`.
    pub decay: f64,
    /// The warm-up.
    pub warmup: EmaWarmup,
    /// The EMA moves after every `interval`-th optimizer step (`>= 1`).
    pub interval: u64,
    /// Where trainable parameters are held below f32, the dtype of their average.
    pub precision: EmaPrecision,
}

impl EmaSettings {
    /// The decay after optimizer step `step` (1-based), `None` when the EMA does not move
    /// after that step.
    ///
    /// ```
    /// use trainer_fsdp::ema::{EmaPrecision, EmaSettings, EmaWarmup};
    /// let precision = EmaPrecision::Fp32;
    /// let flow_grpo = EmaSettings { decay: 0.9, warmup: EmaWarmup::FlowGrpo, interval: 8, precision };
    /// assert_eq!(flow_grpo.decay_at(7), None);
    /// assert_eq!(flow_grpo.decay_at(8), Some(9.0 / 18.0));
    /// assert_eq!(flow_grpo.decay_at(800), Some(0.9));
    /// let awm = EmaSettings { decay: 0.3, warmup: EmaWarmup::Linear { ramp: 0.001 }, interval: 1, precision };
    /// assert_eq!(awm.decay_at(100), Some(0.1));
    /// assert_eq!(awm.decay_at(1000), Some(0.3));
    /// ```
    pub fn decay_at(&self, step: u64) -> Option<f64> {
        if self.interval == 0 || !step.is_multiple_of(self.interval) {
            return None;
        }
        let s = step as f64;
        let warm = match self.warmup {
            EmaWarmup::None => self.decay,
            EmaWarmup::FlowGrpo => (1.0 + s) / (10.0 + s),
            EmaWarmup::Linear { ramp } => ramp * s,
        };
        Some(warm.min(self.decay))
    }
}

/// The EMA copy of a policy module.
#[derive(Debug, Clone)]
pub struct Ema<M> {
    /// The averaged module (the policy's structure and parameter ids; its trainable
    /// parameters are the averages, in the policy's dtypes).
    pub model: M,
    /// The schedule.
    pub settings: EmaSettings,
    /// The average in f32, where it is kept apart from `model` ([`EmaPrecision::Fp32`] and
    /// trainable parameters below f32): the same module with those parameters in f32.
    average: Option<M>,
}

impl<M> Ema<M> {
    /// An EMA starting at `model` (a clone of the policy).
    pub fn new<B: Backend>(model: M, settings: EmaSettings) -> Self
    where
        M: Module<B>,
    {
        let average = match settings.precision {
            EmaPrecision::Fp32 => widened::<B, M>(&model),
            EmaPrecision::Param => None,
        };
        Self {
            model,
            settings,
            average,
        }
    }

    /// An EMA restored from a checkpoint: `model` as it was saved, and the f32 `average` when
    /// one was saved beside it. Without one (a checkpoint written before averages were kept
    /// in f32), it is `model` widened, as [`Ema::new`] would start it.
    pub fn restored<B: Backend>(model: M, average: Option<M>, settings: EmaSettings) -> Self
    where
        M: Module<B>,
    {
        let mut ema = Self::new::<B>(model, settings);
        if ema.average.is_some()
            && let Some(average) = average
        {
            ema.average = Some(average);
        }
        ema
    }

    /// The f32 average when it is kept apart from [`Ema::model`] (what a checkpoint saves
    /// beside it for an exact resume).
    pub fn average(&self) -> Option<&M> {
        self.average.as_ref()
    }

    /// `model` in the layout of this EMA's f32 average (trainable parameters below f32 in
    /// f32), for loading a saved average into; `None` when this EMA keeps none.
    pub fn average_skeleton<B: Backend>(&self, model: M) -> Option<M>
    where
        M: Module<B>,
    {
        self.average.as_ref()?;
        widened::<B, M>(&model)
    }

    /// Moves the average toward `policy` after optimizer step `step` (1-based), if the
    /// schedule moves it then; returns the decay used.
    pub fn update<B: Backend>(&mut self, policy: &M, step: u64) -> Option<f64>
    where
        M: Module<B> + Clone,
    {
        let decay = self.settings.decay_at(step)?;
        match self.average.take() {
            Some(average) => {
                let average = blend(average, policy, decay);
                // decay 0: the average itself, in the copy's dtypes
                self.model = blend(self.model.clone(), &average, 0.0);
                self.average = Some(average);
            }
            None => self.model = blend(self.model.clone(), policy, decay),
        }
        Some(decay)
    }
}

/// `model` with its trainable float parameters below f32 cast to f32 (ids and trainability
/// kept; frozen parameters shared), or `None` when it has no such parameter.
fn widened<B: Backend, M: Module<B>>(model: &M) -> Option<M> {
    let mut find = FindNarrow(false);
    model.visit(&mut find);
    find.0.then(|| model.clone().map(&mut Widen))
}

fn is_narrow(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
}

struct FindNarrow(bool);

impl<B: Backend> ModuleVisitor<B> for FindNarrow {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0 |= param.is_require_grad() && is_narrow(param.val().dtype());
    }
}

struct Widen;

impl<B: Backend> ModuleMapper<B> for Widen {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !param.is_require_grad() {
            return param;
        }
        param.map(|t| {
            if is_narrow(t.dtype()) {
                t.set_require_grad(false)
                    .cast(DType::F32)
                    .set_require_grad(true)
            } else {
                t
            }
        })
    }
}

/// `target <- decay · target + (1 - decay) · source` for every trainable float parameter of
/// `target`, paired with `source`'s by [`ParamId`] (a parameter `source` lacks is left as it
/// is; the copies of one module have the same ids), computed in the target's dtype; at
/// `decay = 0` the target takes `source`'s values exactly (cast to its dtype). The result is
/// detached and keeps requiring gradients where the target did (the checkpoint
/// writes trainable parameters).
pub fn blend<B: Backend, M: Module<B>>(target: M, source: &M, decay: f64) -> M {
    let mut collect = CollectFlat::<B> { values: Vec::new() };
    source.visit(&mut collect);
    let mut mix = Mix::<B> {
        values: collect.values.into_iter().collect(),
        decay,
    };
    target.map(&mut mix)
}

/// How far `after` moved from `before`: `|after - before| / |before|`, the L2 norms taken over
/// every trainable float parameter of `before` that `after` has (paired by [`ParamId`], as
/// the copies of one module are); 0 when neither has any, infinite when only the change is
/// non-zero.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::module::{Module, Param};
/// use burn::tensor::Tensor;
/// type B = Autodiff<Flex>;
/// #[derive(Module, Debug)]
/// struct W<B: burn::tensor::backend::Backend> {
///     w: Param<Tensor<B, 1>>,
/// }
/// let dev = Default::default();
/// let trained = |v: [f32; 2]| Tensor::<B, 1>::from_floats(v, &dev).require_grad();
/// let a = W::<B> { w: Param::from_tensor(trained([3.0, 4.0])) };
/// // the same parameter (its id) moved by 0.5 in each coordinate
/// let b = W::<B> { w: Param::initialized(a.w.id, trained([3.5, 4.5])) };
/// let change = trainer_fsdp::ema::relative_change::<B, _>(&a, &b);
/// assert!((change - 0.5f64.hypot(0.5) / 5.0).abs() < 1e-6, "{change}");
/// ```
pub fn relative_change<B: Backend, M: Module<B>>(before: &M, after: &M) -> f64 {
    let flat = |m: &M| {
        let mut c = CollectFlat::<B> { values: Vec::new() };
        m.visit(&mut c);
        c.values
    };
    let old = flat(before);
    let mut new: HashMap<ParamId, Tensor<B, 1>> = flat(after).into_iter().collect();
    // summed on the device, read once (a read per parameter would wait on the device each
    // time), in the module's visiting order: the f32 sums are the same on every run and
    // after a resume (a map's order is not)
    let mut sums: Option<(Tensor<B, 1>, Tensor<B, 1>)> = None;
    for (id, t) in old {
        let Some(n) = new.remove(&id) else {
            continue;
        };
        let t = t.cast(DType::F32);
        let d = n.cast(DType::F32) - t.clone();
        let (dd, tt) = (d.clone().mul(d).sum(), t.clone().mul(t).sum());
        sums = Some(match sums {
            None => (dd, tt),
            Some((a, b)) => (a + dd, b + tt),
        });
    }
    let Some((moved, norm)) = sums else {
        return 0.0;
    };
    let (moved, norm) = (
        moved.into_scalar().elem::<f64>(),
        norm.into_scalar().elem::<f64>(),
    );
    if moved == 0.0 {
        0.0
    } else {
        (moved / norm).sqrt()
    }
}

/// The trainable float parameters of a module, flattened, with their ids, in visiting order.
struct CollectFlat<B: Backend> {
    values: Vec<(ParamId, Tensor<B, 1>)>,
}

impl<B: Backend> ModuleVisitor<B> for CollectFlat<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if param.is_require_grad() {
            let t = param.val().detach();
            let n = t.shape().num_elements();
            self.values.push((param.id, t.reshape([n])));
        }
    }
}

struct Mix<B: Backend> {
    values: HashMap<ParamId, Tensor<B, 1>>,
    decay: f64,
}

impl<B: Backend> ModuleMapper<B> for Mix<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !param.is_require_grad() {
            return param;
        }
        let Some(source) = self.values.remove(&param.id) else {
            return param;
        };
        let decay = self.decay;
        param.map(|t| {
            let (dims, dtype) = (t.dims(), t.dtype());
            let source = model_weights::in_dtype(source.reshape(dims), dtype);
            let mixed = if decay == 0.0 {
                source
            } else {
                t.detach().mul_scalar(decay) + source.mul_scalar(1.0 - decay)
            };
            mixed.detach().require_grad()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::DType;

    type AB = Autodiff<Flex>;

    // burn's derive needs the backend parameter named `B`
    #[derive(Module, Debug)]
    struct Two<B: Backend> {
        a: Param<Tensor<B, 1>>,
        frozen: Param<Tensor<B, 2>>,
    }

    fn two(a: [f32; 2], frozen: f32) -> Two<AB> {
        let dev = Default::default();
        Two {
            a: Param::from_tensor(Tensor::from_floats(a, &dev)),
            frozen: Param::from_tensor(Tensor::from_floats([[frozen]], &dev))
                .set_require_grad(false),
        }
    }

    fn values(t: &Tensor<AB, 1>) -> Vec<f32> {
        t.clone().into_data().to_vec::<f32>().unwrap()
    }

    #[test]
    fn blend_moves_trainable_parameters_by_id_and_keeps_them_trainable() {
        let policy = two([1.0, 3.0], 5.0);
        // a copy with the same ids, then moved apart
        let mut copy = policy.clone();
        copy.a = copy.a.map(|t| t.mul_scalar(0.0).detach().require_grad());
        let out = blend::<AB, _>(copy, &policy, 0.75);
        assert_eq!(values(&out.a.val()), vec![0.25, 0.75]);
        assert!(out.a.is_require_grad());
        assert_eq!(out.a.id, policy.a.id);
        // the frozen parameter is left alone
        assert!(!out.frozen.is_require_grad());
        // a module with other ids is not paired
        let stranger = two([9.0, 9.0], 5.0);
        let out = blend::<AB, _>(stranger, &policy, 0.5);
        assert_eq!(values(&out.a.val()), vec![9.0, 9.0]);
    }

    #[test]
    fn the_schedules_follow_their_references() {
        let s = EmaSettings {
            decay: 0.9,
            warmup: EmaWarmup::FlowGrpo,
            interval: 1,
            precision: EmaPrecision::Fp32,
        };
        assert_eq!(s.decay_at(1), Some(2.0 / 11.0));
        let s = EmaSettings {
            decay: 0.5,
            warmup: EmaWarmup::None,
            interval: 2,
            precision: EmaPrecision::Fp32,
        };
        assert_eq!((s.decay_at(1), s.decay_at(2)), (None, Some(0.5)));
        // the first step under a linear ramp keeps almost nothing of the start
        let s = EmaSettings {
            decay: 0.3,
            warmup: EmaWarmup::Linear { ramp: 0.001 },
            interval: 1,
            precision: EmaPrecision::Fp32,
        };
        assert_eq!(s.decay_at(1), Some(0.001));
        let mut ema = Ema::new::<AB>(two([0.0, 0.0], 1.0), s);
        let policy = {
            let mut p = ema.model.clone();
            p.a = p.a.map(|t| t.add_scalar(1.0).detach().require_grad());
            p
        };
        assert_eq!(ema.update::<AB>(&policy, 1), Some(0.001));
        let v = values(&ema.model.a.val());
        assert!((v[0] - 0.999).abs() < 1e-6, "{v:?}");
    }

    /// `two`, its trainable parameter held in bf16.
    fn two_bf16(a: [f32; 2]) -> Two<AB> {
        let m = two(a, 5.0);
        Two {
            a: m.a.map(|t| {
                t.set_require_grad(false)
                    .cast(DType::BF16)
                    .set_require_grad(true)
            }),
            frozen: m.frozen,
        }
    }

    fn f64s(t: &Tensor<AB, 1>) -> Vec<f64> {
        t.clone()
            .into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .unwrap()
    }

    fn settings(precision: EmaPrecision) -> EmaSettings {
        EmaSettings {
            decay: 0.99,
            warmup: EmaWarmup::None,
            interval: 1,
            precision,
        }
    }

    #[test]
    fn a_bf16_average_is_kept_in_f32_where_bf16_would_round_every_move_away() {
        // the live weights one bf16 step (2^-7) above where the average starts
        let step = 1.0 / 128.0;
        let policy = {
            let mut p = two_bf16([1.0, 1.0]);
            p.a = p.a.map(|t| t.add_scalar(step).detach().require_grad());
            p
        };
        assert_eq!(f64s(&policy.a.val()), vec![1.0 + step; 2]);
        let start = || {
            let mut m = policy.clone();
            m.a = m.a.map(|t| t.sub_scalar(step).detach().require_grad());
            m
        };
        let n = 100;
        // in bf16: each move, 0.01 of a step, rounds away
        let mut param = Ema::new::<AB>(start(), settings(EmaPrecision::Param));
        assert!(param.average().is_none());
        for s in 1..=n {
            param.update::<AB>(&policy, s);
        }
        assert_eq!(f64s(&param.model.a.val()), vec![1.0; 2]);
        // in f32: the average follows 1 + step (1 - 0.99^n), and the bf16 copy is it rounded
        let mut fp32 = Ema::new::<AB>(start(), settings(EmaPrecision::Fp32));
        for s in 1..=n {
            fp32.update::<AB>(&policy, s);
        }
        let want = 1.0 + step * (1.0 - 0.99f64.powi(n as i32));
        let average = fp32.average().unwrap();
        assert_eq!(average.a.val().dtype(), DType::F32);
        for v in f64s(&average.a.val()) {
            assert!((v - want).abs() < 1e-6, "{v} against {want}");
        }
        assert_eq!(fp32.model.a.val().dtype(), DType::BF16);
        assert_eq!(fp32.model.a.id, policy.a.id);
        assert!(fp32.model.a.is_require_grad());
        for v in f64s(&fp32.model.a.val()) {
            assert!(
                (v - want).abs() <= step / 2.0 + 1e-9,
                "{v} is not {want} rounded"
            );
        }
        // the frozen parameter is the policy's, not widened
        assert_eq!(average.frozen.val().dtype(), policy.frozen.val().dtype());
    }

    #[test]
    fn a_restored_average_continues_as_the_uninterrupted_one() {
        let policy = two_bf16([1.5, -0.25]);
        let start = || two_bf16([1.0, 0.0]);
        let mut straight = Ema::new::<AB>(start(), settings(EmaPrecision::Fp32));
        for s in 1..=3 {
            straight.update::<AB>(&policy, s);
        }
        // what a checkpoint holds: the rounded copy and the f32 average
        let saved = (straight.model.clone(), straight.average().cloned());
        let mut resumed = Ema::restored::<AB>(saved.0.clone(), saved.1, straight.settings);
        straight.update::<AB>(&policy, 4);
        resumed.update::<AB>(&policy, 4);
        assert_eq!(
            f64s(&resumed.average().unwrap().a.val()),
            f64s(&straight.average().unwrap().a.val())
        );
        assert_eq!(f64s(&resumed.model.a.val()), f64s(&straight.model.a.val()));
        // a checkpoint without the average starts it from the rounded copy
        let old = Ema::restored::<AB>(saved.0.clone(), None, straight.settings);
        assert_eq!(
            f64s(&old.average().unwrap().a.val()),
            f64s(&saved.0.a.val())
        );
        // f32 parameters need no separate average
        let f32s = Ema::new::<AB>(two([1.0, 0.0], 5.0), settings(EmaPrecision::Fp32));
        assert!(f32s.average().is_none());
        assert!(f32s.average_skeleton::<AB>(two([0.0, 0.0], 5.0)).is_none());
    }
}
