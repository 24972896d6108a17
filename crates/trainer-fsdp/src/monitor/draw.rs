//! A tiny rasteriser for the run directory's pictures: line plots (the reward curve) and sample
//! grids, captioned with the 8x8 bitmap font of `font8x8`, saved as PNG through `image`.

use std::path::Path;

use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder, RgbImage};

use crate::error::{DrawingProblem, TrainerError};

/// An RGB colour.
pub type Rgb = [u8; 3];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [225, 225, 225];
const GLYPH: u32 = 8;
const LINE: u32 = 10;
/// Colours of successive series without their own (sixteen, so that a comparison of every
/// method and its variants draws each in its own).
const PALETTE: [Rgb; 16] = [
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [255, 127, 14],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
    [57, 59, 121],
    [99, 121, 57],
    [140, 109, 49],
    [132, 60, 57],
    [123, 65, 115],
    [0, 128, 128],
];

/// One named line of a plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// `(x, y)` points in drawing order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
    /// The colour; `None` takes the next palette colour.
    pub color: Option<Rgb>,
    /// A `±` bar per point (a standard error, say): empty, or one per point; a non-finite
    /// one draws no bar.
    pub errors: Vec<f64>,
}

impl Series {
    /// A series with the palette's colour.
    pub fn new(name: &str, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
            color: None,
            errors: Vec::new(),
        }
    }

    /// The series with a `±` bar at each point.
    pub fn with_errors(mut self, errors: Vec<f64>) -> Self {
        self.errors = errors;
        self
    }

    /// `(x, y, ±)` of every finite point (`±` 0 where there is no finite bar).
    fn finite(&self) -> impl Iterator<Item = (f64, f64, f64)> + '_ {
        self.points.iter().enumerate().filter_map(|(i, &(x, y))| {
            let e = self
                .errors
                .get(i)
                .copied()
                .filter(|e| e.is_finite())
                .unwrap_or(0.0);
            (x.is_finite() && y.is_finite()).then_some((x, y, e.abs()))
        })
    }
}

/// A plot's title and axis titles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axes<'a> {
    /// Above the plot.
    pub title: &'a str,
    /// Under the x axis.
    pub x_label: &'a str,
    /// Beside the y axis (drawn upwards).
    pub y_label: &'a str,
    /// Ticks of the x axis at integers only (steps, rollouts).
    pub integer_x: bool,
}

impl<'a> Axes<'a> {
    /// A title with unnamed axes.
    pub fn titled(title: &'a str) -> Self {
        Self {
            title,
            x_label: "",
            y_label: "",
            integer_x: false,
        }
    }
}

fn put(img: &mut RgbImage, x: i64, y: i64, c: Rgb) {
    if x >= 0 && y >= 0 && (x as u32) < img.width() && (y as u32) < img.height() {
        img.put_pixel(x as u32, y as u32, image::Rgb(c));
    }
}

fn fill(img: &mut RgbImage, x0: i64, y0: i64, w: i64, h: i64, c: Rgb) {
    for y in y0..y0 + h {
        for x in x0..x0 + w {
            put(img, x, y, c);
        }
    }
}

/// Bresenham, `thick` pixels wide (a square brush).
fn line(img: &mut RgbImage, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: Rgb, thick: i64) {
    let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
    let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
    let (mut x, mut y, mut err) = (x0, y0, dx + dy);
    let lo = -(thick - 1) / 2;
    loop {
        fill(img, x + lo, y + lo, thick, thick, c);
        if x == x1 && y == y1 {
            break;
        }
        let e2 = 2 * err;
        if e2 >= dy {
            err += dy;
            x += sx;
        }
        if e2 <= dx {
            err += dx;
            y += sy;
        }
    }
}

/// The set pixels `(column, row)` of a character's 8x8 glyph; characters outside ASCII are
/// drawn as `?`.
fn glyph_dots(ch: char) -> impl Iterator<Item = (i64, i64)> {
    let code = if ch.is_ascii() {
        ch as usize
    } else {
        b'?' as usize
    };
    let glyph = font8x8::legacy::BASIC_LEGACY[code];
    (0..8).flat_map(move |row| {
        (0..8)
            .filter(move |col| glyph[row] & (1 << col) != 0)
            .map(move |col| (col as i64, row as i64))
    })
}

