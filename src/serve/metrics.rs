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

    /// Every recorded series' values, with its job's number.
    fn values(&self) -> impl Iterator<Item = (usize, Value<'_>)> + '_ {
        let width = self.width();
        self.recorded
            .iter()
            .enumerate()
            .flat_map(move |(word, bits)| {
                let mut left = *bits;
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
                    (_, Value::Histogram(values, bounds)) => {
                        render_histogram(text, name, &labels, values, bounds);
                    }
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

    /// The jobs numbered up front hold their names, not copies, and a
    /// series recorded for one renders under it; a name first seen when
    /// recorded is numbered then, after them.
    #[test]
    fn jobs_numbered_up_front_share_their_names() {
        let recorder = recorder();
        let metadata = Metadata::new("t", metrics::Level::INFO, None);
        let names: Vec<Arc<str>> = vec!["b".into(), "a\"q".into()];
        let metrics = recorder.metrics();
        metrics.number_jobs(names.iter().cloned());
        let key =
            |job: &str| Key::from_parts("next", vec![metrics::Label::new("job", job.to_owned())]);
        recorder.register_gauge(&key("c"), &metadata).set(3.0);
        recorder.register_gauge(&key("b"), &metadata).set(1.0);
        recorder.register_gauge(&key("a\"q"), &metadata).set(2.0);
        let table = metrics.jobs.names.read().unwrap();
        assert!(Arc::ptr_eq(&table.labels[0], &names[0]));
        let (numbered, _) = table.numbers.get_key_value("a\"q").unwrap();
        assert!(Arc::ptr_eq(numbered, &names[1]));
        assert_eq!(table.numbers["c"], 2);
        drop(table);
        assert!(
            metrics
                .render()
                .contains("next{job=\"b\"} 1\nnext{job=\"a\\\"q\"} 2\nnext{job=\"c\"} 3\n"),
            "{}",
            metrics.render()
        );
    }

    /// Values in several blocks (counters, gauges and histograms) render
    /// each under its own job, and a family renders only the jobs recorded
    /// in it (the numbers are shared by every family).
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
            if job % 5 == 0 {
                let late = recorder.register_histogram(&key("late_seconds", job), &metadata);
                late.record(0.0625);
                late.record(job as f64);
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
        for job in (0..jobs).step_by(5) {
            let below = |bound: f64| 1 + usize::from(job as f64 <= bound);
            let series = format!(
                "late_seconds_bucket{{job=\"j{job}\",le=\"0.1\"}} {}\n\
                 late_seconds_bucket{{job=\"j{job}\",le=\"1\"}} {}\n\
                 late_seconds_bucket{{job=\"j{job}\",le=\"+Inf\"}} 2\n\
                 late_seconds_sum{{job=\"j{job}\"}} {}\n\
                 late_seconds_count{{job=\"j{job}\"}} 2\n",
                below(0.1),
                below(1.0),
                job as f64 + 0.0625
            );
            assert_eq!(text.matches(&series).count(), 1, "{series}");
        }
        assert_eq!(
            text.matches("late_seconds_count{").count(),
            jobs.div_ceil(5)
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd", true), "a\\\"b\\\\c\\nd");
        assert_eq!(escape("say \"x\"\n", false), "say \"x\"\\n");
    }
}
