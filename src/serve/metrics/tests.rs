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
    let key = |job: &str| Key::from_parts("next", vec![metrics::Label::new("job", job.to_owned())]);
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

/// A scrape written in parts, however small, is the text written whole:
/// each family headed once, its series together, none twice or lost.
#[test]
fn a_scrape_in_parts_is_the_scrape_whole() {
    let recorder = recorder();
    let metadata = Metadata::new("t", metrics::Level::INFO, None);
    recorder.describe_gauge("next".into(), None, "the next fire".into());
    let key = |name: &'static str, job: usize| {
        Key::from_parts(name, vec![metrics::Label::new("job", format!("j{job}"))])
    };
    for job in 0..2 * BLOCK + 70 {
        recorder
            .register_gauge(&key("next", job), &metadata)
            .set(job as f64);
        if job % 7 == 0 {
            let late = recorder.register_histogram(&key("late_seconds", job), &metadata);
            late.record(0.5);
        }
        if job % 64 == 63 {
            let labels = vec![
                metrics::Label::new("job", format!("j{job}")),
                metrics::Label::new("outcome", "failed"),
            ];
            let runs = Key::from_parts("runs_total", labels);
            recorder.register_counter(&runs, &metadata).increment(1);
        }
    }
    let jobs = recorder.metrics().jobs;
    let whole = recorder.metrics().render();
    for limit in [1, 100, 4096] {
        let (mut text, mut at, mut parts) = (String::new(), Resume::default(), 0);
        loop {
            let until = text.len() + limit;
            if jobs.render_part(&mut at, &mut text, until) {
                break;
            }
            parts += 1;
        }
        assert!(whole.ends_with(&text), "limit {limit}:\n{text}");
        assert!(parts > 1, "limit {limit}: {parts} parts");
    }
}