/// Draws `text` with its top-left corner at `(x, y)`; characters outside ASCII print as `?`.
fn text(img: &mut RgbImage, x: i64, y: i64, s: &str, c: Rgb) {
    for (i, ch) in s.chars().enumerate() {
        for (col, row) in glyph_dots(ch) {
            put(img, x + (i as i64) * GLYPH as i64 + col, y + row, c);
        }
    }
}

/// Draws `text` upwards (rotated a quarter turn anticlockwise), its baseline on the left,
/// starting at the bottom `(x, y)`.
fn text_up(img: &mut RgbImage, x: i64, y: i64, s: &str, c: Rgb) {
    for (i, ch) in s.chars().enumerate() {
        for (col, row) in glyph_dots(ch) {
            put(img, x + row, y - (i as i64) * GLYPH as i64 - col, c);
        }
    }
}

/// Tick positions over `[lo, hi]`: multiples of a step of 1, 2 or 5 times a power of ten,
/// about `target` of them; with `integer`, steps of at least 1. Returns the ticks and the
/// decimals their labels need.
fn nice_ticks(lo: f64, hi: f64, target: usize, integer: bool) -> (Vec<f64>, usize) {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    if integer {
        step = step.max(1.0).round();
    }
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    let ticks = (first..=last).map(|k| k as f64 * step).collect();
    (ticks, decimals)
}

/// The mapping from data to pixels of a plot.
#[derive(Debug, Clone, Copy)]
struct Frame {
    left: f64,
    top: f64,
    w: f64,
    h: f64,
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn pixel(&self, x: f64, y: f64) -> (i64, i64) {
        let px = self.left + (x - self.x0) / (self.x1 - self.x0) * (self.w - 1.0);
        let py = self.top + (1.0 - (y - self.y0) / (self.y1 - self.y0)) * (self.h - 1.0);
        (px.round() as i64, py.round() as i64)
    }
}

fn padded(lo: f64, hi: f64, pad: f64) -> (f64, f64) {
    if hi > lo {
        let p = (hi - lo) * pad;
        (lo - p, hi + p)
    } else {
        let p = if lo == 0.0 { 0.5 } else { lo.abs() * 0.1 };
        (lo - p, hi + p)
    }
}

fn frame(series: &[Series], width: u32, height: u32) -> Result<Frame, TrainerError> {
    let bad = |problem| TrainerError::Drawing {
        what: "a plot",
        problem,
    };
    if series.is_empty() {
        return Err(bad(DrawingProblem::Empty));
    }
    if width < 160 || height < 100 {
        return Err(bad(DrawingProblem::Geometry {
            what: "the canvas must be at least 160x100 pixels",
        }));
    }
    let (mut xl, mut xh, mut yl, mut yh) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for s in series {
        let mut any = false;
        for (x, y, e) in s.finite() {
            any = true;
            xl = xl.min(x);
            xh = xh.max(x);
            yl = yl.min(y - e);
            yh = yh.max(y + e);
        }
        if !any {
            return Err(bad(DrawingProblem::NoFinitePoint {
                series: s.name.clone(),
            }));
        }
    }
    let (x0, x1) = if xh > xl {
        (xl, xh)
    } else {
        padded(xl, xh, 0.0)
    };
    let (y0, y1) = padded(yl, yh, 0.05);
    let (left, top, right, bottom) = (
        8.0 + LINE as f64 + 7.0 * GLYPH as f64,
        2.0 * LINE as f64,
        12.0,
        3.0 * LINE as f64,
    );
    Ok(Frame {
        left,
        top,
        w: width as f64 - left - right,
        h: height as f64 - top - bottom,
        x0,
        x1,
        y0,
        y1,
    })
}

