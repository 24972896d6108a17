//! The scorer interface: a batch of decoded images with their prompts and metadata in, named
//! reward components per sample out.
//!
//! A scorer declares the inputs it reads ([`Scorer::required_inputs`]) and the most samples it
//! takes at once ([`Scorer::chunk_size`], which bounds its memory); [`Scorer::score`] checks
//! the inputs, splits the batch into chunks, calls [`Scorer::score_chunk`] on each and checks
//! that every chunk returned one [`Components`] per sample.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde_json::Value;

use crate::error::RewardError;
use crate::image::RgbImage;

/// One input a scorer can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Input {
    /// The decoded image.
    Image,
    /// The prompt the image was generated from.
    Prompt,
    /// Per-sample metadata (free JSON, e.g. a task's ground truth).
    Metadata,
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Input::Image => "image",
            Input::Prompt => "prompt",
            Input::Metadata => "metadata",
        })
    }
}

/// A batch of samples: up to three parallel inputs of one length, borrowed.
///
/// ```
/// use reward::{Batch, Input, RgbImage};
///
/// let images = vec![RgbImage::filled(4, 4, [255, 0, 0]); 2];
/// let prompts = vec!["a red square".to_string(), "a blue circle".to_string()];
/// let batch = Batch::new(Some(&images), Some(&prompts), None).unwrap();
/// assert_eq!(batch.len(), 2);
/// assert!(batch.has(Input::Image) && !batch.has(Input::Metadata));
/// assert_eq!(batch.slice(1..2).prompts().unwrap()[0], "a blue circle");
///
/// let short = vec!["one prompt".to_string()];
/// assert!(Batch::new(Some(&images), Some(&short), None).is_err());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    len: usize,
    images: Option<&'a [RgbImage]>,
    prompts: Option<&'a [String]>,
    metadata: Option<&'a [Value]>,
}

impl<'a> Batch<'a> {
    /// A batch of the inputs given, which must all have the same length; at least one must be
    /// given.
    pub fn new(
        images: Option<&'a [RgbImage]>,
        prompts: Option<&'a [String]>,
        metadata: Option<&'a [Value]>,
    ) -> Result<Self, RewardError> {
        let lens = [
            (Input::Image, images.map(<[_]>::len)),
            (Input::Prompt, prompts.map(<[_]>::len)),
            (Input::Metadata, metadata.map(<[_]>::len)),
        ];
        let Some(len) = lens.iter().find_map(|(_, l)| *l) else {
            return Err(RewardError::EmptyBatchInputs);
        };
        for (input, l) in lens {
            if let Some(found) = l
                && found != len
            {
                return Err(RewardError::BatchLength {
                    input,
                    expected: len,
                    found,
                });
            }
        }
        Ok(Self {
            len,
            images,
            prompts,
            metadata,
        })
    }

    /// Images with their prompts (the common case).
    pub fn images_and_prompts(
        images: &'a [RgbImage],
        prompts: &'a [String],
    ) -> Result<Self, RewardError> {
        Self::new(Some(images), Some(prompts), None)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a batch of no samples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the batch carries `input`.
    pub fn has(&self, input: Input) -> bool {
        match input {
            Input::Image => self.images.is_some(),
            Input::Prompt => self.prompts.is_some(),
            Input::Metadata => self.metadata.is_some(),
        }
    }

    /// The images, if carried.
    pub fn images(&self) -> Option<&'a [RgbImage]> {
        self.images
    }

    /// The prompts, if carried.
    pub fn prompts(&self) -> Option<&'a [String]> {
        self.prompts
    }

    /// The metadata, if carried.
    pub fn metadata(&self) -> Option<&'a [Value]> {
        self.metadata
    }

    /// The samples in `range` (panics if the range exceeds the batch).
    pub fn slice(&self, range: Range<usize>) -> Batch<'a> {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "slice {range:?} of a batch of {}",
            self.len
        );
        Batch {
            len: range.len(),
            images: self.images.map(|x| &x[range.clone()]),
            prompts: self.prompts.map(|x| &x[range.clone()]),
            metadata: self.metadata.map(|x| &x[range]),
        }
    }
}

/// The named reward components of one sample (`"pickscore" -> 21.7`).
///
/// Values are stored as given, NaN included: judging them is the job of
/// [`crate::combine::Combination`], which fails a group whose required component is missing
/// or not finite.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Components(BTreeMap<String, f64>);

impl Components {
    /// No components.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a component (replacing a previous value of the same name).
    pub fn insert(&mut self, name: impl Into<String>, value: f64) {
        self.0.insert(name.into(), value);
    }

    /// Builder form of [`Components::insert`].
    pub fn with(mut self, name: impl Into<String>, value: f64) -> Self {
        self.insert(name, value);
        self
    }

    /// A component's value.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// Components in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Number of components.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<S: Into<String>> FromIterator<(S, f64)> for Components {
    fn from_iter<I: IntoIterator<Item = (S, f64)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

/// A reward scorer.
///
/// Implementors provide [`Scorer::score_chunk`] for at most [`Scorer::chunk_size`] samples
/// that carry every input of [`Scorer::required_inputs`]; callers use [`Scorer::score`].
pub trait Scorer {
    /// A short name for messages (`pickscore`, `jpeg`, `remote http://...`).
    fn name(&self) -> String;

    /// The inputs the scorer reads; a batch without one of them is refused.
    fn required_inputs(&self) -> &[Input];

    /// The components the scorer produces for every sample, by name. A scorer may add
    /// further, sample-dependent components (e.g. per-constraint details).
    fn components(&self) -> Vec<String>;

    /// The most samples scored in one call of [`Scorer::score_chunk`] (at least 1): the bound
    /// on the scorer's working memory.
    fn chunk_size(&self) -> usize;

    /// Scores at most [`Scorer::chunk_size`] samples that carry the required inputs: one
    /// [`Components`] per sample, in order.
    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError>;

    /// Scores a batch of any length: checks the required inputs, scores it in chunks of at
    /// most [`Scorer::chunk_size`] samples and checks each chunk's result count.
    fn score(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        for input in self.required_inputs() {
            if !batch.has(*input) {
                return Err(RewardError::MissingInput {
                    scorer: self.name(),
                    input: *input,
                });
            }
        }
        let chunk = self.chunk_size().max(1);
        let mut out = Vec::with_capacity(batch.len());
        let mut start = 0;
        while start < batch.len() {
            let end = (start + chunk).min(batch.len());
            let part = self.score_chunk(batch.slice(start..end))?;
            if part.len() != end - start {
                return Err(RewardError::ScorerOutputLength {
                    scorer: self.name(),
                    expected: end - start,
                    found: part.len(),
                });
            }
            out.extend(part);
            start = end;
        }
        Ok(out)
    }
}
