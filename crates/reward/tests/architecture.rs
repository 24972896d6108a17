//! The crate's invariant: a model crate knows nothing about RL. It may depend on no crate of
//! the RL side of the workspace (the workspace-wide check is the facade's
//! `tests/architecture.rs`; this one fails fast inside the crate).

#[test]
fn depends_on_no_rl_crate() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let mut section = String::new();
    let mut deps = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if section.contains("dependencies")
            && let Some((name, _)) = line.split_once(['=', '.'])
        {
            deps.push(name.trim().to_string());
        }
    }
    assert!(
        deps.iter().any(|d| d == "burn"),
        "parsed no dependencies: {deps:?}"
    );
    for forbidden in [
        "sde-math",
        "noise-recipe",
        "trajectory",
        "flow-grpo",
        "dit-models",
        "trainer-fsdp",
        "flowrl",
    ] {
        assert!(
            !deps.iter().any(|d| d == forbidden),
            "reward must not depend on {forbidden}"
        );
    }
}
