//! The repository explains itself: its docs point at nothing it does not
//! hold.

use std::path::Path;

/// The relative link targets of a Markdown text: `[text](target)`, without
/// any `#anchor`; web addresses left out.
fn relative_links(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap_or_default();
            let web = target.contains("://") || target.starts_with("mailto:");
            (!web && !target.is_empty()).then(|| target.to_owned())
        })
        .collect()
}

#[test]
fn every_link_of_the_readme_resolves_and_it_names_no_file_the_repository_lacks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for target in relative_links(&readme) {
        assert!(
            root.join(&target).exists(),
            "README.md links to missing {target}"
        );
    }
    for outside in ["SPEC.md", "SPEC §", "NOTES.md", "../shared"] {
        assert!(
            !readme.contains(outside),
            "README.md points at {outside}, which the repository does not hold"
        );
    }
}
