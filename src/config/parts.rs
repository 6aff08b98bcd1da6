//! `jobs.toml` parsed a part at a time: each `[[job]]` on its own, and
//! the rest of the file (`[scheduler]`, `[api]`, calendars, notifiers)
//! apart from them. A parse of the whole file holds its whole tree at once
//! (21 MiB for 10,000 jobs, more than the jobs it becomes); a part's tree
//! is let go once its job is checked.
//!
//! A part means what it means in the whole file, or the file is read
//! whole: a cut inside a string, an array or an inline table leaves the
//! part before it unclosed, which does not parse; a part of jobs that
//! holds anything but `[[job]]` tables, or parts of the rest that name the
//! same table, are read whole too. The whole file's parse then says what
//! TOML says of it, with its own messages.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// The file's text could not be read a part at a time: read it whole.
#[derive(Debug)]
pub(super) struct Whole;

/// Where the file's parts are: each `[[job]]` with the tables under it
/// (`[job.env]` …), and the rest between them.
#[derive(Debug, PartialEq)]
pub(super) struct Parts {
    pub(super) jobs: Vec<Range<usize>>,
    pub(super) rest: Vec<Range<usize>>,
}

/// What a header line opens, by its first words.
enum Header {
    Job,
    UnderJob,
    Other,
}

fn header(line: &str) -> Option<Header> {
    let line = line.trim_start();
    if !line.starts_with('[') {
        return None;
    }
    if let Some(rest) = line.strip_prefix("[[job]]").map(str::trim_start)
        && (rest.is_empty() || rest.starts_with('#'))
    {
        return Some(Header::Job);
    }
    if line.starts_with("[job.") || line.starts_with("[[job.") {
        return Some(Header::UnderJob);
    }
    Some(Header::Other)
}

impl Parts {
    /// The parts of `text`, cut before each line that opens a `[[job]]`
    /// or a table of the rest; `None` for a file of no `[[job]]`, read
    /// whole as it costs no more.
    pub(super) fn of(text: &str) -> Option<Parts> {
        let mut parts = Parts {
            jobs: Vec::new(),
            rest: Vec::new(),
        };
        // The part being read: where it starts, and whether it is a job's.
        let (mut start, mut job) = (0, false);
        let mut at = 0;
        for line in text.split_inclusive('\n') {
            let cut = match header(line) {
                Some(Header::Job) => Some(true),
                Some(Header::Other) if job => Some(false),
                _ => None,
            };
            if let Some(next) = cut {
                parts.push(start..at, job);
                (start, job) = (at, next);
            }
            at += line.len();
        }
        parts.push(start..at, job);
        (!parts.jobs.is_empty()).then_some(parts)
    }

    fn push(&mut self, range: Range<usize>, job: bool) {
        match job {
            true => self.jobs.push(range),
            false if !range.is_empty() => self.rest.push(range),
            false => {}
        }
    }
}

/// The rest of the file, its parts parsed into one table with their
/// places in the whole file; [`Whole`] if a part does not parse, holds a
/// `job`, or names a table another part names.
pub(super) fn rest<'t>(text: &'t str, parts: &Parts) -> Result<Spanned<DeTable<'t>>, Whole> {
    let mut root = DeTable::new();
    for range in &parts.rest {
        let table = parsed(text, range.clone())?;
        for (key, value) in table {
            let name: &str = key.get_ref();
            if name == "job" || root.contains_key(name) {
                return Err(Whole);
            }
            root.insert(key, value);
        }
    }
    Ok(Spanned::new(0..text.len(), root))
}

/// The `[[job]]` tables of the part at `range`, with their places in the
/// whole file; [`Whole`] if it does not parse or holds anything else.
pub(super) fn jobs<'t>(
    text: &'t str,
    range: Range<usize>,
) -> Result<Vec<Spanned<DeValue<'t>>>, Whole> {
    let mut table = parsed(text, range)?;
    let Some(DeValue::Array(tables)) = table.remove("job").map(Spanned::into_inner) else {
        return Err(Whole);
    };
    let tables: Vec<Spanned<DeValue<'t>>> = tables.into_iter().collect();
    let all_tables = tables
        .iter()
        .all(|t| matches!(t.get_ref(), DeValue::Table(_)));
    match table.is_empty() && !tables.is_empty() && all_tables {
        true => Ok(tables),
        false => Err(Whole),
    }
}

