//! Strings from `jobs.toml` that reach an action: `${VAR}` expanded once at
//! load, `{placeholder}`s found in the file's text at load and filled in for
//! each run.

use std::fmt;
use std::sync::Arc;

use aho_corasick::AhoCorasick;

/// The placeholders a template may name.
pub const PLACEHOLDERS: [&str; 9] = [
    "job",
    "period",
    "period_key",
    "period_start",
    "period_end",
    "scheduled_at",
    "attempt",
    "shard",
    "shards",
];

/// The placeholders only a sharded job's templates may name.
pub const SHARD_PLACEHOLDERS: [&str; 2] = ["shard", "shards"];

/// A string whose placeholders are known to be valid: literal text (with
/// `${VAR}` already expanded) between placeholders.
///
/// Placeholders are found in the file's text, never in an expanded value, so a
/// secret that happens to contain `{period}` stays as it is. Its `Debug`
/// output hides the text: it may hold an expanded secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
    /// The values `${NAME}` was replaced by (in a `shell` script: that
    /// `/bin/sh` will put in), for [`Secrets`].
    expanded: Vec<String>,
}

#[derive(Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Placeholder(&'static str),
}

impl Template {
    /// The whole template, values included: only for hashing into a
    /// job's definition fingerprint, never for showing (it may hold an
    /// expanded secret).
    pub(crate) fn exact(&self) -> String {
        let mut text = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => text.push_str(&t.replace('{', "{{")),
                Piece::Placeholder(name) => {
                    text.push('{');
                    text.push_str(name);
                    text.push('}');
                }
            }
        }
        text
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Template(…)")
    }
}

/// A problem in a template string, with its byte offset in that string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// What went wrong, in words.
    pub message: String,
    /// Where in the string.
    pub offset: usize,
}

/// The values placeholders are replaced by for one run.
pub trait Values {
    /// The value of a placeholder named in [`PLACEHOLDERS`].
    fn value(&self, name: &str) -> String;
}

impl Template {
    /// Checks that every `{name}` is a known placeholder and expands
    /// `${NAME}` from `env` in the text around them (`$${` is a literal `${`).
    pub fn load(
        raw: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Template, TemplateError> {
        Template::load_as(raw, env, Expansion::Replace)
    }

    /// Like [`Template::load`] for a `shell` script: each `${NAME}` must be
    /// set, but stays in the text for `/bin/sh` to expand from the job's
    /// environment, so a value is never read as shell syntax.
    pub fn load_shell(
        raw: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Template, TemplateError> {
        Template::load_as(raw, env, Expansion::Keep)
    }

    fn load_as(
        raw: &str,
        env: &dyn Fn(&str) -> Option<String>,
        how: Expansion,
    ) -> Result<Template, TemplateError> {
        let mut expanded = Vec::new();
        let mut text = |from: usize, to: usize| {
            expand(&raw[from..to], env, how, &mut expanded)
                .map(Piece::Text)
                .map_err(|e| TemplateError {
                    offset: from + e.offset,
                    ..e
                })
        };
        let mut pieces = Vec::new();
        let mut from = 0;
        for (offset, name) in placeholders(raw) {
            let Some(known) = PLACEHOLDERS.iter().find(|p| **p == name) else {
                let hint = crate::suggest::nearest(name, PLACEHOLDERS)
                    .map(|s| format!("; did you mean `{{{s}}}`?"))
                    .unwrap_or_default();
                return Err(TemplateError {
                    message: format!(
                        "unknown placeholder `{{{name}}}`: expected one of {}{hint}",
                        PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                    ),
                    offset,
                });
            };
            pieces.push(text(from, offset)?);
            pieces.push(Piece::Placeholder(known));
            from = offset + name.len() + 2;
        }
        pieces.push(text(from, raw.len())?);
        // Kept for the life of the job, once per template of 10,000 jobs.
        pieces.shrink_to_fit();
        Ok(Template { pieces, expanded })
    }

    /// The values its `${NAME}`s were replaced by.
    pub(crate) fn expanded(&self) -> &[String] {
        &self.expanded
    }

    /// The literal text between placeholders, in order (`${VAR}` expanded).
    pub fn literals(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Text(text) => Some(text.as_str()),
            Piece::Placeholder(_) => None,
        })
    }

