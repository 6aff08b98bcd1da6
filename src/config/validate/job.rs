//! A `[[job]]` checked: its name, schedule and zone, which of its fires
//! exist and how they move, its retries, deadline, `keep` and `after`.

use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use toml::Spanned;

use super::{date, duration, kept, positive, zone};
use crate::calendar::{Days, OnDayOff};
use crate::config::after::{After, Named};
use crate::config::locator::Locator;
use crate::config::raw::{Calendars, RawJob};
use crate::config::rules::{deadline_problem, job_name_problem, keep_problem, schedule};
use crate::config::vars::Env;
use crate::config::{ConfigError, Fingerprint, Job, Policy, Retry, Settings};
use crate::fires::{FireRules, Shift};
use crate::period::{MAX_SHARDS, PeriodRule};
use crate::schedule::{DstRule, Schedule};
use crate::suggest::nearest;
use crate::template::SHARD_PLACEHOLDERS;

impl RawJob {
    pub(in crate::config) fn validate(
        self,
        at: &Locator,
        settings: &Settings,
        env: Env,
        calendars: &Calendars,
    ) -> Result<Job, ConfigError> {
        // Every mistake of the job is reported at once, not one per `check`.
        let mut errors: Vec<ConfigError> = Vec::new();
        let name = self.name.get_ref();
        if let Some(problem) = job_name_problem(name) {
            kept(
                &mut errors,
                Err::<(), _>(at.error(self.name.span(), problem)),
            );
        }
        let (schedule, fires_rules) = self.schedule(at, settings, calendars, &mut errors);
        let action = kept(&mut errors, self.action(at, env));
        let retry = self.retry(at, &mut errors);
        let timeout = kept(&mut errors, self.timeout(at));
        let (shards, concurrency) = self.slots(at, &mut errors);
        let keep = kept(&mut errors, self.keep(at, settings));
        let output = kept(&mut errors, self.output(at, keep.flatten()));
        let deadline = kept(&mut errors, self.deadline(at, settings));
        let after = kept(&mut errors, self.after(at));
        let (
            Some(schedule),
            Some(action),
            Some(retry),
            Some(timeout),
            Some(concurrency),
            Some(shards),
            Some(keep),
            Some(deadline),
            Some((output_max, keep_output)),
        ) = (
            schedule,
            action,
            retry,
            timeout,
            concurrency,
            shards,
            keep,
            deadline,
            output,
        )
        else {
            return Err(ConfigError::joined(errors));
        };
        if !errors.is_empty() {
            return Err(ConfigError::joined(errors));
        }
        Ok(Job {
            name: name.as_str().into(),
            schedule,
            period: PeriodRule {
                unit: self.period,
                covers: self.covers,
            },
            action,
            policy: Arc::new(Policy {
                fires: fires_rules,
                timeout,
                concurrency,
                shards,
                missed: self.missed,
                retry,
                keep,
                output_max,
                keep_output,
                deadline,
                catch_up: settings.catch_up,
            }),
            after: after.unwrap_or_else(After::nothing),
            definition: Fingerprint::default(),
            when: Fingerprint::default(),
            secrets: Default::default(),
        })
    }

