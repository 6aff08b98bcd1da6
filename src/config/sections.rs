//! The top-level tables of `jobs.toml` sorted out and each validated:
//! `[scheduler]`, `[api]`, every `[[calendar]]`, `[[job]]` and
//! `[[notify]]`, names unique.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::job::Policies;
use super::locator::Locator;
use super::parts::{Parts, Whole};
use super::raw::{Calendars, RawApi, RawCalendar, RawJob, RawSettings};
use super::vars::Vars;
use super::{Action, ApiSettings, ConfigError, Job, Settings, notify};
use crate::suggest::nearest;

/// The tables of an array of tables (`[[job]]`), moved out of the parsed
/// file: a copy of 10,000 jobs' tables took as much memory again as the
/// file's whole parse. Anything else comes back as it was.
fn tables(
    value: toml::Spanned<toml::de::DeValue<'_>>,
) -> Result<toml::de::DeArray<'_>, toml::Spanned<toml::de::DeValue<'_>>> {
    let span = value.span();
    match value.into_inner() {
        toml::de::DeValue::Array(tables) => Ok(tables),
        other => Err(toml::Spanned::new(span, other)),
    }
}

/// Moves `tables` to the end of `into`; into an empty list (the usual
/// case: TOML gathers every `[[job]]` under one key) in their own buffer.
fn move_into<'t>(
    into: &mut Vec<toml::Spanned<toml::de::DeValue<'t>>>,
    tables: toml::de::DeArray<'t>,
) {
    if into.is_empty() {
        *into = tables.into_iter().collect();
    } else {
        into.extend(tables);
    }
}

/// The `[[job]]` tables: parsed with the whole file, or each part of the
/// file that holds them, parsed as its jobs are checked.
enum JobTables<'t> {
    Parsed(Vec<toml::Spanned<toml::de::DeValue<'t>>>),
    Parts(&'t str, Vec<Range<usize>>),
}

impl Default for JobTables<'_> {
    fn default() -> Self {
        JobTables::Parsed(Vec::new())
    }
}

/// The top-level tables of jobs.toml, as written: `[scheduler]`, `[api]`
/// and every `[[job]]`.
#[derive(Default)]
pub(super) struct Sections<'t> {
    settings: Option<toml::Spanned<toml::de::DeValue<'t>>>,
    api: Option<toml::Spanned<toml::de::DeValue<'t>>>,
    jobs: JobTables<'t>,
    pub(super) notify: Vec<toml::Spanned<toml::de::DeValue<'t>>>,
    calendars: Vec<toml::Spanned<toml::de::DeValue<'t>>>,
}

