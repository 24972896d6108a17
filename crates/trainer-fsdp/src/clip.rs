//! Gradient clipping by the **global** norm over every trainable parameter, as
//! `torch.nn.utils.clip_grad_norm_` does (and as the references clip before each optimizer
//! step).
//!
//! burn's built-in `GradientClipping::Norm` clips each tensor by its own norm, which changes
//! the direction of the update; the global clip scales every gradient by one factor:
//!
//! ```text
//! total_norm = sqrt(sum over tensors t, elements i of g_t,i^2)
//! coef       = min(1, max_norm / (total_norm + 1e-6))
//! g_t       <- coef * g_t                                   for every t
//! ```
//!
//! Only parameters that have a gradient in the [`GradientsParams`] count (a frozen base under
//! LoRA has none), so the norm is the norm over the adapters alone. Each tensor's sum of squares
//! is computed on the device in its own dtype (as torch does), the per-tensor sums are gathered
//! in one transfer and added on the host in `f64`.
//!
//! One deliberate difference from torch: a non-finite total norm (a NaN or infinite gradient)
//! leaves the gradients untouched and is reported ([`ClipReport::is_finite`]); the trainer then
//! skips the optimizer step instead of writing NaN into the weights.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::error::TrainerError;

/// torch's `clip_grad_norm_` epsilon in `max_norm / (total_norm + eps)`.
pub const CLIP_EPSILON: f64 = 1e-6;

/// The outcome of [`clip_grad_norm`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipReport {
    /// The global L2 norm before clipping (`train/grad_norm`).
    pub total_norm: f64,
    /// The bound.
    pub max_norm: f64,
    /// The factor applied to every gradient (1 when not clipped).
    pub coef: f64,
    /// Whether the gradients were scaled.
    pub clipped: bool,
    /// Gradient tensors that entered the norm.
    pub tensors: usize,
    /// Gradient elements that entered the norm.
    pub elements: usize,
}

impl ClipReport {
    /// Whether the total norm is finite (a non-finite one leaves the gradients untouched).
    pub fn is_finite(&self) -> bool {
        self.total_norm.is_finite()
    }
}

/// Collects each gradient's sum of squares, in visiting order.
struct SumSquares<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    sums: Vec<Tensor<B::InnerBackend, 1>>,
    elements: usize,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SumSquares<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            self.elements += g.shape().num_elements();
            self.sums.push(g.square().sum());
        }
    }
}

/// Scales every gradient of the module's parameters by one factor.
struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    coef: f64,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.coef));
        }
    }
}

/// The global L2 norm of the gradients `grads` holds for `module`'s parameters, with the
/// number of tensors and elements that entered it. `0` when there is none.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::module::Param;
/// use burn::optim::GradientsParams;
/// use burn::tensor::Tensor;
/// use trainer_fsdp::global_grad_norm;
///
/// type B = Autodiff<Flex>;
/// let dev = Default::default();
/// // two parameters, loss = 3 a0 + 4 b0: gradients (3, 0) and (4, 0), global norm 5
/// let a = Param::from_tensor(Tensor::<B, 1>::from_floats([1.0, 2.0], &dev));
/// let b = Param::from_tensor(Tensor::<B, 1>::from_floats([1.0, 2.0], &dev));
/// let module = (a, b);
/// let loss = module.0.val().slice([0..1]).mul_scalar(3.0) + module.1.val().slice([0..1]).mul_scalar(4.0);
/// let grads = GradientsParams::from_grads::<B, _>(loss.backward(), &module);
/// let (norm, tensors, elements) = global_grad_norm::<B, _>(&module, &grads);
/// assert!((norm - 5.0).abs() < 1e-6);
/// assert_eq!((tensors, elements), (2, 4));
/// ```
pub fn global_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> (f64, usize, usize) {
    let mut v = SumSquares::<B> {
        grads,
        sums: Vec::new(),
        elements: 0,
    };
    module.visit(&mut v);
    let tensors = v.sums.len();
    if tensors == 0 {
        return (0.0, 0, 0);
    }
    // one transfer for every tensor's sum of squares
    let sums = Tensor::cat(v.sums, 0).into_data();
    let total: f64 = sums.iter::<f64>().sum();
    (total.sqrt(), tensors, v.elements)
}

