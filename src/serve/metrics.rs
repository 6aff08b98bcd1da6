//! The metrics recorder of `serve --listen`: each job's series in a table
//! of their own, the rest in `metrics-exporter-prometheus`'s registry.
//!
//! Most series are per job (`job` their first label, and at most one label
//! after it): five for every idle job, more once it runs. The exporter
//! keeps each series under a key of its own (the name, a list of labels,
//! an owned copy of the job's name) and renders a scrape through a
//! snapshot that copies every key into new maps: for 10,000 idle jobs,
//! 50,000 series cost 97 ms of CPU a scrape and megabytes of memory for
//! good. Here a job's name is held once, each family keeps its values as
//! atomics in blocks shared by 128 jobs (8 bytes a counter or gauge; a
//! histogram's buckets and sum, 8 bytes each: a handle onto a series is
//! made when it is recorded, and dropped with it), and a scrape writes the
//! text straight from the atomics.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, SharedString, Unit,
};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

/// The recorder installed by `serve --listen`.
pub(super) struct Recorder {
    exporter: PrometheusRecorder,
    jobs: Arc<JobSeries>,
}

/// What `/metrics` renders from, and keeps up.
#[derive(Clone)]
pub(super) struct Metrics {
    exporter: PrometheusHandle,
    jobs: Arc<JobSeries>,
}

impl Recorder {
    /// `exporter` for the series that are not a job's; a histogram of a
    /// job's with the buckets of `buckets` (by name), else the exporter's.
    pub(super) fn new(exporter: PrometheusRecorder, buckets: &[(&str, &[f64])]) -> Recorder {
        let jobs = JobSeries {
            buckets: buckets
                .iter()
                .map(|(name, bounds)| ((*name).to_owned(), Arc::from(*bounds)))
                .collect(),
            ..JobSeries::default()
        };
        Recorder {
            exporter,
            jobs: Arc::new(jobs),
        }
    }

    /// What renders and keeps up this recorder's series.
    pub(super) fn metrics(&self) -> Metrics {
        Metrics {
            exporter: self.exporter.handle(),
            jobs: self.jobs.clone(),
        }
    }
}

impl Metrics {
    /// The text exposition of every series, in one string.
    #[cfg(test)]
    pub(super) fn render(&self) -> String {
        let mut text = self.exporter.render();
        let mut at = Resume::default();
        while !self.jobs.render_part(&mut at, &mut text, usize::MAX) {}
        text
    }

    /// The text exposition of every series, in parts of about [`PART`]
    /// bytes, each written when the one before has been sent: 100,000 jobs
    /// that have run have 2.3 million series, 140 MB of text, and a scrape
    /// written whole raised the process's peak from 124 to 250 MB. No lock
    /// is held between parts: a series recorded meanwhile shows in this
    /// scrape or the next.
    pub(super) fn render_parts(
        &self,
    ) -> impl futures_util::Stream<Item = Result<String, std::convert::Infallible>> + Send + 'static
    {
        let jobs = self.jobs.clone();
        let first = self.exporter.render();
        let rest = futures_util::stream::unfold(Some(Resume::default()), move |at| {
            let jobs = jobs.clone();
            async move {
                let mut at = at?;
                let mut text = String::with_capacity(PART + PART / 8);
                let done = jobs.render_part(&mut at, &mut text, PART);
                Some((Ok(text), (!done).then_some(at)))
            }
        });
        futures_util::StreamExt::chain(futures_util::stream::iter([Ok(first)]), rest)
    }

    /// Numbers the jobs named `names` now, each under that name itself:
    /// a job numbered when its first series is recorded holds a copy of
    /// its name (3 MiB for 100,000 jobs, made during start-up's catch-up).
    pub(super) fn number_jobs(&self, names: impl Iterator<Item = Arc<str>>) {
        let mut table = self.jobs.names.write().unwrap_or_else(|e| e.into_inner());
        table.numbers.reserve(names.size_hint().0);
        table.labels.reserve(names.size_hint().0);
        for name in names {
            table.number(name);
        }
    }

    /// Moves recorded samples of the exporter's histograms into them.
    pub(super) fn run_upkeep(&self) {
        self.exporter.run_upkeep();
    }
}

