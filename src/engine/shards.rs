//! A period split into shards: each shard is a claim of its own, and the
//! period stands as one claim row made from theirs ([`of_shards`]), which
//! the one state rule ([`super::due::standing`]) then reads as it reads
//! the row of a period not split. Every view and every gate that asks
//! where a period stands reads its rows through [`claims`].

use std::collections::HashMap;

use super::Ask;
use crate::config::Job;
use crate::error::Error;
use crate::period::{Period, PeriodKey, Shard};
use crate::store::{Claim, ClaimRow, ClaimState, Store, Trigger};

/// How many periods one statement reads.
pub const PERIODS_PER_READ: usize = 1_000;

/// The claim rows of one period.
#[derive(Debug, Clone, Default)]
pub struct PeriodClaims {
    /// The row the period stands by: its own, or the one made from its
    /// shards' rows; `None` while it was never claimed (or a shard of it
    /// never was, and none runs or failed).
    pub row: Option<ClaimRow>,
    /// Into how many shards it is split: as its rows say (a period keeps
    /// the count it ran with), or as its job is now if none was claimed.
    pub shards: u32,
    /// Its shards' rows, by shard (empty for a period not split).
    pub shard_rows: Vec<(Shard, ClaimRow)>,
}

impl PeriodClaims {
    /// Whether it, or a shard of it, was ever claimed.
    pub fn claimed(&self) -> bool {
        self.row.is_some() || !self.shard_rows.is_empty()
    }
}

/// The claims of each of `periods`, in their order, in one statement per
/// [`PERIODS_PER_READ`].
pub async fn claims(
    store: &Store,
    periods: &[(&Job, &Period)],
) -> Result<Vec<PeriodClaims>, Error> {
    let asked: Vec<(&str, &Period, u32)> = periods
        .iter()
        .map(|(job, period)| (job.name.as_ref(), *period, job.policy.shards))
        .collect();
    read(store, &asked).await
}

/// The claims of each of `periods` (a job's name, the period, and into how
/// many shards the job splits a period now), in their order.
pub async fn read(
    store: &Store,
    periods: &[(&str, &Period, u32)],
) -> Result<Vec<PeriodClaims>, Error> {
    let mut found: HashMap<String, Vec<ClaimRow>> = HashMap::new();
    for chunk in periods.chunks(PERIODS_PER_READ) {
        let asked: Vec<(&str, &Period)> = chunk
            .iter()
            .map(|(job, period, _)| (*job, *period))
            .collect();
        found.extend(store.period_rows(&asked).await?);
    }
    Ok(periods
        .iter()
        .map(|(job, period, shards)| {
            let key = PeriodKey::new(job, &period.label);
            let rows = found.remove(key.as_str()).unwrap_or_default();
            of_rows(key, rows, *shards)
        })
        .collect())
}

/// `units` (as [`Engine::take`](super::Engine::take) gets them), each
/// period of a job split into shards asked for as it was last claimed
/// where that differs from the job's `shards` now (a reload changed it
/// since part of the period was claimed, or since an earlier fire of it
/// ran): a period is never split two ways. The first shard asked for
/// stands for its period; a shard of the count that is no more is not
/// asked for. One read, for the periods of jobs split into shards and
/// those asked for again (not a fire's own first ask of a job not split:
/// the path of most claims).
pub(crate) async fn resplit(store: &Store, units: Vec<Vec<Ask>>) -> Result<Vec<Vec<Ask>>, Error> {
    let mut asked: Vec<(&str, &Period, u32)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // Asks of jobs split into shards, and every ask but a fire's first
    // (a job's `shards` lowered to 1 meets a period claimed split when
    // its fire's ask is refused and asked again as a catch-up).
    let looked = |ask: &&Ask| ask.job.policy.shards > 1 || ask.due.trigger != Trigger::Schedule;
    for ask in units.iter().flatten().filter(looked) {
        if seen.insert(ask.key().period_key()) {
            asked.push((
                ask.job.name.as_ref(),
                &ask.due.period,
                ask.job.policy.shards,
            ));
        }
    }
    if asked.is_empty() {
        return Ok(units);
    }
    let counts: HashMap<PeriodKey, u32> = read(store, &asked)
        .await?
        .into_iter()
        .zip(&asked)
        .filter(|(claims, (_, _, now))| claims.claimed() && claims.shards != *now)
        .map(|(claims, (job, period, _))| (PeriodKey::new(job, &period.label), claims.shards))
        .collect();
    drop(asked);
    if counts.is_empty() {
        return Ok(units);
    }
    Ok(units
        .into_iter()
        .map(|unit| {
            let mut kept: Vec<Ask> = Vec::with_capacity(unit.len());
            for ask in unit {
                let count = ask.due.shard.map_or(1, |s| s.of);
                match counts.get(&ask.key().period_key()) {
                    Some(shards) if *shards != count => {
                        if !ask.due.first_of_period() {
                            continue;
                        }
                        for due in ask.due.clone().split(*shards) {
                            kept.push(Ask { due, ..ask.clone() });
                        }
                    }
                    _ => kept.push(ask),
                }
            }
            kept
        })
        .collect())
}

