//! Keeps the layer map of `docs/ARCHITECTURE.md` true: reads `cargo metadata` and fails on any
//! dependency between workspace crates that the map does not allow (an upward dependency, a
//! model crate that knows about RL, a crate the map does not know).

use std::collections::BTreeMap;
use std::process::Command;

/// The layer of every workspace crate (lower layers never depend on higher ones).
const LAYERS: &[(&str, u8)] = &[
    ("sde-math", 0),
    ("schedule", 0),
    ("noise-recipe", 0),
    ("velocity-model", 0),
    ("keyed-rng", 0),
    ("fused-ops", 0),
    ("durable", 1),
    ("trajectory", 1),
    ("flow-grpo", 1),
    ("prompt-data", 1),
    ("model-weights", 2),
    ("dit-models", 2),
    ("qwen-image", 2),
    ("reward", 2),
    ("trainer-fsdp", 3),
    ("flowrl", 4),
];

/// Edges forbidden although they point down: the model crates know nothing about RL.
const FORBIDDEN: &[(&str, &str)] = &[
    ("dit-models", "trajectory"),
    ("dit-models", "flow-grpo"),
    ("dit-models", "sde-math"),
    ("dit-models", "noise-recipe"),
    ("qwen-image", "trajectory"),
    ("qwen-image", "flow-grpo"),
    ("qwen-image", "sde-math"),
    ("qwen-image", "noise-recipe"),
    ("reward", "trajectory"),
    ("reward", "flow-grpo"),
    ("reward", "sde-math"),
    ("reward", "noise-recipe"),
    ("model-weights", "trajectory"),
    ("model-weights", "flow-grpo"),
    ("model-weights", "sde-math"),
    ("model-weights", "noise-recipe"),
];

#[test]
fn dependencies_only_point_down() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let members: Vec<&str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();

    let mut problems = Vec::new();
    for pkg in meta["packages"].as_array().unwrap() {
        let name = pkg["name"].as_str().unwrap();
        let Some(&layer) = layers.get(name) else {
            problems.push(format!("workspace crate `{name}` is not in the layer map (docs/ARCHITECTURE.md, tests/architecture.rs)"));
            continue;
        };
        for dep in pkg["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            if !members.contains(&dep_name) || dep["kind"].as_str() == Some("dev") {
                continue;
            }
            let dep_layer = layers[dep_name];
            if dep_layer > layer {
                problems.push(format!(
                    "`{name}` (layer {layer}) depends upward on `{dep_name}` (layer {dep_layer})"
                ));
            }
            if FORBIDDEN.contains(&(name, dep_name)) {
                problems.push(format!(
                    "`{name}` must not depend on `{dep_name}` (model crates know nothing about RL)"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering violations:\n  {}",
        problems.join("\n  ")
    );
    assert!(
        members.contains(&"sde-math"),
        "the metadata lists the workspace: {members:?}"
    );
}
