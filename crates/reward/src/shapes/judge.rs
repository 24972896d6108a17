//! The verifiable composition reward of the shapes world: what the image shows, judged
//! against what the prompt asks, from the pixels alone.

use std::collections::BTreeMap;

use super::render::inside;
use super::{BACKGROUND, Colour, Relation, SceneSpec, Shape};
use crate::error::{ConfigProblem, RewardError};
use crate::image::RgbImage;
use crate::scorer::{Batch, Components, Input, Scorer};

/// The main component of [`ShapesScorer`]: the judgement's total score.
pub const SHAPES_COMPONENT: &str = "shapes";

/// A pixel is explained as `BACKGROUND + alpha * (colour - BACKGROUND)`; a colour explains it
/// when the residual is at most this RGB distance (scaled down for faint coverage).
const MAX_RESIDUAL: f64 = 70.0;

/// At most this many detections (the largest) take part in the matching.
const MAX_DETECTIONS: usize = 8;

/// One object found in an image.
#[derive(Clone, Debug, PartialEq)]
pub struct Detection {
    /// The palette colour of its pixels.
    pub colour: Colour,
    /// The shape whose template fits it best.
    pub shape: Shape,
    /// Pixels in the component.
    pub area: usize,
    /// Centroid `(x, y)` in pixels (pixel centres at `i + 0.5`).
    pub centroid: (f64, f64),
    /// Bounding box `(x0, y0, x1, y1)`, inclusive.
    pub bbox: (usize, usize, usize, usize),
    /// The fit of every shape's template, in [`Shape::ALL`] order: the intersection over
    /// union of the component with that template, in `[0, 1]`.
    pub fits: [f64; 3],
}

impl Detection {
    /// The fit of the chosen shape's template (the largest of [`Detection::fits`]).
    pub fn fit(&self) -> f64 {
        self.fit_of(self.shape)
    }

    /// The fit of `shape`'s template.
    pub fn fit_of(&self, shape: Shape) -> f64 {
        self.fits[Shape::ALL
            .iter()
            .position(|s| *s == shape)
            .expect("every shape is in Shape::ALL")]
    }

    /// How far the best template's fit leads the second best's: how unambiguous the drawn
    /// shape is. Rendered scenes lead by 0.16 in the median (0.05 at the least); a soft blob
    /// that fits two templates almost equally leads by a few hundredths.
    ///
    /// ```
    /// use reward::shapes::{detect, render, RenderOptions, SceneSpec};
    /// let spec = SceneSpec::parse("a red circle").unwrap();
    /// let image = render(&spec, 1, &RenderOptions::default()).unwrap().image;
    /// let d = &detect(&image)[0];
    /// assert!(d.margin() > 0.05 && d.margin() <= d.fit(), "{d:?}");
    /// ```
    pub fn margin(&self) -> f64 {
        let mut fits = self.fits;
        fits.sort_by(|a, b| b.total_cmp(a));
        fits[0] - fits[1]
    }

    /// How far the detection is a `shape`, in `[0, 1]`, under `credit` (see [`ShapeCredit`]).
    pub fn shape_credit(&self, shape: Shape, credit: ShapeCredit) -> f64 {
        match credit {
            ShapeCredit::BestFit => (self.shape == shape) as u8 as f64,
            ShapeCredit::Graded { margin } => {
                let margin = margin.get();
                let own = self.fit_of(shape);
                let rival = Shape::ALL
                    .iter()
                    .filter(|s| **s != shape)
                    .map(|s| self.fit_of(*s))
                    .fold(f64::NEG_INFINITY, f64::max);
                (0.5 + (own - rival) / (2.0 * margin)).clamp(0.0, 1.0)
            }
        }
    }
}

/// How a detection's shape is credited against the shape a prompt asks for.
///
/// The judge fits a square, a circle and a triangle template to every object
/// ([`detect`]). A crisp drawing fits its own template best by a wide margin (0.05 at the
/// least and 0.16 typically over rendered scenes); a soft blob fits two or three of them
/// almost equally (a median margin of 0.017 over the embedded base generator's drawings), so
/// under [`ShapeCredit::BestFit`] its shape turns on a coin flip of its edges and the reward
/// is a step function of the picture; under [`ShapeCredit::Graded`] it grows as the blob
/// becomes the asked shape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum ShapeCredit {
    /// Full credit for the best-fitting template's shape, none for the others (the default).
    #[default]
    BestFit,
    /// Credit `clamp(1/2 + (fit(asked) - max fit(other)) / (2 margin), 0, 1)`: full when the
    /// asked shape's template fits better than every other by `margin`, one half at a tie,
    /// none when another fits better by `margin`. The reward then grows smoothly as a blob
    /// becomes more like the asked shape.
    Graded {
        /// The fit lead that earns full credit.
        margin: CreditMargin,
    },
}