/// A job's series: the job's name, and the label after it, if any.
fn of_job(key: &Key) -> Option<(&str, Option<(&str, &str)>)> {
    let mut labels = key.labels();
    let first = labels.next()?;
    if first.key() != "job" {
        return None;
    }
    let extra = labels.next().map(|l| (l.key(), l.value()));
    match labels.next() {
        Some(_) => None,
        None => Some((first.value(), extra)),
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.jobs.describe(key.as_str(), Kind::Counter, &help);
        self.exporter.describe_counter(key, unit, help);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.jobs.describe(key.as_str(), Kind::Gauge, &help);
        self.exporter.describe_gauge(key, unit, help);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.jobs.describe(key.as_str(), Kind::Histogram, &help);
        self.exporter.describe_histogram(key, unit, help);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        match of_job(key) {
            Some((job, extra)) => match self.jobs.cell(key.name(), Kind::Counter, job, extra) {
                Some(Cell::Number(slot)) => Counter::from_arc(Arc::new(slot)),
                _ => Counter::noop(),
            },
            None => self.exporter.register_counter(key, metadata),
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        match of_job(key) {
            Some((job, extra)) => match self.jobs.cell(key.name(), Kind::Gauge, job, extra) {
                Some(Cell::Number(slot)) => Gauge::from_arc(Arc::new(slot)),
                _ => Gauge::noop(),
            },
            None => self.exporter.register_gauge(key, metadata),
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        match of_job(key).filter(|_| self.jobs.buckets.contains_key(key.name())) {
            Some((job, extra)) => match self.jobs.cell(key.name(), Kind::Histogram, job, extra) {
                Some(Cell::Histogram(row)) => Histogram::from_arc(Arc::new(row)),
                _ => Histogram::noop(),
            },
            None => self.exporter.register_histogram(key, metadata),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A handle onto one series' values, as recording it is given.
enum Cell {
    Number(Slot),
    Histogram(Row),
}

/// How many jobs' values one block holds.
const BLOCK: usize = 128;

/// Where a series' values are: a block of its family's, and the first of
/// them in it. A counter's count or a gauge's `f64` bits is one value; a
/// histogram's are a count per bucket (not cumulative, one above the last
/// bound too) and its sum's `f64` bits.
struct Slot {
    block: Arc<[AtomicU64]>,
    at: usize,
}

impl Slot {
    fn value(&self) -> &AtomicU64 {
        &self.block[self.at]
    }
}

impl CounterFn for Slot {
    fn increment(&self, value: u64) {
        CounterFn::increment(self.value(), value);
    }

    fn absolute(&self, value: u64) {
        self.value().absolute(value);
    }
}

impl GaugeFn for Slot {
    fn increment(&self, value: f64) {
        GaugeFn::increment(self.value(), value);
    }

    fn decrement(&self, value: f64) {
        self.value().decrement(value);
    }

    fn set(&self, value: f64) {
        self.value().set(value);
    }
}

/// A histogram's series: its values, and its family's bucket bounds.
struct Row {
    slot: Slot,
    bounds: Arc<[f64]>,
}

impl metrics::HistogramFn for Row {
    fn record(&self, value: f64) {
        let Slot { block, at } = &self.slot;
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        block[at + bucket].fetch_add(1, Ordering::Relaxed);
        let sum = &block[at + self.bounds.len() + 1];
        let _ = sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |sum| {
            Some((f64::from_bits(sum) + value).to_bits())
        });
    }
}

/// One series of a family: its values per job's number, in blocks of
/// [`BLOCK`] jobs, and which numbers were recorded (a bit each).
struct Cells {
    /// A histogram's bucket bounds; none for a counter or a gauge.
    bounds: Option<Arc<[f64]>>,
    blocks: Vec<Arc<[AtomicU64]>>,
    recorded: Vec<u64>,
}

/// One recorded series' values, as a scrape reads them.
enum Value<'a> {
    Number(&'a AtomicU64),
    Histogram(&'a [AtomicU64], &'a [f64]),
}

impl Cells {
    fn new(bounds: Option<Arc<[f64]>>) -> Cells {
        Cells {
            bounds,
            blocks: Vec::new(),
            recorded: Vec::new(),
        }
    }

    /// How many values a job's series has.
    fn width(&self) -> usize {
        self.bounds.as_ref().map_or(1, |bounds| bounds.len() + 2)
    }

    /// Job number `n`'s cell, if recorded.
    fn get(&self, n: usize) -> Option<Cell> {
        let set = self
            .recorded
            .get(n / 64)
            .is_some_and(|bits| bits & (1 << (n % 64)) != 0);
        if !set {
            return None;
        }
        let slot = Slot {
            block: self.blocks[n / BLOCK].clone(),
            at: n % BLOCK * self.width(),
        };
        Some(match &self.bounds {
            None => Cell::Number(slot),
            Some(bounds) => Cell::Histogram(Row {
                slot,
                bounds: bounds.clone(),
            }),
        })
    }

    /// Job number `n`'s cell, recorded now if it was not.
    fn make(&mut self, n: usize) -> Cell {
        let width = self.width();
        while self.blocks.len() <= n / BLOCK {
            // Zero is a count of 0 and the bits of 0.0.
            let block = (0..BLOCK * width).map(|_| AtomicU64::new(0)).collect();
            self.blocks.push(block);
        }
        if self.recorded.len() <= n / 64 {
            self.recorded.resize(n / 64 + 1, 0);
        }
        self.recorded[n / 64] |= 1 << (n % 64);
        self.get(n).expect("recorded just now")
    }

    /// The recorded series' values from job number `from` on, with their
    /// jobs' numbers.
    fn values_from(&self, from: usize) -> impl Iterator<Item = (usize, Value<'_>)> + '_ {
        let width = self.width();
        self.recorded
            .iter()
            .enumerate()
            .skip(from / 64)
            .flat_map(move |(word, bits)| {
                let below = match word == from / 64 {
                    true => (1u64 << (from % 64)) - 1,
                    false => 0,
                };
                let mut left = *bits & !below;
                std::iter::from_fn(move || {
                    let n = word * 64 + left.trailing_zeros() as usize;
                    left &= left.checked_sub(1)?;
                    Some(n)
                })
            })
            .map(move |n| {
                let block = &self.blocks[n / BLOCK];
                let at = n % BLOCK * width;
                let value = match &self.bounds {
                    None => Value::Number(&block[at]),
                    Some(bounds) => Value::Histogram(&block[at..at + width], bounds),
                };
                (n, value)
            })
    }
}

/// The jobs' series: families by name, each job's name held once.
#[derive(Default)]
struct JobSeries {
    names: RwLock<Names>,
    families: RwLock<BTreeMap<String, Family>>,
    /// The bucket bounds of each histogram family kept here.
    buckets: HashMap<String, Arc<[f64]>>,
}

/// The jobs' names, each numbered once, the number a slot in every family.
#[derive(Default)]
struct Names {
    numbers: HashMap<Arc<str>, usize>,
    /// Each name as a label value, escaped.
    labels: Vec<Arc<str>>,
}

impl Names {
    /// The number of job `name`, numbered now if it is new.
    fn number(&mut self, name: Arc<str>) -> usize {
        if let Some(n) = self.numbers.get(&name) {
            return *n;
        }
        let next = self.labels.len();
        let label = match plain(&name) {
            true => name.clone(),
            false => Arc::from(escape(&name, true)),
        };
        self.numbers.insert(name, next);
        self.labels.push(label);
        next
    }
}

/// One metric's series: per value of the label after `job`, a value per
/// job's number.
struct Family {
    kind: Kind,
    help: Option<String>,
    series: Vec<Series>,
}

/// The label after `job` as recorded (`None`: no such label, the usual
/// case), and a value per job's number.
type Series = (Option<(String, String)>, Cells);

impl JobSeries {
    fn describe(&self, name: &str, kind: Kind, help: &str) {
        let Ok(mut families) = self.families.write() else {
            return;
        };
        let family = families.entry(name.to_owned()).or_insert_with(|| Family {
            kind,
            help: None,
            series: Vec::new(),
        });
        family.help = Some(escape(help, false));
    }

    /// The number of job `job`, numbered now if it is new.
    fn number(&self, job: &str) -> usize {
        if let Ok(names) = self.names.read()
            && let Some(n) = names.numbers.get(job)
        {
            return *n;
        }
        let mut names = self.names.write().unwrap_or_else(|e| e.into_inner());
        match names.numbers.get(job) {
            Some(n) => *n,
            None => names.number(Arc::from(job)),
        }
    }

    /// The cell of job `job`'s series of metric `name` (with the label
    /// `extra`), made now if it is new; none for a metric described or
    /// registered before as another kind (one family, one type, as the
    /// text exposition has it).
    fn cell(&self, name: &str, kind: Kind, job: &str, extra: Option<(&str, &str)>) -> Option<Cell> {
        let n = self.number(job);
        let same = |e: &Option<(String, String)>| {
            e.as_ref().map(|(k, v)| (k.as_str(), v.as_str())) == extra
        };
        if let Ok(families) = self.families.read()
            && let Some(family) = families.get(name)
            && let Some((_, cells)) = family.series.iter().find(|(e, _)| same(e))
            && let Some(cell) = cells.get(n)
        {
            return Some(cell);
        }
        let mut families = self.families.write().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name.to_owned()).or_insert_with(|| Family {
            kind,
            help: None,
            series: Vec::new(),
        });
        if family.kind != kind {
            debug_assert!(
                false,
                "{name} recorded as a {kind:?} and as a {:?}",
                family.kind
            );
            return None;
        }
        let at = match family.series.iter().position(|(e, _)| same(e)) {
            Some(at) => at,
            None => {
                let extra = extra.map(|(k, v)| (k.to_owned(), v.to_owned()));
                let bounds = (kind == Kind::Histogram).then(|| {
                    let bounds = self.buckets.get(name).cloned();
                    bounds.unwrap_or_else(|| Arc::from([]))
                });
                family.series.push((extra, Cells::new(bounds)));
                family.series.len() - 1
            }
        };
        Some(family.series[at].1.make(n))
    }

    /// Appends the families with a series, in name order, as the text
    /// exposition has it, from `at` on until `text` holds `limit` bytes or
    /// more; `at` is then where the next part goes on. True once every
    /// family is written.
    fn render_part(&self, at: &mut Resume, text: &mut String, limit: usize) -> bool {
        let names = self.names.read().unwrap_or_else(|e| e.into_inner());
        let families = self.families.read().unwrap_or_else(|e| e.into_inner());
        let from = match &at.family {
            Some(name) => Bound::Included(name.as_str()),
            None => Bound::Unbounded,
        };
        for (name, family) in families.range::<str, _>((from, Bound::Unbounded)) {
            if at.family.as_ref() != Some(name) {
                *at = Resume {
                    family: Some(name.clone()),
                    ..Resume::default()
                };
            }
            while let Some((extra, cells)) = family.series.get(at.series) {
                for (n, cell) in cells.values_from(at.job) {
                    if !at.headed {
                        if let Some(help) = &family.help {
                            let _ = writeln!(text, "# HELP {name} {help}");
                        }
                        let _ = writeln!(text, "# TYPE {name} {}", family.kind.as_str());
                        at.headed = true;
                    }
                    let labels = Labels {
                        job: &names.labels[n],
                        extra: extra.as_ref(),
                    };
                    render_value(text, name, family.kind, &labels, cell);
                    at.job = n + 1;
                    if text.len() >= limit {
                        return false;
                    }
                }
                at.series += 1;
                at.job = 0;
            }
            if at.headed {
                text.push('\n');
                at.headed = false;
            }
        }
        true
    }
}

/// Where the next part of a scrape goes on: the family, its series, the
/// job's number, and whether the family's head is written.
#[derive(Default)]
struct Resume {
    family: Option<String>,
    series: usize,
    job: usize,
    headed: bool,
}

/// How many bytes of `/metrics`' text are written at a time.
const PART: usize = 256 * 1024;

/// Writes one job's series of family `name`.
fn render_value(text: &mut String, name: &str, kind: Kind, labels: &Labels<'_>, cell: Value<'_>) {
    match (kind, cell) {
        (Kind::Counter, Value::Number(v)) => {
            let _ = writeln!(text, "{name}{{{labels}}} {}", v.load(Ordering::Relaxed));
        }
        (_, Value::Number(v)) => {
            let value = f64::from_bits(v.load(Ordering::Relaxed));
            let _ = writeln!(text, "{name}{{{labels}}} {value}");
        }
        (_, Value::Histogram(values, bounds)) => {
            render_histogram(text, name, labels, values, bounds);
        }
    }
}

/// A series' labels, as the text exposition writes them.
struct Labels<'a> {
    job: &'a str,
    extra: Option<&'a (String, String)>,
}

impl std::fmt::Display for Labels<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job=\"{}\"", self.job)?;
        match self.extra {
            Some((key, value)) => write!(f, ",{key}=\"{}\"", Escaped(value)),
            None => Ok(()),
        }
    }
}