impl<'t> Sections<'t> {
    /// Sorts the file's tables; an unknown one is an error.
    pub(super) fn of(
        root: toml::Spanned<toml::de::DeTable<'t>>,
        at: &Locator<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Self {
        use serde::de::IntoDeserializer;
        let mut sections = Sections::default();
        for (key, value) in root.into_inner() {
            match key.get_ref().as_ref() {
                "scheduler" => sections.settings = Some(value),
                "api" => sections.api = Some(value),
                "job" => match (tables(value), &mut sections.jobs) {
                    (Ok(jobs), JobTables::Parsed(into)) => move_into(into, jobs),
                    (Ok(_), JobTables::Parts(..)) => {}
                    (Err(value), _) => {
                        if let Err(e) = Vec::<RawJob>::deserialize(value.into_deserializer()) {
                            errors.push(at.toml_error(&e));
                        }
                    }
                },
                "calendar" => match tables(value) {
                    Ok(calendars) => move_into(&mut sections.calendars, calendars),
                    Err(value) => {
                        let raw = Vec::<RawCalendar>::deserialize(value.into_deserializer());
                        if let Err(e) = raw {
                            errors.push(at.toml_error(&e));
                        }
                    }
                },
                "notify" => match tables(value) {
                    Ok(notify) => move_into(&mut sections.notify, notify),
                    Err(value) => {
                        let raw = Vec::<super::validate::RawNotify>::deserialize(
                            value.into_deserializer(),
                        );
                        if let Err(e) = raw {
                            errors.push(at.toml_error(&e));
                        }
                    }
                },
                other => {
                    let hint = nearest(other, ["scheduler", "api", "job", "notify", "calendar"])
                        .map(|n| format!("; did you mean `{n}`?"))
                        .unwrap_or_default();
                    errors.push(at.error(
                        key.span(),
                        format!(
                            "unknown field `{other}`, expected `scheduler`, `api`, `job`, `notify` or `calendar`{hint}"
                        ),
                    ));
                }
            }
        }
        sections
    }

    /// The sections of the file cut into `parts`: the rest parsed now, each
    /// part of jobs as its jobs are checked; [`Whole`] if the rest cannot
    /// be read apart from the jobs.
    pub(super) fn of_parts(
        text: &'t str,
        parts: Parts,
        at: &Locator<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Result<Self, Whole> {
        let root = super::parts::rest(text, &parts)?;
        let mut sections = Sections::of(root, at, errors);
        sections.jobs = JobTables::Parts(text, parts.jobs);
        Ok(sections)
    }

    /// `[scheduler]`, validated; a bad one is an error, and the jobs are
    /// still checked against the defaults (but not `keep` against a
    /// `catch_up` the file may set otherwise).
    pub(super) fn settings(
        &self,
        at: &Locator<'_>,
        vars: &Vars<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Result<Settings, ConfigError> {
        use serde::de::IntoDeserializer;
        let settings = self
            .settings
            .clone()
            .map(|value| RawSettings::deserialize(value.into_deserializer()))
            .transpose()
            .map_err(|e| at.toml_error(&e))
            .and_then(|raw| raw.unwrap_or_default().validate(at, vars));
        match settings {
            Ok(settings) => Ok(settings),
            Err(e) => {
                errors.push(e);
                let mut defaults = RawSettings::default().validate(at, vars)?;
                defaults.catch_up = Duration::ZERO;
                Ok(defaults)
            }
        }
    }

    /// `[api]`, validated, if the file has one.
    pub(super) fn api(
        &self,
        at: &Locator<'_>,
        vars: &Vars<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Option<ApiSettings> {
        use serde::de::IntoDeserializer;
        let api = self
            .api
            .clone()
            .map(|value| RawApi::deserialize(value.into_deserializer()))
            .transpose()
            .map_err(|e| at.toml_error(&e))
            .and_then(|raw| raw.map(|raw| raw.validate(at, vars)).transpose());
        api.unwrap_or_else(|e| {
            errors.push(e);
            None
        })
    }

    /// Every `[[calendar]]`, validated, names unique.
    fn calendars(&mut self, at: &Locator<'_>, errors: &mut Vec<ConfigError>) -> Calendars {
        use serde::de::IntoDeserializer;
        let mut calendars = Calendars::new();
        for value in std::mem::take(&mut self.calendars) {
            let span = value.span();
            let raw = match RawCalendar::deserialize(value.into_deserializer()) {
                Ok(raw) => raw,
                Err(e) => {
                    errors.push(at.toml_error(&e));
                    continue;
                }
            };
            let name = raw.name().to_owned();
            if calendars.contains_key(&name) {
                errors.push(at.error(
                    span,
                    format!("calendar name `{name}` is used twice; each needs its own"),
                ));
                continue;
            }
            // A calendar with a mistake is still known by name: its jobs
            // are not told it is missing as well.
            let calendar = raw
                .validate(at)
                .map_err(|e| errors.push(e))
                .ok()
                .map(std::sync::Arc::new);
            calendars.insert(name, calendar);
        }
        calendars
    }

    /// Every `[[job]]`, validated, names unique; with the `${VAR}`s each
    /// one names that are not set (job, variable). [`Whole`] if a part of
    /// jobs cannot be read on its own.
    pub(super) fn jobs(
        mut self,
        at: &Locator<'_>,
        settings: &Settings,
        vars: &Vars<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Result<(Vec<Arc<Job>>, Incomplete), Whole> {
        let calendars = self.calendars(at, errors);
        let mut read = JobsRead {
            at,
            settings,
            vars,
            calendars: &calendars,
            jobs: Vec::new(),
            incomplete: Vec::new(),
            seen: BTreeMap::new(),
            names: Vec::new(),
            policies: Policies::default(),
        };
        match self.jobs {
            JobTables::Parsed(values) => {
                read.jobs.reserve(values.len());
                for value in values {
                    read.job(value, errors);
                }
            }
            JobTables::Parts(text, parts) => {
                read.jobs.reserve(parts.len());
                for part in parts {
                    for value in super::parts::jobs(text, part)? {
                        read.job(value, errors);
                    }
                }
            }
        }
        // With other mistakes in the file, an `after` that names no job is
        // told now, with them, not in a later round (linking the jobs waits
        // for a file without mistakes).
        if !errors.is_empty() {
            for job in &read.jobs {
                errors.extend(job.after.unknown_names(&read.names));
            }
        }
        Ok((read.jobs, read.incomplete))
    }
}

/// The jobs, or notifiers, a lenient read left with `${VAR}`s unset:
/// (name, variable).
type Incomplete = Vec<(String, String)>;

/// The jobs read so far, one table at a time.
struct JobsRead<'a> {
    at: &'a Locator<'a>,
    settings: &'a Settings,
    vars: &'a Vars<'a>,
    calendars: &'a Calendars,
    jobs: Vec<Arc<Job>>,
    incomplete: Incomplete,
    /// Each job's name, with where it is first.
    seen: BTreeMap<String, Range<usize>>,
    /// Every job's name as written, its own mistakes or not: what an
    /// `after` may name.
    names: Vec<String>,
    /// The jobs' policies, each held once.
    policies: Policies,
}

impl JobsRead<'_> {
    /// One `[[job]]` table, validated.
    fn job(&mut self, value: toml::Spanned<toml::de::DeValue<'_>>, errors: &mut Vec<ConfigError>) {
        use serde::de::IntoDeserializer;
        let at = self.at;
        if let toml::de::DeValue::Table(table) = value.get_ref()
            && let Some(name) = table.get("name")
            && let toml::de::DeValue::String(name) = name.get_ref()
        {
            self.names.push(name.to_string());
        }
        let raw_job = match RawJob::deserialize(value.into_deserializer()) {
            Ok(raw_job) => raw_job,
            Err(e) => {
                errors.push(at.toml_error(&e));
                return;
            }
        };
        let name_span = raw_job.name.span();
        let vars = self.vars;
        let mark = vars.mark();
        let mut job = match raw_job.validate(at, self.settings, vars, self.calendars) {
            Ok(job) => job,
            Err(e) => {
                errors.push(e);
                return;
            }
        };
        if let Some(first) = self.seen.get(&*job.name) {
            let line = at.line_col(first.start).0;
            errors.push(at.error(
                name_span,
                format!(
                    "job name `{}` is already used at line {line}; job names must be unique",
                    job.name
                ),
            ));
            return;
        }
        self.seen.insert(job.name.to_string(), name_span);
        job.policy = self.policies.share(&job.policy);
        if let Action::Process(process) = &mut job.action {
            process.inherit.named = vars.names_since(mark);
        }
        for name in vars.missed_since(mark) {
            self.incomplete.push((job.name.to_string(), name));
        }
        self.jobs.push(Arc::new(job));
    }
}

/// Every `[[notify]]`, validated, names unique.
pub(super) fn notifiers(
    values: Vec<toml::Spanned<toml::de::DeValue<'_>>>,
    at: &Locator<'_>,
    vars: &Vars<'_>,
    jobs: &[Arc<Job>],
    errors: &mut Vec<ConfigError>,
) -> (Vec<notify::Notifier>, Vec<(String, String)>) {
    use serde::de::IntoDeserializer;
    let mut notifiers: Vec<notify::Notifier> = Vec::new();
    let mut incomplete = Vec::new();
    for value in values {
        let span = value.span();
        let mark = vars.mark();
        let validated = super::validate::RawNotify::deserialize(value.into_deserializer())
            .map_err(|e| at.toml_error(&e))
            .and_then(|raw| raw.validate(at, vars, jobs));
        match validated {
            Ok(n) if notifiers.iter().any(|m| m.name == n.name) => errors.push(at.error(
                span,
                format!(
                    "notifier name `{}` is used twice; each needs its own",
                    n.name
                ),
            )),
            Ok(n) => {
                for name in vars.missed_since(mark) {
                    incomplete.push((n.name.clone(), name));
                }
                notifiers.push(n);
            }
            Err(e) => errors.push(e),
        }
    }
    (notifiers, incomplete)
}