    /// The placeholder it is made of, if it is just one.
    pub fn only_placeholder(&self) -> Option<&'static str> {
        let mut pieces = self
            .pieces
            .iter()
            .filter(|piece| !matches!(piece, Piece::Text(text) if text.is_empty()));
        match (pieces.next(), pieces.next()) {
            (Some(Piece::Placeholder(name)), None) => Some(name),
            _ => None,
        }
    }

    /// The text before the first placeholder.
    pub fn prefix(&self) -> &str {
        match self.pieces.first() {
            Some(Piece::Text(text)) => text,
            _ => "",
        }
    }

    /// The text with each placeholder replaced by its value, percent-encoded
    /// where it would change the URL's shape (`#` of a shard's key would
    /// start a fragment): an `http` action's `url`.
    pub fn render_in_url(&self, values: &dyn Values) -> String {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.clone(),
                Piece::Placeholder(name) => percent_encoded(&values.value(name), "/:@!$&'()*+,;="),
            })
            .collect()
    }

    /// The text with each placeholder replaced by its value.
    pub fn render(&self, values: &dyn Values) -> String {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.clone(),
                Piece::Placeholder(name) => values.value(name),
            })
            .collect()
    }
}

/// The values the scheduler holds as secret: every `${NAME}` of its
/// configuration (any job's, an `[api]` token's, the database URL's) and
/// the database password, hidden from every message the scheduler writes
/// and from every job's kept output and log lines, whichever job printed
/// them. Values shorter than [`Secrets::SHORTEST`] are left alone: masking
/// `1` would garble every number in a message, and no secret is that short.
///
/// Cheap to clone: every job of a configuration shares one.
#[derive(Clone, Default)]
pub struct Secrets(Option<Arc<Finder>>);

/// The forms to look for, and one automaton that finds them all in one
/// pass over a text, in any ASCII case.
struct Finder {
    /// The values as given.
    values: Vec<String>,
    /// Each value in every form looked for, in ASCII lower case.
    forms: Vec<String>,
    automaton: AhoCorasick,
}

impl Secrets {
    /// The shortest value that is masked.
    pub const SHORTEST: usize = 4;
    /// No values.
    pub const NONE: Secrets = Secrets(None);

