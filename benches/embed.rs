//! The library's timer: how late an every-second code job's handler starts
//! after its fire, embedded in this process, on SQLite and PostgreSQL.
//!
//! `cargo bench --bench embed` (`EMBED_SECONDS`, default 60).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use scheduler::{CodeJob, Context, Scheduler};

/// Handler start − fire, in milliseconds, for `seconds` fires.
async fn lateness(url: &str, seconds: u64) -> Vec<f64> {
    let late = Arc::new(Mutex::new(Vec::new()));
    let seen = late.clone();
    let job = CodeJob::new("tick", "* * * * * *").handler(move |cx: Context| {
        let ms = (chrono::Utc::now() - cx.scheduled_at())
            .num_microseconds()
            .unwrap_or(0) as f64
            / 1000.0;
        seen.lock().unwrap().push(ms);
        async { Ok(()) }
    });
    let scheduler = Scheduler::builder()
        .database_url(url)
        .job(job)
        .build()
        .await
        .unwrap();
    let handle = scheduler.start(tokio::time::sleep(
        Duration::from_secs(seconds) + Duration::from_millis(500),
    ));
    handle.stopped().await.unwrap();
    let mut late = late.lock().unwrap().clone();
    late.sort_by(f64::total_cmp);
    late
}

fn show(what: &str, late: &[f64]) {
    let at = |q: f64| late[((late.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{what}: {} fires, handler start after the fire p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        late.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let seconds = std::env::var("EMBED_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("embed.db").display());
    show("SQLite", &lateness(&sqlite, seconds).await);
    let admin = std::env::var("SCHEDULER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await else {
        println!("PostgreSQL: no server at {admin}; skipped");
        return;
    };
    let name = format!("scheduler_bench_embed_{}", std::process::id());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let mut url = url::Url::parse(&admin).unwrap();
    url.set_path(&name);
    show("PostgreSQL", &lateness(url.as_str(), seconds).await);
    let _ = sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await;
}
