//! Shared by the shapes-loop tests: a tiny random shapes-world generator, a tiny recipe, a
//! scorer that still varies on a random generator's images, and parameter fingerprints.

#![allow(dead_code)]

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::tensor::backend::Backend;
use reward::{Batch, Components, Input, RewardError, Scorer};
use trainer_fsdp::dispatch::FromPlan;
use trainer_fsdp::shapes_world::{
    ShapesGenerator, ShapesWorld, SharedScorer, TextEncoderConfig, transformer_config,
};
use trainer_fsdp::{FlowGrpo, LocalWorkers, Override, RecipeName, Run, TrainConfig};

/// The autodiff backend of the loop tests.
pub type B = Autodiff<Flex>;

/// The shapes-world FlowGRPO run on one process.
pub type ShapesRun = Run<B, ShapesWorld<Flex>, FlowGrpo, LocalWorkers>;

/// A run of the tiny config in `root` (generator under `root/generator`), scored by `scorer`,
/// writing into `run_dir`.
pub fn start_in(
    root: &Path,
    run_dir: &Path,
    rollouts: u64,
    extra: &[&str],
    scorer: SharedScorer,
) -> ShapesRun {
    let cfg = tiny_config(root, rollouts, extra);
    let pre = cfg.preflight().unwrap();
    let dev = Default::default();
    let world = ShapesWorld::<Flex>::load(&root.join("generator"), &cfg.reward.scorers, &dev)
        .unwrap()
        .with_prompt_files(&cfg.data)
        .unwrap()
        .with_scorer(scorer);
    let algorithm = FlowGrpo::from_plan(&pre.algorithm).expect("a FlowGRPO plan");
    let workers = LocalWorkers::new(cfg.run.threads());
    Run::new(cfg, pre, run_dir, dev, world, algorithm, workers).unwrap()
}

/// A tiny random generator written where the shapes-world loader expects it.
pub fn tiny_generator(dir: &Path) {
    let dev = Default::default();
    let text = TextEncoderConfig::new()
        .with_d_model(16)
        .with_layers(1)
        .with_heads(2);
    let dit = transformer_config()
        .with_num_layers(1)
        .with_attention_head_dim(8)
        .with_num_attention_heads(2)
        .with_joint_attention_dim(16)
        .with_axes_dims_rope([2, 2, 4]);
    ShapesGenerator::<Flex>::init_with(&text, &dit, &dev)
        .map(&mut Keyed {
            index: 0,
            embedding: 0,
        })
        .save(dir)
        .unwrap();
}

/// Replaces every float parameter that burn initialised at random with keyed uniform values
/// of the variance burn draws them at: `±1/sqrt(fan_in)` (the first dimension; a vector's
/// length), and an embedding's unit normal as `±sqrt(3)`. The constant ones (norm scales,
/// zero biases) stay. The tiny generator is then the same in every test process, whatever
/// else draws from burn's process-wide random stream. Parameters are keyed by their order in
/// the module, which its structure fixes.
struct Keyed {
    index: u64,
    /// Inside an `Embedding` (depth of nesting there).
    embedding: usize,
}

impl<Bk: Backend> burn::module::ModuleMapper<Bk> for Keyed {
    fn enter_module(&mut self, _name: &str, container_type: &str) {
        if container_type == "Struct:Embedding" || self.embedding > 0 {
            self.embedding += 1;
        }
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.embedding = self.embedding.saturating_sub(1);
    }

    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::tensor::Tensor<Bk, D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<Bk, D>> {
        let (id, tensor, mapper) = param.consume();
        self.index += 1;
        let dims = tensor.dims();
        let values: Vec<f32> = tensor
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap();
        let constant = values.iter().all(|v| v.to_bits() == values[0].to_bits());
        let out = if constant {
            tensor
        } else {
            let bound = if self.embedding > 0 {
                3f64.sqrt()
            } else {
                1.0 / (dims[0].max(1) as f64).sqrt()
            };
            let mut rng = keyed_rng::SplitMix64::new(keyed_rng::absorb(0x7E57_5EED, &[self.index]));
            let keyed: Vec<f32> = (0..values.len())
                .map(|_| rng.range_f64(-bound, bound) as f32)
                .collect();
            burn::tensor::Tensor::from_data(
                burn::tensor::TensorData::new(keyed, dims),
                &tensor.device(),
            )
        };
        burn::module::Param::from_mapped_value(id, out, mapper)
    }
}