    /// The values `${NAME}` put into `templates`.
    pub fn of<'a>(templates: impl IntoIterator<Item = &'a Template>) -> Secrets {
        Secrets::of_values(templates.into_iter().flat_map(|t| t.expanded().iter()))
    }

    /// `values`, each also in the forms a message may quote it in: as a
    /// URL carries it percent-encoded (a redirect's `Location`, an error
    /// quoting a URL), escaped in a JSON string (a service echoing a
    /// header), and cut to the 63 bytes of a PostgreSQL name (an error
    /// quoting an identifier). They are found whatever the ASCII case
    /// (PostgreSQL folds an unquoted name to lower case).
    pub fn of_values<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> Secrets {
        let mut values: Vec<String> = values
            .into_iter()
            .map(|v| v.as_ref().to_owned())
            .filter(|v| v.chars().count() >= Secrets::SHORTEST)
            .collect();
        values.sort();
        values.dedup();
        // A value of several lines (a PEM key, a JSON credential) is also
        // looked for line by line: a job's output is logged a line at a
        // time, so no log line ever holds the whole value.
        let lines: Vec<String> = values
            .iter()
            .filter(|v| v.contains('\n'))
            .flat_map(|v| v.lines().map(str::trim))
            .filter(|line| line.chars().count() >= Secrets::SHORTEST)
            .map(str::to_owned)
            .collect();
        let mut forms: Vec<String> = values
            .iter()
            .chain(&lines)
            .flat_map(|v| {
                let name = (0..=63.min(v.len()))
                    .rev()
                    .find(|at| v.is_char_boundary(*at))
                    .map(|at| v[..at].to_owned());
                let json = json_escaped(v, false);
                let ascii_json = json_escaped(v, true);
                [
                    Some(v.to_owned()),
                    // Every byte but the unreserved ones encoded; `/` kept
                    // (Python's `quote`); what `encodeURIComponent` keeps;
                    // what `encodeURI` keeps; a form's `+` for a space.
                    Some(percent_encoded(v, "")),
                    Some(percent_encoded(v, "/")),
                    Some(percent_encoded(v, "!*'()")),
                    Some(percent_encoded(v, "!#$&'()*+,;=:?@/")),
                    Some(percent_encoded(v, "").replace("%20", "+")),
                    // JSON as serde writes it, and as PHP and Python do:
                    // `/` as `\/`, and every other character as `\uXXXX`.
                    Some(json.replace('/', "\\/")),
                    Some(ascii_json.replace('/', "\\/")),
                    Some(json),
                    Some(ascii_json),
                    Some(html_escaped(v)),
                    name,
                ]
            })
            .flatten()
            .map(|v| v.to_ascii_lowercase())
            .collect();
        forms.sort();
        forms.dedup();
        if forms.is_empty() {
            return Secrets::NONE;
        }
        match AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(&forms)
        {
            Ok(automaton) => Secrets(Some(Arc::new(Finder {
                values,
                forms,
                automaton,
            }))),
            // Only a pattern set beyond the automaton's size limits fails;
            // no configuration's secrets come near them.
            Err(e) => unreachable!("secrets beyond the matcher's limits: {e}"),
        }
    }

    /// These secrets and `more`.
    pub fn with<S: AsRef<str>>(&self, more: impl IntoIterator<Item = S>) -> Secrets {
        let more: Vec<String> = more.into_iter().map(|v| v.as_ref().to_owned()).collect();
        if more.iter().all(|v| v.chars().count() < Secrets::SHORTEST) {
            return self.clone();
        }
        Secrets::of_values(self.values().iter().chain(&more))
    }

    /// The values as given.
    pub fn values(&self) -> &[String] {
        self.0.as_ref().map_or(&[], |f| &f.values)
    }

    fn forms(&self) -> &[String] {
        self.0.as_ref().map_or(&[], |f| &f.forms)
    }

    /// `text` with every value replaced by `***`, in any ASCII case;
    /// overlapping values are masked as one.
    pub fn mask(&self, text: &str) -> String {
        let Some(finder) = &self.0 else {
            return text.to_owned();
        };
        let mut found = finder.automaton.find_overlapping_iter(text).peekable();
        if found.peek().is_none() {
            return text.to_owned();
        }
        let mut spans: Vec<(usize, usize)> = found.map(|m| (m.start(), m.end())).collect();
        spans.sort_unstable();
        let mut masked = String::with_capacity(text.len());
        let mut from = 0;
        for (start, end) in spans {
            if end <= from {
                continue;
            }
            if start >= from {
                masked.push_str(&text[from..start]);
                masked.push_str("***");
            }
            from = end;
        }
        masked.push_str(&text[from..]);
        masked
    }

    /// [`Secrets::mask`] of a piece that goes on from `before` (the bytes
    /// just before it, empty at a text's start; [`Secrets::look_back`] of
    /// them are enough): a value that `before` and the piece's start make
    /// up is masked in the piece too, and nothing else there is, however
    /// much the piece's start looks like a value's end. With `cut_after`
    /// (the text goes on but what follows is unknown: a body read to its
    /// limit), the part of a value found at its end (at least
    /// [`Secrets::SHORTEST`] bytes) is masked as well.
    pub fn mask_cut(&self, before: &str, text: &str, cut_after: bool) -> String {
        // How much of the piece's start is a value begun in `before`.
        let spanned = match &self.0 {
            Some(finder) if !before.is_empty() => {
                let joined = format!("{before}{text}");
                let at = before.len();
                finder
                    .automaton
                    .find_overlapping_iter(&joined)
                    .filter(|m| m.start() < at && m.end() > at)
                    .map(|m| m.end() - at)
                    .max()
                    .unwrap_or(0)
            }
            _ => 0,
        };
        let spanned = (spanned..=text.len())
            .find(|k| text.is_char_boundary(*k))
            .unwrap_or(text.len());
        let mut text = match spanned {
            0 => self.mask(text),
            k => format!("***{}", self.mask(&text[k..])),
        };
        let lower = text.to_ascii_lowercase();
        let begun = self
            .forms()
            .iter()
            .flat_map(|v| (Secrets::SHORTEST..v.len()).map(move |k| (v, k)))
            .filter(|(v, k)| v.is_char_boundary(*k) && lower.ends_with(&v[..*k]))
            .map(|(_, k)| k)
            .max();
        if cut_after && let Some(k) = begun {
            text.replace_range(text.len() - k.., "***");
        }
        text
    }

    /// Where a piece of `bytes` may end when what follows is not known yet
    /// and is given with the next piece: before any value that could run
    /// on past the end (the last [`Secrets::look_back`] bytes at most are
    /// kept back) and outside every value found whole, at a character's
    /// start. A text cut there is masked piece by piece with nothing of a
    /// value on either side of a cut.
    pub fn safe_end(&self, bytes: &[u8]) -> usize {
        let Some(finder) = &self.0 else {
            return bytes.len();
        };
        let longest = finder.forms.iter().map(String::len).max().unwrap_or(1);
        let mut end = bytes.len().saturating_sub(longest - 1);
        for m in finder.automaton.find_overlapping_iter(bytes) {
            if m.start() < end && m.end() > end {
                end = m.start();
            }
        }
        while end > 0 && end < bytes.len() && bytes[end] & 0xC0 == 0x80 {
            end -= 1;
        }
        end
    }

    /// How many of the bytes before a piece [`Secrets::mask_cut`] needs to
    /// find a value that runs into it: the longest value's length.
    pub fn look_back(&self) -> usize {
        self.0
            .as_ref()
            .and_then(|f| f.forms.iter().map(String::len).max())
            .unwrap_or(0)
    }
}

