//! "Did you mean …?": the nearest valid value to a misspelt one.

/// The candidate closest to `given`, if one is close enough to be a likely
/// misspelling (case is ignored).
pub fn nearest<'a>(given: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let given = given.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&given, &c.to_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::nearest;

    #[test]
    fn a_misspelling_finds_its_word_and_nonsense_finds_none() {
        assert_eq!(nearest("schedul", ["name", "schedule"]), Some("schedule"));
        assert_eq!(
            nearest("europe/berln", ["Europe/Berlin", "UTC"]),
            Some("Europe/Berlin")
        );
        assert_eq!(nearest("zzzz", ["name", "schedule"]), None);
    }
}