    /// The job's schedule, in its zone and with the days it fires on, and
    /// how its fires move and are delayed; mistakes added to `errors`.
    fn schedule(
        &self,
        at: &Locator,
        settings: &Settings,
        calendars: &Calendars,
        errors: &mut Vec<ConfigError>,
    ) -> (Option<Schedule>, FireRules) {
        let name = self.name.get_ref();
        let zone = match &self.timezone {
            Some(z) => kept(errors, zone(at, z)),
            None => Some(settings.timezone),
        };
        let dst = DstRule {
            gap: self.dst.gap,
            repeat: self.dst.repeat,
        };
        // Checked in UTC where the zone is wrong, so that both are said.
        let schedule = kept(
            errors,
            schedule(self.schedule.get_ref(), zone.unwrap_or(Tz::UTC), dst)
                .map_err(|problem| at.error(self.schedule.span(), problem)),
        )
        .filter(|_| zone.is_some());
        let (days, fires_rules) = self.days_and_fires(at, calendars, errors);
        let schedule = schedule.map(|s| s.with_days(days));
        if let Some(schedule) = &schedule
            && schedule.days().is_some()
            && schedule.next_after(chrono::DateTime::UNIX_EPOCH).is_none()
        {
            let span = self
                .calendar
                .as_ref()
                .map_or(self.schedule.span(), Spanned::span);
            errors.push(at.error(
                span,
                format!(
                    "job `{name}` would never fire: `{}` falls only on days its calendar skips or outside its active dates",
                    schedule.source()
                ),
            ));
        }
        if let (Some(schedule), Some(shift)) = (&schedule, &fires_rules.shift)
            && let Some(problem) = too_frequent_to_move(schedule)
        {
            errors.push(
                at.error(
                    self.on_day_off
                        .as_ref()
                        .map_or(self.schedule.span(), Spanned::span),
                    format!("`on_day_off = \"{}\"`: {problem}", shift.to),
                ),
            );
        }
        (schedule, fires_rules)
    }

    /// Which fires exist (`active_from`, `active_until`, a calendar with
    /// `on_day_off = "skip"`) and how they move and are delayed (a calendar
    /// with `next` or `previous`, `jitter`); mistakes added to `errors`.
    fn days_and_fires(
        &self,
        at: &Locator,
        calendars: &Calendars,
        errors: &mut Vec<ConfigError>,
    ) -> (Days, FireRules) {
        let mut days = Days {
            from: self
                .active_from
                .as_ref()
                .and_then(|d| kept(errors, date(at, d))),
            until: self
                .active_until
                .as_ref()
                .and_then(|d| kept(errors, date(at, d))),
            ..Days::default()
        };
        if let (Some(from), Some(until), Some(written)) =
            (days.from, days.until, &self.active_until)
            && until < from
        {
            errors.push(at.error(
                written.span(),
                format!("`active_until` {until} comes before `active_from` {from}: the job would never fire"),
            ));
        }
        let on_day_off = self.on_day_off.as_ref().map(|o| *o.get_ref());
        let calendar = match &self.calendar {
            Some(name) => match calendars.get(name.get_ref()) {
                Some(calendar) => calendar.clone(),
                None => {
                    let hint = nearest(name.get_ref(), calendars.keys().map(String::as_str))
                        .map(|n| format!("; did you mean `{n}`?"))
                        .unwrap_or_default();
                    let known = if calendars.is_empty() {
                        "the file has no `[[calendar]]`".to_owned()
                    } else {
                        let names: Vec<String> =
                            calendars.keys().map(|n| format!("`{n}`")).collect();
                        format!("calendars: {}", names.join(", "))
                    };
                    errors.push(at.error(
                        name.span(),
                        format!("unknown calendar `{}` ({known}){hint}", name.get_ref()),
                    ));
                    None
                }
            },
            None => {
                if let Some(written) = &self.on_day_off {
                    errors.push(at.error(
                        written.span(),
                        "`on_day_off` without `calendar`: no day is a day off for this job; name a `[[calendar]]`".into(),
                    ));
                }
                None
            }
        };
        let mut rules = FireRules::default();
        match (calendar, on_day_off.unwrap_or_default()) {
            (Some(calendar), OnDayOff::Skip) => days.working = Some(calendar),
            (Some(calendar), to) => rules.shift = Some(Shift { calendar, to }),
            (None, _) => {}
        }
        if let Some(written) = &self.jitter {
            match duration(at, Some(written), "") {
                Ok(jitter) if jitter < Duration::from_secs(1) => errors.push(at.error(
                    written.span(),
                    "`jitter` must be at least `1s`: fires are delayed by whole seconds".into(),
                )),
                Ok(jitter) => rules.jitter = Some(jitter),
                Err(e) => errors.push(e),
            }
        }
        (days, rules)
    }

    /// `timeout`, if given.
    fn timeout(&self, at: &Locator) -> Result<Option<Duration>, ConfigError> {
        self.timeout
            .as_ref()
            .map(|t| duration(at, Some(t), ""))
            .transpose()
    }