impl PartialEq for Secrets {
    fn eq(&self, other: &Secrets) -> bool {
        self.forms() == other.forms()
    }
}

impl Eq for Secrets {}

/// `value` inside a JSON string: quotes, backslashes and control
/// characters escaped, and with `ascii` every character beyond ASCII
/// written `\uXXXX` (a pair of them beyond the basic plane).
fn json_escaped(value: &str, ascii: bool) -> String {
    let quoted = serde_json::to_string(value).unwrap_or_default();
    let inner = quoted
        .get(1..quoted.len().saturating_sub(1))
        .unwrap_or_default();
    if !ascii {
        return inner.to_owned();
    }
    let mut escaped = String::with_capacity(inner.len());
    for c in inner.chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                escaped.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    escaped
}

/// `value` as HTML text quotes it.
fn html_escaped(value: &str) -> String {
    value
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// `value` with every byte but letters, digits, `-._~` and those of `keep`
/// written `%XX`.
fn percent_encoded(value: &str, keep: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric()
            || b"-._~".contains(&byte)
            || keep.as_bytes().contains(&byte)
        {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({})", self.forms().len())
    }
}

/// `{name}` occurrences, where name is `[a-z_]+`, with their byte offsets.
/// Other braces (JSON bodies, shell `${x}`) are left alone.
pub(crate) fn placeholders(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.match_indices('{').filter_map(move |(offset, _)| {
        let rest = &text[offset + 1..];
        let end = rest.find('}')?;
        let name = &rest[..end];
        let is_name = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        let after_dollar = offset > 0 && text.as_bytes()[offset - 1] == b'$';
        (is_name && !after_dollar).then_some((offset, name))
    })
}

/// What happens to a `${NAME}` that is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expansion {
    /// Replaced by the value.
    Replace,
    /// Kept as written (a shell script expands it itself).
    Keep,
}

