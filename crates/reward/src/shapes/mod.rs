//! The **shapes world**: a small, closed text-to-image task with a verifiable reward — GenEval's
//! categories in miniature — used by the embedded default run and its pretraining data.
//!
//! * **Vocabulary** (closed): five [`Colour`]s (red, green, blue, yellow, purple, each with a
//!   fixed palette RGB on a light-grey [`BACKGROUND`]), three [`Shape`]s (square, circle,
//!   triangle pointing up), counts one to four ([`MAX_OBJECTS`] objects per scene in all) and
//!   four [`Relation`]s (left of, right of, above, below).
//! * **Scenes** ([`SceneSpec`]): one object group (`"a red circle"`, `"three squares"`), two
//!   groups joined by *and* (`"a red circle and a blue square"`), or two single objects in a
//!   spatial relation (`"a red circle left of a yellow triangle"`). [`Category`] names the six
//!   GenEval categories a scene belongs to; [`SceneSpec::all`] enumerates each category and
//!   [`SceneSpec::sample`] draws from it with a seed.
//! * **Grammar**: [`SceneSpec::prompt`] writes the canonical prompt and [`SceneSpec::parse`]
//!   reads any sentence of the grammar back (text outside it is a typed error):
//!
//!   ```text
//!   prompt   := group | group " and " group | single " " relation " " single
//!   group    := count " " [colour " "] shape      (plural shape when count >= 2)
//!   single   := ("a" | "one") " " [colour " "] shape
//!   count    := "a" | "one" | "two" | "three" | "four"
//!   colour   := "red" | "green" | "blue" | "yellow" | "purple"
//!   shape    := "square" | "circle" | "triangle"   (plural: + "s")
//!   relation := "left of" | "right of" | "above" | "below"
//!   ```
//!
//!   plus the scene rules: at most [`MAX_OBJECTS`] objects, and the two groups of a pair or
//!   relation must be distinguishable (different shapes, or both coloured with different
//!   colours).
//! * **Renderer** ([`render`]): scene + seed -> an RGB image ([`IMAGE_SIZE`] = 32 pixels square
//!   by default), sizes, positions and colours jittered, optionally anti-aliased; deterministic.
//! * **Reward** ([`judge`], [`ShapesScorer`]): from the image alone — palette segmentation,
//!   connected components, shape classification by template fit, counts and centroid
//!   relations — each constraint of the prompt is scored in `[0, 1]` and the reward is the
//!   mean of what was asked times how exclusively it was drawn (the formula, and the reward
//!   hack that made the exclusivity a factor, are in [`judge`]).
//! * **A second judgement** ([`judge_rerendered`], [`RerenderScorer`]): another parser and
//!   other thresholds, GenEval's counting credit, and the picture compared pixel by pixel
//!   with a clean re-rendering of what was parsed, so that only a clean drawing of the asked
//!   scene scores full marks; logged beside the first so that a gain one judge alone sees
//!   shows.
//!
//! ```
//! use reward::shapes::{self, Category, RenderOptions, SceneSpec};
//!
//! let spec = SceneSpec::parse("a red circle left of a yellow triangle").unwrap();
//! assert_eq!(spec.category(), Category::Position);
//! assert_eq!(spec.prompt(), "a red circle left of a yellow triangle");
//! let image = shapes::render(&spec, 7, &RenderOptions::default()).unwrap().image;
//! assert_eq!((image.width(), image.height()), (32, 32));
//! let j = shapes::judge(&spec, &image);
//! assert_eq!(j.score, 1.0, "{j:?}");
//!
//! assert!(SceneSpec::parse("a red hexagon").is_err());
//! ```

mod judge;
mod render;
mod rerender;

use std::fmt;

use keyed_rng::SplitMix64;

pub use judge::{
    ConstraintKind, ConstraintResult, CreditMargin, Detection, Judgement, Paint, SHAPES_COMPONENT,
    ShapeCredit, ShapesScorer, detect, detect_with_paint, judge, judge_with,
};
pub use render::{PlacedObject, RenderOptions, RenderedScene, render};
pub use rerender::{
    AGREE_RADIUS, FIDELITY_FLOOR, FIDELITY_FULL, MIN_COMPONENT, PAINT_THRESHOLD, PALETTE_RADIUS,
    ParsedObject, RERENDER_COMPONENT, RerenderScorer, Rerendered, judge_rerendered,
};

