//! The shapes world: grammar round trips and errors, renderer determinism, and the
//! composition reward on rendered images with known content (full marks, partial, none),
//! clean and degraded (noise, blur, off colours).

use reward::shapes::{
    self, BACKGROUND, Category, Colour, ConstraintKind, IMAGE_SIZE, ObjectSpec, RenderOptions,
    SceneSpec, Shape, ShapeCredit, ShapesScorer, judge, judge_with, render,
};
use reward::{Batch, RewardError, RgbImage, Scorer};

fn spec(p: &str) -> SceneSpec {
    SceneSpec::parse(p).unwrap_or_else(|e| panic!("{e}"))
}

/// Deterministic N(0, sigma^2) per channel (Box-Muller on a 64-bit LCG), in 8-bit levels.
fn noisy(image: &RgbImage, sigma: f64, seed: u64) -> RgbImage {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut unit = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    RgbImage::from_fn(image.width(), image.height(), |x, y| {
        let p = image.pixel(x, y);
        std::array::from_fn(|c| {
            let n = (-2.0 * unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * unit()).cos();
            (p[c] as f64 + sigma * n).round().clamp(0.0, 255.0) as u8
        })
    })
}

/// A 3x3 binomial blur (`[1 2 1]^T [1 2 1] / 16`, edges clamped).
fn blurred(image: &RgbImage) -> RgbImage {
    let (w, h) = (image.width() as i64, image.height() as i64);
    RgbImage::from_fn(image.width(), image.height(), |x, y| {
        let mut acc = [0.0f64; 3];
        for dy in -1i64..=1 {
            for dx in -1i64..=1 {
                let k =
                    [1.0, 2.0, 1.0][(dx + 1) as usize] * [1.0, 2.0, 1.0][(dy + 1) as usize] / 16.0;
                let p = image.pixel(
                    (x as i64 + dx).clamp(0, w - 1) as usize,
                    (y as i64 + dy).clamp(0, h - 1) as usize,
                );
                for c in 0..3 {
                    acc[c] += k * p[c] as f64;
                }
            }
        }
        acc.map(|v| v.round() as u8)
    })
}

/// Every pixel moved by `delta` per channel (an off-palette generator).
fn shifted(image: &RgbImage, delta: [i32; 3]) -> RgbImage {
    RgbImage::from_fn(image.width(), image.height(), |x, y| {
        let p = image.pixel(x, y);
        std::array::from_fn(|c| (p[c] as i32 + delta[c]).clamp(0, 255) as u8)
    })
}

#[test]
fn every_scene_round_trips_through_its_prompt() {
    let mut total = 0;
    for category in Category::ALL {
        let all = SceneSpec::all(category);
        assert!(!all.is_empty());
        for s in &all {
            assert_eq!(s.category(), category, "{s}");
            s.validate().unwrap();
            assert_eq!(&SceneSpec::parse(&s.prompt()).unwrap(), s, "{s}");
            total += 1;
        }
    }
    assert_eq!(total, 3 + 6 + 54 + 15 + 840 + 210);
    assert_eq!(spec("one Red  CIRCLE").prompt(), "a red circle");
    assert_eq!(
        spec("a circle below a green triangle").category(),
        Category::Position
    );
}

