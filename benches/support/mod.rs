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