use crate::error::{ConfigProblem, RewardError};

/// Side of the images the renderer makes by default (pixels).
pub const IMAGE_SIZE: usize = 32;

/// The most objects a scene holds.
pub const MAX_OBJECTS: usize = 4;

/// The background colour of every rendered scene (light grey).
pub const BACKGROUND: [u8; 3] = [235, 235, 235];

/// The colours of the shapes world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Colour {
    /// `red`, RGB (220, 40, 40).
    Red,
    /// `green`, RGB (40, 170, 60).
    Green,
    /// `blue`, RGB (40, 80, 220).
    Blue,
    /// `yellow`, RGB (230, 200, 30).
    Yellow,
    /// `purple`, RGB (160, 50, 170).
    Purple,
}

impl Colour {
    /// Every colour, in palette order.
    pub const ALL: [Colour; 5] = [
        Colour::Red,
        Colour::Green,
        Colour::Blue,
        Colour::Yellow,
        Colour::Purple,
    ];

    /// The word used in prompts.
    pub fn word(self) -> &'static str {
        match self {
            Colour::Red => "red",
            Colour::Green => "green",
            Colour::Blue => "blue",
            Colour::Yellow => "yellow",
            Colour::Purple => "purple",
        }
    }

    /// The palette colour the renderer draws (before jitter) and the judge matches against.
    pub fn rgb(self) -> [u8; 3] {
        match self {
            Colour::Red => [220, 40, 40],
            Colour::Green => [40, 170, 60],
            Colour::Blue => [40, 80, 220],
            Colour::Yellow => [230, 200, 30],
            Colour::Purple => [160, 50, 170],
        }
    }

    fn from_word(w: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.word() == w)
    }
}

/// The shapes of the shapes world. Every shape is axis-aligned; the triangle is isosceles and
/// points up (apex at the top centre of its box).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shape {
    /// `square`.
    Square,
    /// `circle`.
    Circle,
    /// `triangle`.
    Triangle,
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 3] = [Shape::Square, Shape::Circle, Shape::Triangle];

    /// The singular word.
    pub fn word(self) -> &'static str {
        match self {
            Shape::Square => "square",
            Shape::Circle => "circle",
            Shape::Triangle => "triangle",
        }
    }

    /// The plural word.
    pub fn plural(self) -> &'static str {
        match self {
            Shape::Square => "squares",
            Shape::Circle => "circles",
            Shape::Triangle => "triangles",
        }
    }
}

/// A spatial relation between the centroids of two objects (image `y` grows downwards).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Relation {
    /// `left of`: the subject's centroid is left of the object's.
    LeftOf,
    /// `right of`.
    RightOf,
    /// `above`: the subject's centroid is higher in the image.
    Above,
    /// `below`.
    Below,
}

impl Relation {
    /// Every relation.
    pub const ALL: [Relation; 4] = [
        Relation::LeftOf,
        Relation::RightOf,
        Relation::Above,
        Relation::Below,
    ];

    /// The words used in prompts.
    pub fn phrase(self) -> &'static str {
        match self {
            Relation::LeftOf => "left of",
            Relation::RightOf => "right of",
            Relation::Above => "above",
            Relation::Below => "below",
        }
    }
}

/// A group of identical objects: how many, which colour (any if `None`), which shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjectSpec {
    /// How many (1 to [`MAX_OBJECTS`]).
    pub count: usize,
    /// The colour, or `None` for any colour.
    pub colour: Option<Colour>,
    /// The shape.
    pub shape: Shape,
}

impl ObjectSpec {
    /// One object.
    pub fn one(colour: Option<Colour>, shape: Shape) -> Self {
        Self {
            count: 1,
            colour,
            shape,
        }
    }

