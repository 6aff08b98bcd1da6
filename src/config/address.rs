//! Where the database is: a URL read once into a SQLite file path (resolved
//! against the right directory) or a PostgreSQL URL that parses, so nothing
//! later can open a throwaway in-memory database or print a password; and
//! the masking of a database URL's password in any text, parsable or not.

use std::fmt;
use std::path::{Path, PathBuf};

/// A database location that can be opened.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A SQLite file, by absolute path, with any `?` parameters as given.
    Sqlite {
        /// The file.
        path: PathBuf,
        /// The query string after `?`, if any (never `mode=memory`).
        params: Option<String>,
    },
    /// A PostgreSQL URL that parses.
    Postgres(String),
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

/// The URL as shown to people: a SQLite path, or the URL with its password
/// masked.
impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseUrl::Sqlite { path, .. } => write!(f, "sqlite://{}", path.display()),
            DatabaseUrl::Postgres(url) => f.write_str(&mask_url(url)),
        }
    }
}

/// The parameters of a PostgreSQL URL that the driver (sqlx) reads; it
/// ignores any other. Besides them, `options[NAME]=VALUE` sets a server
/// setting.
const POSTGRES_PARAMETERS: [&str; 17] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
];

fn known_postgres_parameter(name: &str) -> bool {
    POSTGRES_PARAMETERS.contains(&name)
        || name == "options"
        || (name.starts_with("options[") && name.ends_with(']'))
}

impl DatabaseUrl {
    /// Reads `url`; a relative SQLite path is taken relative to `base`.
    /// The error says what is wrong, with any password masked.
    pub fn parse(url: &str, base: &Path) -> Result<DatabaseUrl, String> {
        if let Some(rest) = url.strip_prefix("sqlite:") {
            return DatabaseUrl::sqlite(url, rest.strip_prefix("//").unwrap_or(rest), base);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return DatabaseUrl::postgres(url);
        }
        Err(format!(
            "`{}` is not a database URL: expected sqlite://FILE or postgres://USER@HOST/DB",
            mask_url(url)
        ))
    }

    /// A `sqlite:` URL whose file and parameters are `rest`.
    fn sqlite(url: &str, rest: &str, base: &Path) -> Result<DatabaseUrl, String> {
        // SQLite takes no password, but a URL that carries one (a
        // `password=` parameter) never shows it.
        let shown = mask_url(url);
        let (file, params) = match rest.split_once('?') {
            Some((file, params)) => (file, Some(params.to_owned())),
            None => (rest, None),
        };
        let in_memory = file == ":memory:"
            || params.as_deref().is_some_and(|p| {
                p.split('&')
                    .any(|kv| kv.eq_ignore_ascii_case("mode=memory"))
            });
        if in_memory {
            return Err(format!(
                "`{shown}` is an in-memory database, lost when the command ends (every run would start afresh): name a file, e.g. sqlite://scheduler.db"
            ));
        }
        // The scheduler writes to its database whatever the command
        // (claims, migrations, its WAL): read-only can never work.
        let read_only = params.as_deref().is_some_and(|p| {
            p.split('&').any(|kv| {
                let kv = kv.to_ascii_lowercase();
                kv == "mode=ro" || kv == "immutable=1" || kv == "immutable=true"
            })
        });
        if read_only {
            return Err(format!(
                "`{shown}` opens the database read-only (`mode=ro` or `immutable`): the scheduler writes to its database whatever the command; expected sqlite://FILE, e.g. sqlite://scheduler.db"
            ));
        }
        if file.is_empty() {
            return Err(format!(
                "`{shown}` names no file (is a variable in it empty?): expected sqlite://FILE, e.g. sqlite://scheduler.db"
            ));
        }
        if file.contains('\0') {
            return Err("the SQLite path contains a NUL byte".into());
        }
        let path = Path::new(file);
        let path = if path.is_absolute() {
            path.to_owned()
        } else {
            base.join(path)
        };
        let url = DatabaseUrl::Sqlite { path, params };
        // The driver's reading of the parameters (`mode`, `cache`, …),
        // before anything creates the file; a build without the driver
        // says so when it opens it.
        #[cfg(not(feature = "sqlite"))]
        return Ok(url);
        #[cfg(feature = "sqlite")]
        match url
            .driver_url()
            .parse::<sqlx::sqlite::SqliteConnectOptions>()
        {
            Ok(_) => Ok(url),
            Err(e) => Err(format!(
                "`{shown}`: {}; expected sqlite://FILE, optionally with ?mode=ro|rw|rwc, cache=shared|private, immutable=true|false or vfs=NAME",
                e.to_string()
                    .trim_start_matches("error with configuration: ")
            )),
        }
    }

