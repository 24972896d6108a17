//! The procedural renderer of the shapes world: scene + seed -> image, deterministic.

use keyed_rng::SplitMix64;

use super::{BACKGROUND, Colour, IMAGE_SIZE, Relation, SceneSpec, Shape};
use crate::error::RewardError;
use crate::image::RgbImage;

/// How scenes are drawn. The defaults are the shapes world's: 32x32 pixels, anti-aliased,
/// object sides 22-34 % of the image, colours jittered by up to 12 levels per channel.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderOptions {
    /// Side of the square image in pixels (at least 16).
    pub size: usize,
    /// Anti-alias edges with 4x4 supersampling (else one sample at each pixel centre).
    pub antialias: bool,
    /// Each object's colour is its palette colour plus a uniform offset in
    /// `[-colour_jitter, colour_jitter]` per channel (clamped to `0..=255`).
    pub colour_jitter: u8,
    /// Smallest object side, as a fraction of `size`.
    pub min_object: f64,
    /// Largest object side, as a fraction of `size`.
    pub max_object: f64,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            size: IMAGE_SIZE,
            antialias: true,
            colour_jitter: 12,
            min_object: 0.22,
            max_object: 0.34,
        }
    }
}

/// One drawn object: the ground truth of a rendered scene.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedObject {
    /// Index of the scene group it belongs to ([`SceneSpec::groups`]).
    pub group: usize,
    /// Its colour (drawn at random for a group of any colour).
    pub colour: Colour,
    /// Its shape.
    pub shape: Shape,
    /// Centre of its box, in pixels (`x` right, `y` down).
    pub centre: (f64, f64),
    /// Side of its box, in pixels.
    pub side: f64,
    /// The RGB it was drawn with (palette plus jitter).
    pub rgb: [u8; 3],
}

/// A rendered scene: the image and what was drawn where.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedScene {
    /// The image.
    pub image: RgbImage,
    /// The objects, in group order.
    pub objects: Vec<PlacedObject>,
}

/// Whether the point `(px, py)` lies in a shape of side `s` centred at `(cx, cy)`.
pub(crate) fn inside(shape: Shape, cx: f64, cy: f64, s: f64, px: f64, py: f64) -> bool {
    let h = s / 2.0;
    match shape {
        Shape::Square => (px - cx).abs() <= h && (py - cy).abs() <= h,
        Shape::Circle => (px - cx).powi(2) + (py - cy).powi(2) <= h * h,
        Shape::Triangle => {
            let top = cy - h;
            py >= top && py <= cy + h && (px - cx).abs() <= (py - top) / 2.0
        }
    }
}

fn overlaps(a: (f64, f64, f64), b: (f64, f64, f64), gap: f64) -> bool {
    let reach = (a.2 + b.2) / 2.0 + gap;
    (a.0 - b.0).abs() < reach && (a.1 - b.1).abs() < reach
}