    fn phrase(&self) -> String {
        let count = match self.count {
            1 => "a",
            2 => "two",
            3 => "three",
            4 => "four",
            _ => "many",
        };
        let shape = if self.count == 1 {
            self.shape.word()
        } else {
            self.shape.plural()
        };
        match self.colour {
            Some(c) => format!("{count} {} {shape}", c.word()),
            None => format!("{count} {shape}"),
        }
    }

    /// Whether two groups can be told apart in an image: different shapes, or both coloured
    /// with different colours.
    pub fn distinguishable_from(&self, other: &ObjectSpec) -> bool {
        self.shape != other.shape
            || matches!((self.colour, other.colour), (Some(a), Some(b)) if a != b)
    }
}

/// A scene of the shapes world (validated by its constructors and by [`SceneSpec::parse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SceneSpec {
    /// One group: `"a red circle"`, `"three squares"`.
    Single(ObjectSpec),
    /// Two groups: `"a red circle and a blue square"`.
    Pair(ObjectSpec, ObjectSpec),
    /// Two single objects in a relation: `"a red circle left of a yellow triangle"`.
    Relation {
        /// The object the sentence is about.
        subject: ObjectSpec,
        /// Where the subject is relative to the object.
        relation: Relation,
        /// The reference object.
        object: ObjectSpec,
    },
}

/// The six GenEval categories, in miniature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// One object of any colour: `"a circle"`.
    SingleObject,
    /// Two objects of different shapes, any colours: `"a circle and a square"`.
    TwoObjects,
    /// Two to four objects of one shape (coloured or not): `"two blue squares"`.
    Counting,
    /// One coloured object: `"a red circle"`.
    Colours,
    /// Two coloured single objects in a relation: `"a red circle left of a yellow triangle"`.
    Position,
    /// Two coloured single objects: `"a red circle and a blue square"`.
    ColourAttribution,
}

impl Category {
    /// Every category.
    pub const ALL: [Category; 6] = [
        Category::SingleObject,
        Category::TwoObjects,
        Category::Counting,
        Category::Colours,
        Category::Position,
        Category::ColourAttribution,
    ];

    /// GenEval's tag for the category (`single_object`, `two_object`, `counting`, `colors`,
    /// `position`, `color_attr`).
    pub fn tag(self) -> &'static str {
        match self {
            Category::SingleObject => "single_object",
            Category::TwoObjects => "two_object",
            Category::Counting => "counting",
            Category::Colours => "colors",
            Category::Position => "position",
            Category::ColourAttribution => "color_attr",
        }
    }
}

impl SceneSpec {
    /// The object groups, in prompt order (the subject first in a relation).
    pub fn groups(&self) -> Vec<ObjectSpec> {
        match *self {
            SceneSpec::Single(a) => vec![a],
            SceneSpec::Pair(a, b) => vec![a, b],
            SceneSpec::Relation {
                subject, object, ..
            } => vec![subject, object],
        }
    }

    /// Total number of objects.
    pub fn object_count(&self) -> usize {
        self.groups().iter().map(|g| g.count).sum()
    }

    /// The canonical prompt (`"a"` for one, plural nouns for more).
    pub fn prompt(&self) -> String {
        match self {
            SceneSpec::Single(a) => a.phrase(),
            SceneSpec::Pair(a, b) => format!("{} and {}", a.phrase(), b.phrase()),
            SceneSpec::Relation {
                subject,
                relation,
                object,
            } => format!(
                "{} {} {}",
                subject.phrase(),
                relation.phrase(),
                object.phrase()
            ),
        }
    }

    /// The scene's GenEval category.
    pub fn category(&self) -> Category {
        match self {
            SceneSpec::Single(a) if a.count > 1 => Category::Counting,
            SceneSpec::Single(a) if a.colour.is_some() => Category::Colours,
            SceneSpec::Single(_) => Category::SingleObject,
            SceneSpec::Pair(a, b) if a.colour.is_some() || b.colour.is_some() => {
                Category::ColourAttribution
            }
            SceneSpec::Pair(a, b) if a.count > 1 || b.count > 1 => Category::Counting,
            SceneSpec::Pair(..) => Category::TwoObjects,
            SceneSpec::Relation { .. } => Category::Position,
        }
    }

