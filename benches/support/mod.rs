//! What the bench binaries share: a fresh PostgreSQL database by name.

use sqlx::Connection;

/// The server the benches use: `SCHEDULER_TEST_DATABASE_URL`, else local.
pub fn admin_url() -> String {
    std::env::var("SCHEDULER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Drops and creates database `name`; its URL, or `None` without a server.
pub async fn postgres_database(name: &str) -> Option<String> {
    let admin = admin_url();
    let mut conn = sqlx::PgConnection::connect(&admin).await.ok()?;
    for statement in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::query(&statement).execute(&mut conn).await.ok()?;
    }
    let mut url = url::Url::parse(&admin).ok()?;
    url.set_path(name);
    Some(url.to_string())
}

/// A port free on loopback now.
#[allow(dead_code)] // only the benches that start `serve --listen`
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18_080)
}

/// Waits until the `serve` at `base` (`http://IP:PORT`) answers `/readyz`.
#[allow(dead_code)] // only the benches that start `serve --listen`
pub fn wait_ready(base: &str) {
    let client = reqwest::blocking::Client::new();
    let start = std::time::Instant::now();
    while client
        .get(format!("{base}/readyz"))
        .send()
        .map_or(true, |r| !r.status().is_success())
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "serve never got ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