    /// `shards` and `concurrency`, which is `shards` unless given (a job
    /// split into shards runs them all at once unless told); mistakes
    /// added to `errors`.
    fn slots(&self, at: &Locator, errors: &mut Vec<ConfigError>) -> (Option<u32>, Option<u32>) {
        let shards = kept(errors, self.shards(at));
        let concurrency = kept(
            errors,
            positive(at, self.concurrency.as_ref(), shards.unwrap_or(1)),
        );
        (shards, concurrency)
    }

    /// `shards`: 1 (not split, as without it) to [`MAX_SHARDS`]; without
    /// it (or 1), no template of the job may name `{shard}` or `{shards}`.
    fn shards(&self, at: &Locator) -> Result<u32, ConfigError> {
        let Some(shards) = &self.shards else {
            return self.no_shard_placeholders(at).map(|()| 1);
        };
        let n = *shards.get_ref();
        let Some(n) = u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_SHARDS).contains(n))
        else {
            return Err(at.error(
                shards.span(),
                format!("`{n}` is out of range: expected a whole number of shards from 1 (not split) to {MAX_SHARDS}"),
            ));
        };
        if n == 1 {
            self.no_shard_placeholders(at)?;
        }
        Ok(n)
    }

    /// Refuses `{shard}` and `{shards}` in a job whose periods are not
    /// split: it would have no value.
    fn no_shard_placeholders(&self, at: &Locator) -> Result<(), ConfigError> {
        for value in self.template_strings() {
            let found = crate::template::placeholders(value.get_ref())
                .find(|(_, name)| SHARD_PLACEHOLDERS.contains(name));
            if let Some((offset, name)) = found {
                let start = value.span().start + 1 + offset;
                return Err(at.error(
                    start..start + name.len() + 2,
                    format!(
                        "`{{{name}}}` in job `{}`, whose periods are not split into shards: set `shards = N` (2 to {MAX_SHARDS}) or take it out",
                        self.name.get_ref()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The strings of its action where placeholders are filled in.
    fn template_strings(&self) -> Vec<&Spanned<String>> {
        let mut strings: Vec<&Spanned<String>> = Vec::new();
        if let Some(command) = &self.command {
            strings.extend(command.get_ref());
        }
        strings.extend(&self.shell);
        strings.extend(&self.workdir);
        if let Some(env) = &self.env {
            strings.extend(env.get_ref().values());
        }
        if let Some(http) = &self.http {
            let http = http.get_ref();
            strings.push(&http.url);
            strings.extend(http.headers.values());
            strings.extend(&http.body);
        }
        if let Some(sql) = &self.sql {
            strings.extend(&sql.get_ref().params);
        }
        strings
    }

    /// `after` as written, each name with its place; linked to the jobs it
    /// names once all are read. `on_upstream_rerun` without it says
    /// nothing, and is refused as the mistake it is.
    fn after(&self, at: &Locator) -> Result<Arc<After>, ConfigError> {
        let named = self.after.as_ref().map_or(&[][..], |a| a.get_ref());
        if let Some(on_rerun) = &self.on_upstream_rerun
            && named.is_empty()
        {
            return Err(at.error(
                on_rerun.span(),
                "`on_upstream_rerun` without `after`: the job waits for no other job's periods, so no rerun upstream concerns it".into(),
            ));
        }
        if named.is_empty() {
            return Ok(After::nothing());
        }
        Ok(Arc::new(After {
            named: named
                .iter()
                .map(|name| Named {
                    name: name.get_ref().clone(),
                    place: at.error(name.span(), String::new()).place,
                })
                .collect(),
            on_rerun: self
                .on_upstream_rerun
                .as_ref()
                .map(|r| *r.get_ref())
                .unwrap_or_default(),
            ..Default::default()
        }))
    }

    /// `deadline`, which must be shorter than the catch-up window: a period
    /// older than the window is not run any more, nor looked at, so it
    /// could never be told late.
    fn deadline(&self, at: &Locator, settings: &Settings) -> Result<Option<Duration>, ConfigError> {
        let Some(written) = &self.deadline else {
            return Ok(None);
        };
        let deadline = duration(at, Some(written), "")?;
        match deadline_problem(deadline, settings.catch_up) {
            Some(problem) => Err(at.error(written.span(), problem)),
            None => Ok(Some(deadline)),
        }
    }

    /// `retry`, its mistakes added to `errors`.
    fn retry(&self, at: &Locator, errors: &mut Vec<ConfigError>) -> Option<Retry> {
        let Some(r) = &self.retry else {
            return Some(Retry::default());
        };
        let attempts = kept(errors, positive(at, r.attempts.as_ref(), 1));
        let backoff = kept(errors, duration(at, r.backoff.as_ref(), "1m"));
        let max_backoff = kept(errors, duration(at, r.max_backoff.as_ref(), "1h"));
        Some(Retry {
            attempts: attempts?,
            backoff: backoff?,
            max_backoff: max_backoff?,
        })
    }

    /// `output_max` and `keep_output`.
    fn output(
        &self,
        at: &Locator,
        keep: Option<Duration>,
    ) -> Result<(u64, Option<Duration>), ConfigError> {
        Ok((self.output_max(at)?, self.keep_output(at, keep)?))
    }

    /// `output_max`: a size (`16MiB`, `512KiB`), within
    /// [`OUTPUT_MAX_RANGE`](crate::config::OUTPUT_MAX_RANGE).
    fn output_max(&self, at: &Locator) -> Result<u64, ConfigError> {
        let Some(written) = &self.output_max else {
            return Ok(crate::config::OUTPUT_MAX);
        };
        written
            .get_ref()
            .parse::<bytesize::ByteSize>()
            .map_err(|e| {
                format!(
                    "`{}` is not a size ({e}): expected e.g. `16MiB`, `512KiB`",
                    written.get_ref()
                )
            })
            .and_then(|size| {
                crate::config::rules::output_max_problem(size.as_u64())
                    .map_or(Ok(size.as_u64()), Err)
            })
            .map_err(|problem| at.error(written.span(), problem))
    }

    /// `keep_output`, no longer than `keep` (the output goes with its
    /// claim anyway).
    fn keep_output(
        &self,
        at: &Locator,
        keep: Option<Duration>,
    ) -> Result<Option<Duration>, ConfigError> {
        let Some(written) = &self.keep_output else {
            return Ok(None);
        };
        let parsed = duration(at, Some(written), "")?;
        match crate::config::rules::keep_output_problem(parsed, keep) {
            Some(problem) => Err(at.error(written.span(), problem)),
            None => Ok(Some(parsed)),
        }
    }

    /// `keep`, which may not be shorter than the catch-up window: a period
    /// pruned inside it would be claimed, and run, again.
    fn keep(&self, at: &Locator, settings: &Settings) -> Result<Option<Duration>, ConfigError> {
        let Some(keep) = &self.keep else {
            return Ok(None);
        };
        let parsed = duration(at, Some(keep), "")?;
        match keep_problem(keep.get_ref(), parsed, settings.catch_up) {
            Some(problem) => Err(at.error(keep.span(), problem)),
            None => Ok(Some(parsed)),
        }
    }
}

/// Why fires of `schedule` cannot be moved to working days: moving is for
/// schedules of at most 24 fires a day (every walk over moved fires looks
/// at every fire within the calendar's longest closure).
fn too_frequent_to_move(schedule: &Schedule) -> Option<String> {
    // A week of the pattern, read in UTC: how often it fires, not where.
    let start = chrono::DateTime::UNIX_EPOCH + chrono::TimeDelta::days(365 * 57);
    let week = start + chrono::TimeDelta::days(7);
    let fires = schedule.fires_between(start, week).take(24 * 7 + 1).count();
    (fires > 24 * 7).then(|| {
        format!(
            "`{}` fires more than 24 times a day; a fire is moved to a working day only for schedules of at most hourly fires (use `on_day_off = \"skip\"`)",
            schedule.source()
        )
    })
}
