//! The data tools on small inputs: conversion with bad rows reported by line, dedup, filters,
//! a split that a rerun reproduces byte for byte, nested eval subsets, leakage detection.

use std::path::{Path, PathBuf};

use prompt_data::{
    CurateOptions, DataError, PromptRecord, SourceFormat, Split, convert, curate, inspect,
    read_jsonl, split_key, write_jsonl,
};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn prompts(path: &Path) -> Vec<String> {
    read_jsonl(path)
        .unwrap()
        .into_iter()
        .map(|(_, r)| r.prompt)
        .collect()
}

#[test]
fn convert_text_and_jsonl_into_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let txt = write(
        dir.path(),
        "p.txt",
        "a red panda in a teacup\n\n  two blue squares  \n",
    );
    let out = dir.path().join("t.jsonl");
    let r = convert(&txt, &SourceFormat::Text, "t2i", "demo_", &out, false).unwrap();
    assert_eq!((r.written, r.blank), (2, 1));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text.lines().next().unwrap(),
        r#"{"prompt":"a red panda in a teacup","metadata":{"task":"t2i","sample_id":"demo_0000001"}}"#
    );
    let recs = read_jsonl(&out).unwrap();
    assert_eq!(recs[1].1.prompt, "two blue squares");
    assert_eq!(
        recs[1].1.metadata.sample_id, "demo_0000003",
        "ids are input line numbers"
    );

    // JSONL: the first of prompt / caption / text, or the field named (replacing `out`)
    let jl = write(
        dir.path(),
        "p.jsonl",
        "{\"caption\": \"a cat\"}\n{\"prompt\": \"a dog\", \"caption\": \"x\"}\n",
    );
    let fmt = SourceFormat::from_path(&jl, None).unwrap();
    convert(&jl, &fmt, "t2i", "", &out, true).unwrap();
    assert_eq!(prompts(&out), ["a cat", "a dog"]);
    let fmt = SourceFormat::Jsonl {
        field: Some("caption".into()),
    };
    convert(&jl, &fmt, "t2i", "", &out, true).unwrap();
    assert_eq!(prompts(&out), ["a cat", "x"]);
}

#[test]
fn bad_rows_are_reported_by_line_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let jl = write(
        dir.path(),
        "bad.jsonl",
        "{\"prompt\": \"ok\"}\nnot json\n{\"prompt\": 3}\n{\"other\": \"x\"}\n{\"prompt\": \"  \"}\n",
    );
    let out = dir.path().join("out.jsonl");
    let err = convert(
        &jl,
        &SourceFormat::Jsonl { field: None },
        "t2i",
        "",
        &out,
        false,
    )
    .unwrap_err();
    let DataError::BadLines { problems } = &err else {
        panic!("{err}")
    };
    let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [2, 3, 4, 5]);
    assert!(
        problems[0].to_string().contains("bad.jsonl:2: not JSON"),
        "{}",
        problems[0]
    );
    assert!(problems[1].problem.contains("not a string"));
    assert!(
        problems[2]
            .problem
            .contains("no prompt / caption / text field")
    );
    assert!(!out.exists(), "a failed conversion writes nothing");

    let err = convert(&jl, &SourceFormat::Text, "txt2img", "", &out, false).unwrap_err();
    assert!(err.to_string().contains("task = txt2img"), "{err}");
    let err = SourceFormat::from_path(Path::new("x.csv"), None).unwrap_err();
    assert!(
        err.to_string().contains(".parquet (a prompt column)"),
        "{err}"
    );

    // the unified reader names missing keys
    let u = write(
        dir.path(),
        "u.jsonl",
        "{\"prompt\": \"a\", \"metadata\": {\"task\": \"t2i\"}}\n",
    );
    let err = read_jsonl(&u).unwrap_err();
    assert!(
        err.to_string()
            .contains("u.jsonl:1: missing required key(s) metadata.sample_id"),
        "{err}"
    );
}

