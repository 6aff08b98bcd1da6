//! The repository explains itself: its docs point at nothing it does not
//! hold.

use std::path::{Path, PathBuf};

use crate::support::{Said, Workspace};

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

/// The README and every page of `docs/`, each with its path.
fn pages() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

#[test]
fn every_link_of_the_docs_resolves_and_they_name_no_file_the_repository_lacks() {
    let pages = pages();
    assert!(pages.len() > 1, "docs/ has no pages");
    for (path, text) in &pages {
        let here = path.parent().unwrap();
        for target in relative_links(text) {
            assert!(
                here.join(&target).exists(),
                "{} links to missing {target}",
                path.display()
            );
        }
        for outside in ["SPEC.md", "SPEC §", "NOTES.md", "../shared"] {
            assert!(
                !text.contains(outside),
                "{} points at {outside}, which the repository does not hold",
                path.display()
            );
        }
    }
}

/// The `toml` code blocks of a Markdown text that are a `jobs.toml` or a
/// part of one (they open a `[scheduler]`, `[api]` or `[[job]]` table).
fn jobs_tomls(text: &str) -> Vec<String> {
    text.split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .filter(|block| {
            block.lines().any(|line| {
                ["[scheduler]", "[api]", "[[job]]"]
                    .contains(&line.split('#').next().unwrap_or("").trim())
            })
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_jobs_toml_of_the_docs_passes_check() {
    let mut checked = 0;
    for (path, text) in pages() {
        for block in jobs_tomls(&text) {
            // A table shown alone is checked beside a job.
            let file = if block.contains("[[job]]") {
                block.clone()
            } else {
                format!(
                    "{block}\n[[job]]\nname = \"x\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n"
                )
            };
            let ws = Workspace::new(&file);
            let out = ws.run(&["check"]);
            assert_eq!(
                out.code(),
                0,
                "{}: this jobs.toml fails `scheduler check`:\n{block}\n{}",
                path.display(),
                out.stderr()
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 3,
        "only {checked} jobs.toml blocks found in the docs"
    );
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