impl ShapeCredit {
    /// [`ShapeCredit::Graded`] with a margin of 0.04, below the least lead of a rendered
    /// scene's objects, so rendered scenes keep full marks.
    pub const GRADED: ShapeCredit = ShapeCredit::Graded {
        margin: CreditMargin(0.04),
    };

    /// [`ShapeCredit::Graded`] with full credit at a fit lead of `margin`.
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] naming `margin` unless it is finite and positive.
    pub fn graded(margin: f64) -> Result<Self, RewardError> {
        Ok(ShapeCredit::Graded {
            margin: CreditMargin::new(margin)?,
        })
    }
}

/// The fit lead at which [`ShapeCredit::Graded`] gives full credit: finite and positive by
/// construction ([`CreditMargin::new`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CreditMargin(f64);

impl CreditMargin {
    /// A margin of `value`.
    ///
    /// # Errors
    /// [`RewardError::InvalidConfig`] naming `margin` unless `value` is finite and positive.
    pub fn new(value: f64) -> Result<Self, RewardError> {
        if value.is_finite() && value > 0.0 {
            Ok(Self(value))
        } else {
            Err(RewardError::InvalidConfig {
                what: "shape credit",
                problems: vec![ConfigProblem::new(
                    "margin",
                    value,
                    "a finite fit lead above 0 (0.04 by default)",
                )],
            })
        }
    }

    /// The margin.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// What a constraint checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConstraintKind {
    /// The group's objects exist with the right shape.
    Object,
    /// Those objects also have the right colour.
    Colour,
    /// The exact number of matching objects (groups of two or more only).
    Count,
    /// The spatial relation between subject and object.
    Relation,
    /// Nothing else is drawn: the share of detections the prompt accounts for.
    Exclusive,
}

impl ConstraintKind {
    /// The component name of the kind's mean in [`ShapesScorer`]'s output.
    pub fn component(self) -> &'static str {
        match self {
            ConstraintKind::Object => "shapes_object",
            ConstraintKind::Colour => "shapes_colour",
            ConstraintKind::Count => "shapes_count",
            ConstraintKind::Relation => "shapes_relation",
            ConstraintKind::Exclusive => "shapes_exclusive",
        }
    }
}

/// One constraint of a prompt and its score.
#[derive(Clone, Debug, PartialEq)]
pub struct ConstraintResult {
    /// What is checked.
    pub kind: ConstraintKind,
    /// Index of the scene group it is about (the subject's for a relation).
    pub group: usize,
    /// Human-readable statement (`"two squares"`, `"blue"`, `"exactly two blue squares"`).
    pub description: String,
    /// Partial credit in `[0, 1]`.
    pub score: f64,
}

/// The judgement of one image against one scene.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// The reward in `[0, 1]`: the mean score of the asked constraints times `Exclusive`.
    pub score: f64,
    /// Every constraint, in prompt order.
    pub constraints: Vec<ConstraintResult>,
    /// Every object found (largest first).
    pub detections: Vec<Detection>,
}