/// Draws the series as lines (with a dot at every point, and its `±` bar where it has one)
/// on a white canvas of `width x height`: the title above, a light grid at round tick values
/// (integers on the x axis with [`Axes::integer_x`]), the axis titles, and a legend. The
/// y-range is the data's (bars included), padded by 5%.
///
/// # Errors
/// [`TrainerError::Drawing`]: no series, a series with no finite point, a canvas smaller than
/// 160x100.
///
/// ```
/// use trainer_fsdp::{Axes, Series, plot_curves};
/// let img = plot_curves(
///     &[Series::new("eval/reward", vec![(0.0, 0.51), (1.0, 0.62), (2.0, 0.80)])
///         .with_errors(vec![0.01, 0.01, 0.02])],
///     &Axes { title: "held-out reward", x_label: "rollout", y_label: "reward", integer_x: true },
///     480,
///     320,
/// ).unwrap();
/// assert_eq!(img.dimensions(), (480, 320));
/// // the line is drawn in the first palette colour somewhere in the plot
/// assert!(img.pixels().any(|p| p.0 == [31, 119, 180]));
/// ```
pub fn plot_curves(
    series: &[Series],
    axes: &Axes<'_>,
    width: u32,
    height: u32,
) -> Result<RgbImage, TrainerError> {
    let f = frame(series, width, height)?;
    let mut img = RgbImage::from_pixel(width, height, image::Rgb(WHITE));
    let (l, t) = (f.left as i64, f.top as i64);
    let (r, b) = (l + f.w as i64 - 1, t + f.h as i64 - 1);
    let (yticks, ydec) = nice_ticks(f.y0, f.y1, 5, false);
    for fy in yticks {
        let (_, py) = f.pixel(f.x0, fy);
        line(&mut img, (l, py), (r, py), GRID, 1);
        let label = format!("{fy:.ydec$}");
        text(
            &mut img,
            l - 4 - (label.len() as i64) * GLYPH as i64,
            py - 4,
            &label,
            BLACK,
        );
    }
    let (xticks, xdec) = nice_ticks(f.x0, f.x1, 6, axes.integer_x);
    for fx in xticks {
        let (px, _) = f.pixel(fx, f.y0);
        line(&mut img, (px, t), (px, b), GRID, 1);
        let label = format!("{fx:.xdec$}");
        let lx = (px - (label.len() as i64) * GLYPH as i64 / 2)
            .clamp(0, width as i64 - (label.len() as i64) * GLYPH as i64);
        text(&mut img, lx, b + 4, &label, BLACK);
    }
    line(&mut img, (l, t), (l, b), BLACK, 1);
    line(&mut img, (l, b), (r, b), BLACK, 1);
    text(&mut img, l, 4, axes.title, BLACK);
    let xw = axes.x_label.len() as i64 * GLYPH as i64;
    text(
        &mut img,
        l + (r - l - xw) / 2,
        b + 4 + LINE as i64 + 2,
        axes.x_label,
        BLACK,
    );
    let yw = axes.y_label.len() as i64 * GLYPH as i64;
    text_up(&mut img, 2, t + (b - t + yw) / 2, axes.y_label, BLACK);
    for (i, s) in series.iter().enumerate() {
        let c = s.color.unwrap_or(PALETTE[i % PALETTE.len()]);
        let pts: Vec<(i64, i64)> = s.finite().map(|(x, y, _)| f.pixel(x, y)).collect();
        for w in pts.windows(2) {
            line(&mut img, w[0], w[1], c, 2);
        }
        for (x, y, e) in s.finite() {
            if e > 0.0 {
                let (px, lo) = f.pixel(x, y - e);
                let (_, hi) = f.pixel(x, y + e);
                line(&mut img, (px, lo), (px, hi), c, 1);
                line(&mut img, (px - 3, lo), (px + 3, lo), c, 1);
                line(&mut img, (px - 3, hi), (px + 3, hi), c, 1);
            }
        }
        for &(x, y) in &pts {
            fill(&mut img, x - 1, y - 1, 3, 3, c);
        }
        // legend, top-left inside the plot
        let ly = t + 4 + i as i64 * LINE as i64;
        fill(&mut img, l + 6, ly + 2, 10, 4, c);
        let name = if s.errors.is_empty() {
            s.name.clone()
        } else {
            format!("{} (+/- s.e.)", s.name)
        };
        text(&mut img, l + 20, ly, &name, BLACK);
    }
    Ok(img)
}