/// [`tiny_generator`] written under `root/generator` and loaded back on the default device.
pub fn load_tiny_generator(root: &Path) -> ShapesGenerator<Flex> {
    let dir = root.join("generator");
    tiny_generator(&dir);
    ShapesGenerator::<Flex>::load(&dir, &Default::default()).unwrap()
}

pub fn tiny_config(root: &Path, rollouts: u64, extra: &[&str]) -> TrainConfig {
    let dir = |name: &str| root.join(name).display().to_string();
    let mut o = vec![
        format!("model.generator.shapes_world.dir={}", dir("generator")),
        "run.num_rollouts=".to_string() + &rollouts.to_string(),
        "rollout.prompts_per_rollout=2".into(),
        "rollout.group_size=4".into(),
        "rollout.micro_batch_size=4".into(),
        "sampling.num_inference_steps=4".into(),
        // the kernel the tests' figures were set with, whatever the recipe's
        "sampling.sde_type=\"sde\"".into(),
        "sampling.sde_pool=[1, 2]".into(),
        "sampling.sde_indices=[1, 2]".into(),
        "sampling.num_sde_steps=2".into(),
        "lora.rank=2".into(),
        "lora.alpha=4.0".into(),
        "eval.interval=1".into(),
        "eval.samples_per_prompt=1".into(),
        "checkpoint.save_interval=1".into(),
        format!("checkpoint.dir={}", dir("ckpt")),
        format!("artifacts.root={}", dir("artifacts")),
        "monitor.progress=\"never\"".into(),
        // the tests replace the world's scorer, which gives no second judgement
        "eval.judges=[]".into(),
    ];
    o.extend(extra.iter().map(|s| s.to_string()));
    let overrides = Override::parse_all(&o).unwrap();
    TrainConfig::from_recipe(RecipeName::ShapesWorldLora, &overrides).unwrap()
}

/// A scorer whose reward varies with the image (its mean brightness), so that a tiny random
/// generator still gets non-degenerate advantages and trains.
pub struct Brightness;

impl Scorer for Brightness {
    fn name(&self) -> String {
        "brightness".into()
    }
    fn required_inputs(&self) -> &[Input] {
        &[Input::Image]
    }
    fn components(&self) -> Vec<String> {
        vec!["shapes".into()]
    }
    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        Ok(batch
            .images()
            .unwrap()
            .iter()
            .map(|img| {
                let bytes = img.as_bytes();
                let mean = bytes.iter().map(|b| f64::from(*b)).sum::<f64>() / bytes.len() as f64;
                Components::from_iter([("shapes", mean / 255.0)])
            })
            .collect())
    }
    fn chunk_size(&self) -> usize {
        usize::MAX
    }
}

/// Every float parameter of a module, as bits.
pub fn param_bits<Bk: Backend, M: Module<Bk>>(module: &M) -> Vec<u32> {
    let mut v = Vec::new();
    struct Collect<'a>(&'a mut Vec<u32>);
    impl<Bk: Backend> burn::module::ModuleVisitor<Bk> for Collect<'_> {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<Bk, D>>,
        ) {
            let data = param.val().into_data().convert::<f32>();
            self.0
                .extend(data.to_vec::<f32>().unwrap().into_iter().map(f32::to_bits));
        }
    }
    module.visit(&mut Collect(&mut v));
    v
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