impl Judgement {
    /// The mean score of the constraints of `kind`, if the scene has any.
    pub fn mean_of(&self, kind: ConstraintKind) -> Option<f64> {
        let v: Vec<f64> = self
            .constraints
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.score)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// Per pixel: the label (0 background, `1 + palette index`) and, per palette colour, the
/// pixel's coverage `alpha` by that colour (0 where the colour does not explain the pixel).
struct Pixels {
    labels: Vec<u8>,
    alpha: Vec<[f64; 5]>,
}

/// Explains every pixel as `BACKGROUND + alpha * (c - BACKGROUND)` (see [`detect`]).
fn classify(image: &RgbImage) -> Pixels {
    let (w, h) = (image.width(), image.height());
    let bg = BACKGROUND.map(f64::from);
    let dirs: Vec<([f64; 3], f64)> = Colour::ALL
        .iter()
        .map(|c| {
            let v: [f64; 3] = std::array::from_fn(|i| c.rgb()[i] as f64 - bg[i]);
            (v, v.iter().map(|x| x * x).sum())
        })
        .collect();
    let mut labels = vec![0u8; w * h];
    let mut alpha = vec![[0.0; 5]; w * h];
    for y in 0..h {
        for x in 0..w {
            let p = image.pixel(x, y);
            let d: [f64; 3] = std::array::from_fn(|i| p[i] as f64 - bg[i]);
            let mut best = (f64::INFINITY, 0u8);
            for (k, (v, norm2)) in dirs.iter().enumerate() {
                let a = (d[0] * v[0] + d[1] * v[1] + d[2] * v[2]) / norm2;
                if a <= 0.0 {
                    continue;
                }
                let res: f64 = (0..3)
                    .map(|i| (d[i] - a * v[i]).powi(2))
                    .sum::<f64>()
                    .sqrt();
                // a faint edge pixel is judged against the residual its coverage allows
                if res <= MAX_RESIDUAL * a.clamp(0.5, 1.0) {
                    alpha[y * w + x][k] = a.min(1.0);
                    if a >= 0.5 && res < best.0 {
                        best = (res, k as u8 + 1);
                    }
                }
            }
            labels[y * w + x] = best.1;
        }
    }
    Pixels { labels, alpha }
}

/// Components smaller than this fraction of the image (and than 4 pixels) are noise.
const MIN_AREA_FRACTION: f64 = 0.008;

/// A component whose best template fit is below this is not an object (a noise blob, a
/// smear).
const MIN_FIT: f64 = 0.5;

/// Stray paint up to this share of the painted pixels is free in the `Exclusive` constraint
/// (an object's noisy or blurred edge leaves a few pixels of another colour).
const CLEAN_TOLERANCE: f64 = 0.95;

/// Finds the objects of an image.
///
/// 1. Every pixel is explained as a blend `BACKGROUND + alpha * (c - BACKGROUND)` of the
///    background and a palette colour `c` (least squares in RGB). Colour `c` *covers* the
///    pixel by `min(alpha, 1)` if the residual is at most `70 * clamp(alpha, 0.5, 1)`
///    (noise and off-palette tints are tolerated, other colours are not); the pixel *takes*
///    the covering colour of smallest residual with `alpha >= 0.5` (the anti-aliased or
///    blurred edge is split where the shape's edge is), else it is background.
/// 2. 4-connected components of one colour are candidate objects; holes inside a component
///    count as covered (noise inside an object). Components of fewer than
///    `max(4, 0.8 % of the image)` pixels are dropped.
/// 3. Each component's *coverage map* is its colour's coverage over the component and the
///    pixels around it (one pixel out). From the map's total `A` and centroid, a template of
///    each shape is fitted — a square of side `sqrt(A)`, a circle of area `A`, an up-pointing
///    triangle of side `sqrt(2 A)` with its centroid (two thirds down from the apex) on the
///    map's — and drawn with 4x4 supersampling, as is and blurred by a 3x3 binomial kernel
///    (generated images are soft); the fit is the larger soft intersection over union
///    `sum min(map, template) / sum max(map, template)` of the two. The best template names
///    the shape; a component whose best fit is below 0.5 is dropped.
///
/// Detections are returned largest first.
pub fn detect(image: &RgbImage) -> Vec<Detection> {
    detect_with_paint(image).0
}

/// How much of an image is painted, and how much of that the detected objects account for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paint {
    /// Pixels that take a palette colour (step 1 of [`detect`]).
    pub painted: usize,
    /// Of those, the pixels of the detected objects' components (holes not counted).
    pub in_objects: usize,
}

impl Paint {
    /// `in_objects / painted`: 1 for an image of clean objects, lower for stray paint
    /// (specks, fragments, smears that fit no shape); 0 for an empty image.
    pub fn clean_fraction(&self) -> f64 {
        if self.painted == 0 {
            0.0
        } else {
            self.in_objects as f64 / self.painted as f64
        }
    }
}

