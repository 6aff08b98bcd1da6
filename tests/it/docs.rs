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

#[test]
fn the_systemd_unit_rates_ok_under_systemd_analyze_security() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/scheduler.service");
    let analysed = std::process::Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(&unit)
        .output();
    let Ok(out) = analysed else {
        eprintln!("systemd-analyze is not installed: the unit's rating is not checked");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let overall = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no rating:\n{text}{}", String::from_utf8_lossy(&out.stderr)));
    let level: f64 = overall
        .rsplit(": ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{overall}"));
    assert!(level < 2.0 && overall.contains(" OK"), "{overall}");
}

#[test]
fn the_image_ships_no_jobs_toml_and_its_context_leaves_out_build_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    assert!(
        !dockerfile
            .lines()
            .any(|l| l.starts_with("COPY") && l.contains("jobs.toml")),
        "the image would run the demo jobs.toml when none is mounted"
    );
    let ignored = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    for entry in ["target", ".git"] {
        assert!(
            ignored.lines().any(|l| l == entry),
            "{entry} in the build context"
        );
    }
}
