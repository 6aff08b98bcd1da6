//! The driver's reload (SIGHUP): jobs.toml read again and applied whole,
//! jobs and settings alike, the timer going on from where it was.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

use super::gauges::retire_gauges;
use super::timer::Timer;
use super::{Index, Service, upstream_jobs};
use crate::config::{Config, Job, Settings};
use crate::store::JobRecord;

/// What the database answered to a sighting of unsighted jobs.
pub(super) struct Sighting {
    jobs: Vec<Arc<Job>>,
    records: HashMap<String, JobRecord>,
    owed: HashMap<Arc<str>, DateTime<Utc>>,
}

impl Service {
    /// Puts the jobs of a reloaded jobs.toml in place: the timer goes on
    /// from where it was for the jobs it had; fires waiting for a slot run
    /// under the job as it is now, a removed job's start nothing more.
    pub(super) fn replace_jobs(&mut self, jobs: Vec<Arc<Job>>) {
        let by_name = Index::new(&jobs);
        for gone in self
            .jobs
            .iter()
            .filter(|old| by_name.find(&jobs, &old.name).is_none())
        {
            retire_gauges(&gone.name);
        }
        let (old, old_jobs, fired_until) = (&self.by_name, &self.jobs, self.fired_until);
        // A reload that makes fires due earlier (a holiday removed) goes
        // back to them, but never before what the job owes: a fire from
        // before it was first seen runs for nobody on its own.
        self.timer = Timer::resumed(
            &jobs,
            |job| {
                let was = &old_jobs[old.find(old_jobs, &job.name)?];
                let from = crate::fires::resume_from(&was.timing(), &job.timing(), fired_until);
                let owed = self
                    .owed_since(job)
                    .map(|at| at - TimeDelta::nanoseconds(1));
                Some(owed.map_or(from, |owed| from.max(owed)))
            },
            self.clock.now(),
        );
        self.by_name = by_name;
        self.upstream = upstream_jobs(&jobs);
        self.jobs = jobs;
        self.paused_shown = None;
        self.take_pending();
        let (by_name, jobs) = (&self.by_name, &self.jobs);
        self.backlog
            .retain_mut(|(job, _)| match by_name.find(jobs, &job.name) {
                Some(i) => {
                    *job = jobs[i].clone();
                    true
                }
                None => false,
            });
    }

    /// Re-reads jobs.toml and applies all of it, jobs and settings alike;
    /// a bad file is logged and the old one kept whole.
    pub(super) async fn reload(&mut self) {
        self.regate = true;
        let Some(mut config) = self.read_again() else {
            return;
        };
        config.mask_also(self.secrets.values());
        self.secrets = config.secrets.clone();
        if let Some(companion) = &self.companion {
            companion.reconfigure(&config);
        }
        let jobs = config.jobs.clone();
        let settings = config.settings.clone();
        self.notify.send_replace(Arc::new(config));
        // Without the database's answer a retimed job goes on as the
        // timer has it; the next sighting records the change.
        let (first_sighted, paused, retimed) = match self.see_jobs_again(&jobs).await {
            Some((first_sighted, paused)) => {
                self.unsighted.clear();
                (first_sighted, paused, self.retimed(&jobs))
            }
            None => {
                // The jobs the loop does not have (or had unsighted) are
                // not known to have been seen: run as returning, they ran
                // the whole catch-up window, from before they existed
                // (adversarial review). They wait for a scan's sighting.
                self.unsighted = jobs
                    .iter()
                    .filter(|job| {
                        self.unsighted.contains(&job.name)
                            || self.by_name.find(&self.jobs, &job.name).is_none()
                    })
                    .map(|job| job.name.clone())
                    .collect();
                (Vec::new(), HashSet::new(), Vec::new())
            }
        };
        if settings.database_url != self.settings.database_url {
            tracing::warn!("reload: a new database_url takes effect at the next start");
        }
        let returning = self.returning(&jobs, &first_sighted, &paused);
        self.replace_jobs(jobs);
        let now = self.clock.now();
        // A job seen for the first time, or whose timing changed, takes what
        // it owes from its sighting on, as `run JOB` and every view have it
        // (docs/commands.md, "One period, one meaning"). The periods a
        // retimed job had waiting here were the old timing's: what it still
        // owes is taken afresh, and a claimed one (a recovery, a retry, one
        // woken by its upstream) comes back with the next scan.
        for job in &retimed {
            self.waiting.remove(&*job.name);
        }
        if !retimed.is_empty() {
            let retimed: HashSet<&str> = retimed.iter().map(|job| job.name.as_ref()).collect();
            self.backlog
                .retain_mut(|(queued, _)| !retimed.contains(queued.name.as_ref()));
        }
        for job in first_sighted.into_iter().chain(retimed).chain(returning) {
            self.catch_up_job(job, DateTime::<Utc>::MIN_UTC, now, Vec::new());
        }
        self.publish_next_fires();
        self.apply_settings(settings);
        self.backlog.rekey(self.settings.catch_up);
        if self.trim {
            super::release_free_memory();
        }
    }

