//! The text of an `sql` action as a database reads it: its statements, split
//! as PostgreSQL or SQLite splits them, and whether one ends or splits the
//! transaction that records its outcome.

/// How a database reads a statement's text, as far as splitting it goes.
#[derive(Clone, Copy)]
pub(super) struct Dialect {
    /// `$tag$ … $tag$` bodies (PostgreSQL).
    dollar_quotes: bool,
    /// `[name]` and `` `name` `` identifiers (SQLite).
    bracketed_names: bool,
    /// `/* /* … */ */` comments nest (PostgreSQL).
    nested_comments: bool,
    /// A `--` comment ends at `\r` as well as `\n` (PostgreSQL; SQLite's
    /// runs to `\n`).
    comment_ends_at_cr: bool,
}

impl Dialect {
    /// PostgreSQL's reading; also the load-time check, before the backend is
    /// known (PostgreSQL runs only the first statement of a text anyway).
    #[cfg(feature = "config-file")]
    pub(super) const POSTGRES: Dialect = Dialect {
        dollar_quotes: true,
        bracketed_names: false,
        nested_comments: true,
        comment_ends_at_cr: true,
    };
    /// SQLite's reading: it runs every statement of a text.
    pub(super) const SQLITE: Dialect = Dialect {
        dollar_quotes: false,
        bracketed_names: true,
        nested_comments: false,
        comment_ends_at_cr: false,
    };

    /// Where the comment that starts at `i` ends (the index after it), if
    /// one starts there: `--` to the end of the line, or a
    /// block comment, nested where the dialect nests them. An unclosed
    /// one runs to the end.
    fn comment_end(self, bytes: &[u8], i: usize) -> Option<usize> {
        match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b'-'), Some(b'-')) => Some(
                bytes[i..]
                    .iter()
                    .position(|b| *b == b'\n' || (self.comment_ends_at_cr && *b == b'\r'))
                    .map_or(bytes.len(), |at| i + at + 1),
            ),
            (Some(b'/'), Some(b'*')) => {
                let (mut depth, mut j) = (1usize, i + 2);
                while j < bytes.len() {
                    match (bytes[j], bytes.get(j + 1)) {
                        (b'*', Some(b'/')) => {
                            depth -= 1;
                            j += 2;
                            if depth == 0 {
                                return Some(j);
                            }
                        }
                        (b'/', Some(b'*')) if self.nested_comments => {
                            depth += 1;
                            j += 2;
                        }
                        _ => j += 1,
                    }
                }
                Some(bytes.len())
            }
            _ => None,
        }
    }
}

/// The statements of `text` as `dialect` reads it: split at each `;`
/// outside quotes, quoted names, comments and (PostgreSQL) dollar-quoted
/// bodies.
pub(super) fn statements(text: &str, dialect: Dialect) -> Vec<&str> {
    let bytes = text.as_bytes();
    let skip_to = |from: usize, end: &[u8]| {
        bytes[from.min(bytes.len())..]
            .windows(end.len())
            .position(|w| w == end)
            .map_or(bytes.len(), |at| from + at + end.len() - 1)
    };
    let mut pieces = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"') => i = skip_to(i + 1, &[quote]),
            b'`' if dialect.bracketed_names => i = skip_to(i + 1, b"`"),
            b'[' if dialect.bracketed_names => i = skip_to(i + 1, b"]"),
            b'-' | b'/' if dialect.comment_end(bytes, i).is_some() => {
                // Just before the comment's end: the loop steps past it.
                i = dialect.comment_end(bytes, i).unwrap_or(bytes.len()) - 1;
            }
            b'$' if dialect.dollar_quotes => {
                let tag = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                    .count();
                let close = i + 1 + tag;
                let numbered = bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
                if !numbered && bytes.get(close) == Some(&b'$') {
                    i = skip_to(close + 1, &bytes[i..=close]);
                }
            }
            b';' => {
                pieces.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    pieces.push(&text[start..]);
    pieces
}

/// The first transaction-control keyword among the statements of `text`
/// as `dialect` reads it.
pub(super) fn ends_the_transaction(text: &str, dialect: Dialect) -> Option<String> {
    statements(text, dialect)
        .into_iter()
        .find_map(|statement| transaction_control(statement, dialect))
}

/// Whether `text` holds no statement at all as `dialect` reads it: only
/// blanks, comments and `;`. The database would "run" it and succeed.
#[cfg(feature = "config-file")]
pub(super) fn is_empty_in_effect(text: &str, dialect: Dialect) -> bool {
    statements(text, dialect)
        .into_iter()
        .all(|statement| after_comments(statement, dialect).is_empty())
}

/// A statement after its leading blanks and `--` or `/* */` comments.
fn after_comments(statement: &str, dialect: Dialect) -> &str {
    let mut rest = statement.trim_start();
    while let Some(end) = dialect.comment_end(rest.as_bytes(), 0) {
        rest = rest[end..].trim_start();
    }
    rest
}

/// The first word of a statement, upper-cased, after blanks and `--` or
/// `/* */` comments.
fn first_word(statement: &str, dialect: Dialect) -> String {
    after_comments(statement, dialect)
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase()
}

/// The transaction-control keyword a statement starts with, if any (after
/// blanks and `--` or `/* */` comments).
fn transaction_control(statement: &str, dialect: Dialect) -> Option<String> {
    let word = first_word(statement, dialect);
    const CONTROL: [&str; 9] = [
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE",
        "PREPARE",
    ];
    CONTROL.contains(&word.as_str()).then_some(word)
}
