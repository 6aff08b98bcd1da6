//! `jobs.toml` read: the file's text parsed, checked section by section
//! and made one [`Config`], `${VAR}`s expanded and their values sealed as
//! secrets.

use std::path::Path;
use std::sync::Arc;

use super::locator::Locator;
use super::parts::{Parts, Whole};
use super::sections::{Sections, notifiers};
use super::vars::Vars;
use super::{Action, Config, ConfigError, Job, Settings, address, environment};
use crate::template::Secrets;

/// How the error of a file that cannot be read begins: each front end
/// adds how to name another.
pub const UNREADABLE: &str = "cannot read the configuration file";

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        place: path.display().to_string(),
        message: format!("{UNREADABLE}: {e}"),
    })
}

/// Which parts of a file take an unset `${VAR}` as empty (and a warning)
/// rather than as a mistake.
#[derive(Debug, Clone, Copy)]
struct Lenient {
    jobs: bool,
    api: bool,
}

impl Lenient {
    const NOTHING: Lenient = Lenient {
        jobs: false,
        api: false,
    };
}

/// The passwords in the scheduler's database variables (`DATABASE_URL`,
/// `PGPASSWORD`), masked in every job's output whether or not the file
/// names them.
fn database_passwords(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let url = env("DATABASE_URL").map(|url| address::url_passwords(&url));
    url.into_iter().flatten().chain(env("PGPASSWORD")).collect()
}

impl Config {
    /// Reads and validates the file at `path`, expanding `${VAR}` from the
    /// process environment; an unset one is an error.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let mut config = Config::load_adjusted(path, &|_| {})?;
        config.link_after()?;
        Ok(config)
    }

    /// Like [`Config::load`], with `adjust` applied to the settings before
    /// the jobs are checked against them (the library's settings given in
    /// code: a zone, a catch-up window), and the jobs' `after` not yet
    /// linked: the library's code jobs join them first
    /// (the builder links them then).
    pub fn load_adjusted(
        path: &Path,
        adjust: &dyn Fn(&mut Settings),
    ) -> Result<Config, ConfigError> {
        let text = read(path)?;
        let env = |name: &str| std::env::var(name).ok();
        let lenient = Lenient::NOTHING;
        Config::parse_inner(path, &text, &env, lenient, adjust, false).map(|(config, _)| config)
    }

    /// Like [`Config::load`] for `run`, which serves no API and runs the
    /// jobs it names only: an unset `${VAR}` of an `[api]` token or of
    /// another job leaves it empty rather than refusing the file. The jobs
    /// it leaves incomplete are listed ([`Config::incomplete`]), with a
    /// warning with its place for each name; [`Config::complete`] refuses
    /// one that is to run.
    pub fn load_to_run(path: &Path) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let text = read(path)?;
        let env = |name: &str| std::env::var(name).ok();
        let lenient = Lenient {
            jobs: true,
            api: true,
        };
        Config::parse_inner(path, &text, &env, lenient, &|_| {}, true)
    }

    /// Like [`Config::load`], for commands that run no action: an unset
    /// `${VAR}` in a job is returned as a warning instead (one per name, at
    /// its first use). `[scheduler].database_url` must still be complete.
    pub fn load_lenient(path: &Path) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let text = read(path)?;
        Config::parse_with(path, &text, &|name| std::env::var(name).ok(), true)
    }

    /// Validates `text` as if read from `path`.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::parse_with(path, text, env, false).map(|(config, _)| config)
    }

    /// Validates `text`; with `lenient`, unset variables of jobs are
    /// warnings. Every mistake is reported, in file order, one paragraph
    /// each.
    pub fn parse_with(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        lenient: bool,
    ) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let lenient = Lenient {
            jobs: lenient,
            api: lenient,
        };
        Config::parse_inner(path, text, env, lenient, &|_| {}, true)
    }

    fn parse_inner(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        lenient: Lenient,
        adjust: &dyn Fn(&mut Settings),
        link: bool,
    ) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let at = Locator { path, text };
        let reading = Reading {
            at: &at,
            env,
            lenient,
            adjust,
            link,
        };
        // A part at a time, for a file that reads so without a mistake;
        // else whole, which says what is wrong and where.
        match reading.in_parts() {
            Some(read) => Ok(read),
            None => reading.whole(),
        }
    }
}