    /// The jobs of `jobs` that the loop had under another timing, not
    /// paused: what they owe after the change is taken afresh.
    fn retimed(&self, jobs: &[Arc<Job>]) -> Vec<Arc<Job>> {
        jobs.iter()
            .filter(|job| {
                self.by_name
                    .find(&self.jobs, &job.name)
                    .is_some_and(|i| self.jobs[i].when != job.when)
                    && !self.paused.contains_key(&*job.name)
            })
            .cloned()
            .collect()
    }

    /// The jobs of `jobs` the loop does not have, known to the database
    /// already (not in `first_sighted`) and not `paused`: a job a reload
    /// took out and this one puts back owes the fires it missed meanwhile,
    /// as `run JOB` and every view have it, and the timer only goes on
    /// from now.
    fn returning(
        &self,
        jobs: &[Arc<Job>],
        first_sighted: &[Arc<Job>],
        paused: &HashSet<String>,
    ) -> Vec<Arc<Job>> {
        jobs.iter()
            .filter(|job| {
                self.by_name.find(&self.jobs, &job.name).is_none()
                    && !self.unsighted.contains(&job.name)
                    && !first_sighted.iter().any(|new| new.name == job.name)
                    && !paused.contains(&*job.name)
                    && !self.paused.contains_key(&*job.name)
            })
            .cloned()
            .collect()
    }

    /// jobs.toml as it is now, checked as at a start; `None`, logged with
    /// its secrets masked, if it is not valid.
    #[cfg(feature = "config-file")]
    fn read_again(&self) -> Option<Config> {
        let sqlite = !self.engine.store().is_postgres();
        let loaded = Config::load(&self.path).and_then(|config| {
            if sqlite {
                config.check_for_sqlite()?;
            }
            Ok(config)
        });
        match loaded {
            Ok(config) => Some(config),
            Err(e) => {
                let e = self.secrets.mask(&e.to_string());
                tracing::error!("reload: keeping the running configuration: {e}");
                None
            }
        }
    }

    /// A build without `config-file` has no file to read again (the
    /// library, the only such build, never reloads): its jobs are the
    /// program's.
    #[cfg(not(feature = "config-file"))]
    fn read_again(&self) -> Option<Config> {
        tracing::warn!("reload: this build reads no jobs.toml; keeping the jobs given in code");
        None
    }