const PAD: u32 = 2;
const CAPTION_LINES: u32 = 3;

/// The height of the caption strip under each tile (0 without captions).
pub fn caption_height(captioned: bool) -> u32 {
    if captioned { CAPTION_LINES * LINE } else { 0 }
}

/// Tiles equally sized RGB images into a grid of `columns` columns (row-major), 2 white pixels
/// apart, each optionally with a caption of up to three lines under it (wrapped between words
/// at the tile's width in 8-pixel characters; what does not fit ends in `..`).
///
/// # Errors
/// [`TrainerError::Drawing`]: no tiles, zero columns, tiles of different sizes, more
/// captions than tiles.
///
/// ```
/// use image::RgbImage;
/// use trainer_fsdp::{caption_height, sample_grid};
/// let red = RgbImage::from_pixel(16, 16, image::Rgb([255, 0, 0]));
/// let blue = RgbImage::from_pixel(16, 16, image::Rgb([0, 0, 255]));
/// let grid = sample_grid(&[red.clone(), blue, red], None, 2).unwrap();
/// // 2 columns x 2 rows of 16 px tiles with 2 px gaps around and between them
/// assert_eq!(grid.dimensions(), (2 + 2 * 18, 2 + 2 * 18));
/// assert_eq!(grid.get_pixel(2 + 18, 2).0, [0, 0, 255]);
/// assert_eq!(caption_height(true), 30);
/// ```
pub fn sample_grid(
    tiles: &[RgbImage],
    captions: Option<&[String]>,
    columns: u32,
) -> Result<RgbImage, TrainerError> {
    let bad = |problem| TrainerError::Drawing {
        what: "a sample grid",
        problem,
    };
    let refs: Vec<&RgbImage> = tiles.iter().collect();
    let (tw, th) =
        tile_geometry(&refs, columns, captions.map_or(0, <[String]>::len)).map_err(bad)?;
    let cols = columns.min(tiles.len() as u32);
    let rows = (tiles.len() as u32).div_ceil(cols);
    let cap = caption_height(captions.is_some());
    let (cw, ch) = (tw + PAD, th + cap + PAD);
    let mut img = RgbImage::from_pixel(PAD + cols * cw, PAD + rows * ch, image::Rgb(WHITE));
    for (i, t) in tiles.iter().enumerate() {
        let (c, r) = (i as u32 % cols, i as u32 / cols);
        let (x0, y0) = (PAD + c * cw, PAD + r * ch);
        image::imageops::replace(&mut img, t, x0 as i64, y0 as i64);
        if let Some(caption) = captions.and_then(|c| c.get(i)) {
            // half a character short of the tile, so that neighbouring captions never touch
            let per_line = (tw.saturating_sub(GLYPH / 2) / GLYPH).max(1) as usize;
            for (k, s) in wrap(caption, per_line, CAPTION_LINES as usize)
                .iter()
                .enumerate()
            {
                text(
                    &mut img,
                    x0 as i64,
                    (y0 + th + 1 + k as u32 * LINE) as i64,
                    s,
                    BLACK,
                );
            }
        }
    }
    Ok(img)
}

/// The one size of `tiles`, checked for a grid of `columns` columns and `captions` captions:
/// at least one tile, a column, no more captions than tiles, every tile the first one's size.
fn tile_geometry(
    tiles: &[&RgbImage],
    columns: u32,
    captions: usize,
) -> Result<(u32, u32), DrawingProblem> {
    let first = tiles.first().ok_or(DrawingProblem::Empty)?;
    if columns == 0 {
        return Err(DrawingProblem::Geometry {
            what: "zero columns",
        });
    }
    if captions > tiles.len() {
        return Err(DrawingProblem::Geometry {
            what: "more captions than tiles",
        });
    }
    let size = first.dimensions();
    match tiles.iter().position(|t| t.dimensions() != size) {
        Some(index) => Err(DrawingProblem::TileSize {
            index,
            expected: size,
            found: tiles[index].dimensions(),
        }),
        None => Ok(size),
    }
}