/// How a file is read, whichever way its tables were parsed.
struct Reading<'a> {
    at: &'a Locator<'a>,
    env: &'a dyn Fn(&str) -> Option<String>,
    lenient: Lenient,
    adjust: &'a dyn Fn(&mut Settings),
    link: bool,
}

impl Reading<'_> {
    /// The file read a part at a time ([`Parts`]); `None` if it cannot be,
    /// or has a mistake.
    fn in_parts(&self) -> Option<(Config, Vec<ConfigError>)> {
        let (at, text) = (self.at, self.at.text);
        let parts = Parts::of(text)?;
        let mut errors: Vec<ConfigError> = Vec::new();
        let sections = Sections::of_parts(text, parts, at, &mut errors).ok()?;
        self.sections(sections, errors).ok()
    }

    /// The file read whole.
    fn whole(&self) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let at = self.at;
        let root = toml::de::DeTable::parse(at.text).map_err(|e| at.toml_error(&e))?;
        let mut errors: Vec<ConfigError> = Vec::new();
        let sections = Sections::of(root, at, &mut errors);
        self.sections(sections, errors)
    }

    /// The file's sections checked and made one [`Config`], with the
    /// warnings of a lenient read.
    fn sections(
        &self,
        mut sections: Sections<'_>,
        mut errors: Vec<ConfigError>,
    ) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let (at, env, lenient) = (self.at, self.env, self.lenient);
        let vars = Vars::new(env, lenient.jobs);
        let api_vars = Vars::new(env, lenient.api);
        let mut settings = sections.settings(at, &vars, &mut errors)?;
        (self.adjust)(&mut settings);
        let api = sections.api(at, &api_vars, &mut errors);
        let notify = std::mem::take(&mut sections.notify);
        let (mut jobs, incomplete) = sections
            .jobs(at, &settings, &vars, &mut errors)
            .map_err(|Whole| at.error(0..0, "this file is read whole".into()))?;
        let (notifiers, incomplete_notifiers) = notifiers(notify, at, &vars, &jobs, &mut errors);
        if !errors.is_empty() {
            return Err(ConfigError::joined(errors));
        }
        let secrets = seal(&mut jobs, &vars, &api_vars, env);
        let mut unset = vars.unset();
        if lenient.jobs {
            for name in api_vars.unset() {
                if !unset.contains(&name) {
                    unset.push(name);
                }
            }
        }
        let warnings = unset.into_iter().map(|name| at.unset(&name)).collect();
        let mut config = Config {
            path: at.path.to_owned(),
            settings,
            api,
            jobs,
            secrets,
            incomplete,
            notifiers,
            incomplete_notifiers,
        };
        // Names are unique within the file; the namespace makes them so in
        // the database.
        if let Some(namespace) = config.settings.namespace.clone() {
            config.put_in_namespace(&namespace);
        }
        if self.link {
            config.link_after()?;
        }
        Ok((config, warnings))
    }
}