#[test]
fn text_outside_the_grammar_is_a_typed_error() {
    let grammar = [
        ("a red hexagon", 2, Some("hexagon")),
        ("two blue square", 2, Some("square")),
        ("a squares", 1, Some("squares")),
        ("five circles", 0, Some("five")),
        ("a red circle.", 2, Some("circle.")),
        ("a red circle next to a square", 3, Some("next")),
        ("a red circle left a square", 4, Some("a")),
        ("a red circle and", 4, None),
        ("", 0, None),
        ("a circle and a square and a triangle", 5, Some("and")),
    ];
    for (p, word, found) in grammar {
        match SceneSpec::parse(p) {
            Err(RewardError::PromptOutsideGrammar {
                word: w, found: f, ..
            }) => {
                assert_eq!((w, f.as_deref()), (word, found), "{p:?}");
            }
            other => panic!("{p:?}: {other:?}"),
        }
    }
    let rules = [
        "a circle and a circle",
        "a circle and a red circle",
        "two circles left of a square",
        "three squares and two circles",
        "a red circle left of a red circle",
    ];
    for p in rules {
        assert!(
            matches!(SceneSpec::parse(p), Err(RewardError::InvalidScene { .. })),
            "{p}"
        );
    }
    // every violation is listed
    let bad = SceneSpec::Relation {
        subject: ObjectSpec {
            count: 3,
            colour: None,
            shape: Shape::Circle,
        },
        relation: shapes::Relation::Above,
        object: ObjectSpec {
            count: 2,
            colour: None,
            shape: Shape::Circle,
        },
    };
    match bad.validate() {
        Err(RewardError::InvalidScene { problems, .. }) => {
            assert_eq!(problems.len(), 3, "{problems:?}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn rendering_is_deterministic_and_varied() {
    let o = RenderOptions::default();
    let s = spec("a red circle and a blue square");
    let a = render(&s, 11, &o).unwrap();
    assert_eq!(a, render(&s, 11, &o).unwrap());
    assert_eq!(
        (a.image.width(), a.image.height()),
        (IMAGE_SIZE, IMAGE_SIZE)
    );
    let distinct: std::collections::HashSet<Vec<u8>> = (0..20)
        .map(|seed| render(&s, seed, &o).unwrap().image.as_bytes().to_vec())
        .collect();
    assert_eq!(distinct.len(), 20);
    assert_eq!(a.objects.len(), 2);
    assert_eq!(
        (a.objects[0].colour, a.objects[0].shape),
        (Colour::Red, Shape::Circle)
    );
    for obj in &a.objects {
        let r = obj.side / 2.0;
        assert!(
            obj.centre.0 - r >= 0.0 && obj.centre.0 + r <= 32.0,
            "{obj:?}"
        );
        assert!(
            obj.side >= 0.2 * 32.0 && obj.side <= 0.34 * 32.0 + 1e-9,
            "{obj:?}"
        );
    }
    // a colourless group draws palette colours
    let any = render(&spec("four triangles"), 5, &o).unwrap();
    assert!(any.objects.iter().all(|p| Colour::ALL.contains(&p.colour)));
    // no anti-aliasing: only background and (jittered) object colours
    let hard = render(
        &spec("a green square"),
        3,
        &RenderOptions {
            antialias: false,
            colour_jitter: 0,
            ..o.clone()
        },
    )
    .unwrap();
    let rgb = Colour::Green.rgb();
    assert!(
        hard.image
            .as_bytes()
            .chunks(3)
            .all(|p| p == BACKGROUND || p == rgb)
    );
}

/// Full marks rate and mean score over `seeds` renders of every scene of every category.
fn sweep(
    seeds: u64,
    degrade: impl Fn(&RgbImage, u64) -> RgbImage,
    credit: ShapeCredit,
) -> (f64, f64, Vec<String>) {
    let o = RenderOptions::default();
    let (mut full, mut n, mut sum) = (0usize, 0usize, 0.0);
    let mut failures = Vec::new();
    for category in Category::ALL {
        let all = SceneSpec::all(category);
        for seed in 0..seeds {
            // a spread of scenes of the category
            let s = all[(seed as usize * 7919) % all.len()];
            let image = degrade(&render(&s, seed, &o).unwrap().image, seed);
            let j = judge_with(&s, &image, credit);
            n += 1;
            sum += j.score;
            if j.score == 1.0 {
                full += 1;
            } else if failures.len() < 5 {
                failures.push(format!(
                    "{s} (seed {seed}): {:.3} {:?}",
                    j.score, j.constraints
                ));
            }
        }
    }
    (full as f64 / n as f64, sum / n as f64, failures)
}

#[test]
fn rendered_scenes_get_full_marks() {
    for credit in [ShapeCredit::BestFit, ShapeCredit::GRADED] {
        let (rate, mean, failures) = sweep(40, |im, _| im.clone(), credit);
        eprintln!(
            "clean, {credit:?}: full marks {:.1} %, mean {mean:.4}; {failures:?}",
            100.0 * rate
        );
        assert_eq!(rate, 1.0, "{failures:#?}");
    }
}

/// An image degradation for a sweep: `(image, seed) -> image`.
type Degrade = Box<dyn Fn(&RgbImage, u64) -> RgbImage>;

#[test]
fn degraded_scenes_still_score() {
    // (name, degradation, least full-marks rate, least mean score)
    let cases: Vec<(&str, Degrade, f64, f64)> = vec![
        (
            "noise sigma 12",
            Box::new(|im, s| noisy(im, 12.0, s)),
            0.98,
            0.995,
        ),
        (
            "noise sigma 20",
            Box::new(|im, s| noisy(im, 20.0, s)),
            0.95,
            0.98,
        ),
        ("blur", Box::new(|im, _| blurred(im)), 0.98, 0.995),
        (
            "blur twice",
            Box::new(|im, _| blurred(&blurred(im))),
            0.95,
            0.98,
        ),
        (
            "blur + noise 12",
            Box::new(|im, s| noisy(&blurred(im), 12.0, s)),
            0.95,
            0.98,
        ),
        (
            "colours off by 25",
            Box::new(|im, _| shifted(im, [25, -20, 15])),
            0.98,
            0.995,
        ),
        (
            "darker by 40",
            Box::new(|im, _| shifted(im, [-40, -40, -40])),
            0.95,
            0.98,
        ),
    ];
    for (name, f, min_rate, min_mean) in cases {
        let (rate, mean, failures) = sweep(20, &f, ShapeCredit::BestFit);
        eprintln!("{name}: full marks {:.1} %, mean {mean:.4}", 100.0 * rate);
        assert!(
            rate >= min_rate && mean >= min_mean,
            "{name}: rate {rate}, mean {mean}: {failures:#?}"
        );
        // graded credit gives a shape the degradation made ambiguous partial credit (a small
        // circle blurred twice: 0.75), so fewer scenes get full marks, but the mean holds
        let (rate, mean, failures) = sweep(20, &f, ShapeCredit::GRADED);
        eprintln!(
            "{name}, graded: full marks {:.1} %, mean {mean:.4}",
            100.0 * rate
        );
        assert!(
            rate >= min_rate - 0.2 && mean >= min_mean,
            "{name}, graded: rate {rate}, mean {mean}: {failures:#?}"
        );
    }
}

#[test]
fn partial_credit_per_constraint() {
    let o = RenderOptions::default();
    // two red squares asked as two blue squares: objects yes, colour no, count of blue 0,
    // nothing else drawn
    let j = judge(
        &spec("two blue squares"),
        &render(&spec("two red squares"), 1, &o).unwrap().image,
    );
    assert_eq!(
        j.constraints.iter().map(|c| c.score).collect::<Vec<_>>(),
        vec![1.0, 0.0, 0.0, 1.0]
    );
    assert!((j.score - 1.0 / 3.0).abs() < 1e-12);
    // three blue squares asked as two: both found and blue, count off by one, one extra
    let j = judge(
        &spec("two blue squares"),
        &render(&spec("three blue squares"), 2, &o).unwrap().image,
    );
    assert_eq!(j.mean_of(ConstraintKind::Count), Some(0.5));
    assert_eq!(j.mean_of(ConstraintKind::Exclusive), Some(2.0 / 3.0));
    assert!((j.score - 2.5 / 3.0 * (2.0 / 3.0)).abs() < 1e-12);
    // the relation reversed: every object right, the relation wrong
    let j = judge(
        &spec("a red circle left of a yellow triangle"),
        &render(&spec("a red circle right of a yellow triangle"), 3, &o)
            .unwrap()
            .image,
    );
    assert_eq!(j.mean_of(ConstraintKind::Relation), Some(0.0));
    assert!((j.score - 4.0 / 5.0).abs() < 1e-12, "{j:?}");
    // colour attribution swapped: shapes right, colours wrong
    let j = judge(
        &spec("a red circle and a blue square"),
        &render(&spec("a blue circle and a red square"), 4, &o)
            .unwrap()
            .image,
    );
    assert_eq!(j.mean_of(ConstraintKind::Object), Some(1.0));
    assert_eq!(j.mean_of(ConstraintKind::Colour), Some(0.0));
    assert!((j.score - 2.0 / 4.0).abs() < 1e-12, "{j:?}");
    // one object of two
    let j = judge(
        &spec("a circle and a square"),
        &render(&spec("a purple circle"), 5, &o).unwrap().image,
    );
    assert!((j.score - 1.0 / 2.0).abs() < 1e-12, "{j:?}");
    // the right object among others: everything asked is there, but not only that
    let mut scene = render(&spec("a red circle and a blue square"), 7, &o)
        .unwrap()
        .image;
    let asked = judge(&spec("a red circle"), &scene);
    assert_eq!(asked.mean_of(ConstraintKind::Object), Some(1.0));
    assert_eq!(asked.mean_of(ConstraintKind::Exclusive), Some(0.5));
    assert!((asked.score - 0.5).abs() < 1e-12, "{asked:?}");
    scene = render(&spec("a red circle"), 7, &o).unwrap().image;
    assert_eq!(judge(&spec("a red circle"), &scene).score, 1.0);
    // the wrong shape entirely
    let j = judge(
        &spec("a red circle"),
        &render(&spec("a red square"), 6, &o).unwrap().image,
    );
    assert_eq!(j.score, 0.0);
}

#[test]
fn empty_and_unrelated_images_score_zero() {
    let blank = RgbImage::filled(32, 32, BACKGROUND);
    for category in Category::ALL {
        for s in SceneSpec::all(category).iter().take(10) {
            let j = judge(s, &blank);
            assert_eq!(j.score, 0.0, "{s}");
            assert!(j.detections.is_empty());
        }
    }
    let grey_noise = noisy(&RgbImage::filled(32, 32, [128, 128, 128]), 40.0, 9);
    assert_eq!(judge(&spec("three circles"), &grey_noise).score, 0.0);
}

#[test]
fn detections_match_what_was_drawn() {
    let o = RenderOptions::default();
    let scene = render(&spec("a red circle and a blue square"), 8, &o).unwrap();
    let d = shapes::detect(&scene.image);
    assert_eq!(d.len(), 2, "{d:?}");
    for obj in &scene.objects {
        let m = d
            .iter()
            .find(|x| x.colour == obj.colour && x.shape == obj.shape)
            .unwrap_or_else(|| panic!("{obj:?} not in {d:?}"));
        assert!(
            (m.centroid.0 - obj.centre.0).abs() < 1.0 && (m.centroid.1 - obj.centre.1).abs() < 1.0
        );
        assert!(m.fit() > 0.7, "{m:?}");
    }
}

#[test]
fn scorer_reports_components_and_rejects_bad_prompts() {
    let o = RenderOptions::default();
    let prompts: Vec<String> = [
        "a red circle left of a yellow triangle",
        "three squares",
        "a green triangle",
    ]
    .map(String::from)
    .to_vec();
    let images: Vec<RgbImage> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| render(&spec(p), i as u64, &o).unwrap().image)
        .collect();
    let out = ShapesScorer::default()
        .score(Batch::images_and_prompts(&images, &prompts).unwrap())
        .unwrap();
    assert_eq!(out[0].get("shapes"), Some(1.0));
    assert_eq!(out[0].get("shapes_relation"), Some(1.0));
    assert_eq!(out[1].get("shapes_count"), Some(1.0));
    assert_eq!(out[1].get("shapes_colour"), None);
    assert_eq!(out[2].get("shapes_colour"), Some(1.0));
    assert_eq!(
        ShapesScorer::default().components(),
        vec!["shapes".to_string()]
    );
    let bad = vec![
        "a red circle".to_string(),
        "a cat".to_string(),
        "two squares".to_string(),
    ];
    let err = ShapesScorer::default()
        .score(Batch::images_and_prompts(&images, &bad).unwrap())
        .unwrap_err();
    assert!(
        matches!(err, RewardError::PromptOutsideGrammar { .. }),
        "{err}"
    );
}

#[test]
fn sampling_is_seeded_and_covers_categories() {
    for category in Category::ALL {
        let a: Vec<SceneSpec> = (0..30).map(|s| SceneSpec::sample(category, s)).collect();
        let b: Vec<SceneSpec> = (0..30).map(|s| SceneSpec::sample(category, s)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|s| s.category() == category));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(
            distinct.len() >= 3.min(SceneSpec::all(category).len()),
            "{category:?}"
        );
    }
}

#[test]
fn larger_renders_are_judged_the_same_way() {
    let o = RenderOptions {
        size: 64,
        ..RenderOptions::default()
    };
    for (i, p) in [
        "four yellow circles",
        "a blue triangle above a red square",
        "a green circle and a purple triangle",
    ]
    .iter()
    .enumerate()
    {
        let s = spec(p);
        let j = judge(&s, &render(&s, i as u64, &o).unwrap().image);
        assert_eq!(j.score, 1.0, "{p}: {j:?}");
    }
}

/// Stray paint that forms no object (specks below the detector's size floor) is not free: it
/// lowers `Exclusive` in proportion to its share of the painted pixels.
#[test]
fn stray_paint_lowers_exclusive() {
    let o = RenderOptions::default();
    let asked = spec("a red circle");
    let clean = render(&asked, 7, &o).unwrap().image;
    assert_eq!(judge(&asked, &clean).score, 1.0);
    let (_, paint) = shapes::detect_with_paint(&clean);
    assert_eq!(paint.clean_fraction(), 1.0);

    // 2x2 blue specks on a coarse lattice, away from the circle
    let mut speckled = clean.clone();
    let n = IMAGE_SIZE;
    let mut specks = 0;
    for y in (1..n - 2).step_by(6) {
        for x in (1..n - 2).step_by(6) {
            let free = (0..2).all(|d| {
                (0..2).all(|e| {
                    speckled.pixel(x + d, y + e) == BACKGROUND && {
                        let (xx, yy) = (x + d, y + e);
                        (xx.saturating_sub(1)..=xx + 1).all(|a| {
                            (yy.saturating_sub(1)..=yy + 1).all(|b| clean.pixel(a, b) == BACKGROUND)
                        })
                    }
                })
            });
            if free {
                for d in 0..2 {
                    for e in 0..2 {
                        speckled.set_pixel(x + d, y + e, Colour::Blue.rgb());
                    }
                }
                specks += 1;
            }
        }
    }
    assert!(specks >= 10, "{specks} specks");
    let j = judge(&asked, &speckled);
    assert_eq!(
        j.detections.len(),
        1,
        "specks are not objects: {:?}",
        j.detections
    );
    assert_eq!(j.mean_of(ConstraintKind::Object), Some(1.0));
    let (_, paint) = shapes::detect_with_paint(&speckled);
    assert_eq!(paint.painted - paint.in_objects, 4 * specks);
    let expected = (paint.clean_fraction() / 0.95).min(1.0);
    assert!(expected < 0.9, "{paint:?}");
    assert_eq!(j.mean_of(ConstraintKind::Exclusive), Some(expected));
    assert_eq!(
        j.score, expected,
        "everything asked is there, times Exclusive: {j:?}"
    );
}

/// The reward hack RL found against an averaged `Exclusive`: the asked object among many
/// blocky blobs of paint. Each blob is a detected object of some shape and colour, so
/// `Object` and `Colour` hold; as a factor, `Exclusive` takes their share of the score away.
#[test]
fn spraying_blobs_around_the_asked_object_does_not_pay() {
    let o = RenderOptions::default();
    let asked = spec("a red circle");
    let clean = render(&asked, 7, &o).unwrap().image;
    assert_eq!(judge(&asked, &clean).score, 1.0);
    // 5x5 squares of the other colours on a lattice, wherever they stay clear of the circle
    let mut sprayed = clean.clone();
    let n = IMAGE_SIZE;
    let colours = [Colour::Blue, Colour::Green, Colour::Yellow, Colour::Purple];
    let mut blobs = 0;
    for (k, (x, y)) in (0..n - 5)
        .step_by(8)
        .flat_map(|y| (0..n - 5).step_by(8).map(move |x| (x, y)))
        .enumerate()
    {
        let clear = (x.saturating_sub(1)..(x + 6).min(n)).all(|a| {
            (y.saturating_sub(1)..(y + 6).min(n)).all(|b| clean.pixel(a, b) == BACKGROUND)
        });
        if clear {
            for a in x..x + 5 {
                for b in y..y + 5 {
                    sprayed.set_pixel(a, b, colours[k % colours.len()].rgb());
                }
            }
            blobs += 1;
        }
    }
    assert!(blobs >= 6, "{blobs} blobs");
    let j = judge(&asked, &sprayed);
    assert_eq!(j.mean_of(ConstraintKind::Object), Some(1.0), "{j:?}");
    assert_eq!(j.mean_of(ConstraintKind::Colour), Some(1.0), "{j:?}");
    let exclusive = j.mean_of(ConstraintKind::Exclusive).unwrap();
    assert!(
        j.detections.len() > blobs / 2 && exclusive < 0.3,
        "the blobs are objects the prompt did not ask for: {j:?}"
    );
    // averaged, the three constraints would still give (1 + 1 + exclusive) / 3 > 2/3
    assert_eq!(j.score, exclusive, "{j:?}");
    assert!(j.score < 0.3, "{j:?}");
}

/// A red superellipse `|x|^p + |y|^p <= r^p` centred on the canvas, 4x4 supersampled and
/// blended into the background: `p = 2` is a circle, large `p` a square.
fn superellipse(p: f64, r: f64) -> RgbImage {
    let c = IMAGE_SIZE as f64 / 2.0;
    let red = Colour::Red.rgb();
    RgbImage::from_fn(IMAGE_SIZE, IMAGE_SIZE, |x, y| {
        let mut hits = 0;
        for sy in 0..4 {
            for sx in 0..4 {
                let u = (x as f64 + (sx as f64 + 0.5) / 4.0 - c).abs() / r;
                let v = (y as f64 + (sy as f64 + 0.5) / 4.0 - c).abs() / r;
                hits += (u.powf(p) + v.powf(p) <= 1.0) as u32;
            }
        }
        let a = hits as f64 / 16.0;
        std::array::from_fn(|i| {
            (BACKGROUND[i] as f64 + a * (red[i] as f64 - BACKGROUND[i] as f64)).round() as u8
        })
    })
}

#[test]
fn graded_shape_credit_is_half_at_a_tie_and_full_at_the_margin() {
    let image = superellipse(2.0, 7.0);
    let d = reward::shapes::detect(&image).remove(0);
    assert_eq!(d.shape, Shape::Circle);
    assert_eq!(d.fit(), d.fit_of(Shape::Circle));
    let lead = d.fit() - d.fit_of(Shape::Square).max(d.fit_of(Shape::Triangle));
    assert!(lead > 0.05, "{d:?}");
    let graded = |margin| ShapeCredit::graded(margin).expect("a positive margin");
    // full credit once the lead reaches the margin, none for the shapes it leads
    assert_eq!(d.shape_credit(Shape::Circle, graded(lead)), 1.0);
    assert_eq!(d.shape_credit(Shape::Square, graded(lead)), 0.0);
    // a lead of half the margin is three quarters of the way
    let c = d.shape_credit(Shape::Circle, graded(2.0 * lead));
    assert!((c - 0.75).abs() < 1e-12, "{c}");
    assert_eq!(d.shape_credit(Shape::Circle, ShapeCredit::BestFit), 1.0);
    assert_eq!(d.shape_credit(Shape::Square, ShapeCredit::BestFit), 0.0);
    // a tie is one half for each of the tied shapes
    let tie = reward::shapes::Detection {
        fits: [0.7, 0.7, 0.6],
        ..d.clone()
    };
    assert_eq!(tie.shape_credit(Shape::Square, ShapeCredit::GRADED), 0.5);
    assert_eq!(tie.shape_credit(Shape::Circle, ShapeCredit::GRADED), 0.5);
    assert_eq!(tie.shape_credit(Shape::Triangle, ShapeCredit::GRADED), 0.0);
}

/// A graded margin that is not a finite positive lead is refused by name, with the value.
#[test]
fn a_graded_margin_must_be_finite_and_positive() {
    for bad in [0.0, -0.04, f64::NAN, f64::INFINITY] {
        let err = ShapeCredit::graded(bad).expect_err("a margin that is not a positive lead");
        let text = err.to_string();
        assert!(
            text.contains("margin") && text.contains(&bad.to_string()),
            "{text}"
        );
    }
    assert_eq!(ShapeCredit::graded(0.04).unwrap(), ShapeCredit::GRADED);
}

/// A circle morphed into a square: the best-fit judge's score for "a red circle" falls from 1
/// to 0 in one jump, the graded judge's in steps that never rise, through partial credit.
#[test]
fn the_graded_judge_scores_a_morph_smoothly() {
    let spec = spec("a red circle");
    let (mut graded, mut best_fit) = (Vec::new(), Vec::new());
    for i in 0..=40 {
        let image = superellipse(2.0 + 0.25 * i as f64, 6.5);
        graded.push(judge_with(&spec, &image, ShapeCredit::GRADED).score);
        best_fit.push(judge_with(&spec, &image, ShapeCredit::BestFit).score);
    }
    eprintln!("graded {graded:.3?}\nbest fit {best_fit:.3?}");
    assert_eq!((graded[0], best_fit[0]), (1.0, 1.0));
    assert_eq!((graded[40], best_fit[40]), (0.0, 0.0));
    assert!(
        best_fit.iter().all(|s| *s == 0.0 || *s == 1.0),
        "{best_fit:?}"
    );
    for w in graded.windows(2) {
        assert!(
            w[1] <= w[0] + 1e-12,
            "the score rose along the morph: {graded:?}"
        );
    }
    let partial = graded.iter().filter(|s| **s > 0.02 && **s < 0.98).count();
    assert!(partial >= 3, "too few partial scores: {graded:?}");
    // the default judge is the best-fit one
    let image = superellipse(4.0, 6.5);
    assert_eq!(
        judge(&spec, &image),
        judge_with(&spec, &image, ShapeCredit::BestFit)
    );
}

/// Judging one image twice gives the same bits: the coverage map's sums (area, centroid) add
/// in one order (they followed a hash map's per-instance order, and a centroid could differ in
/// its last bits between two judgements).
#[test]
fn judging_is_bit_for_bit_repeatable() {
    let o = RenderOptions::default();
    for category in Category::ALL {
        for (i, s) in SceneSpec::all(category).iter().take(6).enumerate() {
            let image = blurred(&render(s, i as u64, &o).unwrap().image);
            let first = judge(s, &image);
            for _ in 0..4 {
                let again = judge(s, &image);
                assert_eq!(again, first, "{s}");
                let bits = |j: &reward::shapes::Judgement| {
                    j.detections
                        .iter()
                        .map(|d| (d.centroid.0.to_bits(), d.centroid.1.to_bits()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(bits(&again), bits(&first), "{s}");
            }
        }
    }
}