/// Tile `index` of a grid that [`sample_grid`] drew with tiles of `tile` = `(width, height)`,
/// captions or not, in `columns` columns: the inverse of its layout, so that an earlier grid
/// written to disk gives its pictures back. `None` when the grid is too small to hold it.
///
/// ```
/// use image::RgbImage;
/// use trainer_fsdp::{grid_tile, sample_grid};
/// let tiles: Vec<RgbImage> = (0..5u8).map(|i| RgbImage::from_pixel(4, 4, image::Rgb([i, 0, 0]))).collect();
/// let grid = sample_grid(&tiles, Some(&["a".to_string()]), 2).unwrap();
/// assert_eq!(grid_tile(&grid, 3, (4, 4), true, 2).unwrap(), tiles[3]);
/// assert!(grid_tile(&grid, 6, (4, 4), true, 2).is_none());
/// ```
pub fn grid_tile(
    grid: &RgbImage,
    index: usize,
    tile: (u32, u32),
    captioned: bool,
    columns: u32,
) -> Option<RgbImage> {
    let (tw, th) = tile;
    let columns = columns.max(1);
    let (c, r) = (index as u32 % columns, index as u32 / columns);
    let x0 = PAD + c * (tw + PAD);
    let y0 = PAD + r * (th + caption_height(captioned) + PAD);
    if x0 + tw > grid.width() || y0 + th > grid.height() {
        return None;
    }
    Some(image::imageops::crop_imm(grid, x0, y0, tw, th).to_image())
}

/// The same prompts before and after training, one above the other: for every `columns`
/// prompts a row of `before` pictures and under it a row of `after` pictures with the
/// prompts' captions, `labels` (`[before, after]`) written up the left margin of each row,
/// and `title` across the top.
///
/// # Errors
/// [`TrainerError::Drawing`]: no tiles, `before` and `after` of different counts or sizes,
/// zero columns, more captions than tiles.
///
/// ```
/// use image::RgbImage;
/// use trainer_fsdp::before_after_grid;
/// let red = RgbImage::from_pixel(40, 40, image::Rgb([255, 0, 0]));
/// let blue = RgbImage::from_pixel(40, 40, image::Rgb([0, 0, 255]));
/// let img = before_after_grid(&[red.clone(), red], &[blue.clone(), blue], &["a".into(), "b".into()], 2, ["before", "after"], "t").unwrap();
/// assert!(img.width() > 2 * 40 && img.height() > 2 * 40);
/// ```
pub fn before_after_grid(
    before: &[RgbImage],
    after: &[RgbImage],
    captions: &[String],
    columns: u32,
    labels: [&str; 2],
    title: &str,
) -> Result<RgbImage, TrainerError> {
    let bad = |problem| TrainerError::Drawing {
        what: "a before-and-after grid",
        problem,
    };
    if before.len() != after.len() {
        return Err(bad(DrawingProblem::Geometry {
            what: "as many pictures before as after",
        }));
    }
    let both: Vec<&RgbImage> = before.iter().chain(after).collect();
    tile_geometry(&both[..before.len()], columns, captions.len()).map_err(bad)?;
    let (tw, th) = tile_geometry(&both, columns, 0).map_err(bad)?;
    let cols = columns.min(before.len() as u32);
    let rows = (before.len() as u32).div_ceil(cols);
    // the labels run up a margin as wide as a glyph and its gaps, under a title line
    let margin = GLYPH + 2 * PAD;
    let head = LINE + 2 * PAD;
    let pair = 2 * (th + PAD) + caption_height(true);
    let mut img = RgbImage::from_pixel(
        margin + PAD + cols * (tw + PAD),
        head + PAD + rows * (pair + 2 * PAD),
        image::Rgb(WHITE),
    );
    let per_title = (img.width() / GLYPH) as usize;
    if let Some(t) = wrap(title, per_title, 1).first() {
        text(&mut img, PAD as i64, PAD as i64, t, BLACK);
    }
    let per_caption = (tw.saturating_sub(GLYPH / 2) / GLYPH).max(1) as usize;
    let fit = (th / GLYPH) as usize;
    for r in 0..rows {
        let y = head + PAD + r * (pair + 2 * PAD);
        for (k, tiles) in [before, after].into_iter().enumerate() {
            let y_row = y + k as u32 * (th + PAD);
            for c in 0..cols {
                let i = (r * cols + c) as usize;
                let Some(t) = tiles.get(i) else { break };
                let x = margin + PAD + c * (tw + PAD);
                image::imageops::replace(&mut img, t, x as i64, y_row as i64);
                // the captions under the lower row of each pair
                let caption = captions.get(i).filter(|_| k == 1);
                for (n, s) in caption
                    .map(|c| wrap(c, per_caption, CAPTION_LINES as usize))
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                {
                    let y_text = y_row + th + 1 + n as u32 * LINE;
                    text(&mut img, x as i64, y_text as i64, s, BLACK);
                }
            }
            // the row's label, centred up its height and cut to fit it
            let label: String = labels[k].chars().take(fit).collect();
            let len = label.chars().count() as u32 * GLYPH;
            let bottom = y_row + th - (th - len) / 2;
            text_up(&mut img, PAD as i64, bottom as i64 - 1, &label, BLACK);
        }
    }
    Ok(img)
}