/// [`detect`], and the [`Paint`] of the image.
pub fn detect_with_paint(image: &RgbImage) -> (Vec<Detection>, Paint) {
    let (w, h) = (image.width(), image.height());
    let px = classify(image);
    let labels = &px.labels;
    let min_area = ((w * h) as f64 * MIN_AREA_FRACTION).round().max(4.0) as usize;
    let mut seen = vec![false; w * h];
    let mut out = Vec::new();
    let mut stack = Vec::new();
    let mut in_objects = 0usize;
    for start in 0..w * h {
        if seen[start] || labels[start] == 0 {
            continue;
        }
        let label = labels[start];
        let mut pixels = Vec::new();
        seen[start] = true;
        stack.push(start);
        while let Some(i) = stack.pop() {
            pixels.push(i);
            let (x, y) = (i % w, i / w);
            let mut visit = |j: usize| {
                if !seen[j] && labels[j] == label {
                    seen[j] = true;
                    stack.push(j);
                }
            };
            if x > 0 {
                visit(i - 1);
            }
            if x + 1 < w {
                visit(i + 1);
            }
            if y > 0 {
                visit(i - w);
            }
            if y + 1 < h {
                visit(i + w);
            }
        }
        if pixels.len() < min_area {
            continue;
        }
        let d = describe(&pixels, &px, w, h, label as usize - 1);
        if d.fit() >= MIN_FIT {
            in_objects += pixels.len();
            out.push(d);
        }
    }
    out.sort_by(|a, b| b.area.cmp(&a.area).then(a.bbox.cmp(&b.bbox)));
    let painted = labels.iter().filter(|&&l| l != 0).count();
    (
        out,
        Paint {
            painted,
            in_objects,
        },
    )
}

/// A 3x3 binomial blur (`[1 2 1] x [1 2 1] / 16`, zero outside).
fn binomial_blur(v: &[f64], w: usize, h: usize) -> Vec<f64> {
    let mut out = vec![0.0; w * h];
    for y in 0..h {
        for x in 0..w {
            let mut acc = 0.0;
            for dy in -1i64..=1 {
                for dx in -1i64..=1 {
                    let (nx, ny) = (x as i64 + dx, y as i64 + dy);
                    if nx >= 0 && ny >= 0 && (nx as usize) < w && (ny as usize) < h {
                        let k = (2 - dx.abs()) * (2 - dy.abs());
                        acc += k as f64 * v[ny as usize * w + nx as usize];
                    }
                }
            }
            out[y * w + x] = acc / 16.0;
        }
    }
    out
}

/// Pixels inside the component that are not reachable from its box border through
/// non-component pixels (holes).
fn holes(pixels: &[usize], w: usize, bbox: (usize, usize, usize, usize)) -> Vec<usize> {
    let (x0, y0, x1, y1) = bbox;
    let (bw, bh) = (x1 - x0 + 1, y1 - y0 + 1);
    let mut mask = vec![false; bw * bh];
    for &i in pixels {
        mask[(i / w - y0) * bw + (i % w - x0)] = true;
    }
    let mut outside = vec![false; bw * bh];
    let mut stack: Vec<usize> = (0..bw * bh)
        .filter(|&i| {
            let (x, y) = (i % bw, i / bw);
            (x == 0 || y == 0 || x + 1 == bw || y + 1 == bh) && !mask[i]
        })
        .collect();
    for &i in &stack {
        outside[i] = true;
    }
    while let Some(i) = stack.pop() {
        let (x, y) = (i % bw, i / bw);
        let mut next = Vec::with_capacity(4);
        if x > 0 {
            next.push(i - 1);
        }
        if x + 1 < bw {
            next.push(i + 1);
        }
        if y > 0 {
            next.push(i - bw);
        }
        if y + 1 < bh {
            next.push(i + bw);
        }
        for j in next {
            if !mask[j] && !outside[j] {
                outside[j] = true;
                stack.push(j);
            }
        }
    }
    (0..bw * bh)
        .filter(|&i| !mask[i] && !outside[i])
        .map(|i| (y0 + i / bw) * w + x0 + i % bw)
        .collect()
}