/// 40 records: 30 distinct prompts of 6+ words, 4 duplicates of them, 6 short ones.
fn raw(dir: &Path) -> PathBuf {
    let mut records = Vec::new();
    for i in 0..30 {
        records.push(PromptRecord::new(
            format!("a photo of object number {i} on a table"),
            "t2i",
            format!("s{i:03}"),
        ));
    }
    for i in 0..4 {
        records.push(PromptRecord::new(
            format!("a photo of object number {i} on a table"),
            "t2i",
            format!("dup{i}"),
        ));
    }
    for i in 0..6 {
        records.push(PromptRecord::new(
            format!("short {i}"),
            "t2i",
            format!("short{i}"),
        ));
    }
    let p = dir.join("raw.jsonl");
    write_jsonl(&p, &records).unwrap();
    p
}

fn options(split: Split) -> CurateOptions {
    CurateOptions {
        min_prompt_words: 6,
        check_media: true,
        split,
        prefix: "demo_".into(),
        overwrite: false,
    }
}

#[test]
fn curate_dedups_filters_and_splits_reproducibly() {
    let dir = tempfile::tempdir().unwrap();
    let input = raw(dir.path());
    let split = Split::EvalSize {
        size: 8,
        subsets: vec![2, 4],
    };
    let r = curate(&input, &dir.path().join("a"), &options(split.clone())).unwrap();
    assert_eq!(
        (
            r.read,
            r.duplicates,
            r.too_short,
            r.missing_media,
            r.train,
            r.eval
        ),
        (40, 4, 6, 0, 22, 8)
    );
    let names: Vec<String> = r
        .files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "demo_train.jsonl",
            "demo_eval.jsonl",
            "demo_eval2.jsonl",
            "demo_eval4.jsonl"
        ]
    );
    // the eval set is the 8 smallest split keys; subsets nest
    let ids = |f: &str| -> Vec<String> {
        read_jsonl(&dir.path().join("a").join(f))
            .unwrap()
            .into_iter()
            .map(|(_, r)| r.metadata.sample_id)
            .collect()
    };
    let mut keys: Vec<(u64, String)> = (0..30)
        .map(|i| format!("s{i:03}"))
        .map(|s| (split_key(&s), s))
        .collect();
    keys.sort();
    let mut want: Vec<String> = keys[..8].iter().map(|k| k.1.clone()).collect();
    want.sort();
    assert_eq!(ids("demo_eval.jsonl"), want);
    for small in ["demo_eval2.jsonl", "demo_eval4.jsonl"] {
        assert!(ids(small).iter().all(|id| want.contains(id)));
    }
    assert!(
        ids("demo_eval2.jsonl")
            .iter()
            .all(|id| ids("demo_eval4.jsonl").contains(id))
    );
    assert!(ids("demo_train.jsonl").iter().all(|id| !want.contains(id)));

    // a rerun gives the identical bytes
    curate(&input, &dir.path().join("b"), &options(split)).unwrap();
    for f in &names {
        assert_eq!(
            std::fs::read(dir.path().join("a").join(f)).unwrap(),
            std::fs::read(dir.path().join("b").join(f)).unwrap(),
            "{f}"
        );
    }
    // the curated files pass inspection
    let evals: Vec<PathBuf> = names[1..]
        .iter()
        .map(|f| dir.path().join("a").join(f))
        .collect();
    let report = inspect(&dir.path().join("a/demo_train.jsonl"), &evals, true).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.records[0].1, 22);

    // a fraction split: a record's side depends on its id alone
    let frac = curate(
        &input,
        &dir.path().join("c"),
        &options(Split::EvalFraction(0.25)),
    )
    .unwrap();
    assert_eq!(frac.train + frac.eval, 30);
    assert!(frac.eval > 0 && frac.eval < 30);
}

