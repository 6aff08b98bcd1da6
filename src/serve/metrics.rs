//! The metrics recorder of `serve --listen`: each job's series in a table
//! of their own, the rest in `metrics-exporter-prometheus`'s registry.
//!
//! Most series are per job (`job` their first label, and at most one label
//! after it): five for every idle job, more once it runs. The exporter
//! keeps each series under a key of its own (the name, a list of labels,
//! an owned copy of the job's name) and renders a scrape through a
//! snapshot that copies every key into new maps: for 10,000 idle jobs,
//! 50,000 series cost 97 ms of CPU a scrape and megabytes of memory for
//! good. Here a job's name is held once, each family keeps its counters and
//! gauges as one atomic per job in shared blocks (8 bytes a series: a
//! handle onto one is made when a series is recorded, and dropped with
//! it), and a scrape writes the text straight from the atomics.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
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
    /// The text exposition of every series.
    pub(super) fn render(&self) -> String {
        let mut text = self.exporter.render();
        self.jobs.render(&mut text);
        text
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
                Some(Cell::Histogram(buckets)) => Histogram::from_arc(buckets),
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

/// A handle onto one series' value, as recording it is given.
enum Cell {
    Number(Slot),
    Histogram(Arc<Buckets>),
}

/// How many series' values one block holds.
const BLOCK: usize = 128;

/// Counters' counts or gauges' `f64` bits, one per job's number.
struct Block([AtomicU64; BLOCK]);

/// One value in a block.
struct Slot {
    block: Arc<Block>,
    at: usize,
}

impl Slot {
    fn value(&self) -> &AtomicU64 {
        &self.block.0[self.at]
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

/// One series of a family: per job's number, its value, if recorded.
enum Cells {
    /// A counter's or gauge's values in blocks, and which numbers were
    /// recorded (a bit each).
    Numbers {
        blocks: Vec<Arc<Block>>,
        recorded: Vec<u64>,
    },
    Histograms(Vec<Option<Arc<Buckets>>>),
}

/// One recorded value of a series, as a scrape reads it.
enum Value<'a> {
    Number(&'a AtomicU64),
    Histogram(&'a Buckets),
}

impl Cells {
    fn new(kind: Kind) -> Cells {
        match kind {
            Kind::Histogram => Cells::Histograms(Vec::new()),
            Kind::Counter | Kind::Gauge => Cells::Numbers {
                blocks: Vec::new(),
                recorded: Vec::new(),
            },
        }
    }

    /// Job number `n`'s cell, if recorded.
    fn get(&self, n: usize) -> Option<Cell> {
        match self {
            Cells::Numbers { blocks, recorded } => {
                let set = recorded
                    .get(n / 64)
                    .is_some_and(|bits| bits & (1 << (n % 64)) != 0);
                set.then(|| {
                    Cell::Number(Slot {
                        block: blocks[n / BLOCK].clone(),
                        at: n % BLOCK,
                    })
                })
            }
            Cells::Histograms(all) => all.get(n)?.clone().map(Cell::Histogram),
        }
    }

    /// Job number `n`'s cell, recorded now if it was not; a histogram's
    /// with the bucket bounds of `bounds`.
    fn make(&mut self, n: usize, bounds: impl FnOnce() -> Arc<[f64]>) -> Cell {
        match self {
            Cells::Numbers { blocks, recorded } => {
                while blocks.len() <= n / BLOCK {
                    blocks.push(Arc::new(Block(std::array::from_fn(|_| AtomicU64::new(0)))));
                }
                if recorded.len() <= n / 64 {
                    recorded.resize(n / 64 + 1, 0);
                }
                recorded[n / 64] |= 1 << (n % 64);
            }
            Cells::Histograms(all) => {
                if all.len() <= n {
                    all.resize(n + 1, None);
                }
                all[n].get_or_insert_with(|| Arc::new(Buckets::new(bounds())));
            }
        }
        self.get(n).expect("recorded just now")
    }

    /// Every recorded value, with its job's number.
    fn values(&self) -> Box<dyn Iterator<Item = (usize, Value<'_>)> + '_> {
        match self {
            Cells::Numbers { blocks, recorded } => {
                Box::new(recorded.iter().enumerate().flat_map(move |(word, bits)| {
                    let mut left = *bits;
                    std::iter::from_fn(move || {
                        let n = word * 64 + left.trailing_zeros() as usize;
                        left &= left.checked_sub(1)?;
                        Some((n, Value::Number(&blocks[n / BLOCK].0[n % BLOCK])))
                    })
                }))
            }
            Cells::Histograms(all) => Box::new(
                all.iter()
                    .enumerate()
                    .filter_map(|(n, b)| Some((n, Value::Histogram(b.as_ref()?)))),
            ),
        }
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
        let next = names.labels.len();
        if let Some(n) = names.numbers.get(job) {
            return *n;
        }
        let name: Arc<str> = Arc::from(job);
        let label = match plain(job) {
            true => name.clone(),
            false => Arc::from(escape(job, true)),
        };
        names.numbers.insert(name, next);
        names.labels.push(label);
        next
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
                family.series.push((extra, Cells::new(kind)));
                family.series.len() - 1
            }
        };
        let bounds = || {
            let bounds = self.buckets.get(name).cloned();
            bounds.unwrap_or_else(|| Arc::from([]))
        };
        Some(family.series[at].1.make(n, bounds))
    }

    /// Appends every family with a series, in name order, as the text
    /// exposition has it.
    fn render(&self, text: &mut String) {
        let names = self.names.read().unwrap_or_else(|e| e.into_inner());
        let families = self.families.read().unwrap_or_else(|e| e.into_inner());
        for (name, family) in families.iter() {
            let mut cells = family
                .series
                .iter()
                .flat_map(|(extra, cells)| cells.values().map(move |(n, value)| (extra, n, value)));
            let Some(first) = cells.next() else {
                continue;
            };
            if let Some(help) = &family.help {
                let _ = writeln!(text, "# HELP {name} {help}");
            }
            let _ = writeln!(text, "# TYPE {name} {}", family.kind.as_str());
            for (extra, n, cell) in std::iter::once(first).chain(cells) {
                let labels = Labels {
                    job: &names.labels[n],
                    extra: extra.as_ref(),
                };
                match (family.kind, cell) {
                    (Kind::Counter, Value::Number(v)) => {
                        let _ = writeln!(text, "{name}{{{labels}}} {}", v.load(Ordering::Relaxed));
                    }
                    (_, Value::Number(v)) => {
                        let value = f64::from_bits(v.load(Ordering::Relaxed));
                        let _ = writeln!(text, "{name}{{{labels}}} {value}");
                    }
                    (_, Value::Histogram(buckets)) => buckets.render(text, name, &labels),
                }
            }
            text.push('\n');
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

/// A histogram of fixed buckets: a count per bucket (not cumulative), the
/// sum's `f64` bits and the count of samples.
struct Buckets {
    bounds: Arc<[f64]>,
    /// One per bound, and one for the samples above the last.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Buckets {
    fn new(bounds: Arc<[f64]>) -> Buckets {
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Buckets {
            bounds,
            counts,
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn render(&self, text: &mut String, name: &str, labels: &Labels<'_>) {
        let mut below = 0;
        for (bound, count) in self.bounds.iter().zip(self.counts.iter()) {
            below += count.load(Ordering::Relaxed);
            let _ = writeln!(text, "{name}_bucket{{{labels},le=\"{bound}\"}} {below}");
        }
        let all = below + self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let sum = f64::from_bits(self.sum.load(Ordering::Relaxed));
        let _ = writeln!(text, "{name}_bucket{{{labels},le=\"+Inf\"}} {all}");
        let _ = writeln!(text, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(text, "{name}_count{{{labels}}} {all}");
    }
}

impl metrics::HistogramFn for Buckets {
    fn record(&self, value: f64) {
        let at = self.bounds.partition_point(|bound| *bound < value);
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |sum| {
                Some((f64::from_bits(sum) + value).to_bits())
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::Recorder as _;

    fn recorder() -> Recorder {
        let exporter = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        Recorder::new(exporter, &[("late_seconds", &[0.1, 1.0])])
    }

    #[test]
    fn a_jobs_series_render_from_the_table_and_the_rest_from_the_exporter() {
        let recorder = recorder();
        let metadata = Metadata::new("t", metrics::Level::INFO, None);
        recorder.describe_gauge("paused".into(), None, "1 while \"paused\"".into());
        let key = |name: &'static str, labels: &[(&'static str, &str)]| {
            let labels: Vec<metrics::Label> = labels
                .iter()
                .map(|(k, v)| metrics::Label::new(*k, v.to_string()))
                .collect();
            Key::from_parts(name, labels)
        };
        recorder
            .register_gauge(&key("paused", &[("job", "a")]), &metadata)
            .set(1.0);
        recorder
            .register_gauge(&key("paused", &[("job", "b")]), &metadata)
            .set(0.5);
        let runs = key("runs_total", &[("job", "a"), ("outcome", "failed")]);
        recorder.register_counter(&runs, &metadata).increment(2);
        recorder.register_counter(&runs, &metadata).increment(1);
        let late = recorder.register_histogram(&key("late_seconds", &[("job", "b")]), &metadata);
        for value in [0.0625, 0.125, 0.5, 7.0] {
            late.record(value);
        }
        let odd = key("runs_total", &[("job", "b"), ("outcome", "x\"y")]);
        recorder.register_counter(&odd, &metadata).increment(1);
        recorder.register_counter(&odd, &metadata).increment(1);
        recorder
            .register_counter(&key("wakeups_total", &[]), &metadata)
            .increment(4);
        recorder
            .register_counter(&key("errors_total", &[("kind", "x")]), &metadata)
            .increment(1);
        let text = recorder.metrics().render();
        for line in [
            "# HELP paused 1 while \"paused\"\n# TYPE paused gauge\npaused{job=\"a\"} 1\npaused{job=\"b\"} 0.5\n",
            "# TYPE runs_total counter\nruns_total{job=\"a\",outcome=\"failed\"} 3\n",
            "late_seconds_bucket{job=\"b\",le=\"0.1\"} 1\nlate_seconds_bucket{job=\"b\",le=\"1\"} 3\nlate_seconds_bucket{job=\"b\",le=\"+Inf\"} 4\nlate_seconds_sum{job=\"b\"} 7.6875\nlate_seconds_count{job=\"b\"} 4\n",
            "runs_total{job=\"b\",outcome=\"x\\\"y\"} 2\n",
            "wakeups_total 4\n",
            "errors_total{kind=\"x\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        assert_eq!(text.matches("# TYPE paused").count(), 1, "{text}");
    }

    /// Values in several blocks render each under its own job, and a
    /// family renders only the jobs recorded in it (the numbers are
    /// shared by every family).
    #[test]
    fn a_familys_values_across_blocks_render_each_once_under_its_job() {
        let recorder = recorder();
        let metadata = Metadata::new("t", metrics::Level::INFO, None);
        let key = |name: &'static str, job: usize| {
            Key::from_parts(name, vec![metrics::Label::new("job", format!("j{job}"))])
        };
        let jobs = 3 * BLOCK + 5;
        for job in 0..jobs {
            let gauge = recorder.register_gauge(&key("next", job), &metadata);
            gauge.set(job as f64 + 0.5);
            if job % 3 == 0 {
                let counter = recorder.register_counter(&key("runs_total", job), &metadata);
                counter.increment(job as u64);
                counter.increment(1);
            }
        }
        let text = recorder.metrics().render();
        for job in 0..jobs {
            let next = format!("next{{job=\"j{job}\"}} {}\n", job as f64 + 0.5);
            assert_eq!(text.matches(&next).count(), 1, "{next}");
            let runs = format!("runs_total{{job=\"j{job}\"}} {}\n", job + 1);
            assert_eq!(
                text.matches(&runs).count(),
                usize::from(job % 3 == 0),
                "{runs}"
            );
        }
        assert_eq!(text.matches("runs_total{").count(), jobs.div_ceil(3));
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd", true), "a\\\"b\\\\c\\nd");
        assert_eq!(escape("say \"x\"\n", false), "say \"x\"\\n");
    }
}
