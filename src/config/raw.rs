//! The raw shape of `jobs.toml` as serde reads it (spans kept): what
//! [`validate`](super::validate) checks into [`Config`](super::Config)
//! values.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::Missed;
use super::after::OnRerun;
use crate::calendar::{Calendar, OnDayOff};
use crate::period::{Covers, Unit};
use crate::schedule::{Gap, Repeat};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSettings {
    pub(super) timezone: Option<Spanned<String>>,
    pub(super) lease: Option<Spanned<String>>,
    pub(super) catch_up: Option<Spanned<String>>,
    pub(super) shutdown_grace: Option<Spanned<String>>,
    pub(super) max_running: Option<Spanned<i64>>,
    pub(super) scan_interval: Option<Spanned<String>>,
    pub(super) database_url: Option<Spanned<String>>,
    pub(super) namespace: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJob {
    pub(super) name: Spanned<String>,
    pub(super) schedule: Spanned<String>,
    pub(super) timezone: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) period: Unit,
    #[serde(default)]
    pub(super) covers: Covers,
    pub(super) command: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) shell: Option<Spanned<String>>,
    pub(super) http: Option<Spanned<RawHttp>>,
    pub(super) sql: Option<Spanned<RawSql>>,
    pub(super) workdir: Option<Spanned<String>>,
    pub(super) env: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    pub(super) inherit: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) timeout: Option<Spanned<String>>,
    pub(super) concurrency: Option<Spanned<i64>>,
    pub(super) shards: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) missed: Missed,
    pub(super) retry: Option<RawRetry>,
    pub(super) keep: Option<Spanned<String>>,
    pub(super) output_max: Option<Spanned<String>>,
    pub(super) keep_output: Option<Spanned<String>>,
    pub(super) deadline: Option<Spanned<String>>,
    pub(super) after: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) on_upstream_rerun: Option<Spanned<OnRerun>>,
    #[serde(default)]
    pub(super) dst: RawDst,
    pub(super) calendar: Option<Spanned<String>>,
    pub(super) on_day_off: Option<Spanned<OnDayOff>>,
    pub(super) active_from: Option<Spanned<toml::Value>>,
    pub(super) active_until: Option<Spanned<toml::Value>>,
    pub(super) jitter: Option<Spanned<String>>,
}

/// `[[calendar]]`: working weekdays and holidays, shared by jobs.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCalendar {
    pub(super) name: Spanned<String>,
    pub(super) working_days: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub(super) holidays: Vec<Spanned<toml::Value>>,
    pub(super) holidays_file: Option<Spanned<String>>,
}

/// The calendars of a file by name; `None` for one with a mistake (which
/// is reported on its own).
pub(super) type Calendars = BTreeMap<String, Option<Arc<Calendar>>>;

impl RawCalendar {
    /// The name as written.
    pub(super) fn name(&self) -> &str {
        self.name.get_ref()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) url: Spanned<String>,
    pub(super) method: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, Spanned<String>>,
    pub(super) body: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSql {
    pub(super) statement: Spanned<String>,
    #[serde(default)]
    pub(super) params: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    pub(super) attempts: Option<Spanned<i64>>,
    pub(super) backoff: Option<Spanned<String>>,
    pub(super) max_backoff: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDst {
    #[serde(default)]
    pub(super) gap: Gap,
    #[serde(default)]
    pub(super) repeat: Repeat,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApi {
    pub(super) key_ttl: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) tokens: Vec<Spanned<RawToken>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToken {
    pub(super) name: Spanned<String>,
    pub(super) secret: Spanned<String>,
    pub(super) allow: Spanned<Vec<Spanned<String>>>,
}