/// The part of `text` at `range` parsed, every place in it counted from
/// the start of `text`.
fn parsed(text: &str, range: Range<usize>) -> Result<DeTable<'_>, Whole> {
    let base = range.start;
    let table = DeTable::parse(&text[range]).map_err(|_| Whole)?;
    Ok(moved_table(table.into_inner(), base))
}

fn moved<'t>(value: Spanned<DeValue<'t>>, by: usize) -> Spanned<DeValue<'t>> {
    let span = value.span();
    let value = match value.into_inner() {
        DeValue::Table(table) => DeValue::Table(moved_table(table, by)),
        DeValue::Array(mut array) => {
            for item in array.iter_mut() {
                let taken = std::mem::replace(item, Spanned::new(0..0, DeValue::Boolean(false)));
                *item = moved(taken, by);
            }
            DeValue::Array(array)
        }
        other => other,
    };
    Spanned::new(span.start + by..span.end + by, value)
}

fn moved_table(table: DeTable<'_>, by: usize) -> DeTable<'_> {
    table
        .into_iter()
        .map(|(key, value)| {
            let span = key.span();
            let key = Spanned::new(span.start + by..span.end + by, key.into_inner());
            (key, moved(value, by))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts<'t>(text: &'t str, ranges: &[Range<usize>]) -> Vec<&'t str> {
        ranges.iter().map(|r| &text[r.clone()]).collect()
    }

    #[test]
    fn each_job_is_a_part_with_its_tables_and_the_rest_lies_between() {
        let text = "[scheduler]\nlease = \"1m\"\n\n[[job]]\nname = \"a\"\n[job.env]\nX = \"1\"\n\
                    [[job]] # b\nname = \"b\"\n[[notify]]\nname = \"n\"\n";
        let parts = Parts::of(text).unwrap();
        assert_eq!(
            texts(text, &parts.jobs),
            [
                "[[job]]\nname = \"a\"\n[job.env]\nX = \"1\"\n",
                "[[job]] # b\nname = \"b\"\n"
            ]
        );
        assert_eq!(
            texts(text, &parts.rest),
            [
                "[scheduler]\nlease = \"1m\"\n\n",
                "[[notify]]\nname = \"n\"\n"
            ]
        );
    }

    #[test]
    fn a_file_without_jobs_is_read_whole() {
        assert_eq!(Parts::of("[scheduler]\nlease = \"1m\"\n"), None);
    }

    #[test]
    fn a_part_keeps_its_places_in_the_whole_file() {
        let text = "[scheduler]\n\n[[job]]\nname = \"a\"\n";
        let parts = Parts::of(text).unwrap();
        let jobs = jobs(text, parts.jobs[0].clone()).unwrap();
        let DeValue::Table(job) = jobs[0].get_ref() else {
            panic!("a table");
        };
        let name = job.get("name").unwrap();
        assert_eq!(&text[name.span()], "\"a\"");
        assert!(
            rest(text, &parts)
                .unwrap()
                .get_ref()
                .contains_key("scheduler")
        );
    }

    #[test]
    fn a_cut_inside_a_string_or_an_array_is_read_whole() {
        for text in [
            "[[job]]\nname = \"a\"\nshell = \"\"\"\n[[job]]\n\"\"\"\n",
            "[[job]]\nname = \"a\"\ncommand = [\n[\"x\"],\n]\n",
            "[[job]]\nname = \"a\"\nshell = '''\n[scheduler]\n'''\n",
        ] {
            let parts = Parts::of(text).unwrap();
            let read = parts
                .jobs
                .iter()
                .map(|r| jobs(text, r.clone()).map(|_| ()))
                .chain([rest(text, &parts).map(|_| ())])
                .collect::<Result<Vec<()>, Whole>>();
            assert!(read.is_err(), "{text}");
        }
    }

    #[test]
    fn parts_of_the_rest_that_name_one_table_are_read_whole() {
        for text in [
            "[api]\n[[job]]\nname = \"a\"\n[api]\n",
            "[[notify]]\nname = \"m\"\n[[job]]\nname = \"a\"\n[[notify]]\nname = \"n\"\n",
            "job = []\n[[job]]\nname = \"a\"\n",
        ] {
            let parts = Parts::of(text).unwrap();
            assert!(rest(text, &parts).is_err(), "{text}");
        }
    }
}
