//! Every attempt's output, written once for both backends: chunks in the
//! order the job printed them, each placed in all the attempt printed (as
//! kept: secrets masked), so that what was not kept shows as a gap.

use std::time::Duration;

use super::Store;
use crate::error::Error;
use crate::state::Stream;

/// A piece of an attempt's output as it is kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Chunk {
    /// Its place among the attempt's chunks, from 0.
    pub seq: i32,
    /// The stream it came on.
    pub stream: Stream,
    /// Where it starts in all the attempt printed, in bytes.
    pub at_byte: i64,
    /// How many bytes just before it could not be written in time.
    pub lost: i64,
    /// Its text, secrets masked.
    pub text: String,
}

from_row!(Chunk {
    seq,
    stream: word,
    at_byte,
    lost,
    text
});

impl Chunk {
    /// Where the next chunk starts if nothing is left out between them.
    pub fn end(&self) -> i64 {
        self.at_byte + self.text.len() as i64
    }
}

/// The most chunks (each at most 64 KiB) one statement writes.
const ROWS_PER_STATEMENT: usize = 4;

impl Store {
    /// Writes `chunks` of attempt `attempt` of `key` (a period of `job`) in
    /// one statement.
    pub async fn write_output(
        &self,
        key: &str,
        attempt: i32,
        job: &str,
        chunks: &[Chunk],
    ) -> Result<(), Error> {
        if chunks.is_empty() {
            return Ok(());
        }
        // A few rows per statement, each value bound as it is: a statement
        // holds SQLite's one writer lock for a moment only, so heartbeats
        // get in between, and no chunk is copied into a document first
        // (a chunk of NUL bytes is six times its size as JSON).
        for rows in chunks.chunks(ROWS_PER_STATEMENT) {
            let values: Vec<String> = (0..rows.len())
                .map(|i| {
                    let n = 4 + i * 5;
                    format!(
                        "($1, $2, $3, {{now}}, ${}, ${}, ${}, ${}, ${})",
                        n,
                        n + 1,
                        n + 2,
                        n + 3,
                        n + 4
                    )
                })
                .collect();
            let values = values.join(", ");
            on_pool!(self, |pool, now| {
                let sql = format!(
                    "INSERT INTO scheduler_output
                        (period_key, attempt, job, at, seq, stream, at_byte, lost, text)
                     VALUES {}
                     ON CONFLICT (period_key, attempt, seq) DO NOTHING",
                    values.replace("{now}", now)
                );
                let mut query = sqlx::query(&sql).bind(key).bind(attempt).bind(job);
                for c in rows {
                    query = query
                        .bind(c.seq)
                        .bind(c.stream.as_str())
                        .bind(c.at_byte)
                        .bind(c.lost)
                        .bind(&c.text);
                }
                query.execute(pool).await.map(|_| ())
            })?;
        }
        Ok(())
    }

    /// Deletes chunks `first..=last` of an attempt: the oldest of its
    /// tail, past its job's `output_max`.
    pub async fn drop_output(
        &self,
        key: &str,
        attempt: i32,
        first: i32,
        last: i32,
    ) -> Result<(), Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query(
                "DELETE FROM scheduler_output
                  WHERE period_key = $1 AND attempt = $2 AND seq BETWEEN $3 AND $4",
            )
            .bind(key)
            .bind(attempt)
            .bind(first)
            .bind(last)
            .execute(pool)
            .await
            .map(|_| ())
        })
    }

    /// Whether attempt `attempt` of `key`, still running by its claim, has
    /// had its lease run out unrenewed (its runner died, or lost the
    /// database): its runner and when the lease ended; `None` while it
    /// holds, or once the claim has moved on.
    pub async fn lease_ran_out(
        &self,
        key: &str,
        attempt: i32,
    ) -> Result<Option<(String, chrono::DateTime<chrono::Utc>)>, Error> {
        // Job names hold no `:`; labels may. Every running claim of a job
        // is among its recent rows.
        let (job, _) = key.split_once(':').unwrap_or((key, ""));
        let rows = self.recent(job, 1).await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.period_key == key && r.attempt == attempt)
            .filter(|r| r.state == crate::state::ClaimState::Running)
            .find_map(|r| Some((r.owner, r.lease_until.filter(|until| *until < r.now)?))))
    }

    /// The chunks of an attempt after chunk `after` (-1: from the first),
    /// in order, at most `limit`.
    pub async fn output(
        &self,
        key: &str,
        attempt: i32,
        after: i32,
        limit: u32,
    ) -> Result<Vec<Chunk>, Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query_as::<_, Chunk>(
                "SELECT seq, stream, at_byte, lost, text FROM scheduler_output
                  WHERE period_key = $1 AND attempt = $2 AND seq > $3
                  ORDER BY seq LIMIT $4",
            )
            .bind(key)
            .bind(attempt)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await
        })
    }

    /// Deletes the output of `job` written more than `keep` ago (its
    /// `keep_output`); returns how many chunks went (`dry_run`: would go;
    /// nothing is deleted). Claims and attempts stay.
    pub async fn prune_output(
        &self,
        job: &str,
        keep: Duration,
        dry_run: bool,
    ) -> Result<u64, Error> {
        let keep = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
        let verb = if dry_run { "SELECT count(*)" } else { "DELETE" };
        let rows = on_pool!(self, |pool, now| {
            if dry_run {
                sqlx::query_scalar::<_, i64>(&format!(
                    "{verb} FROM scheduler_output WHERE job = $1 AND at < {now} - $2"
                ))
                .bind(job)
                .bind(keep)
                .fetch_one(pool)
                .await
                .map(|n| n as u64)
            } else {
                sqlx::query(&format!(
                    "{verb} FROM scheduler_output WHERE job = $1 AND at < {now} - $2"
                ))
                .bind(job)
                .bind(keep)
                .execute(pool)
                .await
                .map(|r| r.rows_affected())
            }
        })?;
        Ok(rows)
    }
}