    /// A `postgres:` URL.
    fn postgres(url: &str) -> Result<DatabaseUrl, String> {
        match url::Url::parse(url) {
            Ok(parsed) if parsed.host_str().is_some_and(|h| !h.is_empty()) => {
                // The driver ignores a parameter it does not know: a
                // misspelt `sslmode` would connect without TLS. Named
                // without its value (a misspelt `password`) and
                // without the query.
                if let Some(unknown) = parsed
                    .query_pairs()
                    .map(|(name, _)| name)
                    .find(|name| !known_postgres_parameter(name))
                {
                    let hint = crate::suggest::nearest(&unknown, POSTGRES_PARAMETERS)
                        .map(|near| format!(" (did you mean `{near}`?)"))
                        .unwrap_or_default();
                    let base = url.split_once('?').map_or(url, |(base, _)| base);
                    // A name that is no parameter name at all (`?s3cr3t`
                    // with no `=`) may be a value: not shown.
                    let named = unknown.chars().all(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '[' | ']' | '.')
                    });
                    let unknown = if named {
                        format!("`{unknown}`")
                    } else {
                        "not named here".into()
                    };
                    return Err(format!(
                        "`{}?…` has the parameter {unknown}{hint}, which the PostgreSQL driver does not know and would ignore; it knows {}, options and options[SETTING]",
                        mask_url(base),
                        POSTGRES_PARAMETERS.join(", ")
                    ));
                }
                // The driver's own reading of its parameters (sslmode, …)
                // is a configuration matter, found before connecting; a
                // build without the driver says so when it opens it.
                #[cfg(not(feature = "postgres"))]
                return Ok(DatabaseUrl::Postgres(url.to_owned()));
                #[cfg(feature = "postgres")]
                match url.parse::<sqlx::postgres::PgConnectOptions>() {
                    Ok(_) => Ok(DatabaseUrl::Postgres(url.to_owned())),
                    Err(e) => {
                        let mut text = mask_password_in(&e.to_string(), url);
                        while let Some(rest) = text.strip_prefix("error with configuration: ") {
                            text = rest.to_owned();
                        }
                        let hint = if text.contains("ssl") {
                            "sslmode is one of disable, allow, prefer, require, verify-ca, verify-full"
                        } else {
                            "a parameter of the URL has a bad value: port and statement-cache-capacity take whole numbers"
                        };
                        Err(format!("`{}`: {text}; {hint}", mask_url(url)))
                    }
                }
            }
            Ok(_) => Err(format!(
                "`{}` names no host: expected postgres://USER:PASSWORD@HOST:PORT/DB",
                mask_url(url)
            )),
            Err(e) => Err(format!(
                "`{}` is not a valid URL ({e}): expected postgres://USER:PASSWORD@HOST:PORT/DB, with special characters in the password percent-encoded",
                mask_url(url)
            )),
        }
    }

    /// The URL handed to the driver.
    pub(crate) fn driver_url(&self) -> String {
        match self {
            DatabaseUrl::Sqlite { path, params } => {
                // sqlx percent-decodes the path, so `%`, `?` and `#` are encoded.
                let mut url = String::from("sqlite://");
                for c in path.to_string_lossy().chars() {
                    match c {
                        '%' => url.push_str("%25"),
                        '?' => url.push_str("%3F"),
                        '#' => url.push_str("%23"),
                        c => url.push(c),
                    }
                }
                if let Some(params) = params {
                    url.push('?');
                    url.push_str(params);
                }
                url
            }
            DatabaseUrl::Postgres(url) => url.clone(),
        }
    }
}

/// A database URL with its password replaced by `***`: the one in the
/// user part and any `password=` query parameter, also in a URL that does
/// not parse.
pub fn mask_url(url: &str) -> String {
    let masked = match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) if parsed.has_host() => url.to_owned(),
        // No host: `postgres:/user:pw@host/db` parses, as a path.
        _ => match user_password(url, true) {
            Some(range) => format!("{}***{}", &url[..range.start], &url[range.end..]),
            None => url.to_owned(),
        },
    };
    mask_query_passwords(&masked)
}

/// `text` with every occurrence of `url`'s password (as written and
/// decoded, and any `password=` parameter) masked.
pub fn mask_password_in(text: &str, url: &str) -> String {
    let mut secrets = url_passwords(url);
    // Longest first, so a password that contains another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.replace(url, &mask_url(url));
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "***");
    }
    text
}

/// The passwords a database URL holds, parsable or not: the user part's
/// and any `password=` parameter's, as written and decoded.
pub fn url_passwords(url: &str) -> Vec<String> {
    let mut secrets: Vec<String> = Vec::new();
    if let Some(range) = user_password(url, false) {
        secrets.push(url[range].to_owned());
    }
    if let Some(password) = url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        secrets.push(password);
    }
    secrets.extend(query_passwords(url).map(|r| url[r].to_owned()));
    let decoded: Vec<String> = secrets
        .iter()
        .filter_map(|s| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
        })
        .collect();
    secrets.extend(decoded);
    secrets.retain(|s| !s.is_empty());
    secrets.sort();
    secrets.dedup();
    secrets
}