/// Clips `grads` in place by the global norm over `module`'s parameters:
/// `g <- g * min(1, max_norm / (total_norm + 1e-6))`; returns the pre-clip norm and the factor.
///
/// # Errors
/// [`TrainerError::InvalidClipNorm`] when `max_norm` is not finite and positive (the config's
/// preflight rejects that); the gradients are then left untouched.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::module::Param;
/// use burn::optim::GradientsParams;
/// use burn::tensor::Tensor;
/// use trainer_fsdp::clip_grad_norm;
///
/// type B = Autodiff<Flex>;
/// let dev = Default::default();
/// let p = Param::from_tensor(Tensor::<B, 1>::from_floats([0.0, 0.0], &dev));
/// // loss = 3 x0 + 4 x1: gradient (3, 4), norm 5, clipped to norm 1
/// let loss = (p.val() * Tensor::from_floats([3.0, 4.0], &dev)).sum();
/// let mut grads = GradientsParams::from_grads::<B, _>(loss.backward(), &p);
/// let report = clip_grad_norm::<B, _>(&p, &mut grads, 1.0).unwrap();
/// assert!((report.total_norm - 5.0).abs() < 1e-6);
/// assert!(report.clipped);
/// let g: Vec<f32> = grads.get::<Flex, 1>(p.id).unwrap().into_data().to_vec().unwrap();
/// assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
/// ```
pub fn clip_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> Result<ClipReport, TrainerError> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(TrainerError::InvalidClipNorm {
            key: "max_norm",
            value: max_norm,
        });
    }
    let (total_norm, tensors, elements) = global_grad_norm(module, grads);
    let raw = max_norm / (total_norm + CLIP_EPSILON);
    let clipped = total_norm.is_finite() && raw < 1.0;
    let coef = if clipped { raw } else { 1.0 };
    if clipped {
        module.visit(&mut Scale::<B> {
            grads,
            coef,
            _b: std::marker::PhantomData,
        });
    }
    Ok(ClipReport {
        total_norm,
        max_norm,
        coef,
        clipped,
        tensors,
        elements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex, NdArray};
    use burn::module::Module;
    use burn::tensor::TensorData;

    type AD = Autodiff<Flex>;
    type AD64 = Autodiff<NdArray<f64>>;

    /// A module with a frozen parameter and two trainable ones (a LoRA-like split). (burn's
    /// `Module` derive expects the backend parameter to be called `B`.)
    #[derive(Module, Debug)]
    struct Adapted<B: burn::tensor::backend::Backend> {
        base: Param<Tensor<B, 2>>,
        lora_a: Param<Tensor<B, 2>>,
        lora_b: Param<Tensor<B, 1>>,
    }

    fn adapted<Bk: AutodiffBackend>(dev: &Bk::Device) -> Adapted<Bk> {
        Adapted {
            base: Param::initialized(
                burn::module::ParamId::new(),
                Tensor::<Bk, 2>::ones([2, 2], dev),
            ),
            lora_a: Param::from_tensor(Tensor::<Bk, 2>::zeros([2, 3], dev)),
            lora_b: Param::from_tensor(Tensor::<Bk, 1>::zeros([4], dev)),
        }
    }

    /// Gradients equal to `ga` and `gb` for the trainable parameters: loss = <a, ga> + <b, gb>
    /// (+ the frozen base, which gets no gradient).
    fn grads_of<Bk: AutodiffBackend>(
        m: &Adapted<Bk>,
        ga: [[f64; 3]; 2],
        gb: [f64; 4],
    ) -> GradientsParams {
        let dev = m.lora_a.val().device();
        let ga = Tensor::<Bk, 2>::from_data(TensorData::from(ga), &dev);
        let gb = Tensor::<Bk, 1>::from_data(TensorData::from(gb), &dev);
        let loss = (m.lora_a.val() * ga).sum() + (m.lora_b.val() * gb).sum() + m.base.val().sum();
        GradientsParams::from_grads::<Bk, _>(loss.backward(), m)
    }

    fn host<const D: usize>(g: Tensor<Flex, D>) -> Vec<f32> {
        g.into_data().to_vec().unwrap()
    }

    #[test]
    fn hand_computed_case_over_lora_only_parameters() {
        let dev = Default::default();
        let m = adapted::<AD>(&dev);
        // squares: a: 1 + 4 + 4 + 0 + 16 + 4 = 29; b: 1 + 1 + 9 + 9 = 20; total 49 -> norm 7
        let mut grads = grads_of(
            &m,
            [[1.0, 2.0, -2.0], [0.0, 4.0, 2.0]],
            [1.0, -1.0, 3.0, 3.0],
        );
        assert!(
            grads.get::<Flex, 2>(m.base.id).is_none(),
            "the frozen base has no gradient"
        );
        let r = clip_grad_norm::<AD, _>(&m, &mut grads, 3.5).unwrap();
        assert_eq!(r.total_norm, 7.0);
        assert_eq!((r.tensors, r.elements), (2, 10));
        assert!(r.clipped);
        let coef = 3.5 / (7.0 + 1e-6);
        assert_eq!(r.coef, coef);
        let a = host(grads.get::<Flex, 2>(m.lora_a.id).unwrap());
        let b = host(grads.get::<Flex, 1>(m.lora_b.id).unwrap());
        let expect_a: Vec<f32> = [1.0, 2.0, -2.0, 0.0, 4.0, 2.0]
            .iter()
            .map(|x| (x * coef) as f32)
            .collect();
        let expect_b: Vec<f32> = [1.0, -1.0, 3.0, 3.0]
            .iter()
            .map(|x| (x * coef) as f32)
            .collect();
        for (x, y) in a.iter().zip(&expect_a).chain(b.iter().zip(&expect_b)) {
            assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{x} vs {y}");
        }
        // the clipped gradients have norm max_norm * total / (total + eps), just below 3.5
        let (after, _, _) = global_grad_norm::<AD, _>(&m, &grads);
        assert!((after - 3.5 * 7.0 / (7.0 + 1e-6)).abs() < 1e-5, "{after}");
    }

    #[test]
    fn below_the_bound_nothing_changes_bit_for_bit() {
        let dev = Default::default();
        let m = adapted::<AD>(&dev);
        let mut grads = grads_of(&m, [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], [0.7, 0.8, 0.9, 1.0]);
        let before = host(grads.get::<Flex, 2>(m.lora_a.id).unwrap());
        let r = clip_grad_norm::<AD, _>(&m, &mut grads, 10.0).unwrap();
        assert!(!r.clipped);
        assert_eq!(r.coef, 1.0);
        assert_eq!(host(grads.get::<Flex, 2>(m.lora_a.id).unwrap()), before);
    }

    #[test]
    fn non_finite_norm_leaves_gradients_alone() {
        let dev = Default::default();
        let m = adapted::<AD>(&dev);
        let mut grads = grads_of(&m, [[1.0, f64::NAN, 0.0], [0.0; 3]], [1.0; 4]);
        let r = clip_grad_norm::<AD, _>(&m, &mut grads, 1.0).unwrap();
        assert!(!r.is_finite());
        assert!(!r.clipped);
        let b = host(grads.get::<Flex, 1>(m.lora_b.id).unwrap());
        assert_eq!(b, vec![1.0; 4]);
    }

    #[test]
    fn an_invalid_max_norm_is_an_error_and_leaves_gradients_alone() {
        let dev = Default::default();
        let m = adapted::<AD>(&dev);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut grads = grads_of(&m, [[1.0, 2.0, -2.0], [0.0, 4.0, 2.0]], [1.0; 4]);
            let err = clip_grad_norm::<AD, _>(&m, &mut grads, bad).unwrap_err();
            match err {
                TrainerError::InvalidClipNorm { key, value } => {
                    assert_eq!(key, "max_norm");
                    assert!(value.to_bits() == bad.to_bits(), "{value} vs {bad}");
                }
                other => panic!("max_norm = {bad}: {other}"),
            }
            let msg = clip_grad_norm::<AD, _>(&m, &mut grads, bad)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(&format!("max_norm = {bad}")) && msg.contains("finite value > 0"),
                "{msg}"
            );
            assert_eq!(
                host(grads.get::<Flex, 1>(m.lora_b.id).unwrap()),
                vec![1.0; 4]
            );
        }
    }

    #[test]
    fn no_gradients_is_a_zero_norm() {
        let dev = Default::default();
        let m = adapted::<AD>(&dev);
        let mut grads = GradientsParams::new();
        let r = clip_grad_norm::<AD, _>(&m, &mut grads, 1.0).unwrap();
        assert_eq!((r.total_norm, r.tensors, r.clipped), (0.0, 0, false));
    }

    /// `torch.nn.utils.clip_grad_norm_` on the same gradients, generated by
    /// `fixtures/generate/trainer_clip_grad_norm.py` (torch 2.6.0): total norm returned and the clipped
    /// gradients, for a bound below and above the norm.
    #[test]
    fn matches_torch_clip_grad_norm() {
        #[derive(serde::Deserialize)]
        struct Case {
            max_norm: f64,
            total_norm: f64,
            grads_a: Vec<f64>,
            grads_b: Vec<f64>,
            clipped_a: Vec<f64>,
            clipped_b: Vec<f64>,
        }
        #[derive(serde::Deserialize)]
        struct Fixture {
            cases: Vec<Case>,
            rtol: f64,
        }
        let fixture: Fixture = serde_json::from_str(include_str!(
            "../../../fixtures/trainer_fsdp/clip_grad_norm.json"
        ))
        .unwrap();
        assert!(fixture.cases.len() >= 2);
        for case in &fixture.cases {
            // the same gradients on f32 (Flex) and on f64 (NdArray<f64>)
            let ga: [[f64; 3]; 2] = [
                case.grads_a[..3].try_into().unwrap(),
                case.grads_a[3..].try_into().unwrap(),
            ];
            let gb: [f64; 4] = case.grads_b[..].try_into().unwrap();
            let dev = Default::default();
            let m = adapted::<AD>(&dev);
            let mut grads = grads_of(&m, ga, gb);
            let r = clip_grad_norm::<AD, _>(&m, &mut grads, case.max_norm).unwrap();
            let tol = fixture.rtol;
            assert!(
                (r.total_norm - case.total_norm).abs() <= tol * case.total_norm,
                "{} vs torch {}",
                r.total_norm,
                case.total_norm
            );
            let a = host(grads.get::<Flex, 2>(m.lora_a.id).unwrap());
            let b = host(grads.get::<Flex, 1>(m.lora_b.id).unwrap());
            for (x, y) in a
                .iter()
                .zip(&case.clipped_a)
                .chain(b.iter().zip(&case.clipped_b))
            {
                assert!(
                    (*x as f64 - y).abs() <= tol * y.abs().max(1e-3),
                    "{x} vs torch {y}"
                );
            }

            let dev64 = Default::default();
            let m64 = adapted::<AD64>(&dev64);
            let mut grads64 = grads_of(&m64, ga, gb);
            let r64 = clip_grad_norm::<AD64, _>(&m64, &mut grads64, case.max_norm).unwrap();
            assert!((r64.total_norm - case.total_norm).abs() <= tol * case.total_norm);
            assert_eq!(r64.clipped, r.clipped);
        }
    }
}