fn describe(pixels: &[usize], px: &Pixels, w: usize, h: usize, k: usize) -> Detection {
    let (mut x0, mut y0, mut x1, mut y1) = (usize::MAX, usize::MAX, 0, 0);
    for &i in pixels {
        let (x, y) = (i % w, i / w);
        x0 = x0.min(x);
        y0 = y0.min(y);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    let bbox = (x0, y0, x1, y1);
    // the coverage map: the component (holes filled) at full coverage where it is mostly
    // covered, and the ring of background pixels around it at their partial coverage
    // ordered, so that the sums below (area, centroid) add in one order on every run
    let mut map: BTreeMap<usize, f64> = BTreeMap::new();
    for &i in pixels {
        map.insert(i, px.alpha[i][k].max(0.5));
    }
    let hole = holes(pixels, w, bbox);
    for &i in &hole {
        map.insert(i, 1.0);
    }
    for &i in pixels {
        let (x, y) = ((i % w) as i64, (i / w) as i64);
        for dy in -1..=1 {
            for dx in -1..=1 {
                let (nx, ny) = (x + dx, y + dy);
                if nx < 0 || ny < 0 || nx >= w as i64 || ny >= h as i64 {
                    continue;
                }
                let j = ny as usize * w + nx as usize;
                if px.labels[j] == 0 && !map.contains_key(&j) {
                    map.insert(j, px.alpha[j][k]);
                }
            }
        }
    }
    let (mut a, mut sx, mut sy) = (0.0, 0.0, 0.0);
    for (&i, &m) in &map {
        a += m;
        sx += m * ((i % w) as f64 + 0.5);
        sy += m * ((i / w) as f64 + 0.5);
    }
    let (cx, cy) = (sx / a, sy / a);
    const SUB: [f64; 4] = [0.125, 0.375, 0.625, 0.875];
    let mut best = (Shape::Square, -1.0);
    let mut fits = [0.0; 3];
    for (si, shape) in Shape::ALL.into_iter().enumerate() {
        let (side, tcy) = match shape {
            Shape::Square => (a.sqrt(), cy),
            Shape::Circle => (2.0 * (a / std::f64::consts::PI).sqrt(), cy),
            Shape::Triangle => {
                let s = (2.0 * a).sqrt();
                (s, cy + s / 6.0 - s / 3.0)
            }
        };
        // the template on a window one pixel wider than it, sharp and blurred
        let r = side / 2.0 + 2.0;
        let tx0 = (cx - r).floor().max(0.0) as usize;
        let ty0 = (tcy - r).floor().max(0.0) as usize;
        let tx1 = ((cx + r).ceil() as usize).min(w - 1);
        let ty1 = ((tcy + r).ceil() as usize).min(h - 1);
        let (tw, th) = (tx1 - tx0 + 1, ty1 - ty0 + 1);
        let mut sharp = vec![0.0; tw * th];
        for y in 0..th {
            for x in 0..tw {
                let mut hits = 0;
                for sy in SUB {
                    for sx in SUB {
                        hits += inside(
                            shape,
                            cx,
                            tcy,
                            side,
                            (tx0 + x) as f64 + sx,
                            (ty0 + y) as f64 + sy,
                        ) as u32;
                    }
                }
                sharp[y * tw + x] = hits as f64 / 16.0;
            }
        }
        let blurred = binomial_blur(&sharp, tw, th);
        let mut iou: f64 = 0.0;
        for t in [&sharp, &blurred] {
            let (mut inter, mut union, mut covered) = (0.0, 0.0, 0.0);
            for y in 0..th {
                for x in 0..tw {
                    let tv = t[y * tw + x];
                    let m = map.get(&((ty0 + y) * w + tx0 + x)).copied().unwrap_or(0.0);
                    covered += m;
                    inter += tv.min(m);
                    union += tv.max(m);
                }
            }
            // map mass outside the template's window is all union
            union += a - covered;
            iou = iou.max(inter / union.max(1e-9));
        }
        fits[si] = iou;
        if iou > best.1 {
            best = (shape, iou);
        }
    }
    Detection {
        colour: Colour::ALL[k],
        shape: best.0,
        area: pixels.len() + hole.len(),
        centroid: (cx, cy),
        bbox,
        fits,
    }
}

/// A slot: one requested object.
struct Slot {
    group: usize,
    shape: Shape,
    colour: Option<Colour>,
}

fn relation_holds(relation: Relation, s: (f64, f64), o: (f64, f64), margin: (f64, f64)) -> bool {
    match relation {
        Relation::LeftOf => o.0 - s.0 > margin.0,
        Relation::RightOf => s.0 - o.0 > margin.0,
        Relation::Above => o.1 - s.1 > margin.1,
        Relation::Below => s.1 - o.1 > margin.1,
    }
}

/// Judges `image` against `spec`, with the default shape credit ([`ShapeCredit::BestFit`]).
///
/// **Objects.** [`detect`] finds the objects. A detection `d` is a shape `s` by its *shape
/// credit* `c(d, s)` in `[0, 1]` ([`Detection::shape_credit`]): how far `s`'s template fits
/// better than the other shapes'. Each requested object (a *slot*; a group of `n` gives `n`
/// slots) is matched to a distinct detection, or to none, maximising `sum over matched slots
/// of c(d, s) * (2 + (1 if the colour is right, or the slot has no colour))` — a slot only
/// matches a detection with some credit for its shape; in a relation scene ties are broken in
/// favour of a matching that satisfies the relation.
///
/// **Constraints**, each scored in `[0, 1]`, for every group `g` of `n` objects in prompt
/// order:
///
/// * `Object`: (sum of the shape credits of `g`'s matched slots) / `n`;
/// * `Colour` (only if `g` names a colour): the same sum over the slots matched to a detection
///   of that colour, / `n` — colour counts only on an object of the right shape;
/// * `Count` (only if `n >= 2`): with `k` the sum of the shape credits for `g`'s shape of the
///   detections (of `g`'s colour, if named), `max(0, 1 - |k - n| / n)`;
///
/// and for every prompt:
///
/// * `Exclusive`: nothing else is drawn — (matched slots) / (detections), times
///   `min(1, c / 0.95)` with `c` the share of the painted pixels that belong to detected
///   objects ([`Paint::clean_fraction`]; 5 % of stray paint is free); 0 for an empty image. Without the first factor a policy satisfies `"a red circle"` by drawing every
///   shape in every colour, without the second by scattering paint that forms no object
///   (specks, fragments, smears that fit no template), which the detector ignores — both
///   reward hacks RL found within a few dozen updates;
///
/// and for a relation scene one more:
///
/// * `Relation`: 1 if both objects are matched and the subject's centroid is beyond the
///   object's along the relation's axis by more than 10 % of the image side (left of:
///   `x_object - x_subject > 0.1 W`; above: `y_object - y_subject > 0.1 H`; image `y` grows
///   down), else 0.
///
/// **Score** = the mean of the other constraints' scores (what was asked) **times**
/// `Exclusive` (that nothing else was drawn): 1 when everything asked is there and nothing
/// else, partial credit per constraint otherwise (e.g. `"two blue squares"` drawn as two red
/// squares scores `(1 + 0 + 0) / 3 * 1`), 0 for an empty image.
///
/// `Exclusive` multiplies rather than averages because, as one constraint among three or four,
/// it was cheap to give up: RL against the averaged score learned to paint a third to a half
/// of the canvas in blocky blobs, four to eight detections, so that one of them fits every
/// requested shape and colour — `Object` and `Colour` at 1 and `Exclusive` near 0.15 kept
/// about 0.7 for `"a red triangle"`, where a clean image of the wrong shape scores 0. Held-out
/// means rose from 0.24 to 0.52 on pictures that had stopped showing shapes. As a factor,
/// extra objects and stray paint cost their share of everything asked.
///
/// With [`ShapeCredit::BestFit`] a detection's shape credit is 1 for its best-fitting template's
/// shape and 0 for the others, so the sums above count objects; [`judge_with`] takes
/// [`ShapeCredit::Graded`], partial credit for ambiguous shapes.
pub fn judge(spec: &SceneSpec, image: &RgbImage) -> Judgement {
    judge_with(spec, image, ShapeCredit::BestFit)
}

/// [`judge`] with the shape credit `credit` (see [`ShapeCredit`]).
pub fn judge_with(spec: &SceneSpec, image: &RgbImage, credit: ShapeCredit) -> Judgement {
    let (detections, paint) = detect_with_paint(image);
    let groups = spec.groups();
    let slots: Vec<Slot> = groups
        .iter()
        .enumerate()
        .flat_map(|(gi, g)| {
            (0..g.count).map(move |_| Slot {
                group: gi,
                shape: g.shape,
                colour: g.colour,
            })
        })
        .collect();
    let margin = (0.1 * image.width() as f64, 0.1 * image.height() as f64);
    let candidates = &detections[..detections.len().min(MAX_DETECTIONS)];
    let relation = match spec {
        SceneSpec::Relation { relation, .. } => Some(*relation),
        _ => None,
    };
    // shape credit of every (slot, candidate) pair
    let shape: Vec<Vec<f64>> = slots
        .iter()
        .map(|s| {
            candidates
                .iter()
                .map(|d| d.shape_credit(s.shape, credit))
                .collect()
        })
        .collect();

    // Exhaustive search over matchings (at most 4 slots, 8 candidates): the most
    // `sum (2 + [colour right]) * shape credit`, ties broken by the relation.
    let pair = |k: usize, d: usize| -> f64 {
        let colour_right = slots[k].colour.is_none_or(|c| c == candidates[d].colour);
        (2.0 + colour_right as u8 as f64) * shape[k][d]
    };
    let relation_ok = |m: &[Option<usize>]| -> bool {
        match (
            relation,
            m.first().copied().flatten(),
            m.get(1).copied().flatten(),
        ) {
            (Some(r), Some(a), Some(b)) => {
                relation_holds(r, candidates[a].centroid, candidates[b].centroid, margin)
            }
            _ => false,
        }
    };
    struct Search<'a> {
        options: usize,
        pair: &'a dyn Fn(usize, usize) -> f64,
        relation: &'a dyn Fn(&[Option<usize>]) -> bool,
        current: Vec<Option<usize>>,
        used: Vec<bool>,
        best: ((f64, bool), Vec<Option<usize>>),
    }
    impl Search<'_> {
        fn run(&mut self, k: usize, score: f64) {
            if k == self.current.len() {
                let key = (score, (self.relation)(&self.current));
                // lexicographic: the score first (up to rounding), then the relation
                let better = if (key.0 - self.best.0.0).abs() > 1e-9 {
                    key.0 > self.best.0.0
                } else {
                    key.1 && !self.best.0.1
                };
                if better {
                    self.best = (key, self.current.clone());
                }
                return;
            }
            self.current[k] = None;
            self.run(k + 1, score);
            for d in 0..self.options {
                let p = (self.pair)(k, d);
                if self.used[d] || p <= 0.0 {
                    continue;
                }
                self.used[d] = true;
                self.current[k] = Some(d);
                self.run(k + 1, score + p);
                self.used[d] = false;
                self.current[k] = None;
            }
        }
    }
    let mut search = Search {
        options: candidates.len(),
        pair: &pair,
        relation: &relation_ok,
        current: vec![None; slots.len()],
        used: vec![false; candidates.len()],
        best: ((0.0, false), vec![None; slots.len()]),
    };
    search.run(0, 0.0);
    let matching = search.best.1;

    let mut constraints = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        // (slot index, matched candidate) of the group's slots
        let mine: Vec<(usize, usize)> = matching
            .iter()
            .enumerate()
            .filter(|(k, _)| slots[*k].group == gi)
            .filter_map(|(k, m)| m.map(|d| (k, d)))
            .collect();
        let n = g.count as f64;
        let noun = if g.count == 1 {
            g.shape.word()
        } else {
            g.shape.plural()
        };
        let matched = mine.iter().fold(0.0, |a, &(k, d)| a + shape[k][d]);
        constraints.push(ConstraintResult {
            kind: ConstraintKind::Object,
            group: gi,
            description: format!("{} {noun}", count_word(g.count)),
            score: matched / n,
        });
        if let Some(c) = g.colour {
            let right = mine
                .iter()
                .filter(|&&(_, d)| candidates[d].colour == c)
                .fold(0.0, |a, &(k, d)| a + shape[k][d]);
            constraints.push(ConstraintResult {
                kind: ConstraintKind::Colour,
                group: gi,
                description: format!("{} {noun} {}", count_word(g.count), c.word()),
                score: right / n,
            });
        }
        if g.count >= 2 {
            let k = detections
                .iter()
                .filter(|d| g.colour.is_none_or(|c| c == d.colour))
                .fold(0.0, |a, d| a + d.shape_credit(g.shape, credit));
            constraints.push(ConstraintResult {
                kind: ConstraintKind::Count,
                group: gi,
                description: format!(
                    "exactly {} {}{noun} (found {k:.2})",
                    count_word(g.count),
                    g.colour
                        .map(|c| format!("{} ", c.word()))
                        .unwrap_or_default()
                ),
                score: (1.0 - (k - n).abs() / n).max(0.0),
            });
        }
    }
    let matched_total = matching.iter().filter(|m| m.is_some()).count() as f64;
    let exclusive = if detections.is_empty() {
        0.0
    } else {
        (matched_total / detections.len() as f64).min(1.0)
            * (paint.clean_fraction() / CLEAN_TOLERANCE).min(1.0)
    };
    constraints.push(ConstraintResult {
        kind: ConstraintKind::Exclusive,
        group: 0,
        description: format!(
            "nothing else drawn ({} detections, {:.0} % of the paint in objects)",
            detections.len(),
            100.0 * paint.clean_fraction()
        ),
        score: exclusive,
    });
    if let Some(r) = relation {
        constraints.push(ConstraintResult {
            kind: ConstraintKind::Relation,
            group: 0,
            description: format!("subject {} object", r.phrase()),
            score: relation_ok(&matching) as u8 as f64,
        });
    }
    // every group has an `Object` constraint, so what was asked is never empty
    let asked: Vec<f64> = constraints
        .iter()
        .filter(|c| c.kind != ConstraintKind::Exclusive)
        .map(|c| c.score)
        .collect();
    let score = asked.iter().fold(0.0, |a, s| a + s) / asked.len() as f64 * exclusive;
    Judgement {
        score,
        constraints,
        detections,
    }
}