/// `s` in lines of at most `width` characters, broken between words (a word longer than a
/// line is split), at most `lines` of them; a cut last line ends in `..`.
fn wrap(s: &str, width: usize, lines: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut words: Vec<String> = s.split_whitespace().map(str::to_string).collect();
    words.reverse();
    while let Some(w) = words.pop() {
        let len = cur.chars().count();
        let wlen = w.chars().count();
        if len == 0 && wlen > width {
            let (head, tail): (String, String) = (
                w.chars().take(width).collect(),
                w.chars().skip(width).collect(),
            );
            out.push(head);
            words.push(tail);
        } else if len == 0 {
            cur = w;
        } else if len + 1 + wlen <= width {
            cur.push(' ');
            cur.push_str(&w);
        } else {
            out.push(std::mem::take(&mut cur));
            words.push(w);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    if out.len() > lines {
        out.truncate(lines);
        let last = out.last_mut().expect("lines >= 1");
        let keep = width.saturating_sub(2).min(last.chars().count());
        *last = last.chars().take(keep).collect::<String>() + "..";
    }
    out
}

/// Nearest-neighbour upscaling by an integer factor (small pictures stay crisp in a grid).
pub fn upscale(img: &RgbImage, factor: u32) -> RgbImage {
    if factor <= 1 {
        return img.clone();
    }
    image::imageops::resize(
        img,
        img.width() * factor,
        img.height() * factor,
        image::imageops::FilterType::Nearest,
    )
}

/// Encodes `img` as PNG and writes it atomically (`.tmp` → fsync → rename).
///
/// # Errors
/// [`TrainerError::Image`], [`TrainerError::Io`] naming the file.
pub fn write_png(path: &Path, img: &RgbImage) -> Result<(), TrainerError> {
    let mut bytes = Vec::new();
    PngEncoder::new(&mut bytes)
        .write_image(
            img.as_raw(),
            img.width(),
            img.height(),
            ExtendedColorType::Rgb8,
        )
        .map_err(|source| TrainerError::Image {
            path: path.to_path_buf(),
            source,
        })?;
    durable::write_atomic(path, &bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_passes_through_its_points() {
        let s = Series {
            name: "r".into(),
            points: vec![(0.0, 0.0), (10.0, 1.0), (f64::NAN, 3.0)],
            color: Some([200, 0, 200]),
            errors: Vec::new(),
        };
        let img = plot_curves(std::slice::from_ref(&s), &Axes::titled("t"), 400, 300).unwrap();
        let f = frame(&[s], 400, 300).unwrap();
        for (x, y) in [(0.0, 0.0), (5.0, 0.5), (10.0, 1.0)] {
            let (px, py) = f.pixel(x, y);
            assert_eq!(
                img.get_pixel(px as u32, py as u32).0,
                [200, 0, 200],
                "({x}, {y})"
            );
        }
        // the y range is padded by 5%, so the points stay inside the plot area
        let (_, top) = f.pixel(10.0, 1.0);
        assert!(top > f.top as i64);
        // far from the line there is only background or grid
        let (px, py) = f.pixel(9.0, 0.1);
        assert_ne!(img.get_pixel(px as u32, py as u32).0, [200, 0, 200]);
    }

    #[test]
    fn constant_and_single_point_series_draw() {
        let img = plot_curves(
            &[Series::new("flat", vec![(3.0, 0.7)])],
            &Axes::titled("t"),
            200,
            120,
        )
        .unwrap();
        assert!(img.pixels().any(|p| p.0 == PALETTE[0]));
    }

    #[test]
    fn bad_input_is_refused() {
        let t = Axes::titled("t");
        assert!(plot_curves(&[], &t, 400, 300).is_err());
        let nan = Series::new("nan", vec![(f64::NAN, 1.0)]);
        let err = plot_curves(&[nan], &t, 400, 300).unwrap_err();
        assert!(
            err.to_string().contains("\"nan\" has no finite point"),
            "{err}"
        );
        let ok = Series::new("ok", vec![(0.0, 1.0)]);
        assert!(plot_curves(&[ok], &t, 50, 50).is_err());
    }

    #[test]
    fn ticks_are_round_and_integer_on_request() {
        let (t, d) = nice_ticks(0.283, 0.551, 5, false);
        assert_eq!(d, 1);
        assert_eq!(
            t.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>(),
            ["0.3", "0.4", "0.5"]
        );
        let (t, d) = nice_ticks(0.283, 0.551, 10, false);
        assert_eq!((t.len(), d), (6, 2), "{t:?}");
        let (t, d) = nice_ticks(-0.5, 79.5, 6, true);
        assert_eq!(d, 0);
        assert_eq!(t, [0.0, 20.0, 40.0, 60.0]);
        // a span of one rollout still ticks at integers
        let (t, _) = nice_ticks(39.0, 40.0, 6, true);
        assert_eq!(t, [39.0, 40.0]);
    }

    #[test]
    fn error_bars_widen_the_range_and_are_drawn() {
        let s = Series::new("e", vec![(0.0, 0.5), (1.0, 0.5)]).with_errors(vec![0.1, f64::NAN]);
        let f = frame(std::slice::from_ref(&s), 400, 300).unwrap();
        assert!(f.y0 < 0.4 && f.y1 > 0.6, "{f:?}");
        let img = plot_curves(&[s], &Axes::titled("t"), 400, 300).unwrap();
        let (px, py) = f.pixel(0.0, 0.58);
        assert_eq!(
            img.get_pixel(px as u32, py as u32).0,
            PALETTE[0],
            "the bar above the point"
        );
    }

    #[test]
    fn captions_wrap_between_words() {
        assert_eq!(
            wrap("a red circle left of a yellow triangle", 16, 3),
            ["a red circle", "left of a yellow", "triangle"]
        );
        assert_eq!(
            wrap("one two three four five six", 9, 2),
            ["one two", "three.."]
        );
        assert_eq!(wrap("abcdefghij", 4, 3), ["abcd", "efgh", "ij"]);
        let up = upscale(&RgbImage::from_pixel(2, 2, image::Rgb([9, 9, 9])), 3);
        assert_eq!(up.dimensions(), (6, 6));
    }

    #[test]
    fn text_uses_the_bitmap_font() {
        let mut img = RgbImage::from_pixel(16, 8, image::Rgb(WHITE));
        text(&mut img, 0, 0, "I", BLACK);
        // font8x8 'I' (0x49): rows 1E 0C 0C 0C 0C 0C 1E 00, bit 0 = leftmost pixel
        let row0: Vec<bool> = (0..8).map(|x| img.get_pixel(x, 0).0 == BLACK).collect();
        assert_eq!(
            row0,
            vec![false, true, true, true, true, false, false, false]
        );
        assert!((0..16).all(|x| img.get_pixel(x, 7).0 == WHITE));
    }

    #[test]
    fn grid_places_tiles_and_captions() {
        let tiles: Vec<RgbImage> = (0..5u8)
            .map(|i| RgbImage::from_pixel(24, 12, image::Rgb([i * 40, 100, 0])))
            .collect();
        let captions: Vec<String> = (0..5).map(|i| format!("prompt {i} is long")).collect();
        let img = sample_grid(&tiles, Some(&captions), 3).unwrap();
        let cap = caption_height(true);
        assert_eq!(img.dimensions(), (2 + 3 * 26, 2 + 2 * (12 + cap + 2)));
        for (i, t) in tiles.iter().enumerate() {
            let (c, r) = (i as u32 % 3, i as u32 / 3);
            let (x, y) = (2 + c * 26, 2 + r * (14 + cap));
            assert_eq!(img.get_pixel(x, y), t.get_pixel(0, 0));
            assert_eq!(img.get_pixel(x + 23, y + 11), t.get_pixel(0, 0));
            // the caption strip under the tile has some ink
            let ink = (0..24)
                .flat_map(|dx| (0..cap).map(move |dy| (dx, dy)))
                .any(|(dx, dy)| img.get_pixel(x + dx, y + 12 + dy).0 == BLACK);
            assert!(ink, "caption of tile {i}");
        }
        // the sixth cell is empty
        assert_eq!(img.get_pixel(2 + 2 * 26 + 5, 2 + 14 + cap + 5).0, WHITE);
    }

    #[test]
    fn grid_refuses_mixed_sizes_and_round_trips_png() {
        let a = RgbImage::from_pixel(4, 4, image::Rgb([1, 2, 3]));
        let b = RgbImage::from_pixel(5, 4, image::Rgb([1, 2, 3]));
        let err = sample_grid(&[a.clone(), b], None, 2).unwrap_err();
        assert!(err.to_string().contains("tile 1 is 5x4"), "{err}");
        assert!(sample_grid(&[], None, 2).is_err());
        assert!(sample_grid(std::slice::from_ref(&a), None, 0).is_err());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grid.png");
        let img = sample_grid(&[a.clone(), a], None, 2).unwrap();
        write_png(&path, &img).unwrap();
        let back = image::open(&path).unwrap().to_rgb8();
        assert_eq!(back, img);
    }

    #[test]
    fn a_before_and_after_grid_pairs_its_pictures_and_refuses_mismatches() {
        let px = |v| RgbImage::from_pixel(16, 16, image::Rgb([v, 0, 0]));
        let before = [px(1), px(2), px(3)];
        let after = [px(4), px(5), px(6)];
        let captions = ["a".to_string(), "b".to_string()];
        let img = before_after_grid(&before, &after, &captions, 2, ["b", "a"], "title").unwrap();
        // prompt 2 opens the second pair of rows; its after picture is under its before one
        let (x0, y0) = (GLYPH + 3 * PAD, LINE + 3 * PAD);
        let pair = 2 * (16 + PAD) + caption_height(true) + 2 * PAD;
        assert_eq!(img.get_pixel(x0, y0).0, [1, 0, 0]);
        assert_eq!(img.get_pixel(x0 + 16 + PAD, y0).0, [2, 0, 0]);
        assert_eq!(img.get_pixel(x0, y0 + 16 + PAD).0, [4, 0, 0]);
        assert_eq!(img.get_pixel(x0, y0 + pair).0, [3, 0, 0]);
        assert_eq!(img.get_pixel(x0, y0 + pair + 16 + PAD).0, [6, 0, 0]);

        let refused = |b: &[RgbImage], a: &[RgbImage], c: &[String]| {
            before_after_grid(b, a, c, 2, ["b", "a"], "t")
                .unwrap_err()
                .to_string()
        };
        assert!(refused(&before, &after[..2], &[]).contains("as many"));
        let e = refused(&before, &[px(4), px(5), RgbImage::new(8, 8)], &[]);
        assert!(e.contains("tile 5 is 8x8"), "{e}");
        let many: Vec<String> = (0..4).map(|i| i.to_string()).collect();
        assert!(refused(&before, &after, &many).contains("more captions"));
        assert!(refused(&[], &[], &[]).contains("nothing"));
    }
}