#[test]
fn curate_refuses_what_it_cannot_split_and_drops_missing_media() {
    let dir = tempfile::tempdir().unwrap();
    let input = raw(dir.path());
    let too_big = Split::EvalSize {
        size: 31,
        subsets: vec![],
    };
    let err = curate(&input, &dir.path().join("x"), &options(too_big)).unwrap_err();
    assert!(
        err.to_string().contains("at most the 30 records left"),
        "{err}"
    );
    let bad_subset = Split::EvalSize {
        size: 4,
        subsets: vec![8],
    };
    assert!(curate(&input, &dir.path().join("x"), &options(bad_subset)).is_err());

    let mut a = PromptRecord::new(
        "<image> make it a watercolour painting please now",
        "i2i",
        "m1",
    );
    a.media = vec!["exists.png".into()];
    let mut b = PromptRecord::new(
        "<image> make it an oil painting please right now",
        "i2i",
        "m2",
    );
    b.media = vec!["missing.png".into()];
    std::fs::write(dir.path().join("exists.png"), b"png").unwrap();
    let p = dir.path().join("media.jsonl");
    write_jsonl(&p, &[a, b]).unwrap();
    let split = Split::EvalSize {
        size: 0,
        subsets: vec![],
    };
    let r = curate(&p, &dir.path().join("m"), &options(split.clone())).unwrap();
    assert_eq!((r.missing_media, r.train), (1, 1));
    let keep = CurateOptions {
        check_media: false,
        ..options(split)
    };
    assert_eq!(curate(&p, &dir.path().join("m2"), &keep).unwrap().train, 2);

    let rep = write(
        dir.path(),
        "rep.jsonl",
        &format!(
            "{}\n{}\n",
            serde_json::to_string(&PromptRecord::new(
                "one two three four five six",
                "t2i",
                "x"
            ))
            .unwrap(),
            serde_json::to_string(&PromptRecord::new(
                "seven eight nine ten eleven twelve",
                "t2i",
                "x"
            ))
            .unwrap()
        ),
    );
    let err = curate(
        &rep,
        &dir.path().join("r"),
        &options(Split::EvalFraction(0.1)),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("rep.jsonl:2: sample_id \"x\" already used on line 1"),
        "{err}"
    );
}

#[test]
fn inspect_finds_leakage_and_bad_records_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let train = write(
        dir.path(),
        "train.jsonl",
        concat!(
            r#"{"prompt": "a cat on a mat", "metadata": {"task": "t2i", "sample_id": "a"}}"#,
            "\n",
            r#"{"prompt": "a dog", "metadata": {"task": "t2i", "sample_id": "b"}}"#,
            "\n",
        ),
    );
    let eval = write(
        dir.path(),
        "eval.jsonl",
        concat!(
            r#"{"prompt": "something new", "metadata": {"task": "t2i", "sample_id": "a"}}"#,
            "\n",
            r#"{"prompt": "a dog", "metadata": {"task": "t2i", "sample_id": "z"}}"#,
            "\n",
            r#"{"prompt": "<image> restyle", "metadata": {"task": "i2i", "sample_id": "c"}}"#,
            "\n",
            r#"{"prompt": "x", "metadata": {"task": "text", "sample_id": "d"}}"#,
            "\n",
            r#"{"prompt": "y", "metadata": {"task": "t2i", "sample_id": "d"}}"#,
            "\n",
            r#"{"prompt": "no metadata"}"#,
            "\n",
        ),
    );
    let report = inspect(&train, &[eval], false).unwrap();
    let found: Vec<(usize, &str)> = report
        .problems
        .iter()
        .map(|p| (p.line, p.problem.as_str()))
        .collect();
    let has = |line: usize, text: &str| found.iter().any(|(l, p)| *l == line && p.contains(text));
    assert!(has(1, "leakage: sample_id \"a\""), "{found:?}");
    assert!(has(2, "leakage: the same prompt and media"), "{found:?}");
    assert!(has(3, "1 placeholder(s)"), "{found:?}");
    assert!(has(4, "metadata.task \"text\""), "{found:?}");
    assert!(has(5, "sample_id \"d\" already on line 4"), "{found:?}");
    assert!(has(6, "missing required key(s) metadata"), "{found:?}");
    assert_eq!(found.len(), 6, "{found:?}");
}

fn parquet_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("fixtures/prompt_data").join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("fixtures/prompt_data/{name}"))
}