fn count_word(n: usize) -> &'static str {
    match n {
        1 => "one",
        2 => "two",
        3 => "three",
        4 => "four",
        _ => "some",
    }
}

/// The shapes world's composition reward as a [`Scorer`]: reads images and prompts, parses
/// each prompt ([`SceneSpec::parse`]; a prompt outside the grammar fails the batch with
/// [`RewardError::PromptOutsideGrammar`]) and [`judge`]s the image.
///
/// Components per sample: [`SHAPES_COMPONENT`] (`"shapes"`, the judgement's score) and the
/// mean score of each constraint kind the prompt has (`"shapes_object"`, `"shapes_colour"`,
/// `"shapes_count"`, `"shapes_relation"`, `"shapes_exclusive"`; see
/// [`ConstraintKind::component`]).
///
/// ```
/// use reward::shapes::{render, RenderOptions, SceneSpec, ShapesScorer};
/// use reward::{Batch, Scorer};
///
/// let prompts = vec!["two blue squares".to_string()];
/// let spec = SceneSpec::parse(&prompts[0]).unwrap();
/// let images = vec![render(&spec, 3, &RenderOptions::default()).unwrap().image];
/// let out = ShapesScorer::default()
///     .score(Batch::images_and_prompts(&images, &prompts).unwrap())
///     .unwrap();
/// assert_eq!(out[0].get("shapes"), Some(1.0));
/// assert_eq!(out[0].get("shapes_count"), Some(1.0));
/// assert_eq!(out[0].get("shapes_relation"), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShapesScorer {
    /// How a detection's shape is credited ([`ShapeCredit::BestFit`] by default).
    pub credit: ShapeCredit,
}