/// Draws `spec` with `seed`: the same arguments always give the same pixels.
///
/// Objects get independent sides in `[min_object, max_object] * size`; positions are drawn
/// uniformly inside the image (one pixel of margin) without overlap (two pixels of gap between
/// boxes). In a relation scene the two centroids are at least `0.3 * size` apart along the
/// relation's axis and at most `0.15 * size` apart across it. Groups of any colour get a random
/// palette colour per object.
///
/// ```
/// use reward::shapes::{render, RenderOptions, SceneSpec};
///
/// let spec = SceneSpec::parse("three purple triangles").unwrap();
/// let a = render(&spec, 1, &RenderOptions::default())?;
/// assert_eq!(a.objects.len(), 3);
/// assert_eq!(a, render(&spec, 1, &RenderOptions::default())?);
/// assert_ne!(a.image, render(&spec, 2, &RenderOptions::default())?.image);
/// # Ok::<(), reward::RewardError>(())
/// ```
///
/// # Errors
/// [`RewardError::InvalidRenderOption`], naming the field, its value and the allowed range,
/// when `options.size < 16`, or unless `0 < options.min_object <= options.max_object <= 0.45`
/// (a NaN fails that too). [`RenderOptions::default`] satisfies both.
pub fn render(
    spec: &SceneSpec,
    seed: u64,
    options: &RenderOptions,
) -> Result<RenderedScene, RewardError> {
    check_options(options)?;
    let size = options.size as f64;
    let mut rng = SplitMix64::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5A4E_5EED);
    let mut objects = Vec::new();
    for (gi, g) in spec.groups().iter().enumerate() {
        for _ in 0..g.count {
            let colour = g
                .colour
                .unwrap_or_else(|| Colour::ALL[rng.below_scaled(Colour::ALL.len())]);
            let j = options.colour_jitter as f64;
            let rgb = colour.rgb().map(|v| {
                (v as f64 + rng.range_f64(-j, j + 1e-9))
                    .round()
                    .clamp(0.0, 255.0) as u8
            });
            objects.push(PlacedObject {
                group: gi,
                colour,
                shape: g.shape,
                centre: (0.0, 0.0),
                side: 0.0,
                rgb,
            });
        }
    }
    let mut shrink = 1.0;
    let mut done = false;
    'attempts: for _ in 0..50 {
        for o in objects.iter_mut() {
            o.side =
                (rng.range_f64(options.min_object, options.max_object) * size * shrink).max(4.0);
        }
        let place = |rng: &mut SplitMix64, s: f64| {
            let lo = s / 2.0 + 1.0;
            let hi = size - s / 2.0 - 1.0;
            (rng.range_f64(lo, hi), rng.range_f64(lo, hi))
        };
        if let SceneSpec::Relation { relation, .. } = spec {
            for _ in 0..400 {
                let a = place(&mut rng, objects[0].side);
                let b = place(&mut rng, objects[1].side);
                let (along, across) = match relation {
                    Relation::LeftOf => (b.0 - a.0, b.1 - a.1),
                    Relation::RightOf => (a.0 - b.0, a.1 - b.1),
                    Relation::Above => (b.1 - a.1, b.0 - a.0),
                    Relation::Below => (a.1 - b.1, a.0 - b.0),
                };
                if along >= 0.3 * size
                    && across.abs() <= 0.15 * size
                    && !overlaps(
                        (a.0, a.1, objects[0].side),
                        (b.0, b.1, objects[1].side),
                        2.0,
                    )
                {
                    objects[0].centre = a;
                    objects[1].centre = b;
                    done = true;
                    break 'attempts;
                }
            }
        } else {
            let mut placed: Vec<(f64, f64, f64)> = Vec::new();
            for o in objects.iter_mut() {
                let mut ok = false;
                for _ in 0..400 {
                    let c = place(&mut rng, o.side);
                    if placed
                        .iter()
                        .all(|p| !overlaps(*p, (c.0, c.1, o.side), 2.0))
                    {
                        o.centre = c;
                        placed.push((c.0, c.1, o.side));
                        ok = true;
                        break;
                    }
                }
                if !ok {
                    shrink *= 0.92;
                    continue 'attempts;
                }
            }
            done = true;
            break;
        }
        shrink *= 0.92;
    }
    if !done {
        // Never reached with the default options; a fixed layout keeps the function total.
        let cells = [(0.25, 0.25), (0.75, 0.75), (0.75, 0.25), (0.25, 0.75)];
        let fixed: Vec<(f64, f64)> = match spec {
            SceneSpec::Relation { relation, .. } => match relation {
                Relation::LeftOf => vec![(0.25, 0.5), (0.75, 0.5)],
                Relation::RightOf => vec![(0.75, 0.5), (0.25, 0.5)],
                Relation::Above => vec![(0.5, 0.25), (0.5, 0.75)],
                Relation::Below => vec![(0.5, 0.75), (0.5, 0.25)],
            },
            _ => cells.to_vec(),
        };
        for (o, c) in objects.iter_mut().zip(fixed) {
            o.side = options.min_object * size;
            o.centre = (c.0 * size, c.1 * size);
        }
    }

    let samples: &[f64] = if options.antialias {
        &[0.125, 0.375, 0.625, 0.875]
    } else {
        &[0.5]
    };
    let n = (samples.len() * samples.len()) as f64;
    let mut image = RgbImage::filled(options.size, options.size, BACKGROUND);
    for y in 0..options.size {
        for x in 0..options.size {
            for o in &objects {
                let h = o.side / 2.0 + 1.0;
                if (x as f64 + 0.5 - o.centre.0).abs() > h + 1.0
                    || (y as f64 + 0.5 - o.centre.1).abs() > h + 1.0
                {
                    continue;
                }
                let mut hits = 0usize;
                for sy in samples {
                    for sx in samples {
                        if inside(
                            o.shape,
                            o.centre.0,
                            o.centre.1,
                            o.side,
                            x as f64 + sx,
                            y as f64 + sy,
                        ) {
                            hits += 1;
                        }
                    }
                }
                if hits > 0 {
                    let a = hits as f64 / n;
                    let bg = image.pixel(x, y);
                    let px: [u8; 3] = std::array::from_fn(|c| {
                        (bg[c] as f64 + (o.rgb[c] as f64 - bg[c] as f64) * a).round() as u8
                    });
                    image.set_pixel(x, y, px);
                }
            }
        }
    }
    Ok(RenderedScene { image, objects })
}