/// Expands `${NAME}` from `env`; `$${` is a literal `${`.
pub fn expand_env(
    raw: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, TemplateError> {
    expand(raw, env, Expansion::Replace, &mut Vec::new())
}

/// Expands `${NAME}` from `env` as `how` says, noting each value put in
/// the text in `expanded`.
fn expand(
    raw: &str,
    env: &dyn Fn(&str) -> Option<String>,
    how: Expansion,
    expanded: &mut Vec<String>,
) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(literal) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(open) = tail.strip_prefix("${") {
            let offset = raw.len() - tail.len();
            let Some(close) = open.find('}') else {
                return Err(TemplateError {
                    message: "`${` without a closing `}`: write `${NAME}` for an environment variable or `$${` for a literal `${`".into(),
                    offset,
                });
            };
            let name = &open[..close];
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(TemplateError {
                    message: format!(
                        "`${{{name}}}` is not an environment variable name: expected letters, digits and `_`"
                    ),
                    offset,
                });
            }
            let value = env(name).ok_or_else(|| TemplateError {
                message: format!(
                    "environment variable `{name}` is not set (named by `${{{name}}}`)"
                ),
                offset,
            })?;
            match how {
                Expansion::Replace => {
                    out.push_str(&value);
                    expanded.push(value);
                }
                // /bin/sh puts the value in: the job's output may show it,
                // so it is masked all the same.
                Expansion::Keep => {
                    out.push_str(&tail[..close + 3]);
                    expanded.push(value);
                }
            }
            rest = &open[close + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Values for Fixed {
        fn value(&self, name: &str) -> String {
            format!("<{name}>")
        }
    }

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    #[test]
    fn placeholders_are_replaced_and_other_braces_kept() {
        let t = Template::load(r#"{"k": "{period}"} ${TOKEN} $${HOME} {job}"#, &env).unwrap();
        assert_eq!(
            t.render(&Fixed),
            r#"{"k": "<period>"} s3cret ${HOME} <job>"#
        );
    }

    #[test]
    fn a_shards_key_in_a_url_stays_in_its_query() {
        struct Key;
        impl Values for Key {
            fn value(&self, _: &str) -> String {
                "ns/b:2026-11#3/8".to_owned()
            }
        }
        let t = Template::load("http://h/x?k={period_key}#top", &env).unwrap();
        assert_eq!(t.render_in_url(&Key), "http://h/x?k=ns/b:2026-11%233/8#top");
    }

    #[test]
    fn an_unknown_placeholder_is_refused_with_the_nearest_name() {
        let err = Template::load("x {perod}", &env).unwrap_err();
        assert!(
            err.message.contains("did you mean `{period}`"),
            "{}",
            err.message
        );
        assert_eq!(err.offset, 2);
    }

    #[test]
    fn an_unset_variable_is_refused() {
        let err = Template::load("a ${MISSING}", &env).unwrap_err();
        assert!(
            err.message.contains("`MISSING` is not set"),
            "{}",
            err.message
        );
    }

    #[test]
    fn an_expanded_value_is_never_read_as_a_placeholder() {
        let env = |_: &str| Some("a{period}{nope}b".to_owned());
        let t = Template::load("{job}:${SECRET}", &env).unwrap();
        assert_eq!(t.render(&Fixed), "<job>:a{period}{nope}b");
    }

    #[test]
    fn a_shell_script_keeps_its_variables_for_the_shell() {
        let t = Template::load_shell("echo ${TOKEN} {job} $${HOME}", &env).unwrap();
        assert_eq!(t.render(&Fixed), "echo ${TOKEN} <job> ${HOME}");
        assert!(Template::load_shell("echo ${MISSING}", &env).is_err());
    }

    #[test]
    fn expanded_values_are_masked_longest_first_and_short_ones_kept() {
        let env = |name: &str| {
            Some(
                match name {
                    "LONG" => "hunter2SECRET",
                    "INNER" => "hunter2",
                    _ => "42",
                }
                .to_owned(),
            )
        };
        let t = Template::load("{period}-${INNER}/${LONG}?n=${N}", &env).unwrap();
        let secrets = Secrets::of([&t]);
        assert_eq!(
            secrets.mask(r#"invalid input syntax: "2026-07-hunter2/hunter2SECRET?n=42""#),
            r#"invalid input syntax: "2026-07-***/***?n=42""#
        );
        // Left for /bin/sh to put in, and masked all the same.
        let shell = Template::load_shell("echo ${LONG}", &env).unwrap();
        assert_eq!(Secrets::of([&shell]).mask("hunter2SECRET"), "***");
    }

    #[test]
    fn a_value_is_masked_in_any_case_and_cut_to_a_postgresql_name() {
        let long = format!(
            "{}ABCDEF",
            "0123456789abcdef"
                .repeat(4)
                .chars()
                .take(58)
                .collect::<String>()
        );
        let env = |name: &str| {
            Some(if name == "A" {
                "Hunter2Secret".to_owned()
            } else {
                long.clone()
            })
        };
        let t = Template::load("${A} ${B}", &env).unwrap();
        let secrets = Secrets::of([&t]);
        let cut = long[..63].to_ascii_lowercase();
        assert_eq!(
            secrets.mask(&format!(
                "relation \"hunter2secret\" does not exist; \"{cut}\""
            )),
            "relation \"***\" does not exist; \"***\""
        );
    }

    #[test]
    fn a_piece_of_a_value_at_a_cut_edge_is_masked() {
        let env = |_: &str| Some("hunter2secretvalue".to_owned());
        let t = Template::load("${A}", &env).unwrap();
        let secrets = Secrets::of([&t]);
        assert_eq!(secrets.mask_cut("", "xxxxhunter2s", true), "xxxx***");
        assert_eq!(
            secrets.mask_cut("zz hunter2s", "ecretvalue yyy", false),
            "*** yyy"
        );
        assert_eq!(
            secrets.mask_cut("", "ecretvalue yyy", false),
            "ecretvalue yyy"
        );
        assert_eq!(
            secrets.mask_cut("something else", "ecretvalue yyy", false),
            "ecretvalue yyy",
            "a start that only looks like a value's end"
        );
    }

    #[test]
    fn a_chunk_of_a_long_run_of_one_letter_is_not_taken_for_a_values_end() {
        let env = |_: &str| Some("tok_aaaaaaaa".to_owned());
        let t = Template::load("${A}", &env).unwrap();
        let secrets = Secrets::of([&t]);
        let run = "A".repeat(64);
        assert_eq!(secrets.mask_cut(&run, &run, false), run);
        let end = secrets.safe_end(run.as_bytes());
        assert_eq!(end, run.len() - (secrets.look_back() - 1));
        let text = format!("xx tok_aaaaaaaa yy{}", "z".repeat(20));
        let bytes = text.as_bytes();
        // Kept back before a value that may run on, never inside one.
        assert_eq!(secrets.safe_end(&bytes[..8]), 0);
        assert_eq!(secrets.safe_end(&bytes[..16]), 3);
        assert_eq!(secrets.safe_end(bytes), bytes.len() - 11);
    }

    #[test]
    fn a_value_is_masked_percent_encoded_too() {
        let env = |_: &str| Some("my secret/tok\"en<>é".to_owned());
        let t = Template::load("https://h/${A}", &env).unwrap();
        let secrets = Secrets::of([&t]);
        for shown in [
            "Location: http://o/my%20secret/tok%22en%3C%3E%C3%A9",
            "Location: http://o/my%20secret%2Ftok%22en%3C%3E%C3%A9",
            "q=my+secret%2Ftok%22en%3C%3E%C3%A9",
        ] {
            assert!(!secrets.mask(shown).contains("secret"), "{shown}");
        }
    }

    #[test]
    fn a_value_is_masked_as_services_echo_it() {
        let env = |_: &str| Some("Ab/cd+ef=gh\"ij\\kl-ñé-0123".to_owned());
        let t = Template::load("${A}", &env).unwrap();
        let secrets = Secrets::of([&t]);
        for shown in [
            // Python's quote() and JavaScript's encodeURI leave `/` alone.
            "Location: http://x/?t=Ab/cd%2Bef%3Dgh%22ij%5Ckl-%C3%B1%C3%A9-0123",
            "Location: http://x/?t=Ab%2Fcd%2Bef%3Dgh%22ij%5Ckl-%C3%B1%C3%A9-0123",
            "Location: http://x/?t=Ab/cd+ef=gh%22ij%5Ckl-%C3%B1%C3%A9-0123",
            // PHP's json_encode writes `\/`; Python's json.dumps `\u00f1`.
            r#"{"auth": "Ab\/cd+ef=gh\"ij\\kl-\u00f1\u00e9-0123"}"#,
            r#"{"auth": "Ab/cd+ef=gh\"ij\\kl-\u00f1\u00e9-0123"}"#,
            r#"{"auth": "Ab\/cd+ef=gh\"ij\\kl-ñé-0123"}"#,
            r#"{"auth": "Ab/cd+ef=gh\"ij\\kl-ñé-0123"}"#,
            "<td>Ab/cd+ef=gh&quot;ij\\kl-ñé-0123</td>",
        ] {
            assert!(!secrets.mask(shown).contains("0123"), "{shown}");
        }
    }

    #[test]
    fn debug_output_hides_the_text() {
        let t = Template::load("${TOKEN}", &env).unwrap();
        assert!(!format!("{t:?}").contains("s3cret"));
    }
}
