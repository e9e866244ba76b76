//! This workspace against docs/architecture.md: no import circle but the known ones, no import against the
//! layers, no crate dependency against the crate order.

use std::path::Path;

#[test]
fn the_workspace_is_layered_as_docs_architecture_md_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let breaches = layer_check::breaches(root).expect("the workspace and its docs are readable");
    assert!(
        breaches.is_empty(),
        "{} breaches of docs/architecture.md (## Layers):\n{}",
        breaches.len(),
        breaches.join("\n")
    );
}