#[test]
fn parquet_columns_convert_with_bad_rows_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.jsonl");
    // pyarrow's snappy file: a null and an empty prompt are rows 2 and 4
    let src = parquet_fixture("prompts.parquet");
    let fmt = SourceFormat::from_path(&src, None).unwrap();
    assert_eq!(fmt, SourceFormat::Parquet { column: None });
    let err = convert(&src, &fmt, "t2i", "pq_", &out, false).unwrap_err();
    let DataError::BadLines { problems } = &err else {
        panic!("{err}")
    };
    let found: Vec<(usize, &str)> = problems
        .iter()
        .map(|p| (p.line, p.problem.as_str()))
        .collect();
    assert_eq!(found, [(2, "column prompt is null"), (4, "empty prompt")]);
    assert!(!out.exists());

    // the uncompressed file's caption column, found without naming it
    let src = parquet_fixture("captions.parquet");
    let r = convert(
        &src,
        &SourceFormat::from_path(&src, None).unwrap(),
        "t2i",
        "c_",
        &out,
        false,
    )
    .unwrap();
    assert_eq!(r.written, 2);
    let recs = read_jsonl(&out).unwrap();
    assert_eq!(recs[1].1.prompt, "a bird");
    assert_eq!(recs[1].1.metadata.sample_id, "c_0000002");

    // a column that is not there, and a codec this build does not read, are named (`out`
    // exists now: replacing it is allowed, so the input's problem is what is reported)
    let fmt = SourceFormat::Parquet {
        column: Some("text".into()),
    };
    let err = convert(&src, &fmt, "t2i", "", &out, true).unwrap_err();
    assert!(
        err.to_string()
            .contains("no text column (the file has [\"caption\"]"),
        "{err}"
    );
    let src = parquet_fixture("zstd.parquet");
    let err = convert(
        &src,
        &SourceFormat::Parquet { column: None },
        "t2i",
        "",
        &out,
        true,
    )
    .unwrap_err();
    assert!(matches!(err, DataError::Parquet { .. }), "{err}");
    assert!(err.to_string().to_lowercase().contains("zstd"), "{err}");
}

#[test]
fn decode_media_opens_every_image() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("ok.png");
    image::RgbImage::from_pixel(2, 2, image::Rgb([1, 2, 3]))
        .save(&png)
        .unwrap();
    std::fs::write(dir.path().join("broken.png"), b"not a png").unwrap();
    let rec = |id: &str, media: &str| {
        let mut r = PromptRecord::new("<image> restyle it", "i2i", id);
        r.media = vec![media.into()];
        r
    };
    let train = dir.path().join("train.jsonl");
    write_jsonl(
        &train,
        &[
            rec("a", "ok.png"),
            rec("b", "broken.png"),
            rec("c", "missing.png"),
            rec("d", "clip.mp4"),
        ],
    )
    .unwrap();
    assert!(inspect(&train, &[], false).unwrap().is_clean());
    let report = inspect(&train, &[], true).unwrap();
    let found: Vec<(usize, &str)> = report
        .problems
        .iter()
        .map(|p| (p.line, p.problem.as_str()))
        .collect();
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0].0 == 2 && found[0].1.contains("does not decode"),
        "{found:?}"
    );
    assert!(
        found[1].0 == 3 && found[1].1.contains("cannot be opened"),
        "{found:?}"
    );
    assert!(
        found[2].0 == 4 && found[2].1.contains("PNG and JPEG images only"),
        "{found:?}"
    );
}

#[test]
fn a_field_is_refused_for_a_text_input() {
    let err = SourceFormat::from_path(Path::new("dir/p.txt"), Some("caption".into())).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("field = \"caption\""), "{msg}");
    assert!(msg.contains("no field for dir/p.txt"), "{msg}");
    assert!(msg.contains("a .txt input is one prompt per line"), "{msg}");
    assert_eq!(
        SourceFormat::from_path(Path::new("p.txt"), None).unwrap(),
        SourceFormat::Text
    );
    assert_eq!(
        SourceFormat::from_path(Path::new("p.jsonl"), Some("caption".into())).unwrap(),
        SourceFormat::Jsonl {
            field: Some("caption".into())
        }
    );
    assert_eq!(
        SourceFormat::from_path(Path::new("p.parquet"), Some("caption".into())).unwrap(),
        SourceFormat::Parquet {
            column: Some("caption".into())
        }
    );
}