/// A label value, escaped as it is written.
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match plain(self.0) {
            true => f.write_str(self.0),
            false => f.write_str(&escape(self.0, true)),
        }
    }
}

/// Whether label value `value` is written as it is, with nothing to escape.
fn plain(value: &str) -> bool {
    !value.contains(['\\', '\n', '"'])
}

/// A label value (`label`) or a help text, escaped as the text exposition
/// needs.
fn escape(text: &str, label: bool) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '\n' => escaped.push_str("\\n"),
            '"' if label => escaped.push_str("\\\""),
            c => escaped.push(c),
        }
    }
    escaped
}

/// Writes a histogram's series: its counts per bucket in `values`
/// (bucket bounds `bounds`, and one above the last), then its sum's bits.
fn render_histogram(
    text: &mut String,
    name: &str,
    labels: &Labels<'_>,
    values: &[AtomicU64],
    bounds: &[f64],
) {
    let mut below = 0;
    for (bound, count) in bounds.iter().zip(values) {
        below += count.load(Ordering::Relaxed);
        let _ = writeln!(text, "{name}_bucket{{{labels},le=\"{bound}\"}} {below}");
    }
    let all = below + values[bounds.len()].load(Ordering::Relaxed);
    let sum = f64::from_bits(values[bounds.len() + 1].load(Ordering::Relaxed));
    let _ = writeln!(text, "{name}_bucket{{{labels},le=\"+Inf\"}} {all}");
    let _ = writeln!(text, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(text, "{name}_count{{{labels}}} {all}");
}

#[cfg(test)]
mod tests;
