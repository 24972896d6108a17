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

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

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

/// The EMA's schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmaSettings {
    /// The largest decay, in `[0, 1)`.
    pub decay: f64,
    /// The warm-up.
    pub warmup: EmaWarmup,
    /// The EMA moves after every `interval`-th optimizer step (`>= 1`).
    pub interval: u64,
}

impl EmaSettings {
    /// The decay after optimizer step `step` (1-based), `None` when the EMA does not move
    /// after that step.
    ///
    /// ```
    /// use trainer_fsdp::ema::{EmaSettings, EmaWarmup};
    /// let flow_grpo = EmaSettings { decay: 0.9, warmup: EmaWarmup::FlowGrpo, interval: 8 };
    /// assert_eq!(flow_grpo.decay_at(7), None);
    /// assert_eq!(flow_grpo.decay_at(8), Some(9.0 / 18.0));
    /// assert_eq!(flow_grpo.decay_at(800), Some(0.9));
    /// let awm = EmaSettings { decay: 0.3, warmup: EmaWarmup::Linear { ramp: 0.001 }, interval: 1 };
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
    /// parameters are the averages).
    pub model: M,
    /// The schedule.
    pub settings: EmaSettings,
}

impl<M> Ema<M> {
    /// An EMA starting at `model` (a clone of the policy).
    pub fn new(model: M, settings: EmaSettings) -> Self {
        Self { model, settings }
    }

    /// Moves the average toward `policy` after optimizer step `step` (1-based), if the
    /// schedule moves it then; returns the decay used.
    pub fn update<B: Backend>(&mut self, policy: &M, step: u64) -> Option<f64>
    where
        M: Module<B> + Clone,
    {
        let decay = self.settings.decay_at(step)?;
        self.model = blend(self.model.clone(), policy, decay);
        Some(decay)
    }
}

/// `target <- decay · target + (1 - decay) · source` for every trainable float parameter of
/// `target`, paired with `source`'s by [`ParamId`] (a parameter `source` lacks is left as it
/// is; the copies of one module have the same ids). The result is detached and keeps
/// requiring gradients where the target did (the checkpoint writes trainable parameters).
pub fn blend<B: Backend, M: Module<B>>(target: M, source: &M, decay: f64) -> M {
    let mut collect = CollectFlat::<B> {
        values: HashMap::new(),
    };
    source.visit(&mut collect);
    let mut mix = Mix::<B> {
        values: collect.values,
        decay,
    };
    target.map(&mut mix)
}

/// The trainable float parameters of a module, flattened, by id.
struct CollectFlat<B: Backend> {
    values: HashMap<ParamId, Tensor<B, 1>>,
}

impl<B: Backend> ModuleVisitor<B> for CollectFlat<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if param.is_require_grad() {
            let t = param.val().detach();
            let n = t.shape().num_elements();
            self.values.insert(param.id, t.reshape([n]));
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
            let dims = t.dims();
            let mixed = t.detach().mul_scalar(decay) + source.reshape(dims).mul_scalar(1.0 - decay);
            mixed.detach().require_grad()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

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
        };
        assert_eq!(s.decay_at(1), Some(2.0 / 11.0));
        let s = EmaSettings {
            decay: 0.5,
            warmup: EmaWarmup::None,
            interval: 2,
        };
        assert_eq!((s.decay_at(1), s.decay_at(2)), (None, Some(0.5)));
        // the first step under a linear ramp keeps almost nothing of the start
        let s = EmaSettings {
            decay: 0.3,
            warmup: EmaWarmup::Linear { ramp: 0.001 },
            interval: 1,
        };
        assert_eq!(s.decay_at(1), Some(0.001));
        let mut ema = Ema::new(two([0.0, 0.0], 1.0), s);
        let policy = {
            let mut p = ema.model.clone();
            p.a = p.a.map(|t| t.add_scalar(1.0).detach().require_grad());
            p
        };
        assert_eq!(ema.update::<AB>(&policy, 1), Some(0.001));
        let v = values(&ema.model.a.val());
        assert!((v[0] - 0.999).abs() < 1e-6, "{v:?}");
    }
}