    /// Shows the database the reloaded `jobs` and takes up from when each
    /// owes its fires; the jobs seen for the first time (not paused), which
    /// are to catch up, and the names of the paused ones. `None` if the
    /// database did not answer.
    async fn see_jobs_again(
        &mut self,
        jobs: &[Arc<Job>],
    ) -> Option<(Vec<Arc<Job>>, HashSet<String>)> {
        let names: Vec<String> = jobs.iter().map(|j| j.name.to_string()).collect();
        // A job this reload shows the database for the first time owes its
        // latest fire within catch_up, as at a start (docs/commands.md).
        let mut first_sighted = Vec::new();
        let mut paused = HashSet::new();
        let store = self.engine.store().clone();
        match store.see_jobs(&names).await {
            Ok(records) => {
                let sighted = jobs
                    .iter()
                    .filter_map(|job| Some((&**job, records.get(&*job.name)?)));
                self.owed =
                    crate::engine::owed::owed_from_all(&store, sighted, self.clock.now()).await;
                for job in jobs {
                    let (Some(record), Some(&owed)) =
                        (records.get(&*job.name), self.owed.get(&*job.name))
                    else {
                        continue;
                    };
                    if record.paused {
                        paused.insert(job.name.to_string());
                    }
                    if record.new {
                        crate::engine::due::log_first_sighting(job, owed);
                        if !record.paused {
                            first_sighted.push(job.clone());
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!("reload: cannot record new jobs yet: {e}");
                return None;
            }
        }
        Some((first_sighted, paused))
    }

    /// Shows the database the jobs a reload could not, beside the loop (a
    /// database that does not answer holds up no fire): each then owes
    /// what that reload's sighting would have given it (a job seen for the
    /// first time its latest fire within `catch_up`, one it knew what it
    /// missed since it owes its fires), and runs ([`Service::sighted`]).
    /// Tried again at the next scan if the database does not answer.
    pub(super) fn sight_unsighted(&mut self) {
        if self.unsighted.is_empty() || self.sighting {
            return;
        }
        self.sighting = true;
        let jobs: Vec<Arc<Job>> = (self.jobs.iter())
            .filter(|job| self.unsighted.contains(&job.name))
            .cloned()
            .collect();
        let store = self.engine.store().clone();
        let events = self.events.0.clone();
        let now = self.clock.now();
        tokio::spawn(async move {
            let names: Vec<String> = jobs.iter().map(|j| j.name.to_string()).collect();
            let sighting = match store.see_jobs(&names).await {
                Ok(records) => {
                    let sighted = jobs
                        .iter()
                        .filter_map(|job| Some((&**job, records.get(&*job.name)?)));
                    let owed = crate::engine::owed::owed_from_all(&store, sighted, now).await;
                    Some(Box::new(Sighting {
                        jobs,
                        records,
                        owed,
                    }))
                }
                Err(e) => {
                    tracing::warn!("cannot record new jobs yet: {e}");
                    None
                }
            };
            let _ = events.send(super::Event::Sighted(sighting));
        });
    }

    /// Takes up the jobs `sighting` recorded that are still unsighted here
    /// under the same definition (a reload meanwhile sighted them, or made
    /// them anew: then the next scan's sighting shows them as they are).
    pub(super) fn sighted(&mut self, sighting: Sighting) {
        let Sighting {
            jobs,
            records,
            owed,
        } = sighting;
        let now = self.clock.now();
        let window = now - TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        for job in jobs {
            let same = self
                .job(&job.name)
                .is_some_and(|now| Arc::ptr_eq(&now, &job));
            let (Some(record), Some(&from)) = (records.get(&*job.name), owed.get(&*job.name))
            else {
                continue;
            };
            if !same || !self.unsighted.remove(&job.name) {
                continue;
            }
            self.owed.insert(job.name.clone(), from);
            if record.new {
                crate::engine::due::log_first_sighting(&job, from);
            }
            if record.paused {
                self.paused.insert(job.name.to_string(), window.max(from));
                continue;
            }
            self.catch_up_job(job, DateTime::<Utc>::MIN_UTC, now, Vec::new());
        }
    }

    /// Puts the reloaded settings in force, and logs what was reloaded.
    fn apply_settings(&mut self, settings: Settings) {
        // Leases granted from now on, and so the heartbeat interval and the
        // fence; claims already held keep the lease they were granted until
        // their next renewal.
        self.engine.set_lease(settings.lease);
        self.health.watch(settings.lease, settings.scan_interval);
        self.settings = settings;
        tracing::info!(
            jobs = self.jobs.len(),
            lease = %humantime::format_duration(self.settings.lease),
            max_running = self.settings.max_running,
            shutdown_grace = %humantime::format_duration(self.settings.shutdown_grace),
            scan_interval = %humantime::format_duration(self.settings.scan_interval),
            catch_up = %humantime::format_duration(self.settings.catch_up),
            "reloaded {}",
            self.path.display()
        );
        if self.jobs.is_empty() {
            tracing::warn!(
                "reload: {} has no jobs; nothing is scheduled",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;
    use tokio::sync::watch;

    use super::*;
    use crate::clock::StoppedClock;
    use crate::driver::Event;
    use crate::engine::Engine;
    use crate::engine::due::Due;
    use crate::store::{Store, Trigger};

    /// A reload that makes a period due earlier than it was, at an instant
    /// already past, still fires it (the review found it lost: the timer
    /// went on from where it had fired other jobs up to).
    #[tokio::test]
    async fn a_reload_that_makes_a_period_due_earlier_still_fires_it() {
        let text = |jitter: &str| {
            format!(
                "[[job]]\nname = \"h\"\nschedule = \"*/5 * * * * *\"\njitter = \"{jitter}\"\ncommand = [\"true\"]\n\n\
                 [[job]]\nname = \"k\"\nschedule = \"*/5 * * * * *\"\ncommand = [\"true\"]\n"
            )
        };
        let path = std::path::Path::new("jobs.toml");
        let config = Config::parse(path, &text("1h"), &|_| None).expect("valid jobs");
        // A fire of `h` delayed three seconds or more.
        let start = Utc.with_ymd_and_hms(2027, 1, 4, 10, 0, 0).unwrap();
        let p = (0..100)
            .map(|n| start + TimeDelta::seconds(5 * n))
            .find(|p| config.jobs[0].timing().jitter(*p) >= TimeDelta::seconds(3))
            .expect("a fire delayed 3 s");
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        let clock = Arc::new(StoppedClock::at(p - TimeDelta::seconds(1)));
        let (_down, shutdown) = watch::channel(false);
        let mut service =
            Service::on(path.into(), config, engine, shutdown).with_clock(clock.clone());
        let mut fired = Vec::new();
        let mut step = |service: &mut Service, millis: i64| {
            clock.advance(TimeDelta::milliseconds(millis));
            service.fire();
            fired.extend(
                service
                    .pending
                    .drain(..)
                    .map(|(job, due)| format!("{}:{}", job.name, due.period.label)),
            );
        };
        // `k` fires at P; `h`'s P is due three seconds or more later ...
        step(&mut service, 1_000);
        step(&mut service, 2_800);
        // ... when a reload takes its jitter down to nothing: now past.
        let reloaded = Config::parse(path, &text("1s"), &|_| None).expect("valid jobs");
        service.replace_jobs(reloaded.jobs);
        step(&mut service, 100);
        let label = crate::period::utc_text(p);
        assert!(fired.contains(&format!("h:{label}")), "{fired:?}");
        assert!(fired.contains(&format!("k:{label}")), "{fired:?}");
    }

    /// A reload that gives back a day its calendar took (a holiday
    /// removed) fires only what the job owes since it was first seen: the
    /// latest fire within `catch_up` of that sighting and the ones after,
    /// never the day's earlier fires (issue 39: 36 periods ran at once, 35
    /// of them from before the job existed).
    #[tokio::test]
    async fn a_reload_that_gives_a_day_back_runs_nothing_from_before_the_job_was_first_seen() {
        let text = |holidays: &str| {
            format!(
                "[scheduler]\ncatch_up = \"3h\"\n\n[[calendar]]\nname = \"c\"\nholidays = [{holidays}]\n\n\
                 [[job]]\nname = \"k\"\nschedule = \"*/5 * * * *\"\ncalendar = \"c\"\n\
                 on_day_off = \"skip\"\ncommand = [\"true\"]\n"
            )
        };
        let path = std::path::Path::new("jobs.toml");
        // Monday 4 January 2027, a holiday when the job is first seen.
        let config = Config::parse(path, &text("\"2027-01-04\""), &|_| None).expect("valid jobs");
        let seen = Utc.with_ymd_and_hms(2027, 1, 4, 16, 17, 0).unwrap();
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        let clock = Arc::new(StoppedClock::at(seen));
        let (_down, shutdown) = watch::channel(false);
        let mut service =
            Service::on(path.into(), config, engine, shutdown).with_clock(clock.clone());
        // Seen on a holiday: its latest fire (Friday's) is older than
        // catch_up, so it owes its fires from the sighting, fixed there.
        let owed = service.jobs[0].owed_since(seen);
        assert_eq!(owed, seen);
        service.owed.insert("k".into(), owed);
        clock.advance(TimeDelta::seconds(5));
        service.fire();
        assert!(service.pending.is_empty(), "a holiday fired");
        // The holiday is taken back out five seconds after the sighting.
        let reloaded = Config::parse(path, &text(""), &|_| None).expect("valid jobs");
        service.replace_jobs(reloaded.jobs);
        clock.advance(TimeDelta::seconds(1));
        service.fire();
        let fired = |service: &mut Service| -> Vec<String> {
            service
                .pending
                .drain(..)
                .map(|(job, due)| format!("{}:{}", job.name, due.period.label))
                .collect()
        };
        // The day's fires before the sighting, 16:15 included, were not
        // fires when it was seen: none runs.
        assert_eq!(fired(&mut service), Vec::<String>::new());
        // The next one does, at its time.
        clock.advance(TimeDelta::minutes(3));
        service.fire();
        assert_eq!(fired(&mut service), ["k:2027-01-04T16:20:00Z"]);
    }

    /// A claim asked for under the old schedule and answered `busy` (or
    /// held up by the database) after a reload changed the schedule is of
    /// a period the job no longer has: it is not asked for again, while a
    /// recovery is (adversarial review: the old schedule's fires ran beside
    /// the new one's after a reload made during a database lock).
    #[tokio::test]
    async fn an_answer_of_the_old_schedule_after_a_reload_is_not_asked_for_again() {
        let text = |schedule: &str| {
            format!("[[job]]\nname = \"h\"\nschedule = \"{schedule}\"\ncommand = [\"true\"]\n")
        };
        let path = std::path::Path::new("jobs.toml");
        let config = Config::parse(path, &text("*/2 * * * * *"), &|_| None).expect("a job");
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        let now = Utc.with_ymd_and_hms(2027, 1, 4, 10, 0, 1).unwrap();
        let clock = Arc::new(StoppedClock::at(now));
        let (_down, shutdown) = watch::channel(false);
        let mut service = Service::on(path.into(), config, engine, shutdown).with_clock(clock);
        let old = |fire: DateTime<Utc>, trigger| Due {
            period: service.jobs[0].timing().period_of(&crate::fires::Fire {
                nominal: fire,
                at: fire,
            }),
            fire,
            trigger,
            shard: None,
        };
        let even = old(now - TimeDelta::seconds(1), Trigger::CatchUp);
        let recovery = old(now - TimeDelta::seconds(3), Trigger::Recovery);
        // Odd seconds from now on.
        let reloaded = Config::parse(path, &text("1-59/2 * * * * *"), &|_| None).expect("a job");
        service.replace_jobs(reloaded.jobs);
        service.handle(Event::Again("h".into(), even));
        service.handle(Event::Again("h".into(), recovery.clone()));
        let waiting: Vec<&Due> = service
            .waiting
            .get("h")
            .into_iter()
            .flat_map(|q| q.values())
            .collect();
        assert_eq!(waiting, [&recovery]);
    }

    /// A reload whose sighting the database refuses runs none of the jobs
    /// it brought: run as jobs coming back, they ran every period of the
    /// catch-up window, from before they existed (adversarial review: 5
    /// hours each). The next scan's sighting gives a new job its latest
    /// fire, as a reload's would have.
    #[tokio::test]
    async fn jobs_a_reload_could_not_sight_run_only_once_sighted() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("jobs.toml");
        let text = |names: &[&str]| -> String {
            let jobs: String = names
                .iter()
                .map(|n| format!("[[job]]\nname = \"{n}\"\nschedule = \"0 * * * *\"\ncommand = [\"true\"]\n\n"))
                .collect();
            format!("[scheduler]\ncatch_up = \"6h\"\n\n{jobs}")
        };
        std::fs::write(&path, text(&["k"])).expect("jobs.toml written");
        let config = Config::parse(&path, &text(&["k"]), &|_| None).expect("valid jobs");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        store.migrate().await.expect("migrated");
        let engine =
            Engine::new(store.clone(), Duration::from_secs(30), "t".into()).expect("an engine");
        let (_down, shutdown) = watch::channel(false);
        let mut service = Service::on(path.clone(), config, engine, shutdown);
        service.catch_up().await.expect("k sighted");
        service.pending.clear();
        let refuse = "CREATE TRIGGER refuse BEFORE INSERT ON scheduler_jobs \
                      WHEN NEW.name = 'n' BEGIN SELECT RAISE(ABORT, 'refused'); END";
        let other = sqlx::SqlitePool::connect(&url).await.expect("a connection");
        sqlx::query(refuse)
            .execute(&other)
            .await
            .expect("a trigger");
        std::fs::write(&path, text(&["k", "n"])).expect("jobs.toml written");
        service.reload().await;
        // Dispatched, queued for a slot, or waiting for the job's own.
        let queued = |service: &Service| -> Vec<String> {
            let waiting = service
                .waiting
                .get("n")
                .into_iter()
                .flat_map(|q| q.values());
            (service.pending.iter().chain(service.backlog.iter()))
                .filter(|(job, _)| &*job.name == "n")
                .map(|(_, due)| due)
                .chain(waiting)
                .map(|due| due.period.label.clone())
                .collect()
        };
        assert_eq!(queued(&service), Vec::<String>::new(), "run unsighted");
        assert!(service.unsighted.contains("n"));
        let sight = async |service: &mut Service| {
            service.sight_unsighted();
            let event = service
                .events
                .1
                .recv()
                .await
                .expect("the sighting's answer");
            service.handle(event);
        };
        // Refused again: still waiting.
        sight(&mut service).await;
        assert_eq!(queued(&service), Vec::<String>::new(), "run unsighted");
        sqlx::query("DROP TRIGGER refuse")
            .execute(&other)
            .await
            .expect("the trigger dropped");
        let hour = || Utc::now().format("%Y-%m-%dT%H:00:00Z").to_string();
        let before = hour();
        sight(&mut service).await;
        assert!(service.unsighted.is_empty());
        let queued = queued(&service);
        // The hour may turn in between.
        let latest = [before, hour()];
        assert!(
            queued.len() == 1 && latest.contains(&queued[0]),
            "its latest fire, once: {queued:?}"
        );
    }
}