/// The largest object side [`render`] accepts, as a fraction of the image side.
const MAX_OBJECT: f64 = 0.45;

impl RenderOptions {
    /// Checks that [`render`] can draw with these options, before any scene is drawn.
    ///
    /// # Errors
    /// [`RewardError::InvalidRenderOption`], as [`render`] returns it.
    pub fn check(&self) -> Result<(), RewardError> {
        check_options(self)
    }
}

/// Refuses options [`render`] cannot draw with: `size < 16`, or not
/// `0 < min_object <= max_object <= 0.45` (a NaN included).
fn check_options(options: &RenderOptions) -> Result<(), RewardError> {
    let refuse = |field: &'static str, value: String, allowed: String| {
        Err(RewardError::InvalidRenderOption {
            field,
            value,
            allowed,
        })
    };
    if options.size < 16 {
        return refuse("size", options.size.to_string(), "at least 16".into());
    }
    let (min, max) = (options.min_object, options.max_object);
    // written so that a NaN is refused too
    if !(min > 0.0 && min <= MAX_OBJECT) {
        return refuse(
            "min_object",
            min.to_string(),
            format!("0 < min_object <= {MAX_OBJECT}"),
        );
    }
    if !(max >= min && max <= MAX_OBJECT) {
        return refuse(
            "max_object",
            max.to_string(),
            format!("min_object ({min}) <= max_object <= {MAX_OBJECT}"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(options: RenderOptions) -> (&'static str, String, String) {
        let spec = SceneSpec::parse("a red circle").unwrap();
        match render(&spec, 1, &options) {
            Err(RewardError::InvalidRenderOption {
                field,
                value,
                allowed,
            }) => (field, value, allowed),
            other => panic!("expected InvalidRenderOption, got {other:?}"),
        }
    }

    #[test]
    fn the_default_options_and_the_bounds_render() {
        let spec = SceneSpec::parse("a red circle").unwrap();
        assert!(render(&spec, 1, &RenderOptions::default()).is_ok());
        let at_the_bounds = RenderOptions {
            size: 16,
            min_object: MAX_OBJECT,
            max_object: MAX_OBJECT,
            ..RenderOptions::default()
        };
        assert!(render(&spec, 1, &at_the_bounds).is_ok());
    }

    #[test]
    fn a_size_below_16_is_refused() {
        let (field, value, allowed) = refused(RenderOptions {
            size: 15,
            ..RenderOptions::default()
        });
        assert_eq!((field, value.as_str()), ("size", "15"));
        assert_eq!(allowed, "at least 16");
        let err = render(
            &SceneSpec::parse("a red circle").unwrap(),
            1,
            &RenderOptions {
                size: 0,
                ..RenderOptions::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "render option size = 0 is outside the allowed range: at least 16"
        );
    }

    #[test]
    fn a_min_object_outside_0_to_0_45_is_refused() {
        for bad in [0.0, -0.1, 0.5, f64::NAN] {
            let (field, value, allowed) = refused(RenderOptions {
                min_object: bad,
                max_object: 0.45,
                ..RenderOptions::default()
            });
            assert_eq!((field, value), ("min_object", bad.to_string()));
            assert_eq!(allowed, "0 < min_object <= 0.45");
        }
    }

    #[test]
    fn a_max_object_below_min_object_or_above_0_45_is_refused() {
        for bad in [0.2, 0.46, 1.0, f64::NAN] {
            let (field, value, allowed) = refused(RenderOptions {
                min_object: 0.22,
                max_object: bad,
                ..RenderOptions::default()
            });
            assert_eq!((field, value), ("max_object", bad.to_string()));
            assert_eq!(allowed, "min_object (0.22) <= max_object <= 0.45");
        }
    }
}