/// Where the password of `scheme://user:password@host…` is, found by text,
/// also with one slash or none after the scheme: after the first `:` of the
/// user part, up to the last `@`. With `lone`, a user part without a `:`
/// is taken whole (`postgres:PASSWORD@host` may be a password).
fn user_password(url: &str, lone: bool) -> Option<std::ops::Range<usize>> {
    let scheme = url
        .find(':')
        .filter(|at| {
            let scheme = &url[..*at];
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        })
        .map_or(0, |at| at + 1);
    let start = scheme + url[scheme..].len() - url[scheme..].trim_start_matches('/').len();
    let rest = &url[start..];
    let at = rest.rfind('@')?;
    match rest[..at].find(':') {
        Some(colon) => Some(start + colon + 1..start + at),
        None if lone && at > 0 => Some(start..start + at),
        None => None,
    }
}

/// Where the values of `password=` parameters are.
fn query_passwords(url: &str) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let lower = url.to_ascii_lowercase();
    let starts: Vec<usize> = lower
        .match_indices("password=")
        .map(|(i, m)| i + m.len())
        .collect();
    starts.into_iter().map(move |start| {
        let end = url[start..]
            .find(['&', '#', ' '])
            .map_or(url.len(), |i| start + i);
        start..end
    })
}

fn mask_query_passwords(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut from = 0;
    for range in query_passwords(url) {
        out.push_str(&url[from..range.start]);
        out.push_str("***");
        from = range.end;
    }
    out.push_str(&url[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_sqlite_path_is_taken_from_the_base_directory() {
        let url = DatabaseUrl::parse("sqlite://data/s.db", Path::new("/etc/jobs")).unwrap();
        assert_eq!(url.to_string(), "sqlite:///etc/jobs/data/s.db");
        let url = DatabaseUrl::parse("sqlite:///abs.db", Path::new("/etc/jobs")).unwrap();
        assert_eq!(url.to_string(), "sqlite:///abs.db");
    }

    #[test]
    fn empty_and_in_memory_sqlite_urls_are_refused() {
        for url in [
            "sqlite://",
            "sqlite:",
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://x.db?mode=memory",
        ] {
            assert!(DatabaseUrl::parse(url, Path::new("/")).is_err(), "{url}");
        }
    }

    #[test]
    fn an_sqlite_url_with_a_parameter_the_driver_does_not_know_is_refused() {
        let err = DatabaseUrl::parse("sqlite://x.db?bogus=1", Path::new("/d")).unwrap_err();
        assert!(err.contains("bogus"), "{err}");
        assert!(DatabaseUrl::parse("sqlite://x.db?mode=rwc", Path::new("/d")).is_ok());
        for url in [
            "sqlite://x.db?mode=ro",
            "sqlite://x.db?immutable=1",
            "sqlite://x.db?cache=shared&Immutable=true",
        ] {
            let err = DatabaseUrl::parse(url, Path::new("/d")).unwrap_err();
            assert!(err.contains("read-only"), "{url}: {err}");
        }
    }

    #[test]
    fn a_postgres_url_with_a_parameter_the_driver_does_not_know_is_refused() {
        let err = DatabaseUrl::parse(
            "postgres://u:PW@h/db?sslmode=require&ssl_mode=x&password=PW2",
            Path::new("/"),
        )
        .unwrap_err();
        assert!(
            err.contains("`ssl_mode` (did you mean `sslmode`?)"),
            "{err}"
        );
        assert!(!err.contains("PW"), "{err}");
        let err = DatabaseUrl::parse("postgres://u@h/db?pass:S3CRET", Path::new("/")).unwrap_err();
        assert!(!err.contains("S3CRET"), "{err}");
        for url in [
            "postgres://u@h/db?sslmode=disable&application_name=a",
            "postgres://u@h/db?options[search_path]=s&options=-c%20x%3Dy",
        ] {
            assert!(DatabaseUrl::parse(url, Path::new("/")).is_ok(), "{url}");
        }
    }

    #[test]
    fn an_unparsable_postgres_url_is_refused_with_its_password_masked() {
        let err =
            DatabaseUrl::parse("postgres://u:PW@127.0.0.1:99999/db", Path::new("/")).unwrap_err();
        assert!(!err.contains("PW"), "{err}");
    }

    #[test]
    fn passwords_are_masked_in_urls_that_do_not_parse() {
        for url in [
            "postgres://app:hunter2@127.0.0.1:notaport/x",
            "postgres://u:hunter2@127.0.0.1:99999/db",
            "postgres://u:hunter2@[::1/db",
            "postgres//u:hunter2@h/db",
            "postgres://u@h:1/db?password=hunter2",
            "postgres://u@h:1/db?sslmode=require&PASSWORD=hunter2&x=1",
            "postgres://u:hunter2@h/db",
        ] {
            let masked = mask_url(url);
            assert!(!masked.contains("hunter2"), "{url} -> {masked}");
            let text = mask_password_in(&format!("failed: {url} (hunter2)"), url);
            assert!(!text.contains("hunter2"), "{url} -> {text}");
        }
    }
}