/// Every value the file read from the environment that is not public is
/// a secret, and so is the database password: each job masks them, and a
/// job's process never inherits a variable that holds one.
fn seal(
    jobs: &mut [Arc<Job>],
    vars: &Vars<'_>,
    api_vars: &Vars<'_>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Secrets {
    let mut read = vars.read_all();
    read.extend(api_vars.read_all());
    let hidden = environment::hidden(read.iter().map(|(name, _)| name.as_str()));
    let secrets = Secrets::of_values(
        read.iter()
            .filter(|(name, _)| !environment::is_public(name))
            .map(|(_, value)| value.clone())
            .chain(database_passwords(env)),
    );
    for job in jobs {
        // Unshared while the file is read: no copy is made.
        let job = Arc::make_mut(job);
        job.derive();
        job.secrets = secrets.clone();
        if let Action::Process(process) = &mut job.action {
            process.inherit.hidden = hidden.clone();
        }
    }
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each way of reading a file, and what it read, in words.
    fn both(text: &str) -> (Option<String>, String) {
        let env = |name: &str| (name == "TOKEN").then(|| "s3cret-token-value".to_owned());
        let at = Locator {
            path: Path::new("jobs.toml"),
            text,
        };
        let reading = Reading {
            at: &at,
            env: &env,
            lenient: Lenient::NOTHING,
            adjust: &|_| {},
            link: true,
        };
        let parts = reading.in_parts().map(|(config, _)| format!("{config:?}"));
        let whole = reading.whole().map(|(config, _)| format!("{config:?}"));
        (parts, whole.unwrap())
    }

    #[test]
    fn a_file_read_a_part_at_a_time_reads_as_it_does_whole() {
        let text = r#"
# [[job]] in a comment
[[calendar]]
name = "business"
holidays = ["2027-01-01"]

[[job]]
name = "billing"
schedule = "0 2 1 * *"
period = "month"
covers = "previous"
calendar = "business"
on_day_off = "next"
shell = """
echo '[[job]]'
echo {period}
"""
[job.env]
TOKEN = "${TOKEN}"
[job.retry]
attempts = 3
backoff = "1s"

[[job]]   # the report
name = "report"
schedule = "0 3 1 * *"
period = "month"
covers = "previous"
after = ["billing"]
[job.http]
url = "http://127.0.0.1:9/{period}"
method = "POST"
[job.http.headers]
X-Token = "${TOKEN}"

[[notify]]
name = "oncall"
url = "http://127.0.0.1:9/hook"

[scheduler]
lease = "30s"
namespace = "team"
"#;
        let (parts, whole) = both(text);
        assert_eq!(parts.as_deref(), Some(whole.as_str()));
        assert!(whole.contains("report"), "{whole}");
    }

    #[test]
    fn a_file_whose_parts_do_not_read_apart_is_read_whole() {
        // Notifiers on both sides of a job name one table from two parts.
        let text = "[[notify]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/\"\n\n\
                    [[job]]\nname = \"j\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n\n\
                    [[notify]]\nname = \"b\"\nurl = \"http://127.0.0.1:9/\"\n";
        let (parts, whole) = both(text);
        assert_eq!(parts, None);
        assert!(whole.contains("\"b\""), "{whole}");
    }

    /// Jobs that wait for nothing share one `after`; one that waits holds
    /// its own, linked to the job it names.
    #[test]
    fn jobs_that_wait_for_nothing_share_one_after() {
        let text = "[[job]]\nname = \"a\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n\n\
                    [[job]]\nname = \"b\"\nschedule = \"@hourly\"\ncommand = [\"true\"]\n\n\
                    [[job]]\nname = \"c\"\nschedule = \"@daily\"\ncommand = [\"true\"]\nafter = [\"a\"]\n";
        let config = Config::parse(Path::new("jobs.toml"), text, &|_| None).unwrap();
        let [a, b, c] = &config.jobs[..] else {
            panic!("three jobs, not {}", config.jobs.len());
        };
        assert!(Arc::ptr_eq(&a.after, &b.after));
        assert!(!a.after.any());
        assert!(!Arc::ptr_eq(&a.after, &c.after));
        let upstream: Vec<&str> = c.after.upstream.iter().map(|up| up.job.as_str()).collect();
        assert_eq!(upstream, ["a"]);
    }

    #[test]
    fn jobs_that_set_the_same_share_one_policy() {
        let text = "[[job]]\nname = \"a\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n\n\
                    [[job]]\nname = \"b\"\nschedule = \"@hourly\"\ncommand = [\"true\"]\n\n\
                    [[job]]\nname = \"c\"\nschedule = \"@daily\"\ncommand = [\"true\"]\ntimeout = \"1m\"\n";
        let env = |_: &str| None;
        let at = Locator {
            path: Path::new("jobs.toml"),
            text,
        };
        let reading = Reading {
            at: &at,
            env: &env,
            lenient: Lenient::NOTHING,
            adjust: &|_| {},
            link: true,
        };
        for (config, _) in [reading.in_parts().unwrap(), reading.whole().unwrap()] {
            let [a, b, c] = &config.jobs[..] else {
                panic!("three jobs: {config:?}");
            };
            assert!(Arc::ptr_eq(&a.policy, &b.policy), "{config:?}");
            assert!(!Arc::ptr_eq(&a.policy, &c.policy), "{config:?}");
            assert_eq!(c.policy.timeout, Some(std::time::Duration::from_secs(60)));
        }
    }
}