    /// Checks the scene rules, listing every violation: counts in `1..=4`, at most
    /// [`MAX_OBJECTS`] objects, single objects in a relation, distinguishable groups.
    pub fn validate(&self) -> Result<(), RewardError> {
        let mut problems = Vec::new();
        let groups = self.groups();
        for (i, g) in groups.iter().enumerate() {
            if g.count == 0 || g.count > MAX_OBJECTS {
                problems.push(ConfigProblem::new(
                    format!("group {i}.count"),
                    g.count,
                    format!("1 to {MAX_OBJECTS}"),
                ));
            }
        }
        if self.object_count() > MAX_OBJECTS {
            problems.push(ConfigProblem::new(
                "objects",
                self.object_count(),
                format!("at most {MAX_OBJECTS} objects in a scene"),
            ));
        }
        if let SceneSpec::Relation {
            subject, object, ..
        } = self
            && (subject.count != 1 || object.count != 1)
        {
            problems.push(ConfigProblem::new(
                "relation",
                format!("counts {} and {}", subject.count, object.count),
                "a relation links two single objects",
            ));
        }
        if groups.len() == 2 && !groups[0].distinguishable_from(&groups[1]) {
            problems.push(ConfigProblem::new(
                "groups",
                format!("{:?} and {:?}", groups[0], groups[1]),
                "two groups of different shapes, or both coloured with different colours",
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RewardError::InvalidScene {
                scene: self.prompt(),
                problems,
            })
        }
    }

    /// Reads a prompt of the grammar (see the module documentation) back into its scene.
    /// Words are separated by whitespace and compared case-insensitively; anything else —
    /// an unknown word, a wrong number (`"a squares"`), punctuation, a missing or extra word,
    /// or a scene that breaks the rules — is an error.
    ///
    /// ```
    /// use reward::shapes::{Colour, ObjectSpec, SceneSpec, Shape};
    ///
    /// let s = SceneSpec::parse("Two blue squares").unwrap();
    /// assert_eq!(s, SceneSpec::Single(ObjectSpec { count: 2, colour: Some(Colour::Blue), shape: Shape::Square }));
    /// assert!(SceneSpec::parse("two blue square").is_err());
    /// assert!(SceneSpec::parse("a red circle.").is_err());
    /// assert!(SceneSpec::parse("a circle and a circle").is_err()); // indistinguishable
    /// ```
    pub fn parse(prompt: &str) -> Result<Self, RewardError> {
        let lower = prompt.to_lowercase();
        let words: Vec<&str> = lower.split_whitespace().collect();
        let mut p = Parser {
            prompt,
            words: &words,
            at: 0,
        };
        let first = p.group()?;
        let spec = match p.peek() {
            None => SceneSpec::Single(first),
            Some("and") => {
                p.at += 1;
                let second = p.group()?;
                SceneSpec::Pair(first, second)
            }
            Some("left") | Some("right") => {
                let relation = if p.peek() == Some("left") {
                    Relation::LeftOf
                } else {
                    Relation::RightOf
                };
                p.at += 1;
                p.expect("of", "\"of\" (after \"left\" or \"right\")")?;
                let object = p.group()?;
                SceneSpec::Relation {
                    subject: first,
                    relation,
                    object,
                }
            }
            Some("above") | Some("below") => {
                let relation = if p.peek() == Some("above") {
                    Relation::Above
                } else {
                    Relation::Below
                };
                p.at += 1;
                let object = p.group()?;
                SceneSpec::Relation {
                    subject: first,
                    relation,
                    object,
                }
            }
            Some(_) => {
                return Err(p.error(
                    "the end of the prompt, \"and\", or a relation (left of, right of, above, below)",
                ));
            }
        };
        if p.peek().is_some() {
            return Err(p.error("the end of the prompt"));
        }
        spec.validate()?;
        Ok(spec)
    }

    /// Every canonical scene of `category`, in a fixed order (for train / evaluation splits):
    /// 3 single objects, 6 ordered shape pairs, 54 counting scenes (2-4 of a shape, any or one
    /// colour), 15 coloured objects, 840 positions (ordered pairs of distinct coloured objects
    /// times 4 relations) and 210 colour attributions (ordered pairs of distinct coloured
    /// objects).
    pub fn all(category: Category) -> Vec<SceneSpec> {
        let coloured: Vec<ObjectSpec> = Colour::ALL
            .iter()
            .flat_map(|c| Shape::ALL.map(|s| ObjectSpec::one(Some(*c), s)))
            .collect();
        match category {
            Category::SingleObject => Shape::ALL
                .map(|s| SceneSpec::Single(ObjectSpec::one(None, s)))
                .to_vec(),
            Category::Colours => coloured.into_iter().map(SceneSpec::Single).collect(),
            Category::Counting => {
                let mut out = Vec::new();
                for count in 2..=MAX_OBJECTS {
                    for colour in std::iter::once(None).chain(Colour::ALL.map(Some)) {
                        for shape in Shape::ALL {
                            out.push(SceneSpec::Single(ObjectSpec {
                                count,
                                colour,
                                shape,
                            }));
                        }
                    }
                }
                out
            }
            Category::TwoObjects => {
                let mut out = Vec::new();
                for a in Shape::ALL {
                    for b in Shape::ALL {
                        if a != b {
                            out.push(SceneSpec::Pair(
                                ObjectSpec::one(None, a),
                                ObjectSpec::one(None, b),
                            ));
                        }
                    }
                }
                out
            }
            Category::ColourAttribution | Category::Position => {
                let mut out = Vec::new();
                for a in &coloured {
                    for b in &coloured {
                        if a == b {
                            continue;
                        }
                        if category == Category::ColourAttribution {
                            out.push(SceneSpec::Pair(*a, *b));
                        } else {
                            for relation in Relation::ALL {
                                out.push(SceneSpec::Relation {
                                    subject: *a,
                                    relation,
                                    object: *b,
                                });
                            }
                        }
                    }
                }
                out
            }
        }
    }

    /// A scene of `category` drawn uniformly from [`SceneSpec::all`] with `seed`
    /// (deterministic).
    pub fn sample(category: Category, seed: u64) -> SceneSpec {
        let all = Self::all(category);
        let mut rng = SplitMix64::new(seed ^ 0x5CE_E5EE_D000 ^ category as u64);
        all[rng.below_scaled(all.len())]
    }
}

impl fmt::Display for SceneSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.prompt())
    }
}