/// The key of shard `k` (given as `field`) of `period` of `job`, checked
/// against the count the period was claimed with (the job's `shards` now,
/// if it never was), and the period's claims; see
/// [`shard_of`](super::labels::shard_of) for what is refused.
pub async fn key_of(
    store: &Store,
    job: &Job,
    period: &Period,
    (k, field, needed): (Option<u32>, &'static str, bool),
) -> Result<(PeriodKey, PeriodClaims), Error> {
    let claims = claims(store, &[(job, period)])
        .await?
        .pop()
        .unwrap_or_default();
    let split = (job.name.as_ref(), claims.shards, "this period");
    let shard = super::labels::shard_of(split, k, field, needed)?;
    Ok((PeriodKey::of(&job.name, &period.label, shard), claims))
}

/// The claims of the period `key` from all its rows: those of the shard
/// count it ran with last (the row claimed last says which), or `shards`
/// if none was claimed.
pub fn of_rows(key: PeriodKey, rows: Vec<ClaimRow>, shards: u32) -> PeriodClaims {
    let count = |row: &ClaimRow| {
        PeriodKey::of_stored(&row.period_key)
            .shard()
            .map_or(1, |s| s.of)
    };
    let Some(latest) = rows.iter().max_by_key(|row| (row.started_at, count(row))) else {
        return PeriodClaims {
            row: None,
            shards,
            shard_rows: Vec::new(),
        };
    };
    let shards = count(latest);
    if shards == 1 {
        let row = rows.into_iter().find(|row| row.period_key == key.as_str());
        return PeriodClaims {
            row,
            shards,
            shard_rows: Vec::new(),
        };
    }
    let mut shard_rows: Vec<(Shard, ClaimRow)> = rows
        .into_iter()
        .filter_map(|row| {
            let shard = PeriodKey::of_stored(&row.period_key).shard()?;
            (shard.of == shards).then_some((shard, row))
        })
        .collect();
    shard_rows.sort_by_key(|(shard, _)| shard.index);
    PeriodClaims {
        row: of_shards(&key, &shard_rows, shards),
        shards,
        shard_rows,
    }
}

/// The row a period split `shards` ways stands by, from its shards' rows:
/// - one that runs (a live lease), else one that stops (released, its
///   runner not yet confirmed), else one whose lease ran out: it is
///   running;
/// - else one that failed: it failed;
/// - else one released and let go: it runs again;
/// - else, with a shard never claimed, none: it stands as a period never
///   claimed (due, waiting, missed …);
/// - else every shard succeeded: it succeeded, from its first shard's
///   start (a success upstream after that makes it stale) to its last
///   shard's end; adopted if every shard was.
pub fn of_shards(key: &PeriodKey, rows: &[(Shard, ClaimRow)], shards: u32) -> Option<ClaimRow> {
    let rank = |row: &ClaimRow| match (row.as_claim(), row.state) {
        (Claim::Held { .. }, ClaimState::Running) => 6,
        (Claim::Held { .. }, _) => 5,
        (_, ClaimState::Running) => 4,
        (_, ClaimState::Failed) => 3,
        (_, ClaimState::Released) => 2,
        (_, ClaimState::Succeeded) => 1,
    };
    let worst = rows
        .iter()
        .map(|(_, row)| row)
        .max_by_key(|row| rank(row))?;
    let all = rows.len() == usize::try_from(shards).unwrap_or(usize::MAX);
    let mut row = match rank(worst) {
        1 if !all => return None,
        1 => {
            let last = rows
                .iter()
                .map(|(_, row)| row)
                .max_by_key(|row| row.finished_at)
                .unwrap_or(worst);
            ClaimRow {
                started_at: rows.iter().filter_map(|(_, row)| row.started_at).min(),
                attempt: rows.iter().map(|(_, row)| row.attempt).max().unwrap_or(0),
                ..last.clone()
            }
        }
        _ => worst.clone(),
    };
    row.period_key = key.as_str().to_owned();
    row.failures = rows.iter().map(|(_, row)| row.failures).max().unwrap_or(0);
    Some(row)
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeDelta, Utc};

    use super::*;
    use crate::state::PeriodState;

    fn row(index: u32, state: ClaimState, started: i64, now: DateTime<Utc>) -> ClaimRow {
        let shard = Shard { index, of: 3 };
        ClaimRow {
            period_key: PeriodKey::of("j", "2026-11", Some(shard)).to_string(),
            period: "2026-11".into(),
            state,
            attempt: 1,
            failures: i32::from(state == ClaimState::Failed),
            owner: "o".into(),
            lease_until: (state == ClaimState::Running).then(|| now + TimeDelta::seconds(30)),
            started_at: Some(now - TimeDelta::seconds(started)),
            retry_at: None,
            finished_at: (state != ClaimState::Running).then_some(now),
            // A released claim let go (no lease left) is claimable.
            claimable: state == ClaimState::Released,
            now,
        }
    }

    fn standing(states: &[ClaimState]) -> Option<PeriodState> {
        let now = Utc::now();
        let key = PeriodKey::new("j", "2026-11");
        let rows: Vec<ClaimRow> = states
            .iter()
            .enumerate()
            .map(|(i, s)| row(u32::try_from(i).unwrap_or(0), *s, 10 - i as i64, now))
            .collect();
        of_rows(key, rows, 3).row.map(|row| row.standing())
    }

    #[test]
    fn a_period_stands_as_its_shards_do() {
        use ClaimState::{Failed, Released, Running, Succeeded};
        assert_eq!(standing(&[]), None);
        assert_eq!(
            standing(&[Succeeded, Succeeded]),
            None,
            "a shard never claimed"
        );
        assert_eq!(
            standing(&[Succeeded, Succeeded, Succeeded]),
            Some(PeriodState::Succeeded)
        );
        assert_eq!(
            standing(&[Succeeded, Failed, Running]),
            Some(PeriodState::Running),
            "running while any shard runs"
        );
        assert_eq!(
            standing(&[Succeeded, Failed, Succeeded]),
            Some(PeriodState::Failed)
        );
        assert_eq!(standing(&[Failed, Released]), Some(PeriodState::Failed));
        assert_eq!(
            standing(&[Succeeded, Released, Succeeded]),
            Some(PeriodState::Released)
        );
    }

    #[test]
    fn a_succeeded_period_started_with_its_first_shard() {
        let now = Utc::now();
        let rows = (0..3)
            .map(|i| row(i, ClaimState::Succeeded, 10 * i64::from(i + 1), now))
            .collect();
        let claims = of_rows(PeriodKey::new("j", "2026-11"), rows, 3);
        let row = claims.row.expect("every shard succeeded");
        assert_eq!(row.period_key, "j:2026-11");
        assert_eq!(row.started_at, Some(now - TimeDelta::seconds(30)));
        assert_eq!(claims.shard_rows.len(), 3);
    }

    #[test]
    fn a_period_keeps_the_shard_count_it_ran_with() {
        let now = Utc::now();
        let rows: Vec<ClaimRow> = (0..3)
            .map(|i| row(i, ClaimState::Succeeded, 5, now))
            .collect();
        // The job is split 8 ways now; the period ran split 3 ways.
        let claims = of_rows(PeriodKey::new("j", "2026-11"), rows, 8);
        assert_eq!(claims.shards, 3);
        assert_eq!(
            claims.row.map(|r| r.standing()),
            Some(PeriodState::Succeeded)
        );
        let none = of_rows(PeriodKey::new("j", "2026-12"), Vec::new(), 8);
        assert_eq!(none.shards, 8);
    }
}