#[test]
fn convert_replaces_an_output_only_with_overwrite_and_never_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let txt = write(dir.path(), "p.txt", "a red panda\n");
    let out = write(dir.path(), "out.jsonl", "keep\n");
    let err = convert(&txt, &SourceFormat::Text, "t2i", "", &out, false).unwrap_err();
    let DataError::OutputExists { paths } = &err else {
        panic!("{err}")
    };
    assert_eq!(paths, std::slice::from_ref(&out));
    assert!(err.to_string().contains("out.jsonl"), "{err}");
    assert!(err.to_string().contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep\n");
    convert(&txt, &SourceFormat::Text, "t2i", "", &out, true).unwrap();
    assert_eq!(prompts(&out), ["a red panda"]);

    // the input as the output, however spelled, even with overwrite: nothing is touched
    let src = "{\"prompt\": \"a cat\", \"score\": 3}\n";
    let jl = write(dir.path(), "p.jsonl", src);
    let fmt = SourceFormat::Jsonl { field: None };
    let new = dir.path().join("new");
    for spelled in [
        jl.clone(),
        dir.path().join(".").join("p.jsonl"),
        new.join("..").join("p.jsonl"),
    ] {
        let err = convert(&jl, &fmt, "t2i", "", &spelled, true).unwrap_err();
        let DataError::OutputIsInput { output, input } = &err else {
            panic!("{}: {err}", spelled.display())
        };
        assert_eq!((output, input), (&spelled, &jl));
        assert!(
            err.to_string().contains("must not replace what it reads"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&jl).unwrap(), src);
    }
    assert!(!new.exists(), "a refused conversion creates no directory");

    #[cfg(unix)]
    {
        // a symlink to the input is the input; a dangling symlink is an existing output
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&jl, &link).unwrap();
        let err = convert(&jl, &fmt, "t2i", "", &link, true).unwrap_err();
        assert!(matches!(err, DataError::OutputIsInput { .. }), "{err}");
        let dangling = dir.path().join("dangling.jsonl");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let err = convert(&jl, &fmt, "t2i", "", &dangling, false).unwrap_err();
        assert!(matches!(err, DataError::OutputExists { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&jl).unwrap(), src);
    }
}

#[test]
fn curate_checks_every_output_before_writing_any() {
    let dir = tempfile::tempdir().unwrap();
    let input = raw(dir.path());
    let split = Split::EvalSize {
        size: 8,
        subsets: vec![2, 4],
    };
    let o = dir.path().join("o");
    std::fs::create_dir(&o).unwrap();
    let eval = write(&o, "demo_eval.jsonl", "keep eval\n");
    let eval4 = write(&o, "demo_eval4.jsonl", "keep eval4\n");
    let err = curate(&input, &o, &options(split.clone())).unwrap_err();
    let DataError::OutputExists { paths } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        paths,
        &[eval.clone(), eval4.clone()],
        "every existing output named"
    );
    assert!(!o.join("demo_train.jsonl").exists(), "nothing written");
    assert!(!o.join("demo_eval2.jsonl").exists(), "nothing written");
    assert_eq!(std::fs::read_to_string(&eval4).unwrap(), "keep eval4\n");

    let replace = CurateOptions {
        overwrite: true,
        ..options(split.clone())
    };
    let r = curate(&input, &o, &replace).unwrap();
    assert_eq!(r.files.len(), 4);
    assert_eq!(ids_of(&eval4).len(), 4);

    // curating a train file into itself is refused even with overwrite, however spelled
    let train = o.join("demo_train.jsonl");
    let before = std::fs::read(&train).unwrap();
    let new = o.join("new");
    for out_dir in [o.clone(), new.join("..")] {
        let err = curate(&train, &out_dir, &replace).unwrap_err();
        let DataError::OutputIsInput { output, input } = &err else {
            panic!("{}: {err}", out_dir.display())
        };
        assert_eq!((output, input), (&out_dir.join("demo_train.jsonl"), &train));
    }
    assert!(!new.exists());
    assert_eq!(std::fs::read(&train).unwrap(), before);

    // so is an input at an output's staging path (`<output>.tmp`, renamed onto the output)
    let staged = o.join("demo_train.jsonl.tmp");
    std::fs::copy(&train, &staged).unwrap();
    let err = curate(&staged, &o, &replace).unwrap_err();
    let DataError::OutputIsInput { output, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(output, &staged);
    assert!(staged.exists());
    assert_eq!(std::fs::read(&train).unwrap(), before);
}

fn ids_of(path: &Path) -> Vec<String> {
    read_jsonl(path)
        .unwrap()
        .into_iter()
        .map(|(_, r)| r.metadata.sample_id)
        .collect()
}