struct Parser<'a> {
    prompt: &'a str,
    words: &'a [&'a str],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.words.get(self.at).copied()
    }

    fn error(&self, expected: &'static str) -> RewardError {
        RewardError::PromptOutsideGrammar {
            prompt: self.prompt.to_string(),
            word: self.at,
            found: self.peek().map(str::to_string),
            expected,
        }
    }

    fn expect(&mut self, word: &str, what: &'static str) -> Result<(), RewardError> {
        if self.peek() == Some(word) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(what))
        }
    }

    fn group(&mut self) -> Result<ObjectSpec, RewardError> {
        let count = match self.peek() {
            Some("a") | Some("one") => 1,
            Some("two") => 2,
            Some("three") => 3,
            Some("four") => 4,
            _ => return Err(self.error("a count (a, one, two, three, four)")),
        };
        self.at += 1;
        let colour = self.peek().and_then(Colour::from_word);
        if colour.is_some() {
            self.at += 1;
        }
        let word = self.peek();
        let shape = Shape::ALL
            .into_iter()
            .find(|s| Some(if count == 1 { s.word() } else { s.plural() }) == word);
        let Some(shape) = shape else {
            return Err(self.error(if count == 1 {
                if colour.is_some() {
                    "a shape (square, circle, triangle)"
                } else {
                    "a colour (red, green, blue, yellow, purple) or a shape (square, circle, triangle)"
                }
            } else if colour.is_some() {
                "a plural shape (squares, circles, triangles)"
            } else {
                "a colour (red, green, blue, yellow, purple) or a plural shape (squares, circles, triangles)"
            }));
        };
        self.at += 1;
        Ok(ObjectSpec {
            count,
            colour,
            shape,
        })
    }
}