impl ShapesScorer {
    /// The judge with shape credit `credit`.
    pub fn with_credit(credit: ShapeCredit) -> Self {
        Self { credit }
    }
}

impl Scorer for ShapesScorer {
    fn name(&self) -> String {
        "shapes".into()
    }

    fn required_inputs(&self) -> &[Input] {
        &[Input::Image, Input::Prompt]
    }

    fn components(&self) -> Vec<String> {
        vec![SHAPES_COMPONENT.to_string()]
    }

    fn chunk_size(&self) -> usize {
        256
    }

    fn score_chunk(&self, batch: Batch<'_>) -> Result<Vec<Components>, RewardError> {
        let images = batch.images().expect("checked by score");
        let prompts = batch.prompts().expect("checked by score");
        let specs = prompts
            .iter()
            .map(|p| SceneSpec::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(images
            .iter()
            .zip(&specs)
            .map(|(im, spec)| {
                let j = judge_with(spec, im, self.credit);
                let mut c = Components::new().with(SHAPES_COMPONENT, j.score);
                let kinds: BTreeMap<ConstraintKind, ()> =
                    j.constraints.iter().map(|c| (c.kind, ())).collect();
                for kind in kinds.keys() {
                    c.insert(kind.component(), j.mean_of(*kind).expect("kind present"));
                }
                c
            })
            .collect())
    }
}
