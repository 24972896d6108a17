//! The scorers of `[reward] scorers`, built once and run as one: every sample's components
//! are the union of the scorers' (preflight refuses two scorers producing one component).

use burn::tensor::backend::Backend;
use reward::shapes::{ShapeCredit, ShapesScorer};
use reward::{
    Batch, Components, Input, JpegReward, JpegScorer, PickScore, PickScoreOptions, RewardError,
    Scorer,
};

use crate::config::ScorerSpec;
use crate::error::TrainerError;

/// A scorer the world can call from any thread.
pub type SharedScorer = Box<dyn Scorer + Send + Sync>;

/// How a world builds its own reward for `{ world = { components } }`.
pub type WorldReward<'a> = dyn Fn(&[String]) -> Result<SharedScorer, TrainerError> + 'a;

/// Builds the scorer of one spec on the backend `Bi` (PickScore's CLIP runs there);
/// `world` builds the world's own reward ([`ScorerSpec::World`]), or is `None` for a world
/// that has none.
///
/// # Errors
/// A PickScore directory that does not load; [`TrainerError::NoWorldReward`] for a world
/// reward the world does not have.
pub fn build_scorer<Bi: Backend>(
    spec: &ScorerSpec,
    world: Option<&WorldReward<'_>>,
    device: &Bi::Device,
) -> Result<SharedScorer, TrainerError>
where
    PickScore<Bi>: Send + Sync,
{
    Ok(match spec {
        ScorerSpec::World { components } => match world {
            Some(build) => build(components)?,
            None => {
                return Err(TrainerError::NoWorldReward {
                    components: components.clone(),
                });
            }
        },
        ScorerSpec::Shapes => Box::new(ShapesScorer::default()),
        ScorerSpec::ShapesGraded => Box::new(ShapesScorer::with_credit(ShapeCredit::GRADED)),
        ScorerSpec::ShapesRerender => Box::new(reward::shapes::RerenderScorer),
        ScorerSpec::JpegCompressibility => Box::new(JpegScorer::ddpo(JpegReward::Compressibility)),
        ScorerSpec::JpegIncompressibility => {
            Box::new(JpegScorer::ddpo(JpegReward::Incompressibility))
        }
        ScorerSpec::Pickscore { model_path } => Box::new(PickScore::<Bi>::from_dir(
            model_path,
            device,
            PickScoreOptions::default(),
        )?),
    })
}

/// Several scorers as one: each scores the whole batch (in its own chunks), and each sample's
/// components are merged in scorer order.
pub struct ScorerSet {
    scorers: Vec<SharedScorer>,
    inputs: Vec<Input>,
}

impl std::fmt::Debug for ScorerSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScorerSet")
            .field("scorers", &self.name())
            .finish()
    }
}

impl ScorerSet {
    /// The set of `scorers` (at least one).
    ///
    /// # Errors
    /// [`TrainerError::NoScorer`] when `scorers` is empty (preflight refuses an empty
    /// `reward.scorers`).
    pub fn new(scorers: Vec<SharedScorer>) -> Result<Self, TrainerError> {
        if scorers.is_empty() {
            return Err(TrainerError::NoScorer);
        }
        let mut inputs: Vec<Input> = Vec::new();
        for s in &scorers {
            for i in s.required_inputs() {
                if !inputs.contains(i) {
                    inputs.push(*i);
                }
            }
        }
        Ok(Self { scorers, inputs })
    }

    /// The set of the configured specs.
    ///
    /// # Errors
    /// [`TrainerError::NoScorer`] for no spec; otherwise as [`build_scorer`].
    pub fn from_specs<Bi: Backend>(
        specs: &[ScorerSpec],
        world: Option<&WorldReward<'_>>,
        device: &Bi::Device,
    ) -> Result<Self, TrainerError>
    where
        PickScore<Bi>: Send + Sync,
    {
        if specs.is_empty() {
            return Err(TrainerError::NoScorer);
        }
        Self::new(
            specs
                .iter()
                .map(|s| build_scorer::<Bi>(s, world, device))
                .collect::<Result<_, _>>()?,
        )
    }
}

impl Scorer for ScorerSet {
    fn name(&self) -> String {
        self.scorers
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(" + ")
    }

    fn required_inputs(&self) -> &[Input] {
        &self.inputs
    }

    fn components(&self) -> Vec<String> {
        self.scorers.iter().flat_map(|s| s.components()).collect()
    }

    fn chunk_size(&self) -> usize {
        // each member chunks its own calls
        usize::MAX
    }

    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        let mut out: Option<Vec<Components>> = None;
        for s in &self.scorers {
            let part = s.score(batch)?;
            match &mut out {
                None => out = Some(part),
                Some(acc) => {
                    for (a, p) in acc.iter_mut().zip(part) {
                        for (k, v) in p.iter() {
                            a.insert(k, v);
                        }
                    }
                }
            }
        }
        Ok(out.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reward::RgbImage;
    use reward::shapes::{RenderOptions, SceneSpec, render};

    #[test]
    fn a_set_merges_its_scorers_components() {
        let set = ScorerSet::from_specs::<burn::backend::Flex>(
            &[ScorerSpec::Shapes, ScorerSpec::JpegCompressibility],
            None,
            &Default::default(),
        )
        .unwrap();
        let prompts: Vec<String> = vec!["a red circle".into()];
        let images: Vec<RgbImage> = vec![
            render(
                &SceneSpec::parse("a red circle").unwrap(),
                1,
                &RenderOptions::default(),
            )
            .unwrap()
            .image,
        ];
        let out = set
            .score(Batch::images_and_prompts(&images, &prompts).unwrap())
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].get("shapes"), Some(1.0));
        assert!(out[0].get("jpeg_compressibility").unwrap() < 0.0);
        assert_eq!(set.name(), "shapes + jpeg_compressibility (quality 95)");
        assert!(set.required_inputs().contains(&Input::Prompt));

        // a world reward needs a world that has one
        let err = ScorerSet::from_specs::<burn::backend::Flex>(
            &[ScorerSpec::World {
                components: vec!["closeness".into()],
            }],
            None,
            &Default::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("closeness"), "{err}");
    }

    #[test]
    fn an_empty_set_is_an_error() {
        let err = ScorerSet::new(Vec::new()).unwrap_err();
        assert!(matches!(err, TrainerError::NoScorer), "{err}");
        assert!(err.to_string().contains("reward.scorers is empty"), "{err}");
        let err = ScorerSet::from_specs::<burn::backend::Flex>(&[], None, &Default::default())
            .unwrap_err();
        assert!(matches!(err, TrainerError::NoScorer), "{err}");
        let one: Vec<SharedScorer> = vec![Box::new(ShapesScorer::default())];
        assert_eq!(ScorerSet::new(one).unwrap().name(), "shapes");
    }
}
